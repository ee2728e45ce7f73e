"""Context-parallel gated delta rule: one long sequence over 1, 2, 4, 8 processes.

For each world size W the script spawns W processes (NCCL on GPUs, one GPU per rank; gloo on
CPUs), gives rank r its contiguous slice of one sequence of --tokens tokens (strong scaling) or
--tokens tokens per rank (weak scaling), and times chunk_gated_delta_rule_cp forward and
forward + backward. Baseline: the single-device operator over the whole sequence on one device.

    time_W        slowest rank's time per call (ms), median over --iters
    efficiency    strong: t_1 / (W * t_W);  weak: t_1(tokens) / t_W   (t_1: single-device op)
    bytes         sent per rank per layer (one call), ring algorithms, from cp_comm_bytes:
                  X = Hv * Dk * (Dk + Dv) * 4   (one rank's fp32 map [M | C], one sequence)
                  forward  (W - 1) X   (all-gather)
                  backward (W - 1) X   (reduce-scatter, NCCL) / 2 (W - 1) X (all-reduce, gloo)

GPU (8 x H200):  python bench/distributed_cp.py --world-sizes 1,2,4,8 --json cp.json
CPU smoke test:  python bench/distributed_cp.py --device cpu --op reference --tokens 512 \
                     --hk 2 --hv 4 --dk 16 --dv 16 --dtype float32 --world-sizes 1,2 --iters 2
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Options:
    tokens: int = 1 << 20
    scaling: str = "strong"  # strong: --tokens in all; weak: --tokens per rank
    hk: int = 16
    hv: int = 32
    dk: int = 128
    dv: int = 128
    dtype: str = "bfloat16"
    gate: str = "scalar"  # scalar | perkey
    device: str = "cuda"
    op: str = "gdr"  # gdr | reference (CPU smoke test only: float64-capable Python loop)
    map_pass: str = "auto"
    rerun: bool = False
    backward: bool = True
    warmup: int = 2
    iters: int = 5
    world_sizes: str = "1,2,4,8"
    json: str = ""


def load_module(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_cp():
    try:
        import gdr.distributed as cp  # installed package

        return cp
    except Exception:
        return load_module("gdr_distributed_bench", REPO / "python" / "gdr" / "distributed.py")


def load_op(opt: Options):
    if opt.op == "gdr":
        import gdr

        return gdr.chunk_gated_delta_rule
    tests = load_module("gdr_test_distributed", REPO / "tests" / "python" / "test_distributed.py")
    return tests.ref_gated_delta_rule


def make_slice(opt: Options, n_tokens: int, seed: int, device):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, opt.dtype)

    def rnd(*shape, scale=1.0, fn=torch.randn):
        return (fn(*shape, generator=gen) * scale).to(device)

    q = rnd(1, n_tokens, opt.hk, opt.dk).to(dt)
    k = rnd(1, n_tokens, opt.hk, opt.dk)
    k = (k / k.norm(dim=-1, keepdim=True)).to(dt)
    v = rnd(1, n_tokens, opt.hv, opt.dv).to(dt)
    gshape = (1, n_tokens, opt.hv) if opt.gate == "scalar" else (1, n_tokens, opt.hv, opt.dk)
    g = rnd(*gshape, scale=-0.2, fn=torch.rand)
    beta = rnd(1, n_tokens, opt.hv, fn=torch.rand)
    return [t.requires_grad_(opt.backward) for t in (q, k, v, g, beta)]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, opt: Options, device, group_sync):
    """Median over iters of the slowest rank's wall time (ms)."""
    for _ in range(opt.warmup):
        fn()
    times = []
    for _ in range(opt.iters):
        group_sync()
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        if dist.is_initialized():
            dt = dt.to(device)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item() * 1e3)
    return statistics.median(times)


def worker(rank: int, world: int, port: int, opt: Options, out_path: str):
    use_cuda = opt.device == "cuda"
    if use_cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device(f"cuda:{rank}" if use_cuda else "cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}",
                            **({"device_id": device} if use_cuda else {}))
    cp = load_cp()
    op = load_op(opt)
    total = opt.tokens * (world if opt.scaling == "weak" else 1)
    bounds = cp.cp_slice_bounds(total, world)
    n = bounds[rank + 1] - bounds[rank]
    q, k, v, g, beta = make_slice(opt, n, 1000 + rank, device)
    do = torch.randn_like(v) if opt.backward else None

    def fwd():
        with torch.set_grad_enabled(opt.backward):
            return cp.chunk_gated_delta_rule_cp(q, k, v, g, beta, op=op, slice_lengths=
                                                [bounds[r + 1] - bounds[r] for r in range(world)],
                                                map_pass=opt.map_pass, rerun=opt.rerun)[0]

    def fwd_only():
        with torch.no_grad():
            fwd()

    def fwd_bwd():
        for t in (q, k, v, g, beta):
            t.grad = None
        fwd().backward(do)

    barrier = dist.barrier
    if use_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    rec = {"world": world, "tokens": total, "tokens_per_rank": n,
           "fwd_ms": time_calls(fwd_only, opt, device, barrier)}
    if opt.backward:
        rec["fwd_bwd_ms"] = time_calls(fwd_bwd, opt, device, barrier)
    if use_cuda:
        peak = torch.tensor([torch.cuda.max_memory_allocated(device)], device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        rec["peak_mem_gib"] = peak.item() / 2**30
    rec.update(cp.cp_comm_bytes(world, 1, opt.hv, opt.dk, opt.dv, backward=opt.backward,
                                nccl=use_cuda))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rec, f)
    dist.barrier()
    dist.destroy_process_group()


def single_device(rank: int, opt: Options, tokens: int, out_path: str):
    """The plain operator over the whole sequence on one device (the baseline), in its own
    process so that its memory is gone before the ranks start."""
    device = torch.device("cuda:0" if opt.device == "cuda" else "cpu")
    op = load_op(opt)
    q, k, v, g, beta = make_slice(opt, tokens, 7, device)
    do = torch.randn_like(v) if opt.backward else None

    def fwd_only():
        with torch.no_grad():
            op(q, k, v, g, beta)

    def fwd_bwd():
        for t in (q, k, v, g, beta):
            t.grad = None
        op(q, k, v, g, beta)[0].backward(do)

    rec = {"world": 1, "tokens": tokens, "single_device_op": True,
           "fwd_ms": time_calls(fwd_only, opt, device, lambda: None)}
    if opt.backward:
        rec["fwd_bwd_ms"] = time_calls(fwd_bwd, opt, device, lambda: None)
    if device.type == "cuda":
        rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    with open(out_path, "w") as f:
        json.dump(rec, f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_json(fn, nprocs: int, args: tuple) -> dict:
    """Run fn(rank, *args, out_path) in nprocs fresh processes; rank 0 writes a JSON record."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rec.json")
        mp.spawn(fn, args=(*args, out), nprocs=nprocs, join=True)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    for f in dataclasses.fields(Options):
        if f.type in ("bool", bool):
            ap.add_argument("--" + f.name.replace("_", "-"), type=lambda s: s.lower() in
                            ("1", "true", "yes"), default=f.default)
        else:
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default),
                            default=f.default)
    opt = Options(**vars(ap.parse_args()))
    worlds = [int(w) for w in opt.world_sizes.split(",")]
    if opt.device == "cuda":
        have = torch.cuda.device_count()
        if max(worlds) > have:
            sys.exit(f"distributed_cp: world size {max(worlds)} needs {max(worlds)} GPUs; "
                     f"this machine has {have} (use --device cpu for the gloo smoke test)")

    base = spawn_json(single_device, 1, (opt, opt.tokens))
    results = {"options": dataclasses.asdict(opt), "single_device": base, "cp": []}
    print(f"single device op: T={opt.tokens} fwd {base['fwd_ms']:.2f} ms"
          + (f", fwd+bwd {base['fwd_bwd_ms']:.2f} ms" if opt.backward else ""), flush=True)
    for w in worlds:
        rec = spawn_json(worker, w, (w, free_port(), opt))
        for key in ("fwd_ms", "fwd_bwd_ms"):
            if key in rec:
                t1 = base[key] * (w if opt.scaling == "weak" else 1)
                rec[key.replace("_ms", "_efficiency")] = t1 / (w * rec[key])
        results["cp"].append(rec)
        line = (f"W={w} T/rank={rec['tokens_per_rank']} fwd {rec['fwd_ms']:.2f} ms "
                f"(eff {rec['fwd_efficiency']:.2f})")
        if opt.backward:
            line += f", fwd+bwd {rec['fwd_bwd_ms']:.2f} ms (eff {rec['fwd_bwd_efficiency']:.2f})"
        line += (f", sent/rank/layer fwd {rec['forward_bytes_sent_per_rank'] / 2**20:.2f} MiB"
                 f" bwd {rec['backward_bytes_sent_per_rank'] / 2**20:.2f} MiB")
        print(line, flush=True)
    text = json.dumps(results, indent=2)
    if opt.json:
        with open(opt.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
