#!/usr/bin/env python3
"""gdr's CPU training path against the peers a user would otherwise run on a CPU.

For each T, one layer (B=1, Hk=16, Hv=32, Dk=Dv=128, fp32, scalar gate, loss = sum(dout * o),
gradients of q, k, v, g, beta), each in a fresh process, in turn (gdr, torch, hf, mlx;
`--rounds` times, medians over rounds):
  gdr    build/<...>/bench/cpu_paths --mode single --a chunkwise (C++, no Python bindings; the
         training step of the torch layer's default: the forward saves the chunk-boundary
         states, docs/operator.md §3; --gdr-path chunkwise:intermediates or :recompute for
         the others)
  torch  bench/peers/torch_chunked.py   PyTorch autograd through the chunked form (operator.md §3)
  hf     bench/peers/hf_chunked.py      PyTorch autograd through transformers' Qwen3-Next CPU
                                        fallback, torch_chunk_gated_delta_rule (if installed)
  mlx    bench/peers/mlx_gated_delta.py mlx-lm's gated_delta_ops under mlx autodiff (if installed)
Time: median of each process's timed runs (after a warm-up). Memory: the process's peak RSS minus
its RSS once the inputs are allocated. Inputs follow the same recipe and seed number on each side
(keys L2-normalised, beta ~ U(0,1), g = -0.2 U(0,1), q, v, dout ~ N(0,1)) but come from each
framework's own generator (torch and hf share torch_chunked.py's). Each row holds, per peer
that ran, speedup_vs_<peer> = peer seconds / gdr seconds and memory_ratio_vs_<peer>. Writes
bench/results/<YYYY-MM-DD>-cpu.json.

Targets (PERF.md): >= 20x faster and >= 10x less memory than mlx-lm; >= 3x faster than a
chunked PyTorch implementation under autograd (torch, and transformers' hf).
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_json(cmd, timeout):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        print("  $", " ".join(cmd), flush=True)
        subprocess.run(cmd + ["--json", path], check=True, timeout=timeout, cwd=HERE,
                       stdout=sys.stderr)
        with open(path) as f:
            return json.load(f)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"  failed: {e}", file=sys.stderr)
        return {"error": str(e)}
    finally:
        os.unlink(path)


def module_version(name):
    """Installed version, without importing the module (that would grow this process, whose
    resident set the children's peak-RSS figures must not see)."""
    from importlib import metadata
    try:
        return metadata.version(name.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return None


def git(*args):
    try:
        return subprocess.check_output(["git", "-C", ROOT, *args], text=True).strip()
    except Exception:
        return None


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def mem_available_gb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable"):
                return int(line.split()[1]) / 1e6
    return 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", default="256,512,1024,2048", help="sequence lengths")
    p.add_argument("--mlx-max-T", type=int, default=512,
                   help="largest T for mlx (its memory grows ~9 MB per token here)")
    p.add_argument("--torch-max-T", type=int, default=4096)
    p.add_argument("--hf-max-T", type=int, default=4096)
    p.add_argument("--peers", default="torch,hf,mlx",
                   help="peers to run (comma-separated; each runs only where it is installed)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3, help="timed runs per process (gdr, torch)")
    p.add_argument("--mlx-repeats", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="fresh processes per (side, T)")
    p.add_argument("--seed", type=int, default=20261129)
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"),
                   help="CMake build directory holding bench/cpu_paths and bench/cpu_peak")
    p.add_argument("--gdr-path", default="chunkwise",
                   help="cpu_paths path for gdr: chunkwise (saves chunk states), "
                        "chunkwise:intermediates, chunkwise:recompute")
    p.add_argument("--out", default="", help="default: bench/results/<date>-cpu.json")
    p.add_argument("--timeout", type=int, default=1800)
    args = p.parse_args()

    args.build = os.path.abspath(args.build)
    cpu_paths = os.path.join(args.build, "bench", "cpu_paths")
    cpu_peak = os.path.join(args.build, "bench", "cpu_peak")
    if not os.path.exists(cpu_paths):
        sys.exit(f"cpu_compare: {cpu_paths} not found; build it (cmake --build {args.build} "
                 "--target cpu_paths cpu_peak)")
    peers = set(args.peers.split(",")) if args.peers else set()
    have_mlx = ("mlx" in peers and module_version("mlx") is not None and
                module_version("mlx_lm") is not None)
    have_hf = "hf" in peers and module_version("transformers") is not None
    have_torch = "torch" in peers
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out_path = args.out or os.path.join(HERE, "results", f"{date}-cpu.json")
    shape = dict(B=1, Hk=16, Hv=32, Dk=128, Dv=128)
    common = ["--B", "1", "--Hk", "16", "--Hv", "32", "--dk", "128", "--dv", "128",
              "--threads", str(args.threads), "--seed", str(args.seed)]

    doc = {
        "what": "CPU forward + backward of one layer: gdr chunkwise vs peers",
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"),
        "tree_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_at_start": os.getloadavg()},
        "versions": {"python": platform.python_version(), "torch": module_version("torch"),
                     "transformers": module_version("transformers"),
                     "mlx": module_version("mlx"), "mlx_lm": module_version("mlx_lm"),
                     "numpy": module_version("numpy")},
        "seed": args.seed,
        "shape": shape,
        "dtype": "f32",
        "threads": args.threads,
        "gdr_path": args.gdr_path,
        "method": __doc__.strip().split("\n\n")[1],
        "rows": [],
    }
    if os.path.exists(cpu_peak):
        doc["cpu_peak"] = run_json([cpu_peak, "--threads", str(args.threads)], args.timeout)

    for T in [int(t) for t in args.T.split(",")]:
        print(f"T={T}", flush=True)
        sides = {"gdr": [], "torch": [], "hf": [], "mlx": []}
        for r in range(args.rounds):
            sides["gdr"].append(run_json(
                [cpu_paths, "--mode", "single", "--a", args.gdr_path, "--direction", "fwdbwd",
                 "--T", str(T), "--pairs", str(args.repeats)] + common, args.timeout))
            if have_torch and T <= args.torch_max_T:
                sides["torch"].append(run_json(
                    [sys.executable, "peers/torch_chunked.py", "--T", str(T), "--repeats",
                     str(args.repeats)] + (["--check"] if r == 0 else []) + common, args.timeout))
            if have_hf and T <= args.hf_max_T:
                sides["hf"].append(run_json(
                    [sys.executable, "peers/hf_chunked.py", "--T", str(T), "--repeats",
                     str(args.repeats)] + (["--check"] if r == 0 else []) + common, args.timeout))
            if have_mlx and T <= args.mlx_max_T:
                if mem_available_gb() < 2.5 * 9e-3 * T + 2:
                    print(f"  mlx skipped at T={T}: {mem_available_gb():.1f} GB available",
                          file=sys.stderr)
                else:
                    sides["mlx"].append(run_json(
                        [sys.executable, "peers/mlx_gated_delta.py", "--T", str(T), "--repeats",
                         str(args.mlx_repeats)] + (["--check"] if r == 0 else []) + common,
                        args.timeout))

        def summary(runs, time_key):
            ok = [x for x in runs if "error" not in x]
            if not ok:
                return None
            secs = [x["seconds"]["median"] if isinstance(x["seconds"], dict) else x["seconds"]
                    for x in ok]
            return {"seconds": statistics.median(secs),
                    "peak_extra_gb": statistics.median([x["peak_extra_bytes"] for x in ok]) / 1e9,
                    "runs": ok}

        row = {"T": T, **shape}
        for side in sides:
            row[side] = summary(sides[side], "seconds")
        g = row["gdr"]
        for side in ("torch", "hf", "mlx"):
            if g and row[side]:
                row[f"speedup_vs_{side}"] = row[side]["seconds"] / g["seconds"]
                row[f"memory_ratio_vs_{side}"] = (row[side]["peak_extra_gb"] /
                                                  max(g["peak_extra_gb"], 1e-9))
        if "speedup_vs_mlx" in row:
            row["meets_mlx_target"] = row["speedup_vs_mlx"] >= 20 and row["memory_ratio_vs_mlx"] >= 10
        for side in ("torch", "hf"):
            if f"speedup_vs_{side}" in row:
                row[f"meets_{side}_target"] = row[f"speedup_vs_{side}"] >= 3
        doc["rows"].append(row)

    doc["machine"]["loadavg_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    fmt = "{:>6} | {:>9} {:>8} | " + " | ".join(["{:>9} {:>8} {:>7}"] * 3) + " {:>7}"
    print(fmt.format("T", "gdr s", "gdr GB", "torch s", "torch GB", "x", "hf s", "hf GB", "x",
                     "mlx s", "mlx GB", "x", "mem x"))

    def cell(row, side, key, f="{:.3f}"):
        return f.format(row[side][key]) if row.get(side) else "-"

    def ratio(row, key):
        return "{:.1f}".format(row[key]) if key in row else "-"

    for row in doc["rows"]:
        cells = [row["T"], cell(row, "gdr", "seconds"), cell(row, "gdr", "peak_extra_gb")]
        for side in ("torch", "hf", "mlx"):
            cells += [cell(row, side, "seconds"), cell(row, side, "peak_extra_gb"),
                      ratio(row, f"speedup_vs_{side}")]
        print(fmt.format(*cells, ratio(row, "memory_ratio_vs_mlx")))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
