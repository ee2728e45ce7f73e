"""Bad input raises before any kernel runs, with a message naming the argument and what is
allowed: ValueError for shapes, dtypes, devices, layouts, values and unsupported combinations (the
core's gdr::InvalidArgument, message intact), TypeError for Python-only type mistakes. Every
message of a call starts with the name of the function called, whichever layer finds the
problem."""

import re

import numpy as np
import pytest
import torch

import gdr
from gdr_testing import make_inputs


def _x(**kw):
    base = dict(B=2, T=10, Hk=2, Hv=4, Dk=8, Dv=8)
    base.update(kw)
    return make_inputs(**base)


def _call(x, **kw):
    return gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)


def test_heads_not_multiple():
    x = _x()
    x["v"] = torch.randn(2, 10, 3, 8)
    x["g"] = -torch.rand(2, 10, 3)
    x["beta"] = torch.rand(2, 10, 3)
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: v has 3 heads.*multiple of Hk=2"):
        _call(x)


@pytest.mark.parametrize("name,bad,pattern", [
    ("q", torch.randn(2, 10, 2, 7), r"(q|k) has shape .*Dk"),
    ("k", torch.randn(2, 11, 2, 8), r"k"),
    ("g", -torch.rand(2, 10, 5), r"g"),
    ("beta", torch.rand(2, 10), r"beta"),
    ("v", torch.randn(2, 10, 4, 8, 1), r"v has rank 5"),
])
def test_shape_errors_name_the_tensor(name, bad, pattern):
    x = _x()
    x[name] = bad
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: .*" + pattern) as e:
        _call(x)
    assert len(str(e.value)) > 20


def test_dtype_errors():
    x = _x()
    x["q"] = x["q"].to(torch.int32)
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: q .*int32"):
        _call(x)
    x = _x()
    x["k"] = x["k"].half()
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: k .*float16"):
        _call(x)
    x = _x()
    x["q"] = x["q"].to(torch.complex64)
    with pytest.raises(ValueError, match=r"q has dtype complex64"):
        _call(x)


def test_initial_state_rows_and_layout():
    x = _x(h0=True)
    # The core calls the initial state h0 (docs/operator.md §1); its message is passed on unchanged.
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: h0 has shape .*N is 2, got 1"):
        _call(x, initial_state=x["initial_state"][:1])
    with pytest.raises(ValueError, match=r"state_layout is 'x_first'; allowed: 'k_first', "
                                         r"'v_first'"):
        _call(x, initial_state=x["initial_state"], state_layout="x_first")


def test_last_dim_not_contiguous_is_refused_by_the_raw_operator():
    x = _x()
    q = torch.randn(2, 10, 8, 2).transpose(-1, -2)  # stride(-1) == 2
    with pytest.raises(ValueError, match=r"^gdr\.forward: q .*(contiguous|stride)"):
        torch.ops.gdr.forward(q, x["k"], x["v"], x["g"], x["beta"], None, None, None, None, None,
                              0.3, "k_first", False, False, False, False, "auto", 64)
    # the FLA-style function makes such tensors contiguous, as FLA's input guard does
    o, _ = _call(dict(x, q=q))
    assert o.shape == (2, 10, 4, 8)


def test_cu_seqlens_errors():
    x = _x(B=1)
    for cu, pat in ([[0, 5, 3, 10], r"cu_seqlens"], [[1, 10], r"cu_seqlens"],
                    [[0, 4, 9], r"cu_seqlens"]):
        with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: .*" + pat):
            _call(x, cu_seqlens=torch.tensor(cu))
    with pytest.raises(ValueError, match=r"cu_seqlens has dtype torch.float32"):
        _call(x, cu_seqlens=torch.tensor([0.0, 10.0]))
    x = _x(B=2)
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: .*"):
        _call(x, cu_seqlens=torch.tensor([0, 10]))


def test_mask_shape():
    x = _x()
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: mask"):
        _call(x, mask=torch.ones(2, 9, dtype=torch.bool))


def test_path_and_chunk_size():
    x = _x()
    with pytest.raises(ValueError, match=r"path is 'fast'; allowed"):
        _call(x, path="fast")
    with pytest.raises(ValueError, match=r"chunk_size is 48; supported: 16, 32, 64"):
        _call(x, chunk_size=48, path="chunkwise")


def test_gate_in_kernel_needs_both():
    x = _x()
    with pytest.raises(ValueError, match=r"A_log .* dt_bias"):
        _call(x, A_log=torch.zeros(4))


def test_python_type_errors():
    x = _x()
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got list"):
        gdr.chunk_gated_delta_rule([1.0], x["k"], x["v"], x["g"], x["beta"])
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): foo"):
        _call(x, foo=1)
    with pytest.raises(TypeError, match=r"scale must be a float"):
        _call(x, scale="1")
    with pytest.raises(ValueError, match=r"head_first=True is not supported"):
        _call(x, head_first=True)
    with pytest.raises(ValueError, match=r"gv \(a per-value gate\) is not supported"):
        gdr.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], gv=x["v"])


def test_decode_errors():
    x = _x(T=1)
    state = torch.zeros(2, 4, 8, 8)
    with pytest.raises(ValueError, match=r"^gdr\.decode_step: state"):
        gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], state[:, :3])
    with pytest.raises(ValueError, match=r"^gdr\.decode_step: state"):
        gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], state.double())
    with pytest.raises(ValueError, match=r"^gdr\.decode_step: state_indices"):
        gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], state,
                        torch.tensor([0, 1, 2]))
    x = _x(T=17)
    with pytest.raises(ValueError, match=r"^gdr\.decode_step: .*17"):
        gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], state)


def test_cuda_tensors_without_cuda_build_or_mixed_devices():
    if gdr.cuda_available() and torch.cuda.is_available():
        x = _x()
        x["k"] = x["k"].cuda()
        with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: k .*cuda"):
            _call(x)
    elif torch.cuda.is_available():
        x = {k: t.cuda() for k, t in _x().items()}
        with pytest.raises(ValueError, match=r"no CUDA paths"):
            _call(x)
    else:
        pytest.skip("no CUDA device")


def test_numpy_arrays_reach_the_core_directly():
    # The binding takes any DLPack tensor; numpy inputs and outputs work without torch.
    x = _x()
    n = {k: t.numpy() for k, t in x.items()}
    o = np.full((2, 10, 4, 8), np.nan, dtype=np.float32)
    gdr._C.forward(n["q"], n["k"], n["v"], n["g"], n["beta"], None, None, None, None, None, o,
                   None)
    ref, _ = _call(x)
    np.testing.assert_allclose(o, ref.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=re.escape("gdr.forward: q is a 0-d tensor")):
        gdr._C.forward(np.array(1.0, dtype=np.float32), n["k"], n["v"], n["g"], n["beta"], None,
                       None, None, None, None, o, None)


# ---- one prefix per call ----------------------------------------------------------------------


def test_every_message_of_a_call_starts_with_its_name():
    # Checks of the Python layer, of the binding (strings) and of the core (shapes, chunk size)
    # all start with the function the caller called.
    x = _x()
    cases = [
        dict(path="fast"),                                   # binding: path
        dict(state_layout="x_first"),                        # binding: state_layout
        dict(chunk_size=48, path="chunkwise"),               # core: dispatch
        dict(cu_seqlens=torch.tensor([0.0, 10.0])),          # Python layer
        dict(initial_state=torch.zeros(1, 4, 8, 8)),         # core: validation
    ]
    for kw in cases:
        with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: "):
            _call(x, **kw)
        if "chunk_size" not in kw:
            with pytest.raises(ValueError, match=r"^gdr\.fused_recurrent_gated_delta_rule: "):
                gdr.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"],
                                                     beta=x["beta"], **kw)
    # Training: the saved tensor is sized by the core before the call, under the same name.
    xg = {k: t.requires_grad_() for k, t in _x().items()}
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: chunk_size is 48"):
        _call(xg, chunk_size=48)
    # The raw operators keep their own names.
    with pytest.raises(ValueError, match=r"^gdr\.forward: path is 'fast'"):
        torch.ops.gdr.forward(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, None, None,
                              None, 0.0, "k_first", False, False, False, False, "fast", 64)


# ---- g > 0 (docs/operator.md §6) -----------------------------------------------------------------


def test_positive_gate_is_refused_with_index_and_value():
    x = _x()
    x["g"][1, 3, 2] = 0.25
    pattern = (r"^gdr\.chunk_gated_delta_rule: g\[1, 3, 2\] is 0\.25; g must be <= 0: it is "
               r"the natural log of the decay .*log-sigmoid")
    with pytest.raises(ValueError, match=pattern):
        _call(x)
    with pytest.raises(ValueError, match=r"^gdr\.fused_recurrent_gated_delta_rule: g\[1, 3, 2\]"):
        gdr.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], beta=x["beta"])
    # per-key gate, bfloat16
    x = _x()
    g = -torch.rand(2, 10, 4, 8)
    g[0, 9, 3, 7] = 1.0
    with pytest.raises(ValueError, match=r"g\[0, 9, 3, 7\] is 1;"):
        _call({**x, "g": g.bfloat16(), "q": x["q"].bfloat16(), "k": x["k"].bfloat16(),
               "v": x["v"].bfloat16(), "beta": x["beta"].bfloat16()})
    # decode
    x = _x(T=1)
    x["g"][1, 0, 0] = 3.0
    with pytest.raises(ValueError, match=r"^gdr\.decode_step: g\[1, 0, 0\] is 3;"):
        gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], torch.zeros(2, 4, 8, 8))


def test_minus_inf_and_nan_gates_are_not_refused():
    x = _x()
    x["g"][0, 2, 1] = float("-inf")
    o, _ = _call(x, path="sequential")
    assert torch.isfinite(o).all()  # exact decay to 0
    x["g"][1, 4, 0] = float("nan")
    o, _ = _call(x, path="sequential", check_values=True)
    assert torch.isnan(o[1]).any()  # NaN passes through
    assert torch.isfinite(o[0]).all()


def test_raw_gate_in_kernel_is_not_checked():
    x = _x()
    a = torch.randn(2, 10, 4).abs()  # raw a > 0 everywhere
    o, _ = _call({**x, "g": a}, A_log=torch.zeros(4), dt_bias=torch.zeros(4))
    assert torch.isfinite(o).all()
