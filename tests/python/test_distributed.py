"""Context-parallel gated delta rule (gdr.distributed) against one process over the whole batch.

Each test spawns W processes (gloo, CPU, free localhost port, bounded time) that run
chunk_gated_delta_rule_cp on their slices; this process runs the float64 sequential reference
over the whole batch and compares o, the final state and every gradient (q, k, v, g, beta, h0)
by relative Frobenius error (docs/operator.md §7).

Operators under test:
  gdr   : gdr.chunk_gated_delta_rule on fp32 inputs      (bar: o/state 1e-5, grads 1e-4)
  gdr_chunkwise : the same with path="chunkwise", chunk_size=16 (several chunks per slice)
  ref32 : the reference below on fp32 inputs             (same bar)
  ref64 : the reference below on float64 inputs          (bar 1e-10: the CP algebra is exact)

Run one world by hand: python tests/python/test_distributed.py --world 4 --op ref64
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

HERE = pathlib.Path(__file__).resolve()
REPO = HERE.parents[2]
CP_PATH = pathlib.Path(os.environ.get(
    "GDR_CP_PATH", REPO / "python" / "gdr" / "distributed.py"))  # GDR_CP_PATH: a copy to test
TIMEOUT_S = 150
# The workers' device: the CPU by default; "cuda" puts every rank on GPU 0 (gloo with CUDA
# tensors: checks device handling where one GPU is all there is).
DEVICE = os.environ.get("GDR_CP_TEST_DEVICE", "cpu")


def load_cp_module():
    spec = importlib.util.spec_from_file_location("gdr_distributed_under_test", CP_PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def gdr_import_error():
    try:
        import gdr  # noqa: F401

        gdr.chunk_gated_delta_rule  # noqa: B018
        return None
    except Exception as e:  # ImportError, AttributeError, a missing shared library
        return f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------------------
# Float64 sequential reference (docs/operator.md §2), autograd through plain torch ops.


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _ref_dense(q, k, v, g, beta, scale, h0, l2norm, mask=None):
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    sd = torch.float64 if v.dtype == torch.float64 else torch.float32
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    rep = Hv // Hk
    q = q.to(sd).repeat_interleave(rep, dim=2)
    k = k.to(sd).repeat_interleave(rep, dim=2)
    v, g, beta = v.to(sd), g.to(sd), beta.to(sd)
    s = h0.to(sd) if h0 is not None else torch.zeros(B, Hv, Dk, Dv, dtype=sd, device=v.device)
    outs = []
    for t in range(T):
        a = torch.exp(g[:, t])
        s_prev = s
        s = s * (a[..., None, None] if g.dim() == 3 else a[..., None])
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", s, k[:, t]))
        s = s + k[:, t, :, :, None] * u[:, :, None, :]
        o_t = scale * torch.einsum("bhkv,bhk->bhv", s, q[:, t])
        if mask is not None:  # a masked token keeps the state and writes 0
            keep = mask[:, t].to(sd)
            s = keep[:, None, None, None] * s + (1 - keep)[:, None, None, None] * s_prev
            o_t = o_t * keep[:, None, None]
        outs.append(o_t)
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, Hv, Dv)
    return o.to(v.dtype), s


def ref_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                         output_final_state=False, use_qk_l2norm_in_kernel=False,
                         cu_seqlens=None, mask=None, **unused):
    """FLA-signature reference: q, k [B,T,Hk,Dk], v [B,T,Hv,Dv], g [B,T,Hv(,Dk)], beta [B,T,Hv]."""
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens is None:
        o, s = _ref_dense(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, mask)
        return o, (s if output_final_state else None)
    cu = [int(x) for x in cu_seqlens.tolist()]
    outs, fins = [], []
    for i in range(len(cu) - 1):
        sl = slice(cu[i], cu[i + 1])
        h = initial_state[i:i + 1] if initial_state is not None else None
        o, s = _ref_dense(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], scale, h,
                          use_qk_l2norm_in_kernel, mask[:, sl] if mask is not None else None)
        outs.append(o)
        fins.append(s)
    return torch.cat(outs, 1), (torch.cat(fins, 0) if output_final_state else None)


# ---------------------------------------------------------------------------------------------
# Cases: global inputs from a seed (same in every process), how the tokens are cut.


def cases(world: int):
    """Each case: name, gate, B, cu_seqlens, slice lengths, Hk, Hv, Dk, Dv, h0, options."""
    out = []
    # Dense batch B = 2, scalar gate, GQA 2 -> 4, Dk != Dv, h0, mask, balanced slices.
    T = 13 * world + 3
    out.append(dict(name="dense_scalar_gqa", gate="scalar", B=2, cu=None,
                    lengths=None, T=T, Hk=2, Hv=4, Dk=8, Dv=6, h0=True, strength=0.2,
                    extreme=False, l2=False, map_pass="concat", rerun=False, mask=True))
    # Varlen, per-key gate: one sequence spans 3+ ranks (middle-only ranks), a zero-length
    # sequence, a sequence ending exactly on a slice end, h0 given, strong decay.
    s = 24
    T = s * world
    cu = [0, 5, 5, s + 6, T - 4, T]
    if world >= 4:
        cu = [0, 5, 5, s, s + 3, 3 * s + 7, T - 1, T]
    out.append(dict(name="varlen_perkey", gate="perkey", B=1, cu=cu, lengths=None, T=T,
                    Hk=1, Hv=2, Dk=6, Dv=8, h0=True, strength=4.0, extreme=True, l2=False,
                    map_pass="concat", rerun=False, mask=False))
    # Varlen, scalar gate, uneven slices with an empty rank, no h0, q/k L2 norm in the kernel,
    # two-call map pass and output recomputed from the incoming state.
    lengths = [30, 0, 40, 26][:world] if world >= 3 else [50, 21]
    T = sum(lengths)
    cu = [0, 7, T - 10, T]
    out.append(dict(name="varlen_scalar_uneven_rerun", gate="scalar", B=1, cu=cu,
                    lengths=lengths, T=T, Hk=2, Hv=4, Dk=5, Dv=7, h0=False, strength=1.0,
                    extreme=False, l2=True, map_pass="split", rerun=True, mask=False))
    # Two stacked calls (layer 2 reads layer 1's output as v): collectives of both layers in
    # forward and backward, gradients through both.
    T = 11 * world + 5
    out.append(dict(name="stacked_varlen", gate="scalar", B=1, cu=[0, 3, T - 2, T],
                    lengths=None, T=T, Hk=1, Hv=2, Dk=4, Dv=4, h0=True, strength=0.5,
                    extreme=False, l2=False, map_pass="auto", rerun=False, mask=False,
                    stacked=True))
    return out


def call_case(fn, case, x, h0, cu, extra):
    """One call, or two stacked calls (v of layer 2 = o of layer 1), of fn (CP or not)."""
    args = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=case["l2"],
                cu_seqlens=cu, **extra)
    o, fs = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], **args)
    if case.get("stacked"):
        o, fs = fn(x["q"], x["k"], o, x["g"], x["beta"], **args)
    return o, fs


def make_inputs(case, seed: int):
    gen = torch.Generator().manual_seed(seed)
    B, T, Hk, Hv, Dk, Dv = case["B"], case["T"], case["Hk"], case["Hv"], case["Dk"], case["Dv"]
    f64 = dict(dtype=torch.float64, generator=gen)
    q = torch.randn(B, T, Hk, Dk, **f64)
    k = torch.randn(B, T, Hk, Dk, **f64)
    if not case["l2"]:
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, T, Hv, Dv, **f64)
    gshape = (B, T, Hv) if case["gate"] == "scalar" else (B, T, Hv, Dk)
    g = -case["strength"] * torch.rand(*gshape, **f64)
    if case["extreme"]:
        g.view(B * T, -1)[3::11] = -30.0
    beta = torch.rand(B, T, Hv, **f64)
    n = B if case["cu"] is None else len(case["cu"]) - 1
    h0 = torch.randn(n, Hv, Dk, Dv, **f64) if case["h0"] else None
    do = torch.randn(B, T, Hv, Dv, **f64)
    dfs = torch.randn(n, Hv, Dk, Dv, **f64)
    mask = torch.rand(B, T, generator=gen) > 0.25 if case["mask"] else None
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, do=do, dfs=dfs, mask=mask)


def slice_bounds(case, world):
    if case["lengths"] is not None:
        b = [0]
        for n in case["lengths"]:
            b.append(b[-1] + n)
        return b
    base, extra = divmod(case["T"], world)
    b = [0]
    for r in range(world):
        b.append(b[-1] + base + (1 if r < extra else 0))
    return b


def fs_weights(world):
    """Rank r counts w_r of the final-state loss term; the weights sum to 1."""
    w = [float(r + 1) for r in range(world)]
    return [x / sum(w) for x in w]


GRAD_NAMES = ("q", "k", "v", "g", "beta", "h0")


# ---------------------------------------------------------------------------------------------
# Worker: one rank.


def run_cases(cp, op, dtype, rank, world, seed):
    dev = torch.device(DEVICE)
    results = {}
    for ci, case in enumerate(cases(world)):
        x = make_inputs(case, seed + ci)
        x = {n: (t.to(dev) if t is not None else None) for n, t in x.items()}
        bounds = slice_bounds(case, world)
        a, b = bounds[rank], bounds[rank + 1]
        leaf = {}
        for name in ("q", "k", "v", "g", "beta"):
            leaf[name] = x[name][:, a:b].to(dtype).clone().requires_grad_(True)
        h0 = x["h0"].to(torch.float32 if dtype != torch.float64 else dtype).requires_grad_(True) \
            if x["h0"] is not None else None
        cu = torch.tensor(case["cu"], dtype=torch.int32) if case["cu"] is not None else None
        o, fs = call_case(cp.chunk_gated_delta_rule_cp, case, leaf, h0, cu, dict(
            slice_lengths=case["lengths"], op=op, map_pass=case["map_pass"],
            rerun=case["rerun"], mask=x["mask"][:, a:b] if x["mask"] is not None else None))
        loss = (o.double() * x["do"][:, a:b]).sum() + \
            fs_weights(world)[rank] * (fs.double() * x["dfs"]).sum()
        loss.backward()
        res = {"o": o.detach().double().cpu(), "fs": fs.detach().double().cpu()}
        for name in ("q", "k", "v", "g", "beta"):
            res["d" + name] = leaf[name].grad.double().cpu()
        if h0 is not None:
            res["dh0"] = h0.grad.double().cpu()
        results[case["name"]] = res
    return results


def worker(rank, world, port, seed, op_names, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    if DEVICE.startswith("cuda"):
        torch.cuda.set_device(torch.device(DEVICE))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}",
                            timeout=__import__("datetime").timedelta(seconds=TIMEOUT_S))
    cp = load_cp_module()
    results = {}
    for op_name in op_names.split(","):
        if op_name.startswith("gdr"):
            import functools

            import gdr

            op, dtype = gdr.chunk_gated_delta_rule, torch.float32
            if op_name == "gdr_chunkwise":  # several chunks per slice
                op = functools.partial(op, path="chunkwise", chunk_size=16)
        else:
            op = ref_gated_delta_rule
            dtype = torch.float64 if op_name == "ref64" else torch.float32
        results[op_name] = run_cases(cp, op, dtype, rank, world, seed)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Driver: spawn, gather, compare.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(x).any():
        return float("nan")
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else num


def available_ops():
    return ["ref64", "ref32"] + (["gdr", "gdr_chunkwise"] if gdr_import_error() is None else [])


_RUNS = {}


def run_world(world: int, op_name: str):
    """One spawn per world size runs every available operator; later calls reuse it."""
    if world not in _RUNS:
        _RUNS[world] = _spawn(world, ",".join(available_ops()))
    seed, per_rank = _RUNS[world]
    return seed, [pr[op_name] for pr in per_rank]


def _spawn(world: int, op_name: str):
    seed = int.from_bytes(os.urandom(4), "little")
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs = []
        port = free_port()
        logs = [tempfile.TemporaryFile() for _ in range(world)]
        for r in range(world):
            cmd = [sys.executable, str(HERE), "--worker", "--rank", str(r), "--world", str(world),
                   "--port", str(port), "--seed", str(seed), "--op", op_name, "--out", d]
            procs.append(subprocess.Popen(cmd, env=env, stdout=logs[r], stderr=subprocess.STDOUT))
        deadline = time.time() + TIMEOUT_S
        failed = None
        while any(p.poll() is None for p in procs):
            bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if bad or time.time() > deadline:
                failed = bad[0] if bad else None
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                break
            time.sleep(0.05)
        for p in procs:
            p.wait()
        text = []
        for f in logs:
            f.seek(0)
            text.append(f.read().decode(errors="replace"))
            f.close()
        if failed is not None:
            raise AssertionError(f"rank {failed} failed (seed {seed}):\n{text[failed][-4000:]}")
        for r, p in enumerate(procs):
            assert p.returncode == 0, (f"world {world} op {op_name}: rank {r} exit {p.returncode}"
                                       f" (timeout {TIMEOUT_S}s):\n{text[r][-2000:]}")
        per_rank = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]
    return seed, per_rank


def reference_results(case, seed):
    x = make_inputs(case, seed)
    leaf = {n: x[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
    h0 = x["h0"].clone().requires_grad_(True) if x["h0"] is not None else None
    cu = torch.tensor(case["cu"], dtype=torch.int64) if case["cu"] is not None else None
    o, fs = call_case(ref_gated_delta_rule, case, leaf, h0, cu, dict(mask=x["mask"]))
    ((o * x["do"]).sum() + (fs * x["dfs"]).sum()).backward()
    ref = {"o": o.detach(), "fs": fs.detach()}
    for n in ("q", "k", "v", "g", "beta"):
        ref["d" + n] = leaf[n].grad
    if h0 is not None:
        ref["dh0"] = h0.grad
    return ref


def compare(world, op_name):
    seed, per_rank = run_world(world, op_name)
    tol_o, tol_g = (1e-10, 1e-10) if op_name == "ref64" else (1e-5, 1e-4)
    report, failures = [], []
    for ci, case in enumerate(cases(world)):
        ref = reference_results(case, seed + ci)
        got = {}
        for key in ("o", "dq", "dk", "dv", "dg", "dbeta"):
            got[key] = torch.cat([pr[case["name"]][key] for pr in per_rank], dim=1)
        for key in ("fs", "dh0"):
            if key in ref:
                got[key] = per_rank[0][case["name"]][key]
                for r in range(1, world):  # replicated on every rank
                    e = rel_err(per_rank[r][case["name"]][key], got[key])
                    if not e < 1e-12:
                        failures.append(f"{case['name']}: {key} differs between rank 0 and {r}")
        for key, val in got.items():
            e = rel_err(val, ref[key])
            tol = tol_o if key in ("o", "fs") else tol_g
            report.append(f"{case['name']:>28} {key:>6} {e:.2e}")
            if not e < tol:
                failures.append(f"{case['name']}: {key} rel err {e:.3e} >= {tol:.0e}")
    print(f"world={world} op={op_name} seed={seed}\n" + "\n".join(report))
    assert not failures, f"world={world} op={op_name} seed={seed}:\n" + "\n".join(failures)


GDR_ERR = gdr_import_error()


@pytest.mark.parametrize("world", [2, 4])
def test_cp_reference_float64(world):
    compare(world, "ref64")


@pytest.mark.parametrize("world", [2, 4])
def test_cp_reference_fp32(world):
    compare(world, "ref32")


@pytest.mark.skipif(GDR_ERR is not None, reason=f"gdr cannot be imported: {GDR_ERR}")
@pytest.mark.parametrize("op_name", ["gdr", "gdr_chunkwise"])
@pytest.mark.parametrize("world", [2, 4])
def test_cp_gdr_fp32(world, op_name):
    compare(world, op_name)


def test_plan_edges():
    """Plans for slices that hold only the middle of a sequence, or nothing."""
    cp = load_cp_module()
    bounds = [0, 10, 10, 25, 40]
    cu = [0, 3, 3, 35, 40]
    p0 = cp._make_plan(0, 4, bounds, 1, cu, True)  # starts sequence 0: no widened pass
    assert p0.t_first == 0 and p0.rest_ids == [0, 2] and p0.rest_cu == [0, 3, 10]
    assert p0.rest_ends_here == [True, False] and p0.reset == [True, False, False, False]
    p1 = cp._make_plan(1, 4, bounds, 1, cu, True)
    assert p1.t_first == 0 and p1.first_rows == [] and p1.rest_ids == [] and not p1.reset[1]
    p2 = cp._make_plan(2, 4, bounds, 1, cu, True)
    assert p2.t_first == 15 and p2.first_rows == [2] and not p2.first_ends_here
    assert not p2.reset[2] and p2.rest_ids == []
    p3 = cp._make_plan(3, 4, bounds, 1, cu, True)
    assert p3.t_first == 10 and p3.first_ends_here and p3.rest_ids == [3]
    assert p3.rest_cu == [0, 5] and p3.h_rows[0] == [0] and p3.empty_seqs == [1]
    pr = cp._make_plan(2, 4, bounds, 1, [0, 3, 10, 40], False)  # rank 2 starts a sequence
    assert pr.t_first == 0 and pr.rest_ids == [2] and pr.reset[2] and pr.h_rows[2] is None
    pd = cp._make_plan(2, 4, bounds, 3, None, True)  # dense B = 3: a middle rank
    assert pd.t_first == 15 and pd.first_rows == [0, 1, 2] and not pd.first_ends_here
    assert cp._make_plan(0, 4, bounds, 3, None, True).rest_ids == [0, 1, 2]
    with pytest.raises(ValueError, match="cu_seqlens"):
        cp._make_plan(0, 4, bounds, 1, [0, 3, 39], True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--op", default="ref64",
                    help="ref64, ref32, gdr or gdr_chunkwise; a comma list runs several")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.worker:
        worker(a.rank, a.world, a.port, a.seed, a.op, a.out)
    else:
        for name in a.op.split(","):
            compare(a.world, name)
