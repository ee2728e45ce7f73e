"""Drop-in functions with flash-linear-attention's names, arguments, layouts and return values.

    o, final_state = chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                            output_final_state=False,
                                            use_qk_l2norm_in_kernel=False, cu_seqlens=None)
    o, final_state = fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None,
                                                      beta=None, ...)

Layouts (time-major, FLA's head_first=False): q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv] with
Hv % Hk == 0; g [B, T, Hv] (log decay) or [B, T, Hv, Dk] (per-key gate); beta [B, T, Hv];
initial_state / final_state [N, Hv, Dk, Dv] (fp32; a bf16/fp16 initial_state is upcast),
N = B or len(cu_seqlens) - 1. Tensors whose last dim is not contiguous are made contiguous.

What gdr adds, as keyword arguments:
    mask               [B, T] bool; a false position leaves the state as it was and writes o = 0
    state_layout       'k_first' ([.., Dk, Dv], default) or 'v_first' ([.., Dv, Dk]);
                       transpose_state_layout=True is the same as 'v_first'
    A_log, dt_bias     gate in kernel: g holds the raw `a`, g = -exp(A_log) * softplus(a + dt_bias)
    use_beta_sigmoid_in_kernel   beta holds the raw `b`; beta = sigmoid(b)
    path, chunk_size   'auto' | 'reference' | 'sequential' | 'chunkwise'; 16 | 32 | 64
    check_values       check g <= 0 and cu_seqlens on CUDA tensors too (a reduction kernel, a
                       copy to the host and a stream synchronisation per call, not capturable in
                       CUDA graphs; off by default: the kernels then clamp cu_seqlens into [0, T]).
                       CPU tensors are always checked: g > 0 (a forgotten log-sigmoid) is refused
                       with its index and value; -inf is allowed, NaN passes through
    save_chunk_intermediates   (chunk_gated_delta_rule, CPU training) the forward keeps each
                       chunk's Tinv and Vnew as well as its incoming state (what docs/operator.md §3
                       keeps, and the default of a CPU training call) for the backward, which
                       then skips recomputing them: ~1.07x faster fwd + bwd, 1.75 KB per token
                       and value head at Dk = Dv = 128 instead of 1 KB; off by default
All of them are differentiable (autograd) and traceable (torch.compile(fullgraph=True)).

Errors: every message of a call starts with the name of the function called, e.g.
"gdr.chunk_gated_delta_rule: v has 3 heads; Hv must be a multiple of Hk=2", whichever layer
finds the problem (this module, the binding or the core, which is handed that name).
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch
from torch import Tensor

from . import _ops  # registers torch.ops.gdr.*

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "decode_step"]


def _tensor(op: str, name: str, x, optional: bool = False) -> Optional[Tensor]:
    if x is None:
        if optional:
            return None
        raise ValueError(f"{op}: {name} is required (got None)")
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _scale(op: str, scale) -> float:
    # The core resolves the scale (0 means 1/sqrt(Dk)) and refuses a non-finite one; only the
    # Python spelling of "default" (None) and a literal 0, which would mean it too, are here.
    if scale is None:
        return 0.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{op}: scale must be a float or None, got {type(scale).__name__}")
    if scale == 0:
        raise ValueError(f"{op}: scale is 0; must be nonzero (None: 1/sqrt(Dk))")
    return float(scale)


def _layout(op: str, state_layout, transpose_state_layout) -> str:
    if transpose_state_layout is not None:
        if not isinstance(transpose_state_layout, bool):
            raise TypeError(f"{op}: transpose_state_layout must be a bool")
        want = "v_first" if transpose_state_layout else "k_first"
        if state_layout is not None and state_layout != want:
            raise ValueError(f"{op}: state_layout='{state_layout}' contradicts "
                             f"transpose_state_layout={transpose_state_layout}")
        return want
    # The binding checks the value ('k_first' or 'v_first'), with the core's message style.
    return "k_first" if state_layout is None else state_layout


def _path(op: str, path, chunk_size) -> tuple[str, int]:
    # The binding checks path's value and the core chunk_size's; only the Python types here.
    if not isinstance(path, str):
        raise TypeError(f"{op}: path must be a str, got {type(path).__name__}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"{op}: chunk_size must be an int (16, 32 or 64)")
    return path, chunk_size


def _gate_in_kernel(op: str, use_gate_in_kernel, A_log, dt_bias) -> bool:
    if use_gate_in_kernel is None:
        use_gate_in_kernel = A_log is not None
    if use_gate_in_kernel and (A_log is None or dt_bias is None):
        raise ValueError(f"{op}: the gate in kernel needs both A_log [Hv] and dt_bias "
                         f"([Hv] or [Hv, Dk]); got A_log={'given' if A_log is not None else None}, "
                         f"dt_bias={'given' if dt_bias is not None else None}")
    if not use_gate_in_kernel and (A_log is not None or dt_bias is not None):
        raise ValueError(f"{op}: A_log / dt_bias are given but use_gate_in_kernel is False")
    return bool(use_gate_in_kernel)


def _last_contiguous(x: Optional[Tensor]) -> Optional[Tensor]:
    # Like FLA's input guard, but only where the core needs it: the last dim must have stride 1.
    if x is not None and x.dim() > 0 and x.numel() > 0 and x.stride(-1) != 1:
        return x.contiguous()
    return x


def _check_unknown(op: str, kwargs: dict) -> None:
    kwargs = dict(kwargs)
    if kwargs.pop("head_first", False):
        raise ValueError(f"{op}: head_first=True is not supported; pass [B, T, H, D] tensors")
    if kwargs.pop("cp_context", None) is not None:
        raise ValueError(f"{op}: cp_context (context parallelism) is not supported by gdr")
    if kwargs:
        raise TypeError(f"{op}: unexpected keyword argument(s): {', '.join(sorted(kwargs))}")


def _run_forward(op, q, k, v, g, beta, scale, initial_state, output_final_state,
                 use_qk_l2norm_in_kernel, cu_seqlens, mask, state_layout, A_log, dt_bias,
                 gate_in_kernel, beta_sigmoid, path, chunk_size, save_chunk_intermediates,
                 check_values):
    if cu_seqlens is not None and cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: cu_seqlens has dtype {cu_seqlens.dtype}; allowed: int32, int64")
    if initial_state is not None and initial_state.dtype in (torch.float16, torch.bfloat16):
        initial_state = initial_state.float()  # states are fp32 (FLA callers may pass bf16)
    q, k, v, g, beta, initial_state = (_last_contiguous(t)
                                       for t in (q, k, v, g, beta, initial_state))
    # Training: the forward also fills the chunkwise path's saved-for-backward tensor (the
    # chunk-boundary states of operator.md §3, or on the CPU with them the chunk intermediates),
    # which autograd hands to the backward (_ops.py). CUDA keeps chunk states only.
    save = "none"
    cpu = q.device.type == "cpu"
    if (_ops.wants_saved(path, (q, k, v, g, beta, A_log, dt_bias, initial_state)) and
            (cpu or chunk_size == 64)):  # the CUDA chunked kernels run chunks of 64
        save = "chunk_intermediates" if save_chunk_intermediates and cpu else "chunk_states"
    o, final_state, _ = torch.ops.gdr.forward(
        q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens, scale, state_layout,
        gate_in_kernel, bool(beta_sigmoid), bool(use_qk_l2norm_in_kernel),
        bool(output_final_state), path, chunk_size, save, bool(check_values), op)
    return o, (final_state if output_final_state else None)


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    *,
    mask: Optional[Tensor] = None,
    state_layout: Optional[str] = None,
    transpose_state_layout: Optional[bool] = None,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_gate_in_kernel: Optional[bool] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    path: str = "auto",
    chunk_size: int = 64,
    save_chunk_intermediates: bool = False,
    check_values: bool = False,
    **kwargs,
) -> tuple[Tensor, Optional[Tensor]]:
    """The chunkwise-parallel gated delta rule (training and prefill). Returns (o, final_state).

    g of rank 3 is a scalar gate per head; g of rank 4 ([B, T, Hv, Dk]) a per-key gate.
    final_state is None unless output_final_state. See the module docstring for the extras.
    """
    op = "gdr.chunk_gated_delta_rule"
    _check_unknown(op, kwargs)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _tensor(op, name, x)
    for name, x in (("initial_state", initial_state), ("cu_seqlens", cu_seqlens), ("mask", mask),
                    ("A_log", A_log), ("dt_bias", dt_bias)):
        _tensor(op, name, x, optional=True)
    return _run_forward(
        op, q, k, v, g, beta, _scale(op, scale), initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, mask,
        _layout(op, state_layout, transpose_state_layout), A_log, dt_bias,
        _gate_in_kernel(op, use_gate_in_kernel, A_log, dt_bias), use_beta_sigmoid_in_kernel,
        *_path(op, path, chunk_size), save_chunk_intermediates, check_values)


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Optional[Tensor] = None,
    gk: Optional[Tensor] = None,
    gv: Optional[Tensor] = None,
    beta: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    *,
    mask: Optional[Tensor] = None,
    state_layout: Optional[str] = None,
    transpose_state_layout: Optional[bool] = None,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_gate_in_kernel: Optional[bool] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    path: str = "sequential",
    check_values: bool = False,
    **kwargs,
) -> tuple[Tensor, Optional[Tensor]]:
    """The token-by-token gated delta rule (decode-style: state in, final state out).

    On CUDA it runs the recurrent/decode kernel, on the CPU the sequential path. g [B, T, Hv]
    is the scalar log decay, gk [B, T, Hv, Dk] the per-key one (both given: they add); g and gk
    both None means no decay; beta None means beta = 1. Returns (o, final_state).
    """
    op = "gdr.fused_recurrent_gated_delta_rule"
    _check_unknown(op, kwargs)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(op, name, x)
    for name, x in (("g", g), ("gk", gk), ("gv", gv), ("beta", beta),
                    ("initial_state", initial_state), ("cu_seqlens", cu_seqlens), ("mask", mask),
                    ("A_log", A_log), ("dt_bias", dt_bias)):
        _tensor(op, name, x, optional=True)
    if gv is not None:
        raise ValueError(f"{op}: gv (a per-value gate) is not supported; gdr takes g [B, T, Hv] "
                         f"or gk [B, T, Hv, Dk]")
    gate_in_kernel = _gate_in_kernel(op, use_gate_in_kernel, A_log, dt_bias)
    if gk is not None:
        if gate_in_kernel and g is not None:
            raise ValueError(
                f"{op}: with the gate in kernel pass the raw gate as g or gk, not both")
        if g is not None:
            if g.dim() != 3:
                raise ValueError(f"{op}: g has rank {g.dim()}; with gk given g must be [B, T, Hv]")
            g = g.unsqueeze(-1).to(torch.promote_types(g.dtype, gk.dtype)) + gk
        else:
            g = gk
    elif g is None:
        if gate_in_kernel:
            raise ValueError(f"{op}: the gate in kernel needs the raw gate in g (or gk)")
        g = torch.zeros(v.shape[:3], dtype=torch.float32, device=v.device)
    if beta is None:
        beta = torch.ones(v.shape[:3], dtype=q.dtype, device=v.device)
    return _run_forward(
        op, q, k, v, g, beta, _scale(op, scale), initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, mask,
        _layout(op, state_layout, transpose_state_layout), A_log, dt_bias, gate_in_kernel,
        use_beta_sigmoid_in_kernel, *_path(op, path, 64), False, check_values)


def decode_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    state_indices: Optional[Tensor] = None,
    scale: Optional[float] = None,
    *,
    mask: Optional[Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
    state_layout: Optional[str] = None,
    transpose_state_layout: Optional[bool] = None,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_gate_in_kernel: Optional[bool] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    check_values: bool = False,
) -> Tensor:
    """One serving step: T = 1..16 new tokens for each of B sequences, state updated in place.

    state is a pool [P, Hv, Dk, Dv] ([P, Hv, Dv, Dk] v-first), float32 or bfloat16 (computed in
    fp32, stored rounded to nearest even once per step; it moves half the state bytes);
    sequence b reads and writes
    row state_indices[b] (int32/int64 [B]; negative: skipped, its o is 0), or row b when
    state_indices is None (P >= B). Returns o [B, T, Hv, Dv]. Not differentiable.
    """
    op = "gdr.decode_step"
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        _tensor(op, name, x)
    for name, x in (("state_indices", state_indices), ("mask", mask), ("A_log", A_log),
                    ("dt_bias", dt_bias)):
        _tensor(op, name, x, optional=True)
    q, k, v, g, beta = (_last_contiguous(t) for t in (q, k, v, g, beta))
    return torch.ops.gdr.decode_(
        q, k, v, g, beta, state, state_indices, A_log, dt_bias, mask, _scale(op, scale),
        _layout(op, state_layout, transpose_state_layout),
        _gate_in_kernel(op, use_gate_in_kernel, A_log, dt_bias),
        bool(use_beta_sigmoid_in_kernel), bool(use_qk_l2norm_in_kernel), bool(check_values), op)
