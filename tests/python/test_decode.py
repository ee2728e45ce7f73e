"""The decode-style operators: gdr.decode_step (state pool updated in place, per-row indices) and
gdr.fused_recurrent_gated_delta_rule (state in, final state out), against the float64
recurrence, and the step-by-step path against the chunked one."""

import pytest
import torch

import gdr
from gdr_testing import TOL_FWD, make_inputs, rel_err, torch_reference


@pytest.mark.parametrize("T", [1, 3, 16])
@pytest.mark.parametrize("gate", ["scalar", "per_key"])
@pytest.mark.parametrize("layout", ["k_first", "v_first"])
def test_decode_step_matches_reference(T, gate, layout):
    B, Hk, Hv, Dk, Dv = 3, 2, 4, 16, 8
    x = make_inputs(B=B, T=T, Hk=Hk, Hv=Hv, Dk=Dk, Dv=Dv, gate=gate, h0=True, N=B,
                    state_layout=layout, decay="strong")
    pool = torch.randn(6, *x["initial_state"].shape[1:])
    idx = torch.tensor([5, -1, 2], dtype=torch.int64)
    pool[5] = x["initial_state"][0]
    pool[2] = x["initial_state"][2]
    before = pool.clone()
    o = gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, idx,
                        state_layout=layout)
    o_ref, s_ref = torch_reference(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                   initial_state=x["initial_state"], state_layout=layout)
    for b, row in ((0, 5), (2, 2)):
        assert rel_err(o[b], o_ref[b]) < TOL_FWD
        assert rel_err(pool[row], s_ref[b]) < TOL_FWD
    assert torch.equal(o[1], torch.zeros_like(o[1]))  # skipped sequence: o written as 0
    for row in (0, 1, 3, 4):
        assert torch.equal(pool[row], before[row])  # rows no sequence uses stay as they were


@pytest.mark.parametrize("T", [1, 4])
def test_decode_step_bf16_pool(T):
    # A bfloat16 pool: the step starts from its rounded rows, computes in fp32 and stores the
    # new rows rounded to nearest even: the float64 recurrence's state rounded to bf16, up to the
    # elements whose fp32 value lies across a rounding boundary from it (one bf16 step each).
    x = make_inputs(B=2, T=T, Hk=2, Hv=2, Dk=16, Dv=16, h0=True, decay="strong")
    pool = x["initial_state"].to(torch.bfloat16)
    h0 = pool.float()
    o = gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], pool)
    o_ref, s_ref = torch_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0)
    assert pool.dtype == torch.bfloat16
    assert rel_err(o, o_ref) < TOL_FWD
    assert rel_err(pool.float(), s_ref.to(torch.bfloat16).float()) < 5e-4
    assert rel_err(pool.float(), s_ref) > 0  # (rounded)


def test_decode_step_mask_and_fused_options():
    B, T, H, D = 2, 4, 2, 16
    x = make_inputs(B=B, T=T, Hk=H, Dk=D, Dv=D, h0=True)
    a = torch.randn(B, T, H)
    b = torch.randn(B, T, H)
    A_log, dt_bias = torch.rand(H), torch.rand(H)
    mask = torch.tensor([[True, False, True, True], [False, True, True, False]])
    state = x["initial_state"].clone()
    o = gdr.decode_step(x["q"] * 2, x["k"] * 3, x["v"], a, b, state, mask=mask,
                        use_qk_l2norm_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                        use_beta_sigmoid_in_kernel=True)
    o_ref, s_ref = torch_reference(x["q"] * 2, x["k"] * 3, x["v"], a, b,
                                   initial_state=x["initial_state"], mask=mask,
                                   use_qk_l2norm=True, A_log=A_log, dt_bias=dt_bias,
                                   beta_sigmoid=True)
    assert rel_err(o, o_ref) < TOL_FWD and rel_err(state, s_ref) < TOL_FWD


@pytest.mark.parametrize("gate", ["scalar", "per_key"])
def test_fused_recurrent_matches_reference_and_chunk(gate):
    x = make_inputs(B=2, T=50, Hk=1, Hv=2, Dk=16, Dv=16, gate=gate, h0=True)
    kw = dict(g=x["g"]) if gate == "scalar" else dict(gk=x["g"])
    o, fs = gdr.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], beta=x["beta"],
                                                 initial_state=x["initial_state"],
                                                 output_final_state=True, **kw)
    o_ref, s_ref = torch_reference(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                   initial_state=x["initial_state"])
    assert rel_err(o, o_ref) < TOL_FWD and rel_err(fs, s_ref) < TOL_FWD
    o_c, fs_c = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                           initial_state=x["initial_state"],
                                           output_final_state=True, path="chunkwise")
    assert rel_err(o_c, o) < 2 * TOL_FWD and rel_err(fs_c, fs) < 2 * TOL_FWD


def test_fused_recurrent_defaults_and_g_plus_gk():
    x = make_inputs(B=1, T=12, Hk=2, Dk=8, Dv=8, gate="per_key")
    # beta None -> 1; g and gk both None -> no decay
    o, fs = gdr.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], output_final_state=True)
    ones = torch.ones(1, 12, 2)
    o_ref, s_ref = torch_reference(x["q"], x["k"], x["v"], torch.zeros(1, 12, 2), ones)
    assert rel_err(o, o_ref) < TOL_FWD and rel_err(fs, s_ref) < TOL_FWD
    g = -torch.rand(1, 12, 2) * 0.3
    o, _ = gdr.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g=g, gk=x["g"],
                                                beta=x["beta"])
    o_ref, _ = torch_reference(x["q"], x["k"], x["v"], g[..., None] + x["g"], x["beta"])
    assert rel_err(o, o_ref) < TOL_FWD


def test_no_final_state_unless_asked():
    x = make_inputs(B=1, T=5, Hk=1, Dk=8, Dv=8)
    o, fs = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert fs is None and o.shape == (1, 5, 1, 8)
    o, fs = gdr.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], beta=x["beta"])
    assert fs is None


def test_step_by_step_equals_chunked():
    # Feeding the tokens one at a time through decode_step gives the chunked result.
    x = make_inputs(B=2, T=40, Hk=2, Hv=4, Dk=16, Dv=16, h0=True)
    o_c, fs_c = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                           initial_state=x["initial_state"],
                                           output_final_state=True)
    state = x["initial_state"].clone()
    outs = []
    for t0 in range(0, 40, 8):
        sl = slice(t0, t0 + 8)
        outs.append(gdr.decode_step(x["q"][:, sl], x["k"][:, sl], x["v"][:, sl], x["g"][:, sl],
                                    x["beta"][:, sl], state))
    assert rel_err(torch.cat(outs, 1), o_c) < 2 * TOL_FWD
    assert rel_err(state, fs_c) < 2 * TOL_FWD
