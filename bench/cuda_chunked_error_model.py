#!/usr/bin/env python3
"""Float64 model of the CUDA chunked forward's arithmetic (src/cuda/chunked/, scalar gate), no GPU.

1. The algebra, in float64 (no rounding): prep (W, U, P, the row factors fq, fk), the state pass
   (Vnew = U - W S; S <- gn S + k^T (diag(fk) Vnew)), the output O = diag(fq) (q S) + P Vnew and
   the exact segment split (M from the identity with U = 0, R from a zero start,
   S_{j+1} = M_j S_j + R_j, each segment again from its true start) against the token recurrence:
   differences at the float64 rounding level.
2. The 16-bit scratch path's rounding: W, U, P, the output kernel's Vnew and chunk states rounded
   to bf16 (nearest even), o rounded to bf16, everything else exact, on bf16 inputs; relative
   Frobenius errors of o and of the final state against float64 on the same inputs (the tests'
   metric, bar 5e-3). The hi + lo split products (~2^-17) and fp32 accumulation are not modelled.
   --exact NAME... leaves those intermediates unrounded (W U P S V O) to see what each costs;
   --stored models the path without row factors (per-key gate's, masks, f16): Qs = scale e^G q
   and Kd = e^{G_n - G} k stored in bf16 too.

  python3 bench/cuda_chunked_error_model.py [--T 2065] [--D 128] [--decay 0.2] [--beta-one]
                                            [--stored] [--exact W U P S V O]
"""
import argparse

import numpy as np


def bf16(x):
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return b.view(np.float32).astype(np.float64)


def inputs(T, D, decay, beta_one, seed):
    rng = np.random.default_rng(seed)
    q = bf16(rng.uniform(-1, 1, (T, D)))
    k = rng.standard_normal((T, D))
    k = bf16(k / np.linalg.norm(k, axis=1, keepdims=True))
    v = bf16(rng.uniform(-1, 1, (T, D)))
    g = -decay * rng.random(T)
    beta = np.ones(T) if beta_one else rng.random(T)
    h0 = rng.uniform(-1, 1, (D, D))
    return q, k, v, g, beta, h0


def recurrence(q, k, v, g, beta, h0, scale):
    S = h0.copy()
    o = np.zeros_like(v)
    for t in range(len(g)):
        S = np.exp(g[t]) * S
        S = S + beta[t] * np.outer(k[t], v[t] - S.T @ k[t])
        o[t] = scale * S.T @ q[t]
    return o, S


def prep(q, k, v, g, beta, scale, c, C, rw, ru, rp):
    T = len(g)
    r0, n = c * C, min(C, T - c * C)
    pad = lambda x: np.concatenate([x[r0:r0 + n], np.zeros((C - n,) + x.shape[1:])])
    K, Q, V, B, G = pad(k), pad(q), pad(v), pad(beta), np.cumsum(pad(g))
    Gam = np.exp(G[:, None] - G[None, :]) * np.tril(np.ones((C, C)))
    A = np.tril(B[:, None] * Gam * (K @ K.T), -1)
    Tinv = np.linalg.inv(np.eye(C) + A)
    valid = np.arange(C) < n
    return dict(W=rw(Tinv @ (B[:, None] * np.exp(G)[:, None] * K)), U=ru(Tinv @ (B[:, None] * V)),
                P=rp(scale * Gam * (Q @ K.T)), fq=np.where(valid, scale * np.exp(G), 0),
                fk=np.where(valid, np.exp(G[-1] - G), 0), gn=np.exp(G[-1]), K=K, Q=Q, n=n,
                Tb=Tinv * B[None, :], V=V, eG=np.where(valid, np.exp(G), 0))


def walk(chunks, S, cs, u_zero=False):
    states, vnews = [], []
    for c in cs:
        p = chunks[c]
        states.append(S.copy())
        Vn = (0 if u_zero else p["U"]) - p["W"] @ S
        vnews.append(Vn)
        S = p["gn"] * S + p["K"].T @ (p["fk"][:, None] * Vn)
    return S, states, vnews


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2065)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--decay", type=float, default=0.2, help="g = -decay U(0,1)")
    ap.add_argument("--beta-one", action="store_true")
    ap.add_argument("--segment", type=int, default=3, help="chunks per segment (algebra check)")
    ap.add_argument("--exact", nargs="*", default=[], choices=list("WUPSVO"))
    ap.add_argument("--stored", action="store_true", help="Qs, Kd stored in bf16")
    ap.add_argument("--single", action="store_true",
                    help="the state pass's products on bf16 S and diag(fk) Vnew (one product each, "
                    "as FLA's bf16 h and v_new), not hi + lo")
    ap.add_argument("--fused", action="store_true",
                    help="the fused design's roundings (docs/cuda-chunked.md §A fused forward): "
                    "Vnew = bf16(Tinv diag(beta)) bf16(V - diag(e^G) K bf16(S)), o from bf16(S) "
                    "and bf16(Vnew), the update from bf16(diag(fk) Vnew); S fp32")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    C, scale = 64, a.D ** -0.5
    q, k, v, g, beta, h0 = inputs(a.T, a.D, a.decay, a.beta_one, a.seed)
    o_ref, S_ref = recurrence(q, k, v, g, beta, h0, scale)
    nc = (a.T + C - 1) // C
    ident = lambda x: x

    # 1. the algebra, unrounded
    chunks = [prep(q, k, v, g, beta, scale, c, C, ident, ident, ident) for c in range(nc)]
    S_end, states, vnews = walk(chunks, h0, range(nc))
    o = np.concatenate([(p["fq"][:, None] * (p["Q"] @ s) + p["P"] @ vn)[:p["n"]]
                        for p, s, vn in zip(chunks, states, vnews)])
    segs = [list(range(j, min(j + a.segment, nc))) for j in range(0, nc, a.segment)]
    starts = [h0]
    for sg in segs[:-1]:
        R = walk(chunks, np.zeros_like(h0), sg)[0]
        M = walk(chunks, np.eye(a.D), sg, u_zero=True)[0]
        starts.append(M @ starts[-1] + R)
    states2 = sum((walk(chunks, s0, sg)[1] for sg, s0 in zip(segs, starts)), [])
    print(f"algebra: o {rel(o, o_ref):.1e}, final state {rel(S_end, S_ref):.1e}, segment split "
          f"chunk states {max(rel(x, y) for x, y in zip(states2, states)):.1e}")

    # 2. bf16 intermediates
    rnd = {n: (ident if n in a.exact else bf16) for n in "WUPSVO"}
    chunks = [prep(q, k, v, g, beta, scale, c, C, rnd["W"], rnd["U"], rnd["P"]) for c in range(nc)]
    S = h0.copy()
    o = np.zeros_like(v)
    one = bf16 if a.single else ident  # the state pass's product operands
    for c, p in enumerate(chunks):
        Vn = p["U"] - p["W"] @ one(S)
        if a.stored:
            Qs, Kd = bf16(p["fq"][:, None] * p["Q"]), bf16(p["fk"][:, None] * p["K"])
            oc = Qs @ rnd["S"](S) + p["P"] @ rnd["V"](Vn)
            S = p["gn"] * S + Kd.T @ one(Vn)
        else:
            oc = p["fq"][:, None] * (p["Q"] @ rnd["S"](S)) + p["P"] @ rnd["V"](Vn)
            S = p["gn"] * S + p["K"].T @ one(p["fk"][:, None] * Vn)
        o[c * C:c * C + p["n"]] = rnd["O"](oc[:p["n"]])
    if a.fused:  # the fused design: no W, U; T~ = Tinv diag(beta) and P in bf16
        S = h0.copy()
        o = np.zeros_like(v)
        for c, p in enumerate(chunks):
            Sb = bf16(S)
            Y = bf16(p["V"] - p["eG"][:, None] * (p["K"] @ Sb))
            Vn = bf16(p["Tb"]) @ Y
            oc = p["fq"][:, None] * (p["Q"] @ Sb) + p["P"] @ bf16(Vn)
            S = p["gn"] * S + p["K"].T @ bf16(p["fk"][:, None] * Vn)
            o[c * C:c * C + p["n"]] = bf16(oc[:p["n"]])
        print(f"fused design, T={a.T} D={a.D} g=-{a.decay}U(0,1){' beta=1' if a.beta_one else ''}: "
              f"o {rel(o, o_ref):.2e}, final state {rel(S, S_ref):.2e} (bar 5e-3)")
        return
    print(f"bf16 scratch{' (stored Qs, Kd)' if a.stored else ''} "
          f"(exact: {''.join(a.exact) or 'none'}), T={a.T} D={a.D} "
          f"g=-{a.decay}U(0,1){' beta=1' if a.beta_one else ''}"
          f"{' single products' if a.single else ''}: o {rel(o, o_ref):.2e}, "
          f"final state {rel(S, S_ref):.2e} (bar 5e-3)")


if __name__ == "__main__":
    main()
