#!/usr/bin/env python3
"""Chunked forward on CUDA: gdr's chunk_gated_delta_rule (torch op; path="chunkwise" runs the
chunked kernels, src/cuda/chunked/; --path picks another) against FLA's chunk_gated_delta_rule (chunk_kda for the
per-key gate) on the same inputs: bf16 q, k (unit L2 rows), v; fp32 g = -0.2 U(0,1) (log decay;
[B, T, Hv] or [B, T, Hv, Dk]), fp32 beta ~ U(0,1); fp32 h0 [N, Hv, Dk, Dv] and the final state.

Method (docs/cuda-chunked.md; ../PERF.md's rules): NS input sets (together > 3x the 60 MB L2 where
a set is smaller), CUDA events around each call, warm-up first, median of --reps calls cycling
over the sets. Each row also reports gdr vs FLA relative Frobenius error of o and of the final
state. TFLOP/s and the fraction of the floor use the work model
  FLOPs per token and value head = 6 Dk Dv + 64 (6 Dk + 4 Dv),
  bytes = q, k, v, g, beta read once, o written once, h0 read, final state written,
  floor = max(FLOPs / 779e12, bytes / 4.17e12)   (the H200's measured ceilings).
--crossover also times gdr's recurrent path (path="sequential") against the chunked one at short
lengths (the heuristics.h threshold).

On the GPU machine FLA comes from .peer/ and gdr from the build (scripts/device-check chunked):
  PYTHONPATH=/tmp/gdrpkg:/tmp/peer python3 bench/cuda_chunked.py --json out.json
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch

SHAPES = [  # (B, T, Hk, Hv, gate)
    (1, 4096, 16, 32, "scalar"),
    (1, 16384, 16, 32, "scalar"),
    (1, 65536, 16, 32, "scalar"),
    (8, 4096, 16, 32, "scalar"),
    (1, 32768, 32, 32, "scalar"),
    ("varlen32", None, 16, 32, "scalar"),
    (1, 16384, 32, 32, "per_key"),
]


def varlen_lengths(seed=20261205):
    g = torch.Generator().manual_seed(seed)
    return [int(x) for x in torch.randint(100, 8001, (32,), generator=g)]


def make_set(B, T, Hk, Hv, D, gate, gen, cu=None):
    dev = "cuda"
    q = (torch.rand(B, T, Hk, D, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    k = torch.rand(B, T, Hk, D, device=dev, generator=gen) * 2 - 1
    k = (k / k.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
    v = (torch.rand(B, T, Hv, D, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    gshape = (B, T, Hv, D) if gate == "per_key" else (B, T, Hv)
    g = -0.2 * torch.rand(*gshape, device=dev, generator=gen)
    beta = torch.rand(B, T, Hv, device=dev, generator=gen)
    N = B if cu is None else len(cu) - 1
    h0 = torch.rand(N, Hv, D, D, device=dev, generator=gen) * 2 - 1
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)


def work(B, T, Hk, Hv, D, N, gate):
    flops = B * T * Hv * (6 * D * D + 64 * (6 * D + 4 * D))
    gbytes = (D if gate == "per_key" else 1) * 4
    nbytes = (B * T * (2 * Hk * D * 2 + 2 * Hv * D * 2 + Hv * (gbytes + 4)) + 2 * N * Hv * D * D * 4)
    return flops, nbytes


def time_calls(fn, sets, reps, warmup):
    for i in range(warmup):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        d = sets[i % len(sets)]
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(d)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times), min(times)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--crossover", action="store_true")
    ap.add_argument("--rows", default="all", help="comma-separated row indices, or all")
    ap.add_argument("--path", default="chunkwise",
                    help="gdr's path for the rows: chunkwise (the chunked kernels, default), auto "
                         "(what heuristics.h picks) or sequential (the recurrent kernel)")
    args = ap.parse_args()
    import gdr
    fla_chunk = fla_kda = None
    fla_version = None
    if not args.no_peer:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
            from fla.ops.kda import chunk_kda as fla_kda
            import fla
            fla_version = getattr(fla, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            print(f"FLA not available: {e}", file=sys.stderr)
    D = 128
    rows = []
    cross = []

    def dump():
        meta = dict(
            command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
            commit=os.environ.get("GDR_COMMIT", "unknown"), device=torch.cuda.get_device_name(),
            overrides=os.environ.get("GDR_OVERRIDES", ""),  # gdr's forced kernel choices, if any
            torch=torch.__version__, cuda=torch.version.cuda, fla=fla_version,
            triton=getattr(__import__("triton"), "__version__", None), seed=1234,
            method="CUDA events per call, median of reps after warm-up, input sets rotated")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(dict(meta=meta, rows=rows, crossover=cross), fh, indent=1)

    shapes = SHAPES if args.rows == "all" else [SHAPES[int(i)] for i in args.rows.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for (B, T, Hk, Hv, gate) in shapes:
        cu = None
        label = None
        if B == "varlen32":
            lens = varlen_lengths()
            cu = [0]
            for L in lens:
                cu.append(cu[-1] + L)
            B, T = 1, cu[-1]
            label = f"varlen 32 seqs {min(lens)}..{max(lens)}"
        N = B if cu is None else len(cu) - 1
        flops, nbytes = work(B, T, Hk, Hv, D, N, gate)
        ns = max(1, min(4, math.ceil(180e6 / nbytes)))
        sets = [make_set(B, T, Hk, Hv, D, gate, gen, cu) for _ in range(ns)]
        cu32 = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
        cu64 = None if cu is None else cu32.long()

        def run_gdr(d, path=args.path):
            return gdr.chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["g"], d["beta"],
                                              initial_state=d["h0"], output_final_state=True,
                                              cu_seqlens=cu32, path=path)

        def run_fla(d):
            if gate == "per_key":
                return fla_kda(d["q"], d["k"], d["v"], d["g"], d["beta"], initial_state=d["h0"],
                               output_final_state=True, cu_seqlens=cu64)
            return fla_chunk(d["q"], d["k"], d["v"], d["g"], d["beta"], initial_state=d["h0"],
                             output_final_state=True, cu_seqlens=cu64)

        row = dict(B=B, T=T, Hk=Hk, Hv=Hv, Dk=D, Dv=D, gate=gate, N=N, label=label, path=args.path,
                   seqlens=(None if cu is None else [cu[i + 1] - cu[i] for i in range(N)]),
                   input_sets=ns, flops=flops, bytes=nbytes)
        with torch.inference_mode():
            gdr_ms, gdr_min = time_calls(run_gdr, sets, args.reps, args.warmup)
            row.update(gdr_ms=gdr_ms, gdr_min_ms=gdr_min)
            floor_ms = max(flops / 779e12, nbytes / 4.17e12) * 1e3
            row.update(floor_ms=floor_ms, gdr_tflops=flops / gdr_ms / 1e9,
                       gdr_floor_fraction=floor_ms / gdr_ms)
            if fla_chunk is not None:
                try:
                    peer_ms, peer_min = time_calls(run_fla, sets, args.reps, args.warmup)
                    o1, s1 = run_gdr(sets[0])
                    o2, s2 = run_fla(sets[0])
                    row.update(peer_ms=peer_ms, peer_min_ms=peer_min, speedup=peer_ms / gdr_ms,
                               rel_err_o_vs_peer=rel(o1, o2), rel_err_state_vs_peer=rel(s1, s2))
                except Exception as e:  # noqa: BLE001
                    row.update(peer_error=str(e)[:300])
        rows.append(row)
        print(f"B={B} T={T} Hk={Hk} Hv={Hv} {gate:7s} gdr {row['gdr_ms']:.3f} ms "
              f"({row['gdr_tflops']:.0f} TFLOP/s, {row['gdr_floor_fraction']:.2f} of floor)  "
              f"FLA {row.get('peer_ms', float('nan')):.3f} ms  speedup "
              f"{row.get('speedup', float('nan')):.2f}  err o {row.get('rel_err_o_vs_peer', float('nan')):.1e}"
              f" S {row.get('rel_err_state_vs_peer', float('nan')):.1e}", flush=True)
        del sets
        torch.cuda.empty_cache()
        dump()
    if args.crossover:
        with torch.inference_mode():
            for B, T in [(1, 64), (1, 128), (1, 256), (8, 64), (8, 128), (32, 64), (32, 128)]:
                sets = [make_set(B, T, 16, 32, D, "scalar", gen) for _ in range(2)]
                r = {}
                for path in ("sequential", "chunkwise"):
                    def f(d, path=path):
                        return gdr.chunk_gated_delta_rule(
                            d["q"], d["k"], d["v"], d["g"], d["beta"], initial_state=d["h0"],
                            output_final_state=True, path=path)
                    r[path] = time_calls(f, sets, args.reps, args.warmup)[0]
                cross.append(dict(B=B, T=T, Hk=16, Hv=32, sequential_ms=r["sequential"],
                                  chunkwise_ms=r["chunkwise"]))
                print(f"crossover B={B} T={T}: sequential {r['sequential']:.3f} ms, "
                      f"chunkwise {r['chunkwise']:.3f} ms", flush=True)
                dump()
    print("\n| B | T | Hk | Hv | gate | gdr ms | FLA ms | speedup | floor frac |")
    for r in rows:
        print(f"| {r['B']} | {r['T']} | {r['Hk']} | {r['Hv']} | {r['gate']} | {r['gdr_ms']:.3f} | "
              f"{r.get('peer_ms', float('nan')):.3f} | {r.get('speedup', float('nan')):.2f} | "
              f"{r['gdr_floor_fraction']:.2f} |")
    dump()


if __name__ == "__main__":
    main()
