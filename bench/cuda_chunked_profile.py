#!/usr/bin/env python3
"""Per-kernel time of gdr's chunked forward and backward on CUDA (torch.profiler's CUPTI kernel
records; the device has no nsys). For each shape: the forward alone (path="chunkwise"), then
forward + backward, each averaged over --reps calls after a warm-up; prints one table per shape
(kernel name, calls, total microseconds per call) and writes the rows as JSON (--json). --peer
does the same for FLA's chunk_gated_delta_rule on the same inputs (its backward for timing only:
fla.ops.common.chunk_o.IS_NVIDIA_HOPPER is set to False, as in bench/cuda_chunked_bwd.py).

  PYTHONPATH=/tmp/gdrpkg python3 bench/cuda_chunked_profile.py --shapes 1x16384x16x32,8x4096x16x32
"""
import argparse
import json
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import gdr


def make_inputs(B, T, Hk, Hv, D, grad):
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = (torch.rand(B, T, Hk, D, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
    k = torch.rand(B, T, Hk, D, device="cuda", generator=gen) * 2 - 1
    k = (k / k.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
    v = (torch.rand(B, T, Hv, D, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
    g = -0.2 * torch.rand(B, T, Hv, device="cuda", generator=gen)
    beta = torch.rand(B, T, Hv, device="cuda", generator=gen)
    h0 = torch.rand(B, Hv, D, D, device="cuda", generator=gen) * 2 - 1
    ins = [q, k, v, g, beta, h0]
    if grad:
        for x in ins:
            x.requires_grad_(True)
    return ins


def gdr_call(q, k, v, g, beta, h0):
    return gdr.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                      output_final_state=True, path="chunkwise")


def peer_call():
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    fla_chunk_o.IS_NVIDIA_HOPPER = False  # timing only: see the module docstring

    def call(q, k, v, g, beta, h0):
        return fla_chunk(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    return call


def run(ins, backward, call=gdr_call):
    q, k, v, g, beta, h0 = ins
    o, ht = call(q, k, v, g, beta, h0)
    if backward:
        (o.float().sum() + ht.sum()).backward()


def kernel_table(ins, backward, reps, call):
    for _ in range(3):
        run(ins, backward, call)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run(ins, backward, call)
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.split("(")[0][:60]
            per[name][0] += 1
            per[name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    rows = [dict(kernel=n, calls_per_iter=c / reps, us_per_iter=t / reps) for n, (c, t) in per.items()]
    rows.sort(key=lambda r: -r["us_per_iter"])
    return rows


def timeline(ins, backward, call):
    """One call's kernels in launch order: start and end (us) relative to the first kernel's start,
    so that overlap (the output kernel under the state pass) and gaps between kernels show."""
    run(ins, backward, call)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(ins, backward, call)
        torch.cuda.synchronize()
    spans = [(e.time_range.start, e.time_range.end, e.name.split("(")[0][:60]) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    spans.sort()
    t0 = spans[0][0] if spans else 0
    return [dict(kernel=n, start_us=a - t0, end_us=b - t0) for a, b, n in spans]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16384x16x32,8x4096x16x32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--peer", action="store_true", help="also FLA's kernels on the same inputs")
    a = ap.parse_args()
    libs = [("gdr", gdr_call)] + ([("fla", peer_call())] if a.peer else [])
    out = []
    for s, (lib, call), backward in ((s, lc, bw) for s in a.shapes.split(",") for lc in libs
                                     for bw in (False, True)):
        B, T, Hk, Hv = (int(x) for x in s.split("x"))
        ins = make_inputs(B, T, Hk, Hv, 128, backward)
        rows = kernel_table(ins, backward, a.reps, call)
        total = sum(r["us_per_iter"] for r in rows)
        print(f"== {lib} {s} {'fwd+bwd' if backward else 'fwd'}: {total:.0f} us of kernels per "
              "call")
        for r in rows:
            print(f"  {r['us_per_iter']:9.1f} us  {r['calls_per_iter']:5.1f}x  {r['kernel']}")
        spans = timeline(ins, backward, call)
        print(f"   timeline of one call ({spans[-1]['end_us']:.0f} us first start to last end):"
              if spans else "   no kernels")
        for r in spans:
            print(f"    {r['start_us']:9.1f} .. {r['end_us']:9.1f} us  {r['kernel']}")
        out.append(dict(lib=lib, shape=s, backward=backward, total_us=total, kernels=rows,
                        timeline=spans))
        del ins
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
