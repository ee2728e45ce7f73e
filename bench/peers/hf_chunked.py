"""Peer: Hugging Face transformers' CPU fallback for Qwen3-Next's gated delta rule under PyTorch
autograd (scalar gate), fp32.

What transformers really runs in a Qwen3-Next layer on a CPU when flash-linear-attention is not
installed: `transformers.models.qwen3_next.modeling_qwen3_next.torch_chunk_gated_delta_rule`
(imported from the installed package, nothing copied). Per its source: chunk C = 64, GQA by
repeat_interleave (value head h reads key head h / (Hv / Hk), as in gdr), q scaled by Dk^-0.5
inside, the unit lower-triangular system by torch.linalg.solve_triangular, a Python loop over
chunks carrying the state [B, Hv, Dk, Dv], and the backward left to autograd. We pass
use_qk_l2norm_in_kernel=False (keys arrive L2-normalised, as for the other peers) and
output_final_state=True (the final state, as gdr returns it; only o enters the loss).

Same inputs (bench/peers/torch_chunked.py's recipe and seed), same loss sum(dout * o), gradients
of q, k, v, g (log decay) and beta; torch.set_num_threads(threads). --check compares o and the
final state with torch_chunked.py's float64 per-token loop on a small shape (GQA, T not a
multiple of the chunk) in float64, and the gradients with those of torch_chunked.py's chunked form.

Usage: python bench/peers/hf_chunked.py --T 1024 [--check] [--json out.json]
"""

import importlib.util

import torch

from common import emit, measure, parser, rss_bytes
from torch_chunked import chunk_gated_delta, inputs, sequential_reference

import transformers
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule


def hf_forward(q, k, v, g, beta):
    """o [B, T, Hv, Dv] and the final state [B, Hv, Dk, Dv] (k-first); scale Dk^-0.5 inside."""
    return torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, initial_state=None,
                                        output_final_state=True, use_qk_l2norm_in_kernel=False)


def check(seed):
    """float64: forward against the per-token loop, gradients against torch_chunked's form."""
    xs = inputs(2, 150, 2, 4, 16, 8, torch.float64, seed)
    scale = 16 ** -0.5
    # The function casts to float32 inside; float64 in gives float32 arithmetic, so compare
    # against the float64 loop at fp32 accuracy.
    leaves = [x.clone().requires_grad_() for x in xs[:5]]
    o, S = hf_forward(*leaves)
    o_ref, S_ref = sequential_reference(*xs[:5], scale)
    err = max(((o.double() - o_ref).norm() / o_ref.norm()).item(),
              ((S.double() - S_ref).norm() / S_ref.norm()).item())
    (o.double() * xs[5]).sum().backward()
    ref_leaves = [x.clone().requires_grad_() for x in xs[:5]]
    o2, _ = chunk_gated_delta(*ref_leaves, scale)
    (o2 * xs[5]).sum().backward()
    gerr = max(((a.grad - b.grad).norm() / b.grad.norm()).item()
               for a, b in zip(leaves, ref_leaves))
    if not (err < 1e-5 and gerr < 1e-4):
        raise SystemExit(f"hf_chunked: disagrees with the reference: o/state {err:.2e}, "
                         f"gradients {gerr:.2e}")
    return max(err, gerr)


def main():
    args = parser(__doc__).parse_args()
    if importlib.util.find_spec("fla") is not None:
        raise SystemExit("hf_chunked: flash-linear-attention is installed, so transformers would "
                         "not run its PyTorch fallback; this peer measures the fallback")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    check_err = check(args.seed) if args.check else None
    q, k, v, g, beta, dout = inputs(args.B, args.T, args.Hk, args.Hv, args.dk, args.dv,
                                    torch.float32, args.seed)
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta)]
    baseline = rss_bytes()

    def step():
        for x in leaves:
            x.grad = None
        o, _ = hf_forward(*leaves)
        (o * dout).sum().backward()

    seconds, samples = measure(step, args.repeats)
    extra = {"check_rel_error": check_err, "threads_used": torch.get_num_threads(),
             "function": "transformers.models.qwen3_next.modeling_qwen3_next."
                         "torch_chunk_gated_delta_rule"}
    emit(args, "hf_qwen3_next_torch_chunk_autograd",
         {"torch": torch.__version__, "transformers": transformers.__version__}, seconds, samples,
         baseline, extra)


if __name__ == "__main__":
    main()
