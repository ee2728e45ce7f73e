#!/usr/bin/env python3
"""Peer timing: FLA's fused_recurrent_gated_delta_rule as a decode step, measured the way
bench/cuda_decode measures gdr: NS input sets (together > 3x the 60 MB L2 where memory allows),
one torch.cuda.CUDAGraph holding C = max(NS, --graph-calls) calls cycling over the sets (default
16, as bench/cuda_decode), events around each replay, time per call = replay / C, median of >= 20
replays after warm-up. Same shapes and inputs' kinds:
bf16 q, k (unit L2 rows), v; fp32 g ~ -0.2 U(0,1), beta ~ U(0,1); fp32 state [B, Hv, Dk, Dv]
read as initial_state and written as the final state (FLA does not update in place).

--check DIR compares FLA with gdr on the inputs bench/cuda_decode dumped there (--dump).

On the GPU machine FLA comes from .peer/ (shared/tools/fetch-peer):
  python3 -m pip install -q --no-index --no-deps --target /tmp/peer .peer/*.whl
  PYTHONPATH=/tmp/peer python3 bench/peers/fla_decode.py --json out.json
"""
import argparse
import json
import math
import os
import statistics
import sys

import numpy as np
import torch


def make_set(B, T, Hk, Hv, Dk, Dv, dtype, gen):
    dev = "cuda"
    q = (torch.rand(B, T, Hk, Dk, device=dev, generator=gen) * 2 - 1).to(dtype)
    k = torch.rand(B, T, Hk, Dk, device=dev, generator=gen) * 2 - 1
    k = (k / k.norm(dim=-1, keepdim=True)).to(dtype)
    v = (torch.rand(B, T, Hv, Dv, device=dev, generator=gen) * 2 - 1).to(dtype)
    g = -0.2 * torch.rand(B, T, Hv, device=dev, generator=gen)
    beta = torch.rand(B, T, Hv, device=dev, generator=gen)
    h0 = torch.rand(B, Hv, Dk, Dv, device=dev, generator=gen) * 2 - 1
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)


def set_bytes(B, T, Hk, Hv, Dk, Dv, es):
    return 2.0 * B * Hv * Dk * Dv * 4 + es * B * T * (2 * Hk * Dk + 2 * Hv * Dv) + 8.0 * B * T * Hv


def time_graph(fn, sets, reps, warmup, graph_calls=0):
    # One graph of max(NS, graph_calls) calls cycling over the sets (as bench/cuda_decode).
    calls = max(len(sets), graph_calls)
    # Warm up (Triton compiles) on a side stream, as torch.cuda.graphs asks.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for d in sets:
                fn(d)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [fn(sets[i % len(sets)]) for i in range(calls)]
    for _ in range(warmup):
        graph.replay()
    times = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del outs, graph
    return 1e3 * statistics.median(times) / calls


def copy_bandwidth():
    a = torch.ones(1 << 28, device="cuda", dtype=torch.float32)  # 1 GiB
    b = torch.empty_like(a)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for i in range(23):
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        if i >= 3:
            ts.append(e0.elapsed_time(e1))
    return 2.0 * a.numel() * 4 / (1e-3 * statistics.median(ts))


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def check_against_gdr(fn_raw, d):
    meta = json.load(open(os.path.join(d, "meta.json")))
    B, T, Hk, Hv, Dk, Dv = (meta[x] for x in ("B", "T", "Hk", "Hv", "Dk", "Dv"))
    bf = meta["dtype"] == "bfloat16"
    dt16 = torch.bfloat16 if bf else torch.float16

    def load(name, shape, dtype):
        raw = np.fromfile(os.path.join(d, name), dtype=np.uint16 if dtype == dt16 else np.float32)
        t = torch.from_numpy(raw.copy())
        if dtype == dt16:
            t = t.view(torch.int16).view(dt16)
        return t.reshape(shape).cuda()

    q = load("q.bin", (B, T, Hk, Dk), dt16)
    k = load("k.bin", (B, T, Hk, Dk), dt16)
    v = load("v.bin", (B, T, Hv, Dv), dt16)
    g = load("g.bin", (B, T, Hv), torch.float32)
    beta = load("beta.bin", (B, T, Hv), torch.float32)
    h0 = load("h0.bin", (B, Hv, Dk, Dv), torch.float32)
    o_gdr = load("o.bin", (B, T, Hv, Dv), dt16)
    ht_gdr = load("ht.bin", (B, Hv, Dk, Dv), torch.float32)
    o, ht = fn_raw(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0.clone(), output_final_state=True)
    torch.cuda.synchronize()
    res = dict(shape=meta, o_rel_diff=rel(o_gdr.float(), o.float()), state_rel_diff=rel(ht_gdr, ht))
    res["ok"] = res["o_rel_diff"] < 1e-2 and res["state_rel_diff"] < 1e-4
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,32,128,256")
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--hk", type=int, default=16)
    ap.add_argument("--hv", type=int, default=32)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--graph-calls", type=int, default=16,
                    help="calls per captured graph, at least (cycling over the sets)")
    ap.add_argument("--json", default="")
    ap.add_argument("--check", default="", help="directory dumped by cuda_decode --dump")
    a = ap.parse_args()
    import fla
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fr

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda")
    gen.manual_seed(a.seed)
    copy_bw = copy_bandwidth()
    print(f"FLA {getattr(fla, '__version__', '?')}, torch {torch.__version__}, "
          f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    out = dict(peer="fla.fused_recurrent_gated_delta_rule", fla_version=getattr(fla, "__version__", "?"),
               torch=torch.__version__, device=torch.cuda.get_device_name(),
               copy_bandwidth_Bps=copy_bw, seed=a.seed, graph_calls=a.graph_calls, rows=[])
    if a.check:
        res = check_against_gdr(fr, a.check)
        print(f"sanity vs gdr {res['shape']}: o rel diff {res['o_rel_diff']:.2e}, "
              f"state rel diff {res['state_rel_diff']:.2e} -> {'ok' if res['ok'] else 'MISMATCH'}")
        out["check"] = res

    def call(d):
        return fr(q=d["q"], k=d["k"], v=d["v"], g=d["g"], beta=d["beta"],
                  initial_state=d["h0"], output_final_state=True)

    free = torch.cuda.mem_get_info()[0]
    for T in [int(x) for x in a.tokens.split(",")]:
        for B in [int(x) for x in a.batches.split(",")]:
            sb = set_bytes(B, T, a.hk, a.hv, a.dk, a.dv, 2)
            ns = min(64, max(2, math.ceil(180e6 / sb)))
            while ns > 1 and ns * sb * 1.6 > 0.25 * free:  # 1.6: FLA allocates its outputs too
                ns -= 1
            sets = [make_set(B, T, a.hk, a.hv, a.dk, a.dv, torch.bfloat16, gen) for _ in range(ns)]
            us = time_graph(call, sets, max(a.reps, 20), a.warmup, a.graph_calls)
            gbps = sb / (us * 1e-6) / 1e9
            print(f"FLA B={B:4d} T={T:2d}  {us:9.2f} us  {gbps:7.0f} GB/s  "
                  f"{100 * gbps * 1e9 / copy_bw:5.1f}% of copy  sets {ns}")
            out["rows"].append(dict(B=B, T=T, Hk=a.hk, Hv=a.hv, Dk=a.dk, Dv=a.dv, fla_us=us,
                                    bytes=sb, gbps=gbps, fraction_of_copy=gbps * 1e9 / copy_bw,
                                    sets=ns, graph_calls=max(ns, a.graph_calls)))
            del sets
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.check and not out["check"]["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
