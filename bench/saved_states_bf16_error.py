#!/usr/bin/env python3
"""Would bf16 saved chunk states do? (CPU experiment, no GPU; docs/cuda-chunked.md §Backward
memory.) The forward's saved chunk states are fp32 (0.54 GB of the 1.19 GB peak of forward +
backward at 1 x 16384, Hv = 32, D = 128). This runs gdr's CPU chunkwise forward with
save_for_backward="chunk_states" on bf16 inputs, then the CPU chunkwise backward from those
states as they are and rounded to bf16, and prints each gradient's relative Frobenius error
against the float64 reference backward (docs/operator.md §7's metric; the bf16 bar is 1e-2).

  PYTHONPATH=<gdr package> python3 bench/saved_states_bf16_error.py [--T 1024] [--D 128]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from gdr import _ops  # noqa: E402
from gdr_testing import make_inputs  # noqa: E402


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--D", type=int, default=128)
    args = ap.parse_args()
    # backward returns dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0.
    names = {0: "dq", 1: "dk", 2: "dv", 3: "dg", 4: "dbeta", 7: "dh0"}
    for decay in ["mild", "strong", "extreme"]:
        torch.manual_seed(0)
        x = make_inputs(B=1, T=args.T, Hk=2, Hv=4, Dk=args.D, Dv=args.D, decay=decay, h0=True,
                        dtype=torch.bfloat16)
        q, k, v, g, beta, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
        fwd = (q, k, v, g, beta, None, None, h0, None, None, 0.0, "k_first", False, False, False)
        o, fs, saved = _ops.forward(*fwd, True, "chunkwise", 64, "chunk_states")
        do, dfs = torch.randn_like(o), torch.randn_like(fs)

        def backward(states, cast, path):
            t = [cast(a) for a in (do, dfs, q, k, v, g, beta)]
            return _ops.backward(t[0], t[1], *t[2:7], None, None, cast(h0), None, None, 0.0,
                                 "k_first", False, False, False, path, 64, states)

        ref = backward(None, lambda a: a.double(), "reference")
        for label, states in (("fp32 states", saved),
                              ("bf16 states", saved.to(torch.bfloat16).to(torch.float32))):
            got = backward(states, lambda a: a, "chunkwise")
            print(f"{decay:8s} {label}: " +
                  "  ".join(f"{n} {rel(got[i], ref[i]):.2e}" for i, n in names.items()))


if __name__ == "__main__":
    main()
