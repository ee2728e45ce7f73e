"""The algebra of the CUDA chunked backward (src/cuda/chunked/backward_kernels.cuh), step by step
as its kernels decompose it, emulated in float64 numpy on the CPU against torch autograd of the
per-token recurrence (docs/operator.md §2). It checks the decomposition only, not the CUDA
indexing (the GPU tests, tests/cuda/test_chunked_backward.cpp, do that): change it with the kernels
when their algebra changes. g = -30 is included (dg's cancellation-free form). Chunks of C = 64
rows; a short last chunk is padded with identity rows (g = 0, beta = 0, zero q, k, v, dO), as the
kernels do.
"""
import numpy as np
import pytest
import torch

C = 64


def recurrence(q, k, v, g, beta, h0, scale, per_key):
    """docs/operator.md §2, one token at a time (torch, for autograd)."""
    S = h0.clone()
    outs = []
    for t in range(q.shape[0]):
        a = torch.exp(g[t])
        Sp = a[:, None] * S if per_key else a * S
        u = beta[t] * (v[t] - Sp.T @ k[t])
        S = Sp + torch.outer(k[t], u)
        outs.append(scale * S.T @ q[t])
    return torch.stack(outs), S


def pad(x, n):
    out = np.zeros((C,) + x.shape[1:])
    out[:n] = x
    return out


def prep(q, k, v, g, beta, dO, scale, per_key):
    """chunk_prep_kernel's outputs per chunk (Tinv, KK, G, W, U, Qs, Kd, P, gn)."""
    L, Dk = q.shape
    wg = Dk if per_key else 1
    lower = np.tril(np.ones((C, C)))
    chunks = []
    for t0 in range(0, L, C):
        n = min(C, L - t0)
        Q, K, V = pad(q[t0:t0 + n], n), pad(k[t0:t0 + n], n), pad(v[t0:t0 + n], n)
        gg, b, do = pad(g[t0:t0 + n].reshape(n, wg), n), pad(beta[t0:t0 + n], n), pad(dO[t0:t0 + n], n)
        G = np.cumsum(gg, axis=0)  # [C, wg]
        with np.errstate(over="ignore", invalid="ignore"):
            Gam = np.where(lower[:, :, None] > 0, np.exp(G[:, None, :] - G[None, :, :]), 0.0)
        if per_key:
            KK = np.einsum("ri,ji,rji->rj", K, K, Gam)
            QK = np.einsum("ri,ji,rji->rj", Q, K, Gam)
        else:
            KK, QK = (K @ K.T) * Gam[:, :, 0], (Q @ K.T) * Gam[:, :, 0]
        Tinv = np.linalg.inv(np.eye(C) + np.tril(b[:, None] * KK, -1))
        Gw = G if per_key else np.repeat(G, Dk, 1)
        e, d = np.exp(Gw), np.exp(Gw[-1] - Gw)
        chunks.append(dict(
            n=n, Q=Q, K=K, V=V, G=G, b=b, do=do, Tinv=Tinv, KK=np.tril(KK, -1),
            P=scale * np.tril(QK), W=Tinv @ (b[:, None] * e * K), U=Tinv @ (b[:, None] * V),
            Qs=scale * e * Q, Kd=d * K, gn=np.exp(Gw[-1]), e=e, d=d))
    return chunks


def pairwise(c, dMq, dMk, i, gi, dqh, dkh):
    """The pairwise terms of P and KK for key channel i (added to dqh, dkh) and
    dgd_t = sum_{r >= t} sum_{j < t} t[r, j], per pair (the scalar gate's sums; the per-key
    kernel's block form, pairwise_blocks, is checked against it below)."""
    Q, K, G, n = c["Q"], c["K"], c["G"], c["n"]
    dyk, cs, dgd = np.zeros(C), np.zeros(C), np.zeros(C)
    for r in range(n - 1, -1, -1):
        dxq = dxk = 0.0
        for j in range(r + 1):
            E = np.exp(G[r, gi] - G[j, gi])
            z = E * (dMq[r, j] * Q[r, i] + dMk[r, j] * K[r, i])
            dxq += dMq[r, j] * E * K[j, i]
            dxk += dMk[r, j] * E * K[j, i]
            dyk[j] += z
            if j < r:
                cs[j] += z * K[j, i]
        dgd[r] += cs[:r].sum()
        dqh[r, i] += dxq
        dkh[r, i] += dxk
    dkh[:n, i] += dyk[:n]
    return dgd


B16 = 16  # the per-key kernels' block size: rows and columns of a chunk in 16 x 16 blocks


def pairwise_blocks(c, dMq, dMk, dqh, dkh):
    """bwd_key_kernel's phase 2 under the per-key gate, all channels at once, by 16 x 16 blocks
    (R, J) of (r, j) as the kernel forms them: off the diagonal through the reference row
    p = 16 R (e^{G_r - G_j} = e^{G_r - G_p} e^{G_p - G_j}) as matrix products (step A: each block
    row's dxq, dxk and the blocks' sums, each block column's dyk, and dg's rectangle pieces (c),
    (b)), the diagonal blocks per pair (step B: (a)), the whole-block sums (d). Returns dgd."""
    Q, K, G, n = c["Q"], c["K"], c["G"], c["n"]
    Dk = Q.shape[1]
    bc = np.zeros((C, Dk))
    tot = {}
    for B in range(4):
        rows = slice(B16 * B, B16 * B + B16)
        ox, ok, oy = (np.zeros((B16, Dk)) for _ in range(3))
        for J in range(B):  # the row block: (R, J) = (B, J)
            p, cols = B16 * B, slice(B16 * J, B16 * J + B16)
            right = K[cols] * np.exp(G[p] - G[cols])
            f = np.exp(G[rows] - G[p])
            sx, sk = f * (dMq[rows, cols] @ right), f * (dMk[rows, cols] @ right)
            ox, ok = ox + sx, ok + sk
            tot[(B, J)] = (Q[rows] * sx + K[rows] * sk).sum(0)
        for R in range(B + 1, 4):  # the column block: (R, J) = (R, B)
            p, rr = B16 * R, slice(B16 * R, B16 * R + B16)
            f = np.exp(G[rr] - G[p])
            oy += np.exp(G[p] - G[rows]) * (dMq[rr, rows].T @ (Q[rr] * f) + dMk[rr, rows].T @ (K[rr] * f))
        rt, ct = Q[rows] * ox + K[rows] * ok, K[rows] * oy
        bc[rows] = np.cumsum(rt[::-1], 0)[::-1] + np.cumsum(ct, 0) - ct  # (c) + (b)
        dqh[rows] += ox
        dkh[rows] += ok + oy
    for B in range(4):  # (a), and the diagonal blocks' own pairwise terms
        for i in range(Dk):
            dyd, cs = np.zeros(B16), np.zeros(B16)
            for rl in range(B16 - 1, -1, -1):
                r = B16 * B + rl
                if r >= n:
                    continue
                dxq = dxk = 0.0
                for jl in range(rl + 1):
                    j = B16 * B + jl
                    E = np.exp(G[r, i] - G[j, i])
                    z = E * (dMq[r, j] * Q[r, i] + dMk[r, j] * K[r, i])
                    dxq += dMq[r, j] * E * K[j, i]
                    dxk += dMk[r, j] * E * K[j, i]
                    dyd[jl] += z
                    if jl < rl:
                        cs[jl] += z * K[j, i]
                bc[r, i] += cs[:rl].sum()
                dqh[r, i] += dxq
                dkh[r, i] += dxk
            for m in range(B16):
                if B16 * B + m < n:
                    dkh[B16 * B + m, i] += dyd[m]
    bc[B16:2 * B16] += tot[(2, 0)] + tot[(3, 0)]  # (d)
    bc[2 * B16:3 * B16] += tot[(3, 0)] + tot[(3, 1)]
    return bc


def emulate(q, k, v, g, beta, h0, dO, dht, scale, per_key):
    L, Dk = q.shape
    chunks = prep(q, k, v, g, beta, dO, scale, per_key)
    # state_pass_kernel: the states entering each chunk, Vnew.
    S, states = h0.copy(), []
    for c in chunks:
        states.append(S.copy())
        c["Vn"] = c["U"] - c["W"] @ S
        S = c["gn"][:, None] * S + c["Kd"].T @ c["Vn"]
    # bwd_state_kernel: dS leaving each chunk, dVnew, dh0.
    dS, dS_out = dht.copy(), [None] * len(chunks)
    for ci in range(len(chunks) - 1, -1, -1):
        c = chunks[ci]
        dS_out[ci] = dS.copy()
        c["dVn"] = c["P"].T @ c["do"] + c["Kd"] @ dS
        dS = c["gn"][:, None] * dS + c["Qs"].T @ c["do"] - c["W"].T @ c["dVn"]
    wg = Dk if per_key else 1
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dg, db = np.zeros((L, wg)), np.zeros(L)
    for ci, c in enumerate(chunks):
        n, t0, S, dSl = c["n"], ci * C, states[ci], dS_out[ci]
        Q, K, b, e, d = c["Q"], c["K"], c["b"], c["e"], c["d"]
        # bwd_dvb_kernel
        dVb = c["Tinv"].T @ c["dVn"]
        dMq = scale * np.tril(c["do"] @ c["Vn"].T)
        dA = -np.tril(dVb @ c["Vn"].T, -1)
        dbp = (dVb * c["V"]).sum(1) + (dA * c["KK"]).sum(1)
        # bwd_key_kernel, phase 1
        X1, dKb, Y = scale * c["do"] @ S.T, -dVb @ S.T, c["Vn"] @ dSl.T
        dqh, dkh = e * X1, b[:, None] * e * dKb + d * Y
        dgc, yk, dbk = e * (X1 * Q + b[:, None] * dKb * K), d * Y * K, e * dKb * K
        # phase 2: per channel
        dgf = np.zeros((C, Dk))
        if per_key:
            dgd_all = pairwise_blocks(c, dMq, b[:, None] * dA, dqh, dkh)
        for i in range(Dk):
            gi = i if per_key else 0
            if per_key:
                dgd = dgd_all[:, i].copy()
            else:
                dgd = pairwise(c, dMq, b[:, None] * dA, i, gi, dqh, dkh)
            dgd[:n] += np.concatenate([[0.0], np.cumsum(yk[:n - 1, i])])
            acc = np.exp(c["G"][-1, gi]) * (S[i] * dSl[i]).sum()
            for r in range(n - 1, -1, -1):
                acc += dgc[r, i]
                dgf[r, i] = acc + dgd[r]
        # phase 3 and bwd_keygrad_kernel
        dq[t0:t0 + n], dk[t0:t0 + n] = dqh[:n], dkh[:n]
        dv[t0:t0 + n] = b[:n, None] * dVb[:n]
        db[t0:t0 + n] = dbp[:n] + dbk[:n].sum(1)
        dg[t0:t0 + n] = dgf[:n] if per_key else dgf[:n].sum(1, keepdims=True)
    return dq, dk, dv, dg.reshape(g.shape), db, dS


@pytest.mark.parametrize("per_key", [False, True])
@pytest.mark.parametrize("L,decay", [(70, 0.2), (130, 4.0), (65, 30.0)])
def test_kernel_decomposition_matches_autograd(per_key, L, decay):
    rng = np.random.default_rng(L + 7 * per_key)
    Dk, Dv = 8, 6
    q = rng.standard_normal((L, Dk))
    k = rng.standard_normal((L, Dk))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((L, Dv))
    g = -decay * rng.random((L, Dk) if per_key else (L,))
    if decay == 30.0:
        g[:] = -30.0
    beta = rng.random(L)
    h0 = rng.standard_normal((Dk, Dv))
    dO = rng.standard_normal((L, Dv))
    dht = rng.standard_normal((Dk, Dv))
    scale = Dk ** -0.5
    leaves = [torch.tensor(x, dtype=torch.float64, requires_grad=True)
              for x in (q, k, v, g, beta, h0)]
    o, S = recurrence(*leaves, scale, per_key)
    ((o * torch.tensor(dO)).sum() + (S * torch.tensor(dht)).sum()).backward()
    got = emulate(q, k, v, g, beta, h0, dO, dht, scale, per_key)
    for name, x, t in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, leaves):
        ref = t.grad.numpy()
        assert np.linalg.norm(x - ref) / np.linalg.norm(ref) < 1e-12, name


@pytest.mark.parametrize("decay", [0.5, 30.0])
def test_per_key_block_split_matches_pairs(decay):
    """The per-key kernels' 16 x 16 block split against the per-pair sums on one chunk: the
    prep's A and P (chunk_prep_kernel) and the backward's phase 2 (pairwise_blocks), with a
    short chunk (rows past n zero, as the kernels pad them)."""
    rng = np.random.default_rng(int(decay))
    Dk, n = 8, 57
    Q, K = pad(rng.standard_normal((n, Dk)), n), pad(rng.standard_normal((n, Dk)), n)
    G = np.cumsum(pad(-decay * rng.random((n, Dk)), n), 0)
    c = {"Q": Q, "K": K, "G": G, "n": n}
    # prep: A[r, j] = sum_i K_r K_j Gam (j < r), P[r, j] = sum_i Q_r K_j Gam (j <= r)
    gam = np.exp(np.minimum(G[:, None, :] - G[None, :, :], 0.0))
    A = np.tril(np.einsum("ri,ji,rji->rj", K, K, gam), -1)
    P = np.tril(np.einsum("ri,ji,rji->rj", Q, K, gam))
    A2, P2 = np.zeros((C, C)), np.zeros((C, C))
    for R in range(4):
        rows = slice(B16 * R, B16 * R + B16)
        for J in range(R):
            p, cols = B16 * R, slice(B16 * J, B16 * J + B16)
            right, f = K[cols] * np.exp(G[p] - G[cols]), np.exp(G[rows] - G[p])
            A2[rows, cols], P2[rows, cols] = (K[rows] * f) @ right.T, (Q[rows] * f) @ right.T
        blk = np.einsum("ri,ji,rji->rj", Q[rows], K[rows], gam[rows, rows])
        P2[rows, rows] = np.tril(blk)
        A2[rows, rows] = np.tril(np.einsum("ri,ji,rji->rj", K[rows], K[rows], gam[rows, rows]), -1)
    assert np.abs(A - A2).max() <= 1e-12 * np.abs(A).max()
    assert np.abs(P - P2).max() <= 1e-12 * np.abs(P).max()
    # backward phase 2
    dMq = np.tril(pad(pad(rng.standard_normal((n, n)), n).T, n).T)
    dMk = np.tril(pad(pad(rng.standard_normal((n, n)), n).T, n).T, -1)
    ref = [np.zeros((C, Dk)) for _ in range(2)]
    dgd = np.stack([pairwise(c, dMq, dMk, i, i, *ref) for i in range(Dk)], 1)
    got = [np.zeros((C, Dk)) for _ in range(2)]
    dgd2 = pairwise_blocks(c, dMq, dMk, *got)
    for x, y in zip(ref + [dgd[:n]], got + [dgd2[:n]]):
        assert np.abs(x - y).max() <= 1e-12 * np.abs(x).max()
