"""Shared helpers of the CPU peer benchmarks: inputs, timing, peak memory, JSON output.

Each peer script measures one configuration per process (so that its peak RSS belongs to that
configuration alone): forward + backward of one layer, loss = sum(dout * o), gradients of
q, k, v, g (log decay) and beta. Peak memory is the process's peak RSS (VmHWM) minus the
resident set size once the inputs are allocated (the extra memory of forward + backward).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--Hk", type=int, default=16)
    p.add_argument("--Hv", type=int, default=32)
    p.add_argument("--dk", type=int, default=128)
    p.add_argument("--dv", type=int, default=128)
    p.add_argument("--threads", type=int, default=0, help="0 = all cores")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    p.add_argument("--seed", type=int, default=20261129)
    p.add_argument("--check", action="store_true",
                   help="first check against a float64 per-token loop on a small shape")
    p.add_argument("--json", default="", help="write the result here (else stdout)")
    return p


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes():
    """VmHWM of this process. Not ru_maxrss: after fork + exec that also counts the parent's
    resident set at the time of the fork (the driver's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure(step, repeats):
    """Runs step() once to warm up, then `repeats` times; returns (median, all) in seconds."""
    step()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def emit(args, peer, versions, seconds, samples, baseline, extra=None):
    peak = peak_rss_bytes()
    out = {
        "peer": peer,
        "shape": {"B": args.B, "T": args.T, "Hk": args.Hk, "Hv": args.Hv, "Dk": args.dk,
                  "Dv": args.dv},
        "threads": args.threads,
        "seed": args.seed,
        "seconds": seconds,
        "samples": samples,
        "peak_rss_bytes": peak,
        "baseline_rss_bytes": baseline,
        "peak_extra_bytes": max(0, peak - baseline),
        "versions": dict(versions, python=platform.python_version()),
    }
    if extra:
        out.update(extra)
    text = json.dumps(out, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text if not args.json else
          f"{peer} T={args.T}: {seconds:.3f} s, peak extra {out['peak_extra_bytes'] / 1e9:.3f} GB",
          file=sys.stdout)
    return out
