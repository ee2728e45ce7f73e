#!/usr/bin/env python3
"""Chunked forward + backward on CUDA (training step of one layer's recurrence): gdr's
chunk_gated_delta_rule through torch autograd (the CUDA chunked forward keeps its chunk states,
the CUDA chunked backward reads them; src/cuda/chunked/) against FLA's chunk_gated_delta_rule on
the same inputs (bench/cuda_chunked.py's: bf16 q, k (unit rows), v; fp32 g = -0.2 U(0,1), beta,
h0), Dk = Dv = 128, scalar gate; and the forward benchmark's per-key row (g [B, T, Hv, Dk])
against FLA's chunk_kda. The upstream gradients of o and of the final state are fixed
random tensors; one timed call is forward + torch.autograd.grad for q, k, v, g, beta, h0.

Method: CUDA events around each call, warm-up first, median of --reps calls cycling over the
input sets (bench/cuda_chunked.py's time_calls); peak memory of one call = max_memory_allocated
after reset_peak_memory_stats, minus the memory allocated before the call (inputs and upstream
gradients excluded). speedup = FLA ms / gdr ms.

FLA refuses its gated backward on Hopper with Triton < 3.7.1 (the GPU machine has Triton 3.6):
for timing only, fla.ops.common.chunk_o.IS_NVIDIA_HOPPER is set to False before calling it (see
/work/shared/tools/fetch-peer); the gradients it then returns are not used (only o is compared).

On the GPU machine (scripts/device-check chunked_bwd):
  PYTHONPATH=/tmp/gdrpkg:/tmp/peer python3 bench/cuda_chunked_bwd.py --json out.json
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The forward benchmark's rows, (B, T, Hk, Hv, gate): the same shapes and varlen batch.
from cuda_chunked import SHAPES, make_set, rel, time_calls, varlen_lengths  # noqa: E402


GRAD_INPUTS = ("q", "k", "v", "g", "beta", "h0")


def with_grads(d, gen):
    """The set's inputs as leaves that require grad, plus fixed upstream gradients."""
    x = {k: t.detach().clone().requires_grad_(k in GRAD_INPUTS) for k, t in d.items()}
    x["do"] = torch.randn(d["v"].shape, device="cuda", generator=gen).to(d["v"].dtype)
    x["dfs"] = torch.randn(d["h0"].shape, device="cuda", generator=gen)
    return x


def peak_bytes(fn, d):
    """Peak memory of one call beyond what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(d)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--rows", default="all", help="comma-separated row indices, or all")
    args = ap.parse_args()
    import gdr
    fla_chunk = fla_kda = None
    fla_version = None
    if not args.no_peer:
        try:
            import fla
            import fla.ops.common.chunk_o as fla_chunk_o
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
            from fla.ops.kda import chunk_kda as fla_kda
            fla_chunk_o.IS_NVIDIA_HOPPER = False  # timing only: see the module docstring
            fla_version = getattr(fla, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            print(f"FLA not available: {e}", file=sys.stderr)
    D = 128
    rows = []

    def dump():
        meta = dict(
            command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
            commit=os.environ.get("GDR_COMMIT", "unknown"), device=torch.cuda.get_device_name(),
            overrides=os.environ.get("GDR_OVERRIDES", ""),  # gdr's forced kernel choices, if any
            torch=torch.__version__, cuda=torch.version.cuda, fla=fla_version,
            triton=getattr(__import__("triton"), "__version__", None), seed=1234,
            method="forward + autograd.grad per call, CUDA events, median of reps after warm-up, "
                   "input sets rotated; peak = max_memory_allocated beyond the inputs")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(dict(meta=meta, rows=rows), fh, indent=1)

    shapes = SHAPES if args.rows == "all" else [SHAPES[int(i)] for i in args.rows.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for (B, T, Hk, Hv, gate) in shapes:
        cu = None
        label = None
        if B == "varlen32":
            lens = varlen_lengths()
            cu = [0]
            for L in lens:
                cu.append(cu[-1] + L)
            B, T = 1, cu[-1]
            label = f"varlen 32 seqs {min(lens)}..{max(lens)}"
        N = B if cu is None else len(cu) - 1
        g_bytes = (D if gate == "per_key" else 1) * 4
        in_bytes = (B * T * (2 * Hk * D * 2 + 2 * Hv * D * 2 + Hv * (g_bytes + 4))
                    + 2 * N * Hv * D * D * 4)
        ns = max(1, min(3, math.ceil(180e6 / in_bytes)))
        sets = [with_grads(make_set(B, T, Hk, Hv, D, gate, gen, cu), gen) for _ in range(ns)]
        cu32 = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
        cu64 = None if cu is None else cu32.long()

        def step(fn, d):
            o, s = fn(d)
            grads = torch.autograd.grad((o, s), [d[k] for k in GRAD_INPUTS], (d["do"], d["dfs"]))
            return o, grads

        def run_gdr(d):
            return step(lambda x: gdr.chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                output_final_state=True, cu_seqlens=cu32), d)

        def run_fla(d):
            peer = fla_kda if gate == "per_key" else fla_chunk
            return step(lambda x: peer(
                x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                output_final_state=True, cu_seqlens=cu64), d)

        row = dict(B=B, T=T, Hk=Hk, Hv=Hv, Dk=D, Dv=D, gate=gate, N=N, label=label,
                   seqlens=(None if cu is None else [cu[i + 1] - cu[i] for i in range(N)]),
                   input_sets=ns)
        try:
            gdr_ms, gdr_min = time_calls(run_gdr, sets, args.reps, args.warmup)
            row.update(gdr_ms=gdr_ms, gdr_min_ms=gdr_min, gdr_peak_bytes=peak_bytes(run_gdr, sets[0]))
        except Exception as e:  # noqa: BLE001
            row.update(gdr_error=str(e)[:300])
        if fla_chunk is not None:
            try:
                peer_ms, peer_min = time_calls(run_fla, sets, args.reps, args.warmup)
                row.update(peer_ms=peer_ms, peer_min_ms=peer_min,
                           peer_peak_bytes=peak_bytes(run_fla, sets[0]))
                if "gdr_ms" in row:
                    row.update(speedup=peer_ms / gdr_ms,
                               rel_err_o_vs_peer=rel(run_gdr(sets[0])[0].detach(),
                                                     run_fla(sets[0])[0].detach()))
            except Exception as e:  # noqa: BLE001
                row.update(peer_error=str(e)[:300])
        rows.append(row)
        print(f"B={B} T={T} Hk={Hk} Hv={Hv} {gate} gdr {row.get('gdr_ms', float('nan')):.3f} ms "
              f"(peak {row.get('gdr_peak_bytes', 0) / 2**30:.2f} GiB)  FLA "
              f"{row.get('peer_ms', float('nan')):.3f} ms (peak "
              f"{row.get('peer_peak_bytes', 0) / 2**30:.2f} GiB)  speedup "
              f"{row.get('speedup', float('nan')):.2f}  {row.get('gdr_error', '')}"
              f"{row.get('peer_error', '')}", flush=True)
        del sets
        torch.cuda.empty_cache()
        dump()
    print("\n| B | T | Hk | Hv | gdr ms | FLA ms | speedup | gdr peak GiB | FLA peak GiB |")
    for r in rows:
        print(f"| {r['B']} | {r['T']} | {r['Hk']} | {r['Hv']} | {r.get('gdr_ms', float('nan')):.3f} "
              f"| {r.get('peer_ms', float('nan')):.3f} | {r.get('speedup', float('nan')):.2f} | "
              f"{r.get('gdr_peak_bytes', 0) / 2**30:.2f} | {r.get('peer_peak_bytes', 0) / 2**30:.2f} |")
    dump()


if __name__ == "__main__":
    main()
