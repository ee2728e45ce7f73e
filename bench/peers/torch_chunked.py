"""Peer: PyTorch autograd through a chunked implementation of docs/operator.md §3 (scalar gate).

What a user without gdr would write on a CPU: the chunkwise form with PyTorch ops, chunk C = 64,
the unit lower-triangular inverse by torch.linalg.solve_triangular, a Python loop over chunks
carrying the state, and the backward left to autograd (which keeps every chunk's intermediates).
fp32, torch.set_num_threads(threads).

Usage: python bench/peers/torch_chunked.py --T 1024 [--check] [--json out.json]
"""

import math

import torch

from common import emit, measure, parser, rss_bytes


def chunk_gated_delta(q, k, v, g, beta, scale, C=64):
    """o [B, T, Hv, Dv] and the final state [B, Hv, Dk, Dv] (k-first), docs/operator.md §3."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if Hv // Hk > 1:
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, T, D]
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # [B, H, T]
    pad = (-T) % C  # padding tokens: g = 0, beta = 0, q = k = 0 is the identity step
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (torch.nn.functional.pad(x, (0, pad)) for x in (g, beta))
    n = (T + pad) // C
    q, k = q.reshape(B, Hv, n, C, Dk), k.reshape(B, Hv, n, C, Dk)
    v = v.reshape(B, Hv, n, C, Dv)
    G = g.reshape(B, Hv, n, C).cumsum(-1)
    beta = beta.reshape(B, Hv, n, C)
    ones = torch.ones(C, C, dtype=torch.bool)
    lower, strict = torch.tril(ones), torch.tril(ones, -1)
    gam = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, -math.inf).exp()
    A = (beta[..., :, None] * gam * (k @ k.transpose(-1, -2))).masked_fill(~strict, 0)
    eye = torch.eye(C, dtype=q.dtype).expand_as(A)
    eG = G.exp()
    Tinv = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
    W = Tinv @ ((beta * eG)[..., None] * k)
    U = Tinv @ (beta[..., None] * v)
    P = (q @ k.transpose(-1, -2)) * gam
    S = q.new_zeros(B, Hv, Dk, Dv)
    outs = []
    for c in range(n):
        vnew = U[:, :, c] - W[:, :, c] @ S
        outs.append(scale * ((eG[:, :, c, :, None] * q[:, :, c]) @ S + P[:, :, c] @ vnew))
        Gn = G[:, :, c, -1]
        d = (Gn[..., None] - G[:, :, c]).exp()
        S = Gn.exp()[..., None, None] * S + (d[..., None] * k[:, :, c]).transpose(-1, -2) @ vnew
    o = torch.stack(outs, dim=2).reshape(B, Hv, n * C, Dv)[:, :, :T].transpose(1, 2)
    return o, S


def sequential_reference(q, k, v, g, beta, scale):
    """docs/operator.md §2, per token (the check)."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    q = q.repeat_interleave(Hv // Hk, dim=2)
    k = k.repeat_interleave(Hv // Hk, dim=2)
    S = q.new_zeros(B, Hv, Dk, Dv)
    outs = []
    for t in range(T):
        S = g[:, t].exp()[..., None, None] * S
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhij,bhi->bhj", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(scale * torch.einsum("bhij,bhi->bhj", S, q[:, t]))
    return torch.stack(outs, dim=1), S


def inputs(B, T, Hk, Hv, Dk, Dv, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hk, Dk, generator=gen, dtype=dtype)
    k = torch.randn(B, T, Hk, Dk, generator=gen, dtype=dtype)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, T, Hv, Dv, generator=gen, dtype=dtype)
    g = -0.2 * torch.rand(B, T, Hv, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, Hv, generator=gen, dtype=dtype)
    dout = torch.randn(B, T, Hv, Dv, generator=gen, dtype=dtype)
    return q, k, v, g, beta, dout


def check(seed):
    xs = inputs(2, 150, 2, 4, 16, 8, torch.float64, seed)
    scale = 16 ** -0.5
    o, S = chunk_gated_delta(*xs[:5], scale)
    o_ref, S_ref = sequential_reference(*xs[:5], scale)
    err = max(((o - o_ref).norm() / o_ref.norm()).item(), ((S - S_ref).norm() / S_ref.norm()).item())
    if not err < 1e-10:
        raise SystemExit(f"torch_chunked: chunked form disagrees with the per-token loop: {err:.2e}")
    return err


def main():
    args = parser(__doc__).parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    check_err = check(args.seed) if args.check else None
    q, k, v, g, beta, dout = inputs(args.B, args.T, args.Hk, args.Hv, args.dk, args.dv,
                                    torch.float32, args.seed)
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta)]
    scale = args.dk ** -0.5
    baseline = rss_bytes()

    def step():
        for x in leaves:
            x.grad = None
        o, _ = chunk_gated_delta(*leaves, scale)
        (o * dout).sum().backward()

    seconds, samples = measure(step, args.repeats)
    extra = {"check_rel_error_f64": check_err, "threads_used": torch.get_num_threads()}
    emit(args, "torch_chunked_autograd", {"torch": torch.__version__}, seconds, samples, baseline,
         extra)


if __name__ == "__main__":
    main()
