#!/usr/bin/env python3
"""Plots of committed benchmark results for the README (matplotlib, an optional dependency).

    python3 bench/plot_results.py                                  # the decode plot
    python3 bench/plot_results.py --decode bench/results/<date>-decode-<n>.json
    python3 bench/plot_results.py --chunk-fwd bench/results/<date>-chunk-fwd.json \
        [--chunk-bwd bench/results/<date>-chunk-bwd.json]

--decode reads a bench/cuda_decode results file (rows with shape.B, shape.T, gdr_us, fla_us)
and writes docs/img/decode.png: time per call against B for gdr and FLA, one panel per T.
--chunk-fwd reads a chunked-forward results file (rows with B, T, Hk, Hv, gdr_ms, peer_ms,
speedup) and writes docs/img/chunk-fwd.png: forward time against T for gdr and the peer, one
line pair per (B, Hk, Hv) (scalar gate, equal-length sequences; the varlen and per-key rows are
in the tables); --chunk-bwd (rows of bench/cuda_chunked_bwd.py, same fields) adds a second panel,
forward + backward. Exit status 2 when matplotlib is missing or an input is malformed.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_DECODE = os.path.join(HERE, "results", "2026-12-04-decode-43.json")
IMG = os.path.join(ROOT, "docs", "img")


def load_rows(path):
    with open(path) as f:
        data = json.load(f)
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: no 'rows' list")
    return data, rows


def decode_series(rows, tokens):
    """{T: [(B, gdr_us, fla_us), ...]} for the scalar-gate fp32-state rows that have FLA."""
    out = {t: [] for t in tokens}
    for r in rows:
        s = r.get("shape", {})
        if s.get("T") not in out or r.get("fla_us") is None:
            continue
        if s.get("gate", "scalar") != "scalar" or not str(s.get("state", "float32")).startswith(
                "float32"):
            continue
        out[s["T"]].append((s["B"], r["gdr_us"], r["fla_us"]))
    for t in tokens:
        if not out[t]:
            raise ValueError(f"no rows with T = {t} and an FLA time")
        out[t].sort()
    return out


def plot_decode(plt, path, out_path, tokens=(1, 8)):
    data, rows = load_rows(path)
    series = decode_series(rows, tokens)
    fig, axes = plt.subplots(1, len(tokens), figsize=(5.2 * len(tokens), 4.0), squeeze=False)
    for ax, t in zip(axes[0], tokens):
        bs = [b for b, _, _ in series[t]]
        ax.plot(bs, [g for _, g, _ in series[t]], "o-", label="gdr")
        ax.plot(bs, [f for _, _, f in series[t]], "s--", label="FLA fused_recurrent")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(bs)
        ax.set_xticklabels([str(b) for b in bs])
        ax.set_xlabel("B (sequences)")
        ax.set_ylabel("time per call (us)")
        ax.set_title(f"decode, T = {t}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    device = data.get("device", "")
    commit = str(data.get("commit", ""))[:7]
    fig.suptitle(f"Hk/Hv = 16/32, Dk = Dv = 128, bf16 inputs, fp32 state; {device}, {commit}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def chunk_series(rows):
    """{(B, Hk, Hv): [(T, gdr_ms, peer_ms), ...]} from a chunked results file: scalar-gate rows
    of equal-length sequences (no label, no seqlens) that have both times."""
    out = {}
    for r in rows:
        missing = [k for k in ("B", "T", "Hk", "Hv", "gdr_ms", "peer_ms") if k not in r]
        if missing:
            raise ValueError(f"chunk row without {', '.join(missing)}: {r}")
        if r.get("label") or r.get("seqlens") or r.get("gate", "scalar") != "scalar":
            continue
        if r["gdr_ms"] is None or r["peer_ms"] is None:
            continue
        out.setdefault((r["B"], r["Hk"], r["Hv"]), []).append((r["T"], r["gdr_ms"], r["peer_ms"]))
    for v in out.values():
        v.sort()
    return out


def plot_chunk_panel(ax, series, ylabel):
    for (b, hk, hv), pts in sorted(series.items()):
        ts = [t for t, _, _ in pts]
        line, = ax.plot(ts, [g for _, g, _ in pts], "o-", label=f"gdr B={b} Hk/Hv={hk}/{hv}")
        ax.plot(ts, [p for _, _, p in pts], "s--", color=line.get_color(),
                label=f"FLA B={b} Hk/Hv={hk}/{hv}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("T (tokens per sequence)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_chunk(plt, fwd_path, bwd_path, out_path):
    fwd_meta, fwd_rows = load_rows(fwd_path)
    panels = [(chunk_series(fwd_rows), "forward time (ms)", fwd_meta)]
    if bwd_path:
        bwd_meta, bwd_rows = load_rows(bwd_path)
        panels.append((chunk_series(bwd_rows), "forward + backward time (ms)", bwd_meta))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.4), squeeze=False)
    for ax, (series, ylabel, data) in zip(axes[0], panels):
        plot_chunk_panel(ax, series, ylabel)
        meta = data.get("meta", data)
        ax.set_title(f"{ylabel.split(' time')[0]}; {meta.get('device', '')}, "
                     f"{str(meta.get('commit', ''))[:7]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--decode", default=None, help=f"decode results (default {DEFAULT_DECODE})")
    p.add_argument("--chunk-fwd", default=None, help="chunked-forward results file")
    p.add_argument("--chunk-bwd", default=None,
                   help="chunked forward + backward results file (a second panel; needs --chunk-fwd)")
    p.add_argument("--out-dir", default=IMG, help="where the PNGs go (default docs/img)")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_results.py: matplotlib is not installed (pip install matplotlib); it is an "
              "optional dependency used only for the README's plots", file=sys.stderr)
        return 2
    decode = args.decode or (None if args.chunk_fwd else DEFAULT_DECODE)
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        if decode:
            out = os.path.join(args.out_dir, "decode.png")
            plot_decode(plt, decode, out)
            print(f"wrote {out}")
        if args.chunk_fwd:
            out = os.path.join(args.out_dir, "chunk-fwd.png")
            plot_chunk(plt, args.chunk_fwd, args.chunk_bwd, out)
            print(f"wrote {out}")
    except (OSError, ValueError, KeyError) as e:
        print(f"plot_results.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
