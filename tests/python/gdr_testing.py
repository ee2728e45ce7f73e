"""Test helpers: operator.md §7 inputs, the relative Frobenius error, and a plain PyTorch float64
recurrence (docs/operator.md §2) that autograd differentiates; independent of gdr's own code."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

# docs/operator.md §7 tolerances (fp32 paths): o and final state, gradients.
TOL_FWD = 1e-5
TOL_GRAD = 1e-4


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x = x.detach().double()
    ref = ref.detach().double()
    assert x.shape == ref.shape, (x.shape, ref.shape)
    if torch.isnan(ref).any() or torch.isnan(x).any():
        assert torch.equal(torch.isnan(x), torch.isnan(ref)), "NaN positions differ"
        keep = ~torch.isnan(ref)
        x, ref = x[keep], ref[keep]
    den = ref.norm().item()
    num = (x - ref).norm().item()
    if den == 0.0:
        return num
    return num / den


def make_inputs(B=2, T=33, Hk=2, Hv=None, Dk=16, Dv=16, gate="scalar", decay="mild",
                dtype=torch.float32, h0=False, N=None, device="cpu", generator=None,
                normalize_k=True, state_layout="k_first"):
    """q, k, v, g, beta (and h0) as docs/operator.md §7 draws them (fresh random each call)."""
    Hv = Hv or Hk
    gen = generator
    kw = dict(dtype=torch.float64, device="cpu", generator=gen)
    q = torch.randn(B, T, Hk, Dk, **kw)
    k = torch.randn(B, T, Hk, Dk, **kw)
    if normalize_k:
        k = F.normalize(k, dim=-1)
    v = torch.randn(B, T, Hv, Dv, **kw)
    gshape = (B, T, Hv) if gate == "scalar" else (B, T, Hv, Dk)
    if decay == "mild":
        g = -0.2 * torch.rand(gshape, **kw)
    elif decay == "strong":
        g = -4.0 * torch.rand(gshape, **kw)
    elif decay == "extreme":
        g = torch.full(gshape, -30.0, dtype=torch.float64)
    else:
        raise ValueError(decay)
    beta = torch.rand(B, T, Hv, **kw)
    out = dict(q=q, k=k, v=v, g=g, beta=beta)
    if h0:
        n = N if N is not None else B
        shape = (n, Hv, Dk, Dv) if state_layout == "k_first" else (n, Hv, Dv, Dk)
        out["initial_state"] = torch.randn(shape, **kw)
    return {name: t.to(device=device, dtype=dtype if name in ("q", "k", "v") else
                       (torch.float64 if dtype == torch.float64 else torch.float32))
            for name, t in out.items()}


def torch_reference(q, k, v, g, beta, scale: Optional[float] = None, initial_state=None,
                    output_final_state: bool = True, cu_seqlens=None, mask=None,
                    use_qk_l2norm: bool = False, A_log=None, dt_bias=None,
                    beta_sigmoid: bool = False, state_layout: str = "k_first",
                    l2norm_eps: float = 1e-6):
    """The docs/operator.md §2 recurrence in float64, token by token; differentiable by autograd.

    Returns (o [B,T,Hv,Dv] float64, final_state [N,Hv,Dk,Dv] (or v-first) float64).
    """
    f = lambda t: None if t is None else t.double()  # noqa: E731
    q, k, v, g, beta = f(q), f(k), f(v), f(g), f(beta)
    A_log, dt_bias, initial_state = f(A_log), f(dt_bias), f(initial_state)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    grp = Hv // Hk
    if scale is None:
        scale = 1.0 / math.sqrt(Dk)
    if use_qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + l2norm_eps)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + l2norm_eps)
    q = q.repeat_interleave(grp, dim=2)
    k = k.repeat_interleave(grp, dim=2)
    if A_log is not None:
        # g = -exp(A_log) * softplus(a + dt_bias); dt_bias [Hv] or [Hv, Dk] broadcasts over B, T.
        A = torch.exp(A_log)
        if g.dim() == 4:
            A = A[:, None]
        g = -A * F.softplus(g + dt_bias)
    if beta_sigmoid:
        beta = torch.sigmoid(beta)
    per_key = g.dim() == 4
    if cu_seqlens is not None:
        cu = [int(x) for x in cu_seqlens.tolist()]
        spans = [(0, cu[i], cu[i + 1] - cu[i]) for i in range(len(cu) - 1)]
    else:
        spans = [(b, 0, T) for b in range(B)]
    o = [[None] * T for _ in range(B)]
    finals = []
    for n, (b, t0, length) in enumerate(spans):
        if initial_state is not None:
            S = initial_state[n]
            if state_layout == "v_first":
                S = S.transpose(-1, -2)
        else:
            S = torch.zeros(Hv, Dk, Dv, dtype=torch.float64, device=q.device)
        for t in range(t0, t0 + length):
            if mask is not None and not bool(mask[b, t]):
                o[b][t] = torch.zeros(Hv, Dv, dtype=torch.float64, device=q.device)
                continue
            decay = torch.exp(g[b, t])
            S = S * (decay[:, :, None] if per_key else decay[:, None, None])
            kt, qt = k[b, t], q[b, t]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", S, kt))
            S = S + kt[:, :, None] * u[:, None, :]
            o[b][t] = scale * torch.einsum("hkv,hk->hv", S, qt)
        finals.append(S.transpose(-1, -2) if state_layout == "v_first" else S)
    for b in range(B):
        for t in range(T):
            if o[b][t] is None:  # positions outside every sequence (not produced by valid input)
                o[b][t] = torch.zeros(Hv, Dv, dtype=torch.float64, device=q.device)
    o = torch.stack([torch.stack(row) for row in o]) if T > 0 else \
        torch.zeros(B, 0, Hv, Dv, dtype=torch.float64, device=q.device)
    final = torch.stack(finals) if finals else \
        torch.zeros(0, Hv, Dk, Dv, dtype=torch.float64, device=q.device)
    return o, final


def load_example(name: str = "gated_deltanet_lm"):
    """examples/gated_deltanet_lm.py as a module (the examples folder is not a package)."""
    import importlib.util
    import pathlib
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(name, root / "examples" / "gated_deltanet_lm.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod
