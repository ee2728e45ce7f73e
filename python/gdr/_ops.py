"""The torch.library operators of gdr: torch.ops.gdr.forward, .backward and .decode_.

Each allocates its outputs, hands DLPack views to the core (gdr._C) and returns. The core
validates every shape, dtype, device, layout and value before touching memory; its messages reach
Python unchanged (ValueError for bad arguments, RuntimeError for failures while running). Every
message starts with the `op` argument: the public function the caller called (gdr._api passes
e.g. "gdr.chunk_gated_delta_rule"; called directly, "gdr.forward", "gdr.backward", "gdr.decode").
`scale` 0 means 1/sqrt(Dk), resolved by the core (Problem::scale) like every other default.
`check_values` asks for the value check of g on CUDA tensors (g <= 0; include/gdr/params.h,
ExecConfig::check_values: it synchronises the stream); CPU tensors are always checked.

Autograd: forward's gradient is the backward operator (docs/operator.md §4), registered with
register_autograd. Fake (meta) implementations make the operators traceable by torch.compile.
On a training call (see wants_saved) forward also returns the saved-for-backward tensor of the
chunkwise path (include/gdr/params.h, ForwardParams::saved), and autograd keeps it and hands it
to backward: save_for_backward="chunk_states" (chunk_gated_delta_rule's default) keeps the state
entering each chunk, as operator.md §3's training forward does (1 KB per token and value head at
Dk = Dv = 128, chunk 64), and the backward recomputes each chunk's Tinv and Vnew from it;
"chunk_intermediates" (save_chunk_intermediates=True, CPU only) keeps those too (1.75 KB) and the
backward recomputes nothing; "none" keeps nothing and the backward runs its own pass over the
chunks. CUDA tensors: the CUDA chunked forward fills the chunk states and the CUDA chunked
backward (src/cuda/chunked/chunked_backward.cu) reads them on the device, no host copy.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C

__all__ = ["forward", "backward", "decode_"]


def _stream(t: Tensor) -> int:
    """The current CUDA stream of t's device as an integer (0 for CPU tensors)."""
    if t.device.type == "cuda":
        return torch.cuda.current_stream(t.device).cuda_stream
    return 0


def _scratch(t: Tensor):
    """For CUDA tensors, the allocator of the core's temporary device memory: torch's caching
    allocator on the current stream, so that the scratch of the chunked kernels shows in
    torch.cuda.max_memory_allocated and comes from torch's cache (None for CPU tensors)."""
    if t.device.type != "cuda":
        return None
    device = t.device
    return lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device)


def _d(t: Optional[Tensor]) -> Optional[Tensor]:
    # DLPack export refuses tensors that require grad; the core never differentiates anyway.
    return None if t is None else t.detach()


def _last_contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    # Incoming gradients can be expanded (stride 0) or transposed; the core needs stride(-1) == 1.
    if t is None:
        return None
    if t.dim() > 0 and t.stride(-1) != 1:
        # contiguous() keeps the strides of an empty tensor (T = 0): a fresh one instead.
        return t.contiguous() if t.numel() > 0 else torch.empty(t.shape, dtype=t.dtype,
                                                                device=t.device)
    return t


def _size(t: Optional[Tensor], i: int) -> int:
    """t.shape[i], or 0 when t is absent or too small (the core then names the bad input)."""
    if t is None or t.dim() <= i or t.dim() == 0:
        return 0
    return t.shape[i]


def _state_dtype(q: Tensor) -> torch.dtype:
    # States are fp32; float64 inputs (CPU checks, gradcheck) keep float64 states.
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _state_shape(q, k, v, cu_seqlens, state_layout):
    n = (_size(cu_seqlens, 0) - 1) if cu_seqlens is not None else _size(v, 0)
    n = max(n, 0)
    hv, dk, dv = _size(v, 2), _size(k, 3), _size(v, 3)
    return (n, hv, dv, dk) if state_layout == "v_first" else (n, hv, dk, dv)


SAVED_CONTENTS = ("none", "chunk_states", "chunk_intermediates")


def _check_saved_content(content: str, op: str) -> None:
    if content not in SAVED_CONTENTS:
        raise ValueError(f"{op}: save_for_backward is {content!r}; allowed: "
                         + ", ".join(repr(c) for c in SAVED_CONTENTS))


def saved_shape(q, k, v, cu_seqlens, chunk_size, content="chunk_states", op="gdr.forward"):
    """[chunk_rows, Hv, record] of the saved-for-backward tensor, from shapes alone (so that the
    fake implementation works): the core's gdr::saved_shape (include/gdr/problem.h) through
    gdr._C.saved_shape."""
    n = (_size(cu_seqlens, 0) - 1) if cu_seqlens is not None else _size(q, 0)
    return tuple(_C.saved_shape(_size(q, 0), _size(q, 1), max(n, 0), cu_seqlens is not None,
                                _size(v, 2), _size(k, 3), _size(v, 3), chunk_size,
                                q.dtype == torch.float64, content == "chunk_intermediates",
                                op=op))


def wants_saved(path: str, tensors) -> bool:
    """Whether a forward should fill the saved-for-backward tensor: gradients will be taken (grad
    mode on and an input that requires grad) and the path may be the chunkwise one (on CUDA the
    forward then runs the chunked kernels and keeps their chunk states for the CUDA backward)."""
    present = [t for t in tensors if t is not None]
    return (torch.is_grad_enabled() and path in ("auto", "chunkwise") and
            any(t.requires_grad for t in present))


def _alloc_forward(q, k, v, cu_seqlens, state_layout, output_final_state, chunk_size,
                   save_for_backward, op):
    o = torch.empty(v.shape, dtype=q.dtype, device=v.device)
    if output_final_state:
        fs = torch.empty(_state_shape(q, k, v, cu_seqlens, state_layout), dtype=_state_dtype(q),
                         device=v.device)
    else:
        fs = torch.empty((0,), dtype=_state_dtype(q), device=v.device)
    _check_saved_content(save_for_backward, op)
    if save_for_backward != "none":
        # CUDA with 16-bit inputs: bf16 chunk states (half the bytes; the CUDA backward widens
        # them to fp32; docs/cuda-chunked.md §Backward memory). Else fp32 (float64 for float64).
        bf16_states = (v.device.type == "cuda" and save_for_backward == "chunk_states" and
                       q.dtype in (torch.bfloat16, torch.float16))
        saved = torch.empty(saved_shape(q, k, v, cu_seqlens, chunk_size, save_for_backward, op),
                            dtype=torch.bfloat16 if bf16_states else _state_dtype(q),
                            device=v.device)
    else:
        saved = torch.empty((0,), dtype=_state_dtype(q), device=v.device)
    return o, fs, saved


# ---- forward -------------------------------------------------------------------------------------


@torch.library.custom_op("gdr::forward", mutates_args=())
def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    A_log: Optional[Tensor],
    dt_bias: Optional[Tensor],
    initial_state: Optional[Tensor],
    mask: Optional[Tensor],
    cu_seqlens: Optional[Tensor],
    scale: float,
    state_layout: str,
    gate_in_kernel: bool,
    beta_sigmoid: bool,
    qk_l2norm: bool,
    output_final_state: bool,
    path: str,
    chunk_size: int,
    save_for_backward: str = "none",
    check_values: bool = False,
    op: str = "gdr.forward",
) -> tuple[Tensor, Tensor, Tensor]:
    """o [B,T,Hv,Dv], the final state ([N,Hv,Dk,Dv], or shape [0] when not requested) and the
    saved-for-backward tensor ([chunk_rows, Hv, record], see saved_shape; shape [0] when
    save_for_backward is "none"; "chunk_states" or "chunk_intermediates" make the CPU path
    chunkwise)."""
    o, fs, saved = _alloc_forward(q, k, v, cu_seqlens, state_layout, output_final_state,
                                  chunk_size, save_for_backward, op)
    _C.forward(
        _d(q), _d(k), _d(v), _d(g), _d(beta), _d(A_log), _d(dt_bias), _d(initial_state),
        _d(mask), _d(cu_seqlens), o, fs if output_final_state else None,
        scale=scale, state_layout=state_layout, gate_in_kernel=gate_in_kernel,
        beta_sigmoid=beta_sigmoid, qk_l2norm=qk_l2norm, path=path, chunk_size=chunk_size,
        stream=_stream(v), saved=saved if save_for_backward != "none" else None,
        check_values=check_values, op=op, scratch=_scratch(v))
    return o, fs, saved


@forward.register_fake
def _forward_fake(q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens, scale,
                  state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, output_final_state, path,
                  chunk_size, save_for_backward="none", check_values=False, op="gdr.forward"):
    return _alloc_forward(q, k, v, cu_seqlens, state_layout, output_final_state, chunk_size,
                          save_for_backward, op)


# ---- backward ------------------------------------------------------------------------------------


def _grad_like(t: Tensor) -> Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _alloc_backward(q, k, v, g, beta, A_log, dt_bias, initial_state):
    dev = v.device
    absent = torch.empty((0,), dtype=_state_dtype(q), device=dev)
    return (
        _grad_like(q), _grad_like(k), _grad_like(v), _grad_like(g), _grad_like(beta),
        _grad_like(A_log) if A_log is not None else absent.clone(),
        _grad_like(dt_bias) if dt_bias is not None else absent.clone(),
        _grad_like(initial_state) if initial_state is not None else absent.clone(),
    )


def _run_backward(dout, dfinal_state, q, k, v, g, beta, A_log, dt_bias, initial_state, mask,
                  cu_seqlens, scale, state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, path,
                  chunk_size, saved, op):
    grads = _alloc_backward(q, k, v, g, beta, A_log, dt_bias, initial_state)
    dq, dk, dv, dg, dbeta, dA, ddt, dh0 = grads
    _C.backward(
        q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens, dout, dfinal_state,
        dq, dk, dv, dg, dbeta,
        dA if A_log is not None else None,
        ddt if dt_bias is not None else None,
        dh0 if initial_state is not None else None,
        scale=scale, state_layout=state_layout, gate_in_kernel=gate_in_kernel,
        beta_sigmoid=beta_sigmoid, qk_l2norm=qk_l2norm, path=path, chunk_size=chunk_size,
        stream=_stream(v), saved=saved, op=op, scratch=_scratch(v))
    return grads


@torch.library.custom_op("gdr::backward", mutates_args=())
def backward(
    dout: Tensor,
    dfinal_state: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    A_log: Optional[Tensor],
    dt_bias: Optional[Tensor],
    initial_state: Optional[Tensor],
    mask: Optional[Tensor],
    cu_seqlens: Optional[Tensor],
    scale: float,
    state_layout: str,
    gate_in_kernel: bool,
    beta_sigmoid: bool,
    qk_l2norm: bool,
    path: str,
    chunk_size: int,
    saved: Optional[Tensor] = None,
    op: str = "gdr.backward",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0); an absent input's gradient has shape [0].

    saved: the forward's saved-for-backward tensor of the same call (the chunkwise backward then
    reads the chunk states, and on the CPU the chunk matrices, instead of recomputing them), or
    None. On CUDA the chunked backward runs on the device whatever forward path ran (a forward
    forced to "sequential" still gets the chunked backward; "reference" is CPU-only).
    """
    args = [_d(t) for t in (dout, dfinal_state, q, k, v, g, beta, A_log, dt_bias, initial_state,
                            mask, cu_seqlens)]
    args[0] = _last_contiguous(args[0])
    args[1] = _last_contiguous(args[1])
    if v.device.type == "cuda" and path in ("sequential", "auto", "chunkwise"):
        # The one CUDA backward: the chunked one, chunks of 64 (the chunk size does not change
        # the gradients; `saved` only ever comes from the CUDA chunked forward, chunks of 64).
        path, chunk_size = "chunkwise", 64
    opts = (scale, state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, path, chunk_size)
    return _run_backward(*args, *opts, _d(saved), op)


@backward.register_fake
def _backward_fake(dout, dfinal_state, q, k, v, g, beta, A_log, dt_bias, initial_state, mask,
                   cu_seqlens, scale, state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, path,
                   chunk_size, saved=None, op="gdr.backward"):
    return _alloc_backward(q, k, v, g, beta, A_log, dt_bias, initial_state)


def _forward_setup_context(ctx, inputs, output):
    (q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens, scale, state_layout,
     gate_in_kernel, beta_sigmoid, qk_l2norm, output_final_state, path, chunk_size,
     *rest) = inputs
    save_for_backward = rest[0] if rest else "none"
    op = rest[2] if len(rest) > 2 else "gdr.forward"
    saved = output[2] if save_for_backward != "none" else None
    ctx.mark_non_differentiable(output[2])
    # Pass absent output gradients as None: otherwise autograd makes a zero tensor the size of
    # `saved` (tens of MB) for the non-differentiable output in every backward.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens,
                          saved)
    ctx.opts = (scale, state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, path, chunk_size)
    ctx.output_final_state = output_final_state
    # The backward's messages carry the public function's name too (gdr.backward when the
    # caller called torch.ops.gdr.forward itself).
    ctx.op = "gdr.backward" if op == "gdr.forward" else op


def _forward_backward(ctx, do, dfs, _dsaved):
    q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens, saved = ctx.saved_tensors
    if do is None:
        do = torch.zeros(v.shape, dtype=q.dtype, device=v.device)
    if not ctx.output_final_state:
        dfs = None
    dq, dk, dv, dg, dbeta, dA, ddt, dh0 = torch.ops.gdr.backward(
        _last_contiguous(do), _last_contiguous(dfs), q, k, v, g, beta, A_log, dt_bias,
        initial_state, mask, cu_seqlens, *ctx.opts, saved, ctx.op)
    return (dq, dk, dv, dg, dbeta,
            dA if A_log is not None else None,
            ddt if dt_bias is not None else None,
            dh0 if initial_state is not None else None,
            None, None, None, None, None, None, None, None, None, None, None, None, None)


forward.register_autograd(_forward_backward, setup_context=_forward_setup_context)


# ---- decode (state in place) ---------------------------------------------------------------------


@torch.library.custom_op("gdr::decode_", mutates_args=("state",))
def decode_(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    state_indices: Optional[Tensor],
    A_log: Optional[Tensor],
    dt_bias: Optional[Tensor],
    mask: Optional[Tensor],
    scale: float,
    state_layout: str,
    gate_in_kernel: bool,
    beta_sigmoid: bool,
    qk_l2norm: bool,
    check_values: bool = False,
    op: str = "gdr.decode",
) -> Tensor:
    """o [B,T,Hv,Dv]; state [P,Hv,Dk,Dv] (or v-first) is read and updated in place."""
    o = torch.empty(v.shape, dtype=q.dtype, device=v.device)
    _C.decode(
        _d(q), _d(k), _d(v), _d(g), _d(beta), _d(A_log), _d(dt_bias), _d(mask), state.detach(),
        _d(state_indices), o, scale=scale, state_layout=state_layout,
        gate_in_kernel=gate_in_kernel, beta_sigmoid=beta_sigmoid, qk_l2norm=qk_l2norm,
        stream=_stream(v), check_values=check_values, op=op)
    return o


@decode_.register_fake
def _decode_fake(q, k, v, g, beta, state, state_indices, A_log, dt_bias, mask, scale,
                 state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, check_values=False,
                 op="gdr.decode"):
    return torch.empty(v.shape, dtype=q.dtype, device=v.device)
