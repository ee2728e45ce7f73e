"""Forward and gradients of gdr's operators against the float64 recurrence (docs/operator.md §7).

fp32 inputs through each CPU path; the oracle is the plain PyTorch float64 recurrence of
gdr_testing.torch_reference, differentiated by autograd. o and the final state must be within
1e-5, every gradient within 1e-4 (relative Frobenius error). Fresh random inputs every run.
"""

import pytest
import torch

import gdr
from gdr_testing import TOL_FWD, TOL_GRAD, make_inputs, rel_err, torch_reference

PATHS = ["reference", "sequential", "chunkwise", "auto"]

# Named corner cases (docs/operator.md §7): T around the chunk, GQA, both gates, decays, h0, mask,
# varlen with an empty sequence, the fused options, the v-first layout, Dk != Dv.
CASES = {
    "T1": dict(B=2, T=1, Hk=2, Dk=16, Dv=16),
    "T63_gqa4_strong_h0": dict(B=1, T=63, Hk=1, Hv=4, Dk=16, Dv=16, decay="strong", h0=True),
    "T64_perkey_h0": dict(B=2, T=64, Hk=2, Dk=16, Dv=16, gate="per_key", h0=True),
    "T65_perkey_strong": dict(B=1, T=65, Hk=2, Dk=16, Dv=8, gate="per_key", decay="strong"),
    "T200_extreme_d64": dict(B=1, T=200, Hk=1, Dk=64, Dv=64, decay="extreme", h0=True),
    "T130_d64_gqa2": dict(B=1, T=130, Hk=1, Hv=2, Dk=64, Dv=32, h0=True),
    "mask": dict(B=2, T=70, Hk=2, Dk=16, Dv=16, h0=True, mask=True),
    "varlen_empty_seq": dict(B=1, T=90, Hk=2, Dk=16, Dv=16, h0=True, cu=[0, 17, 17, 90]),
    "fused_opts": dict(B=2, T=40, Hk=2, Hv=4, Dk=16, Dv=16, fused=True, h0=True),
    "fused_perkey": dict(B=1, T=40, Hk=2, Dk=16, Dv=16, gate="per_key", fused=True),
    "v_first": dict(B=2, T=50, Hk=2, Dk=16, Dv=8, h0=True, layout="v_first"),
}


def _setup(case, dtype=torch.float32):
    c = dict(case)
    mask = c.pop("mask", False)
    cu = c.pop("cu", None)
    fused = c.pop("fused", False)
    layout = c.pop("layout", "k_first")
    n = len(cu) - 1 if cu is not None else None
    x = make_inputs(**c, dtype=dtype, N=n, state_layout=layout)
    extra = dict(state_layout=layout)
    if mask:
        m = torch.rand(c["B"], c["T"]) > 0.3
        m[:, 0] = False
        extra["mask"] = m
    if cu is not None:
        extra["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    if fused:
        hv = x["v"].shape[2]
        fdt = torch.float64 if dtype == torch.float64 else torch.float32
        x["g"] = torch.randn(x["g"].shape, dtype=fdt)  # raw `a`
        x["beta"] = torch.randn(x["beta"].shape, dtype=fdt)  # raw `b`
        x["A_log"] = torch.rand(hv, dtype=fdt) * 1.5 - 1.0
        dk = x["k"].shape[-1]
        x["dt_bias"] = torch.randn((hv,) if x["g"].dim() == 3 else (hv, dk), dtype=fdt) * 0.5
        x["q"] = x["q"] * 3.0  # make the in-kernel L2 norm matter
        extra.update(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    return x, extra


def _ref(x, extra):
    return torch_reference(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x.get("initial_state"),
        cu_seqlens=extra.get("cu_seqlens"), mask=extra.get("mask"),
        use_qk_l2norm=extra.get("use_qk_l2norm_in_kernel", False), A_log=x.get("A_log"),
        dt_bias=x.get("dt_bias"), beta_sigmoid=extra.get("use_beta_sigmoid_in_kernel", False),
        state_layout=extra["state_layout"])


def _gdr(x, extra, path, chunk_size=64, save=False):
    return gdr.chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x.get("initial_state"),
        output_final_state=True, cu_seqlens=extra.get("cu_seqlens"), mask=extra.get("mask"),
        use_qk_l2norm_in_kernel=extra.get("use_qk_l2norm_in_kernel", False),
        A_log=x.get("A_log"), dt_bias=x.get("dt_bias"),
        use_beta_sigmoid_in_kernel=extra.get("use_beta_sigmoid_in_kernel", False),
        state_layout=extra["state_layout"], path=path, chunk_size=chunk_size,
        save_chunk_intermediates=save)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_gradients_match_float64(name, path):
    x, extra = _setup(CASES[name])
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    # chunkwise: the opt-in chunk intermediates; auto: the default chunk states (both saved).
    o, fs = _gdr(leaves, extra, path, save=path == "chunkwise")
    assert o.dtype == x["q"].dtype and fs.dtype == torch.float32
    ref_leaves = {k: t.detach().double().requires_grad_() for k, t in x.items()}
    o_ref, fs_ref = _ref(ref_leaves, extra)
    assert rel_err(o, o_ref) < TOL_FWD, f"o: {rel_err(o, o_ref):.3e}"
    assert rel_err(fs, fs_ref) < TOL_FWD, f"final_state: {rel_err(fs, fs_ref):.3e}"

    w_o = torch.randn(o.shape, dtype=torch.float64)
    w_s = torch.randn(fs.shape, dtype=torch.float64)
    ((o.double() * w_o).sum() + (fs.double() * w_s).sum()).backward()
    ((o_ref * w_o).sum() + (fs_ref * w_s).sum()).backward()
    for key in x:
        got, want = leaves[key].grad, ref_leaves[key].grad
        assert got is not None, f"no gradient for {key}"
        assert got.dtype == x[key].dtype and got.shape == x[key].shape
        err = rel_err(got, want)
        assert err < TOL_GRAD, f"d{key}: {err:.3e}"


@pytest.mark.parametrize("name", ["T63_gqa4_strong_h0", "T64_perkey_h0", "varlen_empty_seq",
                                  "mask", "fused_opts"])
def test_gdr_reference_path_equals_torch_recurrence_float64(name):
    # Both oracles in float64 must agree to rounding.
    x, extra = _setup(CASES[name], dtype=torch.float64)
    o, fs = _gdr(x, extra, "reference")
    o_ref, fs_ref = _ref(x, extra)
    assert o.dtype == torch.float64
    assert rel_err(o, o_ref) < 1e-12
    assert rel_err(fs, fs_ref) < 1e-12


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_chunk_sizes(chunk_size):
    x, extra = _setup(dict(B=1, T=100, Hk=2, Dk=16, Dv=16, gate="per_key", h0=True))
    o, fs = _gdr(x, extra, "chunkwise", chunk_size)
    o_ref, fs_ref = _ref(x, extra)
    assert rel_err(o, o_ref) < TOL_FWD and rel_err(fs, fs_ref) < TOL_FWD


def test_empty_sequence_returns_empty_and_keeps_state():
    x = make_inputs(B=2, T=0, Hk=2, Dk=16, Dv=16, h0=True)
    o, fs = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                       initial_state=x["initial_state"], output_final_state=True)
    assert o.shape == (2, 0, 2, 16)
    assert torch.equal(fs, x["initial_state"])


def test_nan_input_propagates():
    x = make_inputs(B=1, T=20, Hk=1, Dk=16, Dv=16)
    x["v"][0, 5, 0, 3] = float("nan")
    o, _ = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      output_final_state=True)
    assert not torch.isnan(o[0, :5]).any()
    assert torch.isnan(o[0, 5:]).any()


@pytest.mark.parametrize("path", ["sequential", "chunkwise"])
def test_bfloat16_inputs(path):
    # bf16 q/k/v, fp32 gates; the CPU computes in fp32, so the bar is the bf16 one (5e-3).
    x = make_inputs(B=1, T=70, Hk=2, Dk=32, Dv=32, h0=True, dtype=torch.bfloat16)
    o, fs = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                       initial_state=x["initial_state"], output_final_state=True,
                                       path=path)
    assert o.dtype == torch.bfloat16
    o_ref, fs_ref = torch_reference(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    initial_state=x["initial_state"])
    assert rel_err(o, o_ref) < 5e-3 and rel_err(fs, fs_ref) < 5e-3


def test_low_precision_initial_state_is_upcast():
    # FLA callers sometimes pass a bf16 h0; gdr keeps states in fp32 and upcasts it.
    x = make_inputs(B=2, T=10, Hk=1, Dk=8, Dv=8, h0=True)
    h0 = x["initial_state"].bfloat16().requires_grad_()
    o, fs = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                       initial_state=h0, output_final_state=True)
    # (an fp32 h0 that requires grad as well: the same training-mode path, saved tensor and all)
    o32, fs32 = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                           initial_state=h0.detach().float().requires_grad_(),
                                           output_final_state=True)
    assert fs.dtype == torch.float32 and torch.equal(o, o32) and torch.equal(fs, fs32)
    fs.sum().backward()
    assert h0.grad is not None and h0.grad.dtype == torch.bfloat16


# ---- the saved-for-backward tensor (CPU chunkwise training path) ---------------------------------

SAVED_CASES = ["T1", "T63_gqa4_strong_h0", "T64_perkey_h0", "T200_extreme_d64", "mask",
               "varlen_empty_seq", "fused_opts", "fused_perkey", "v_first"]


def _op_args(x, extra, chunk_size):
    return (x["q"], x["k"], x["v"], x["g"], x["beta"], x.get("A_log"), x.get("dt_bias"),
            x.get("initial_state"), extra.get("mask"), extra.get("cu_seqlens"),
            x["q"].shape[-1] ** -0.5, extra["state_layout"], "A_log" in x,
            extra.get("use_beta_sigmoid_in_kernel", False),
            extra.get("use_qk_l2norm_in_kernel", False), True, "chunkwise", chunk_size)


@pytest.mark.parametrize("content", ["chunk_states", "chunk_intermediates"])
@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("name", SAVED_CASES)
def test_op_backward_with_saved_tensor_matches_float64(name, chunk_size, content):
    # torch.ops.gdr.forward fills the saved tensor (poisoned with NaN by a first call that must
    # overwrite it); torch.ops.gdr.backward reads it. o, final state and every gradient against
    # the float64 recurrence.
    from gdr import _ops
    x, extra = _setup(CASES[name])
    args = _op_args(x, extra, chunk_size)
    o, fs, saved = torch.ops.gdr.forward(*args, content)
    cu = extra.get("cu_seqlens")
    n = len(cu) - 1 if cu is not None else x["q"].shape[0]
    # The documented shape (include/gdr/problem.h, SavedShape), worked out here.
    B, T, _, Dk = x["q"].shape
    Hv, Dv, C = x["v"].shape[2], x["v"].shape[3], chunk_size
    rows = (T + n * (C - 1)) // C if cu is not None else B * -(-T // C)
    record = Dk * Dv + (C * C + C * Dv if content == "chunk_intermediates" else 0)
    assert tuple(saved.shape) == (rows, Hv, record)
    assert _ops.saved_shape(x["q"], x["k"], x["v"], cu, chunk_size, content) == (rows, Hv, record)
    assert saved.dtype == torch.float32
    ref_leaves = {k: t.detach().double().requires_grad_() for k, t in x.items()}
    o_ref, fs_ref = _ref(ref_leaves, extra)
    assert rel_err(o, o_ref) < TOL_FWD and rel_err(fs, fs_ref) < TOL_FWD
    do, dfs = torch.randn_like(o), torch.randn_like(fs)
    grads = torch.ops.gdr.backward(do, dfs, *args[:10], *args[10:15], "chunkwise", chunk_size,
                                   saved)
    ((o_ref * do.double()).sum() + (fs_ref * dfs.double()).sum()).backward()
    names = ["q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"]
    for key, got in zip(names, grads):
        if key not in x:
            continue
        err = rel_err(got, ref_leaves[key].grad)
        assert err < TOL_GRAD, f"d{key}: {err:.3e}"
    # The backward reads the tensor: a poisoned copy poisons dq (dq = scale e .* (dO S^T) + ...,
    # S the state entering the chunk, read from it).
    bad = torch.ops.gdr.backward(do, dfs, *args[:10], *args[10:15], "chunkwise", chunk_size,
                                 torch.full_like(saved, float("nan")))
    assert torch.isnan(bad[0]).any()


def test_op_refuses_an_unknown_saved_content():
    x, extra = _setup(CASES["T1"])
    with pytest.raises(ValueError, match="save_for_backward is 'states'; allowed: 'none', "
                                         "'chunk_states', 'chunk_intermediates'"):
        torch.ops.gdr.forward(*_op_args(x, extra, 64), "states")


@pytest.mark.parametrize("path", ["auto", "chunkwise", "sequential"])
def test_autograd_keeps_the_saved_tensor_on_cpu_training_paths(path):
    # chunk_gated_delta_rule with inputs that require grad: autograd keeps the saved tensor for
    # the chunkwise and automatic paths (and gradients match), not for the per-token loop; by
    # default the chunk states (docs/operator.md §3), with save_chunk_intermediates=True the chunk
    # intermediates too.
    x, extra = _setup(dict(B=1, T=70, Hk=1, Hv=2, Dk=16, Dv=16, h0=True))
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    o_default, _ = _gdr(leaves, extra, path)
    kept_default = o_default.grad_fn.saved_tensors[-1]
    if path == "sequential":
        assert kept_default is None
    else:
        assert tuple(kept_default.shape) == (2, 2, 16 * 16)
    o, fs = _gdr(leaves, extra, path, save=True)
    kept = o.grad_fn.saved_tensors[-1]
    if path == "sequential":
        assert kept is None
    else:
        assert tuple(kept.shape) == (2, 2, 16 * 16 + 64 * 64 + 64 * 16)  # S | Tinv | Vnew
    (o.sum() + fs.sum()).backward()
    ref_leaves = {k: t.detach().double().requires_grad_() for k, t in x.items()}
    o_ref, fs_ref = _ref(ref_leaves, extra)
    (o_ref.sum() + fs_ref.sum()).backward()
    for key in x:
        assert rel_err(leaves[key].grad, ref_leaves[key].grad) < TOL_GRAD, key
    with torch.no_grad():
        o2, _ = _gdr(leaves, extra, path)
    assert o2.grad_fn is None and rel_err(o2, o) < TOL_FWD
