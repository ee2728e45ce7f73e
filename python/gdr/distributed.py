"""Context parallelism for the gated delta rule over torch.distributed.

One batch of sequences is cut along the token axis into contiguous slices, one per rank of a
process group, in group-rank order: rank r holds global tokens [a_r, b_r).

Math. For one sequence and value head, every token's step
    S -> (I - beta k k^T) diag(alpha) S + beta k v^T          (alpha = exp(g), scalar or per key)
is affine in S, so the map over a slice is affine too:
    S_out = M S_in + C,   M in R^{Dk x Dk},  C in R^{Dk x Dv}.
Running the single-device operator over the slice with v' = [v | 0_{Dk}] and h0' = [0 | I_{Dk}]
(value width Dv + Dk) gives in one pass
    final state  [C | M]                      (the columns of I evolve with v = 0: linear part)
    output       o'_t = [o_loc_t | scale M_t^T q_t]
where M_t is the map up to token t, so the true output from any incoming state is
    o_t = o_loc_t + S_in^T (scale M_t^T q_t)  =  o'[:Dv] + o'[Dv:] @ S_in     (per head).
Every rank exchanges its carry-out map (M, C) once (one all-gather of Hv*Dk*(Dk+Dv) fp32 per
sequence crossing the slice end), composes the maps of the ranks before it into its own
incoming state S_in (fp32), and corrects its output with one [t, Dk] x [Dk, Dv] product per head.
The backward runs the same chain transposed: dS_in = sum_t o'[Dv:]_t^T do_t (+ M^T dfinal),
dM_r = G S_in_r^T, dC_r = G, G <- M_r^T G, then one reduction (reduce-scatter on NCCL, all-reduce
on gloo) hands each rank the gradient of its (M, C), and the operator's own backward maps the
gradients of [o' | final] to q, k, v, g, beta.

The whole call is one autograd node, so every rank issues the same collectives in the same order
(forward: all-gather of (M, C) [+ all-reduce of final states]; backward: [all-reduce of the final
state gradient], reduction of the (M, C) gradients [, all-reduce of dh0]). All ranks must take
part in forward and backward of every call, as with any collective.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Callable, List, Optional, Sequence, Union

import torch
import torch.distributed as dist

__all__ = [
    "chunk_gated_delta_rule_cp",
    "cp_slice_bounds",
    "cp_split",
    "cp_comm_bytes",
]

_OP_NAME = "gdr.chunk_gated_delta_rule_cp"


def _default_op() -> Callable:
    import gdr  # the single-device operator (autograd-capable)

    return gdr.chunk_gated_delta_rule


def cp_slice_bounds(total_tokens: int, world_size: int) -> List[int]:
    """Balanced contiguous slices: rank r holds tokens [bounds[r], bounds[r + 1])."""
    if world_size < 1 or total_tokens < 0:
        raise ValueError(
            f"{_OP_NAME}: world_size={world_size}, total_tokens={total_tokens}; need >= 1 and >= 0")
    base, extra = divmod(total_tokens, world_size)
    bounds = [0]
    for r in range(world_size):
        bounds.append(bounds[-1] + base + (1 if r < extra else 0))
    return bounds


def cp_split(x: torch.Tensor, bounds: Sequence[int], rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's slice of a full tensor along the token axis (dim 1 for [B, T, ...])."""
    return x.narrow(dim, bounds[rank], bounds[rank + 1] - bounds[rank])


def cp_comm_bytes(world_size: int, num_boundary_rows: int, hv: int, dk: int, dv: int,
                  num_seqs_final: int = 0, backward: bool = True, h0_grad: bool = False,
                  nccl: bool = True) -> dict:
    """Bytes each rank sends per call (one layer), counting ring algorithms.

    rows = sequences crossing a slice end as seen by the exchange: 1 under varlen, B otherwise.
    X = rows * Hv * Dk * (Dk + Dv) * 4 bytes (fp32 (M, C) of one rank).
    forward : all-gather of X per rank            -> sends (W - 1) * X
              (+ all-reduce of final states F = N * Hv * Dk * Dv * 4 -> 2 (W - 1) / W * F)
    backward: reduce-scatter of W * X (NCCL)       -> sends (W - 1) * X
              all-reduce of W * X (gloo)           -> sends 2 (W - 1) * X
              (+ all-reduce of the final-state gradient F, of dh0 F)
    """
    w = world_size
    x = num_boundary_rows * hv * dk * (dk + dv) * 4
    f = num_seqs_final * hv * dk * dv * 4
    ar = lambda n: 2 * (w - 1) * n // w  # noqa: E731  ring all-reduce, bytes sent per rank
    fwd = (w - 1) * x + (ar(f) if num_seqs_final else 0)
    bwd = 0
    if backward:
        bwd = (w - 1) * x if nccl else ar(w * x)
        if num_seqs_final:
            bwd += ar(f)
        if h0_grad:
            bwd += ar(f)
    return {"exchange_bytes_per_rank": x, "forward_bytes_sent_per_rank": fwd,
            "backward_bytes_sent_per_rank": bwd}


@dataclasses.dataclass(frozen=True)
class _Plan:
    rank: int
    world: int
    bounds: List[int]  # W + 1 global token offsets of the slices
    varlen: bool
    nb: int  # rows of the exchanged maps: 1 under varlen, B otherwise
    n_seqs: int  # N: rows of h0 and of the final state
    # The first piece: the slice's tokens of a sequence that started on an earlier rank (run
    # with the widened value [v | 0] to get its map); t_first = 0 when the slice starts a
    # sequence (or is empty): then its incoming state is h0 or 0 and no map is needed.
    t_first: int
    first_rows: List[int]  # sequence ids of the first piece's rows (nb of them; [] if none)
    first_ends_here: bool  # the first piece's sequence ends inside this slice
    # The rest: pieces of sequences starting inside the slice, one ordinary call from h0 rows.
    rest_ids: List[int]
    rest_cu: List[int]  # their local cu_seqlens (starting at 0, relative to t_first); [] if dense
    rest_ends_here: List[bool]
    reset: List[bool]  # per rank: its first piece starts a sequence (state comes from h0 or 0)
    h_rows: List[Optional[List[int]]]  # per rank: rows of h0 giving its reset state (None: zeros)
    empty_seqs: List[int]  # zero-length sequences: final state = h0 row (or 0)


def _make_plan(rank: int, world: int, bounds: List[int], batch: int, cu: Optional[List[int]],
               has_h0: bool) -> _Plan:
    a, b = bounds[rank], bounds[rank + 1]
    total = bounds[-1]
    if cu is None:
        rows = list(range(batch))
        last_nonempty = max((r for r in range(world) if bounds[r + 1] > bounds[r]), default=-1)
        first = rank > 0 and b > a  # rank 0 starts every row from h0 or 0
        ends = rank == last_nonempty
        return _Plan(
            rank=rank, world=world, bounds=bounds, varlen=False, nb=batch, n_seqs=batch,
            t_first=b - a if first else 0, first_rows=rows if first else [],
            first_ends_here=ends and first, rest_ids=rows if (b > a and not first) else [],
            rest_cu=[], rest_ends_here=[ends] * batch if (b > a and not first) else [],
            reset=[r == 0 for r in range(world)],
            h_rows=[rows if (r == 0 and has_h0) else None for r in range(world)],
            empty_seqs=rows if total == 0 else [])
    n = len(cu) - 1
    if cu[0] != 0 or cu[-1] != total or any(cu[i] > cu[i + 1] for i in range(n)):
        raise ValueError(
            f"{_OP_NAME}: cu_seqlens must start at 0, be non-decreasing and end at the global "
            f"token count {total} (sum of the ranks' slices); got start {cu[0]}, end {cu[-1]}")

    def seq_of(p: int) -> int:  # the non-empty sequence holding global token p
        return bisect.bisect_right(cu, p) - 1

    reset, h_rows = [], []
    for r in range(world):
        ar, br = bounds[r], bounds[r + 1]
        if br > ar:
            s = seq_of(ar)
            rs = cu[s] == ar or r == 0
            reset.append(rs)
            h_rows.append([s] if (rs and has_h0) else None)
        else:
            reset.append(r == 0)
            h_rows.append(None)
    t_first, first_rows, first_end, rest_ids, rest_cu, rest_end = 0, [], False, [], [0], []
    if b > a:
        s = seq_of(a)
        if reset[rank]:  # the slice starts sequence s: it joins the ordinary call
            s -= 1
        else:
            t_first = min(cu[s + 1], b) - a
            first_rows = [s]
            first_end = cu[s + 1] <= b
        for s2 in range(s + 1, n):
            if cu[s2] >= b:
                break
            if cu[s2 + 1] > cu[s2] and cu[s2 + 1] > a:
                rest_ids.append(s2)
                rest_cu.append(rest_cu[-1] + min(cu[s2 + 1], b) - max(cu[s2], a))
                rest_end.append(cu[s2 + 1] <= b)
    return _Plan(rank=rank, world=world, bounds=bounds, varlen=True, nb=1, n_seqs=n,
                 t_first=t_first, first_rows=first_rows, first_ends_here=first_end,
                 rest_ids=rest_ids, rest_cu=rest_cu if rest_ids else [], rest_ends_here=rest_end,
                 reset=reset, h_rows=h_rows,
                 empty_seqs=[s for s in range(n) if cu[s] == cu[s + 1]])


@dataclasses.dataclass
class _Config:
    plan: _Plan
    op: Callable
    scale: float
    group: object
    nccl: bool
    map_pass: str  # "concat": one call with v' = [v | 0]; "split": two calls
    rerun: bool  # recompute the first piece's output from S_in instead of the correction
    l2norm: bool
    output_final_state: bool
    cu_dtype: torch.dtype
    mask: Optional[torch.Tensor]  # [B, T_r] bool, this rank's slice
    op_kwargs: dict  # non-tensor options passed to every operator call


def _all_gather(x: torch.Tensor, cfg: _Config) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((cfg.plan.world,) + tuple(x.shape))
    if cfg.nccl:
        dist.all_gather_into_tensor(out, x, group=cfg.group)
    else:  # gloo's all_gather_into_tensor wants a flat output; the list form is portable
        dist.all_gather(list(out.unbind(0)), x, group=cfg.group)
    return out


def _all_reduce(x: torch.Tensor, cfg: _Config) -> torch.Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=cfg.group)
    return x


def _reduce_to_rank(x: torch.Tensor, cfg: _Config) -> torch.Tensor:
    """x: [W, ...] per-rank contributions; returns sum over ranks of x[own rank]."""
    if cfg.nccl:
        out = x.new_empty(tuple(x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), op=dist.ReduceOp.SUM, group=cfg.group)
        return out
    return _all_reduce(x, cfg)[cfg.plan.rank]


def _mm(m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # M X per (row, head)
    return torch.einsum("nhkj,nhjv->nhkv", m, x)


def _mtm(m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # M^T X per (row, head)
    return torch.einsum("nhjk,nhjv->nhkv", m, x)


class _ContextParallelGDR(torch.autograd.Function):
    """(q, k, v, g, beta, h0) slices -> (o slice, replicated final state)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, cfg: _Config):
        p = cfg.plan
        B, _, Hv, Dv = v.shape
        Dk = k.shape[-1]
        sd = torch.float64 if q.dtype == torch.float64 else torch.float32
        dev = q.device
        t1 = p.t_first
        needs = ctx.needs_input_grad
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(bool(needs[i]) and x.is_floating_point())
                      if x is not None else None
                      for i, x in enumerate((q, k, v, g, beta, h0))]
            ql, kl, vl, gl, bl, hl = leaves
            kw = dict(scale=cfg.scale, use_qk_l2norm_in_kernel=cfg.l2norm, **cfg.op_kwargs)
            m = cfg.mask
            kw1 = dict(kw, mask=m[:, :t1]) if m is not None else kw  # first piece
            kwr = dict(kw, mask=m[:, t1:]) if m is not None else kw  # the rest

            o_a = f_a = o_b = f_b = None
            if t1 > 0:
                sl = slice(0, t1)
                q1, k1, v1, g1, b1 = (x[:, sl] for x in (ql, kl, vl, gl, bl))
                eye = torch.eye(Dk, dtype=sd, device=dev).expand(p.nb, Hv, Dk, Dk)
                if cfg.map_pass == "concat":
                    vp = torch.cat([v1, v1.new_zeros(p.nb, t1, Hv, Dk)], dim=-1)
                    h0p = torch.cat([torch.zeros(p.nb, Hv, Dk, Dv, dtype=sd, device=dev), eye],
                                    dim=-1).contiguous()
                    o_a, f_a = cfg.op(q1, k1, vp, g1, b1, initial_state=h0p,
                                      output_final_state=True, **kw1)
                else:
                    o_loc, c_loc = cfg.op(q1, k1, v1, g1, b1, initial_state=None,
                                          output_final_state=True, **kw1)
                    o_m, m_loc = cfg.op(q1, k1, v1.new_zeros(p.nb, t1, Hv, Dk), g1, b1,
                                        initial_state=eye.contiguous(), output_final_state=True,
                                        **kw1)
                    o_a = torch.cat([o_loc, o_m], dim=-1)
                    f_a = torch.cat([c_loc, m_loc], dim=-1)
                if f_a is None:
                    raise RuntimeError(f"{_OP_NAME}: the operator returned no final state")
            if p.rest_ids:
                rs = slice(t1, None)
                cu_t = torch.tensor(p.rest_cu, dtype=cfg.cu_dtype, device=dev) if p.varlen \
                    else None
                h0r = hl[p.rest_ids] if hl is not None else None
                o_b, f_b = cfg.op(ql[:, rs], kl[:, rs], vl[:, rs], gl[:, rs], bl[:, rs],
                                  initial_state=h0r, output_final_state=True, cu_seqlens=cu_t,
                                  **kwr)

        # Carry-out map of this slice: [M | C], fp32.
        if p.rest_ids:  # the last piece started in this slice: constant map [0 | final]
            last = f_b[-1:] if p.varlen else f_b
            mc_out = torch.cat([torch.zeros(p.nb, Hv, Dk, Dk, dtype=sd, device=dev),
                                last.detach().to(sd)], dim=-1)
        elif t1 > 0:
            fa = f_a.detach().to(sd)
            mc_out = torch.cat([fa[..., Dv:], fa[..., :Dv]], dim=-1)
        else:
            mc_out = torch.cat([torch.eye(Dk, dtype=sd, device=dev).expand(p.nb, Hv, Dk, Dk),
                                torch.zeros(p.nb, Hv, Dk, Dv, dtype=sd, device=dev)], dim=-1)
        mc_all = _all_gather(mc_out, cfg)  # [W, nb, Hv, Dk, Dk + Dv]

        h_all = _reset_states(p, h0, Hv, Dk, Dv, sd, dev)
        xs = []  # S_in of ranks 0..rank
        x = h_all[0]
        xs.append(x)
        for r in range(p.rank):
            if p.reset[r + 1]:
                x = h_all[r + 1]
            else:
                x = _mm(mc_all[r, ..., :Dk], x) + mc_all[r, ..., Dk:]
            xs.append(x)
        s_in = xs[-1]

        o1 = s_leaf = None
        if t1 > 0:
            if cfg.rerun:
                with torch.enable_grad():
                    s_leaf = s_in.clone().requires_grad_(True)
                    o1, _ = cfg.op(q1, k1, v1, g1, b1, initial_state=s_leaf,
                                   output_final_state=False, **kw1)
                o1_val = o1.detach()
            else:
                oa = o_a.detach()
                o1_val = (oa[..., :Dv].to(sd) + torch.einsum(
                    "nthk,nhkv->nthv", oa[..., Dv:].to(sd), s_in)).to(v.dtype)
            parts = [o1_val]
        else:
            parts = []
        if p.rest_ids:
            parts.append(o_b.detach().to(v.dtype))
        if not parts:
            parts = [v.new_zeros(B, 0, Hv, Dv)]
        o = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

        if cfg.output_final_state:
            part = torch.zeros(p.n_seqs, Hv, Dk, Dv, dtype=sd, device=dev)
            if t1 > 0 and p.first_ends_here:
                fa = f_a.detach().to(sd)
                part[p.first_rows] = _mm(fa[..., Dv:], s_in) + fa[..., :Dv]
            for i, sid in enumerate(p.rest_ids):
                if p.rest_ends_here[i]:
                    part[sid] = f_b[i].detach().to(sd)
            if p.rank == 0 and p.empty_seqs and h0 is not None:
                part[p.empty_seqs] = h0[p.empty_seqs].detach().to(sd)
            fs = _all_reduce(part, cfg)
        else:
            fs = o.new_empty(0)
            ctx.mark_non_differentiable(fs)

        if any(needs[:6]):  # keep the local graphs and the chain for backward
            ctx.cfg = cfg
            ctx.dims = (B, Hv, Dk, Dv, sd)
            ctx.leaves = leaves
            ctx.graph = (o_a, f_a, o_b, f_b, o1, s_leaf)
            ctx.chain = (mc_all[: p.rank, ..., :Dk].clone(), xs, s_in)
        return o, fs

    @staticmethod
    def backward(ctx, do, dfs):
        cfg = ctx.cfg
        p = cfg.plan
        B, Hv, Dk, Dv, sd = ctx.dims
        o_a, f_a, o_b, f_b, o1, s_leaf = ctx.graph
        m_prev, xs, s_in = ctx.chain
        leaves = ctx.leaves
        t1 = p.t_first
        dev = s_in.device
        grads = [None] * 6

        def accumulate(outs, gouts):
            pairs = [(o, g) for o, g in zip(outs, gouts) if o is not None and o.requires_grad]
            want = [i for i, x in enumerate(leaves) if x is not None and x.requires_grad]
            if not pairs or not want:
                return
            res = torch.autograd.grad([o for o, _ in pairs], [leaves[i] for i in want],
                                      [g.to(o.dtype) for o, g in pairs], allow_unused=True)
            for i, r in zip(want, res):
                if r is not None:
                    grads[i] = r if grads[i] is None else grads[i] + r

        dfs_full = None
        if cfg.output_final_state:
            dfs_full = _all_reduce(dfs.to(sd), cfg)

        d_s = torch.zeros(p.nb, Hv, Dk, Dv, dtype=sd, device=dev)
        d_fa = torch.zeros_like(f_a, dtype=sd) if t1 > 0 else None
        d_oa = None
        if t1 > 0:
            do1 = do[:, :t1].to(sd)
            if cfg.rerun:
                want = [i for i, x in enumerate(leaves) if x is not None and x.requires_grad]
                res = torch.autograd.grad(o1, [s_leaf] + [leaves[i] for i in want],
                                          do[:, :t1].to(o1.dtype), allow_unused=True)
                d_s = d_s + res[0].to(sd)
                for i, r in zip(want, res[1:]):
                    if r is not None:
                        grads[i] = r if grads[i] is None else grads[i] + r
            else:
                om = o_a.detach()[..., Dv:].to(sd)
                d_oa = torch.cat([do1, torch.einsum("nthv,nhkv->nthk", do1, s_in)], dim=-1)
                d_s = d_s + torch.einsum("nthk,nthv->nhkv", om, do1)
            if dfs_full is not None and p.first_ends_here:
                dfr = dfs_full[p.first_rows]
                fa = f_a.detach().to(sd)
                d_s = d_s + _mtm(fa[..., Dv:], dfr)
                d_fa[..., Dv:] += torch.einsum("nhkv,nhjv->nhkj", dfr, s_in)
                d_fa[..., :Dv] += dfr

        # Chain backward: S_in_{r+1} = M_r S_in_r + C_r unless rank r + 1 resets.
        d_mc = torch.zeros(p.world, p.nb, Hv, Dk, Dk + Dv, dtype=sd, device=dev)
        d_h = [None] * p.world
        gcur = d_s
        for r in range(p.rank - 1, -1, -1):
            if p.reset[r + 1]:
                d_h[r + 1] = gcur
                gcur = None
                break
            d_mc[r, ..., :Dk] = torch.einsum("nhkv,nhjv->nhkj", gcur, xs[r])
            d_mc[r, ..., Dk:] = gcur
            gcur = _mtm(m_prev[r], gcur)
        if gcur is not None:
            d_h[0] = gcur
        d_own = _reduce_to_rank(d_mc, cfg)  # gradient of this rank's carry-out [M | C]

        d_fb = torch.zeros_like(f_b, dtype=sd) if p.rest_ids else None
        if p.rest_ids:
            if p.varlen:
                d_fb[-1] += d_own[0, ..., Dk:]
            else:
                d_fb += d_own[..., Dk:]
            if dfs_full is not None:
                for i, sid in enumerate(p.rest_ids):
                    if p.rest_ends_here[i]:
                        d_fb[i] += dfs_full[sid]
        elif t1 > 0:
            d_fa[..., Dv:] += d_own[..., :Dk]
            d_fa[..., :Dv] += d_own[..., Dk:]

        accumulate([o_a if d_oa is not None else None, f_a, o_b, f_b],
                   [d_oa, d_fa, do[:, t1:] if p.rest_ids else None, d_fb])

        if ctx.needs_input_grad[5]:
            h0l = leaves[5]
            dh0 = grads[5].to(sd) if grads[5] is not None else torch.zeros(
                p.n_seqs, Hv, Dk, Dv, dtype=sd, device=dev)
            for r in range(p.world):
                if d_h[r] is not None and p.h_rows[r] is not None:
                    dh0 = dh0.index_add(0, torch.tensor(p.h_rows[r], device=dev), d_h[r])
            if dfs_full is not None and p.rank == 0 and p.empty_seqs:
                dh0 = dh0.index_add(0, torch.tensor(p.empty_seqs, device=dev),
                                    dfs_full[p.empty_seqs])
            grads[5] = _all_reduce(dh0, cfg).to(h0l.dtype)
        for i in range(5):  # inputs that reach no output (an empty slice): zero gradients
            if ctx.needs_input_grad[i] and grads[i] is None:
                grads[i] = torch.zeros_like(leaves[i])
        ctx.graph = ctx.leaves = ctx.chain = None
        return (*grads, None)


def _reset_states(p: _Plan, h0, Hv, Dk, Dv, sd, dev) -> torch.Tensor:
    """[W, nb, Hv, Dk, Dv]: the state each resetting rank starts from (h0 rows or zeros)."""
    h = torch.zeros(p.world, p.nb, Hv, Dk, Dv, dtype=sd, device=dev)
    for r in range(p.world):
        if p.h_rows[r] is not None:
            h[r] = h0[p.h_rows[r]].detach().to(sd)
    return h


def chunk_gated_delta_rule_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[Union[torch.Tensor, Sequence[int]]] = None,
    group=None,
    slice_lengths: Optional[Sequence[int]] = None,
    op: Optional[Callable] = None,
    map_pass: str = "auto",
    rerun: bool = False,
    mask: Optional[torch.Tensor] = None,
    **op_kwargs,
):
    """Gated delta rule over a token axis split across the ranks of `group`.

    Each rank passes its contiguous slice of the global batch, in group-rank order:
      q, k [B, T_r, Hk, Dk]; v [B, T_r, Hv, Dv]; g [B, T_r, Hv] or [B, T_r, Hv, Dk] (log decay);
      beta [B, T_r, Hv].  T_r may differ between ranks and may be 0.
    cu_seqlens: the GLOBAL boundaries [N + 1] of the whole batch (same on every rank, B = 1),
      in global token positions; sequences may cross any number of slice ends.
    initial_state: the GLOBAL h0 [N, Hv, Dk, Dv] fp32 (N = B without varlen), same on every rank;
      its gradient comes back complete (summed over ranks) on every rank.
    slice_lengths: T_r of every rank; if None, one all-gather of the lengths finds them.
    op: the single-device operator, FLA signature (default gdr.chunk_gated_delta_rule).
    map_pass: "concat" (one call of width Dv + Dk gives the slice's map and output), "split"
      (two calls of widths Dv and Dk, for operators limited in Dv), "auto" (concat when
      Dv + Dk <= 256, the widest head dim the kernels promise, else split).
    rerun: recompute the first piece's output from the incoming state with a second call (one
      rounding of o in low precision) instead of the fp32 correction o' [:Dv] + o'[Dv:] S_in.
    mask: [B, T_r] bool, this rank's slice (a masked token keeps the state, writes o = 0).
    op_kwargs: non-tensor options for the operator (e.g. path=, chunk_size=,
      use_beta_sigmoid_in_kernel=); tensors (A_log, dt_bias) are refused: their gradients would
      not cross ranks, apply the gate outside.

    Returns (o [B, T_r, Hv, Dv] this rank's slice, final_state [N, Hv, Dk, Dv] fp32 replicated on
    every rank, or None). Gradient semantics: the objective is the sum of the ranks' losses, so a
    loss term on the replicated final state should be counted once over the ranks.
    """
    op = _default_op() if op is None else op
    for key, val in op_kwargs.items():
        if isinstance(val, torch.Tensor) or key in ("state_layout", "transpose_state_layout"):
            raise ValueError(f"{_OP_NAME}: {key} is not supported under context parallelism "
                             f"(tensor options and the v-first state layout are refused)")
    if mask is not None and tuple(mask.shape) != tuple(q.shape[:2]):
        raise ValueError(f"{_OP_NAME}: mask has shape {tuple(mask.shape)}; expected this "
                         f"rank's (B, T_r) = {tuple(q.shape[:2])}")
    if map_pass not in ("auto", "concat", "split"):
        raise ValueError(f"{_OP_NAME}: map_pass={map_pass!r}; allowed: 'auto', 'concat', 'split'")
    for name, x, nd in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("beta", beta, 3)):
        if x.dim() != nd:
            raise ValueError(f"{_OP_NAME}: {name} has {x.dim()} dims; expected {nd}")
    if g.dim() not in (3, 4):
        raise ValueError(f"{_OP_NAME}: g has {g.dim()} dims; expected 3 (scalar) or 4 (per key)")
    B, T_r, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    if q.shape != k.shape or v.shape[:2] != (B, T_r) or Hv % Hk != 0:
        raise ValueError(f"{_OP_NAME}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)};"
                         f" need q == k shape, matching B/T, Hv a multiple of Hk={Hk}")
    group = group if group is not None else dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nccl = q.is_cuda and "nccl" in str(dist.get_backend(group))  # tensor-form collectives
    if slice_lengths is None:
        t = torch.tensor([T_r], dtype=torch.int64, device=q.device)
        all_t = t.new_empty(world)
        dist.all_gather(list(all_t.split(1)), t, group=group)
        slice_lengths = all_t.tolist()
    slice_lengths = [int(x) for x in slice_lengths]
    if len(slice_lengths) != world or slice_lengths[rank] != T_r:
        raise ValueError(f"{_OP_NAME}: slice_lengths={slice_lengths} does not match world "
                         f"size {world} and this rank's T={T_r}")
    bounds = [0]
    for n in slice_lengths:
        bounds.append(bounds[-1] + n)
    cu_list, cu_dtype = None, torch.int32
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"{_OP_NAME}: with cu_seqlens, B must be 1; got B={B}")
        if isinstance(cu_seqlens, torch.Tensor):
            cu_dtype = cu_seqlens.dtype
            cu_list = [int(x) for x in cu_seqlens.tolist()]
        else:
            cu_list = [int(x) for x in cu_seqlens]
    n_seqs = len(cu_list) - 1 if cu_list is not None else B
    if initial_state is not None and tuple(initial_state.shape) != (n_seqs, Hv, Dk, Dv):
        raise ValueError(f"{_OP_NAME}: initial_state has shape {tuple(initial_state.shape)}; "
                         f"expected the global (N, Hv, Dk, Dv) = {(n_seqs, Hv, Dk, Dv)}")
    plan = _make_plan(rank, world, bounds, B, cu_list, initial_state is not None)
    if map_pass == "auto":
        map_pass = "concat" if Dv + Dk <= 256 else "split"
    cfg = _Config(plan=plan, op=op, scale=float(scale) if scale is not None else Dk ** -0.5,
                  group=group, nccl=nccl, map_pass=map_pass, rerun=rerun,
                  l2norm=use_qk_l2norm_in_kernel, output_final_state=output_final_state,
                  cu_dtype=cu_dtype, mask=mask, op_kwargs=dict(op_kwargs))
    o, fs = _ContextParallelGDR.apply(q, k, v, g, beta, initial_state, cfg)
    return o, (fs if output_final_state else None)
