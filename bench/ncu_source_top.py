#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, from Nsight Compute's per-SASS-line counters.

Reads the CSV that `scripts/device-check ncu` writes with NCU_SOURCE=1 (`ncu -i <report> --page
source --csv --print-source sass`, one row per SASS instruction) and prints
  - the instructions executed and the warp stall samples summed by opcode (the first word of the
    SASS text, predicates and modifiers dropped: LDS, HMMA, IMAD, ...), largest first;
  - the N lines with the most stall samples, with their share.
Column names differ between Nsight Compute versions: the script takes the first column whose
name contains "Source", "Instructions Executed" and "Warp Stall Sampling (All" (or "Sampling").

    python3 bench/ncu_source_top.py ncu-source-1.csv [--top 30]
"""
import argparse
import csv
import collections
import re
import sys


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def pick(columns, *needles):
    for needle in needles:
        for c in columns:
            if needle.lower() in c.lower():
                return c
    return None


def opcode(sass):
    words = sass.strip().split()
    while words and words[0].startswith("@"):  # predicate guard
        words = words[1:]
    if not words:
        return "?"
    return re.split(r"[.\s]", words[0])[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        lines = [l for l in f if l.strip() and not l.startswith("==")]
    # ncu 2025+ writes a "Kernel Name", <name> line before the header: start at the header.
    header = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0)
    lines = lines[header:]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"{args.csv}: no rows")
    cols = list(rows[0].keys())
    src = pick(cols, "Source")
    ex = pick(cols, "Instructions Executed", "Inst Executed")
    st = pick(cols, "Warp Stall Sampling (All", "Sampling")
    if src is None:
        sys.exit(f"no source column among {cols}")
    print(f"columns: source={src!r} executed={ex!r} stalls={st!r}")
    by_op = collections.defaultdict(lambda: [0.0, 0.0, 0])
    total_ex = total_st = 0.0
    for r in rows:
        op = opcode(r[src])
        e, s = number(r.get(ex)), number(r.get(st))
        by_op[op][0] += e
        by_op[op][1] += s
        by_op[op][2] += 1
        total_ex += e
        total_st += s
    print(f"\n{len(rows)} SASS lines, {total_ex:.4g} instructions executed, {total_st:.4g} stall samples")
    print(f"\n{'opcode':<12} {'lines':>6} {'executed':>12} {'share':>7} {'stalls':>10} {'share':>7}")
    for op, (e, s, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:<12} {n:>6} {e:>12.4g} {e / max(total_ex, 1):>7.1%} {s:>10.4g} {s / max(total_st, 1):>7.1%}")
    print(f"\ntop {args.top} lines by stall samples:")
    for r in sorted(rows, key=lambda r: -number(r.get(st)))[: args.top]:
        s = number(r.get(st))
        addr = r.get(pick(cols, "Address") or "", "")
        print(f"{addr:>8} {s:>8.4g} {s / max(total_st, 1):>6.1%}  {r[src].strip()[:90]}")


if __name__ == "__main__":
    main()
