"""GDR_OVERRIDES (gdr/decode_overrides.h parse_decode_overrides): the module reads the variable
once, on its first call, so each case runs in a fresh interpreter. A bad value raises ValueError
naming the function called, the variable and the item; a good one leaves the CPU paths (which
ignore the CUDA overrides) bit for bit as they are."""

import os
import subprocess
import sys

import pytest

_PROGRAM = r"""
import sys, torch, gdr
torch.manual_seed(7)
q = torch.randn(1, 70, 2, 16)
k = torch.nn.functional.normalize(torch.randn(1, 70, 2, 16), dim=-1)
v = torch.randn(1, 70, 2, 16)
g = -0.2 * torch.rand(1, 70, 2)
beta = torch.rand(1, 70, 2)
try:
    o, s = gdr.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
except ValueError as e:
    print("ValueError:", e)
    sys.exit(3)
torch.save((o, s), sys.argv[1])
"""


def _run(tmp_path, name, spec):
    env = dict(os.environ)
    env.pop("GDR_OVERRIDES", None)
    if spec is not None:
        env["GDR_OVERRIDES"] = spec
    out = tmp_path / (name + ".pt")
    p = subprocess.run([sys.executable, "-c", _PROGRAM, str(out)], env=env, capture_output=True,
                       text=True, timeout=120)
    return p, out


def test_bad_value_names_the_call_and_the_item(tmp_path):
    p, _ = _run(tmp_path, "bad", "chunked_state_pas=3")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "gdr.chunk_gated_delta_rule: GDR_OVERRIDES: no field 'chunked_state_pas'" in p.stdout
    assert "chunked_state_pass" in p.stdout  # the fields it knows


def test_good_value_leaves_the_cpu_results(tmp_path):
    import torch

    p0, out0 = _run(tmp_path, "rules", None)
    p1, out1 = _run(tmp_path, "forced", "chunked_state_pass=3,chunked_prep=3")
    assert p0.returncode == 0, p0.stdout + p0.stderr
    assert p1.returncode == 0, p1.stdout + p1.stderr
    (o0, s0), (o1, s1) = torch.load(out0), torch.load(out1)
    assert torch.equal(o0, o1) and torch.equal(s0, s1)
