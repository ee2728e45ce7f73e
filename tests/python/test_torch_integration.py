"""torch.library integration: opcheck of every operator, gradcheck in float64 on the CPU paths,
and torch.compile(fullgraph=True) against eager."""

import pytest
import torch

import gdr
from gdr_testing import make_inputs, rel_err

SMALL = dict(B=1, T=20, Hk=1, Hv=2, Dk=4, Dv=3)


def _forward_args(x, *, A_log=None, dt_bias=None, mask=None, cu=None, layout="k_first",
                  gate_in_kernel=False, beta_sigmoid=False, l2=False, ofs=True, path="auto",
                  chunk=16):
    scale = x["q"].shape[-1] ** -0.5
    return (x["q"], x["k"], x["v"], x["g"], x["beta"], A_log, dt_bias, x.get("initial_state"),
            mask, cu, scale, layout, gate_in_kernel, beta_sigmoid, l2, ofs, path, chunk)


# ---- opcheck -------------------------------------------------------------------------------------

OPCHECK_CASES = {
    "scalar_h0": dict(gate="scalar", h0=True),
    "perkey": dict(gate="per_key", h0=False),
}


@pytest.mark.parametrize("case", list(OPCHECK_CASES))
@pytest.mark.parametrize("path", ["sequential", "chunkwise"])
def test_opcheck_forward(case, path):
    x = make_inputs(**SMALL, **OPCHECK_CASES[case])
    for t in x.values():
        t.requires_grad_()
    torch.library.opcheck(torch.ops.gdr.forward.default, _forward_args(x, path=path))


def test_opcheck_forward_fused_options_and_varlen():
    x = make_inputs(B=1, T=20, Hk=1, Hv=2, Dk=4, Dv=3, h0=True, N=3)
    x["A_log"] = torch.rand(2)
    x["dt_bias"] = torch.rand(2)
    leaves = {k: t.requires_grad_() for k, t in x.items()}
    cu = torch.tensor([0, 5, 5, 20], dtype=torch.int64)
    torch.library.opcheck(torch.ops.gdr.forward.default, _forward_args(
        leaves, A_log=leaves["A_log"], dt_bias=leaves["dt_bias"], cu=cu, gate_in_kernel=True,
        beta_sigmoid=True, l2=True))


def test_opcheck_forward_mask_vfirst_no_final_state():
    x = make_inputs(**SMALL, h0=True, state_layout="v_first")
    mask = torch.rand(1, 20) > 0.3
    torch.library.opcheck(torch.ops.gdr.forward.default,
                          _forward_args(x, mask=mask, layout="v_first", ofs=False))


@pytest.mark.parametrize("content", ["chunk_states", "chunk_intermediates"])
@pytest.mark.parametrize("varlen", [False, True])
def test_opcheck_forward_saved_for_backward(varlen, content):
    # save_for_backward: the third output is the chunkwise path's saved tensor (its fake shape
    # comes from the shapes alone, varlen included).
    x = make_inputs(**SMALL, h0=not varlen)
    for t in x.values():
        t.requires_grad_()
    cu = torch.tensor([0, 3, 3, 20], dtype=torch.int32) if varlen else None
    torch.library.opcheck(torch.ops.gdr.forward.default,
                          _forward_args(x, cu=cu, path="chunkwise") + (content,))


@pytest.mark.parametrize("saved", ["none", "chunk_states", "chunk_intermediates"])
def test_opcheck_backward(saved):
    x = make_inputs(**SMALL, h0=True)
    o, fs, kept = torch.ops.gdr.forward(*_forward_args(x), saved)
    args = (torch.randn_like(o), torch.randn_like(fs)) + _forward_args(x)[:10] + \
        (x["q"].shape[-1] ** -0.5, "k_first", False, False, False, "auto", 16)
    torch.library.opcheck(torch.ops.gdr.backward.default,
                          args + ((kept,) if saved != "none" else ()))


@pytest.mark.parametrize("indices", [False, True])
def test_opcheck_decode(indices):
    x = make_inputs(B=3, T=2, Hk=1, Hv=2, Dk=4, Dv=3)
    state = torch.randn(5, 2, 4, 3)
    idx = torch.tensor([4, -1, 0], dtype=torch.int32) if indices else None
    torch.library.opcheck(torch.ops.gdr.decode_.default, (
        x["q"], x["k"], x["v"], x["g"], x["beta"], state, idx, None, None, None, 0.5, "k_first",
        False, False, False))


# ---- gradcheck (float64, CPU paths) --------------------------------------------------------------

GRADCHECK_CASES = {
    "scalar_h0": dict(make=dict(gate="scalar", h0=True)),
    "perkey_h0_strong": dict(make=dict(gate="per_key", h0=True, decay="strong")),
    "mask": dict(make=dict(h0=True), mask=True),
    "varlen": dict(make=dict(h0=True, N=3), cu=[0, 7, 7, 20]),
    "fused": dict(make=dict(h0=True), fused=True),
    "v_first": dict(make=dict(h0=True, state_layout="v_first"), layout="v_first"),
}


@pytest.mark.parametrize("path", ["reference", "sequential", "chunkwise"])
@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck_float64(case, path):
    spec = GRADCHECK_CASES[case]
    x = make_inputs(**SMALL, **spec["make"], dtype=torch.float64)
    kw = dict(state_layout=spec.get("layout", "k_first"), path=path, chunk_size=16)
    if spec.get("mask"):
        kw["mask"] = torch.rand(1, 20) > 0.3
    if "cu" in spec:
        kw["cu_seqlens"] = torch.tensor(spec["cu"], dtype=torch.int32)
    if spec.get("fused"):
        x["A_log"] = torch.rand(2, dtype=torch.float64)
        x["dt_bias"] = torch.rand(2, dtype=torch.float64)
        x["g"] = torch.randn_like(x["g"])
        kw.update(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    else:  # gdr refuses g > 0: keep every g at least 100 steps of eps below 0
        x["g"] = x["g"].clamp(max=-1e-4)
    names = list(x)
    inputs = tuple(x[n].clone().requires_grad_() for n in names)

    def fn(*ts):
        d = dict(zip(names, ts))
        o, fs = gdr.chunk_gated_delta_rule(
            d["q"], d["k"], d["v"], d["g"], d["beta"], initial_state=d.get("initial_state"),
            output_final_state=True, A_log=d.get("A_log"), dt_bias=d.get("dt_bias"), **kw)
        return o, fs

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_fused_recurrent_gradcheck_float64():
    x = make_inputs(**SMALL, h0=True, dtype=torch.float64)
    gk = -torch.rand(1, 20, 2, 4, dtype=torch.float64) * 0.5 - 1e-4  # <= 0 within eps steps too
    x["g"] = x["g"].clamp(max=-1e-4)
    inputs = (x["q"], x["k"], x["v"], x["g"], gk, x["beta"], x["initial_state"])
    inputs = tuple(t.clone().requires_grad_() for t in inputs)

    def fn(q, k, v, g, gk, beta, h0):
        return gdr.fused_recurrent_gated_delta_rule(q, k, v, g=g, gk=gk, beta=beta,
                                                    initial_state=h0, output_final_state=True)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


# ---- torch.compile -------------------------------------------------------------------------------


class TinyMixer(torch.nn.Module):
    def __init__(self, d=32, hk=2, hv=4, dk=8, dv=8):
        super().__init__()
        self.hk, self.hv, self.dk, self.dv = hk, hv, dk, dv
        self.qkv = torch.nn.Linear(d, 2 * hk * dk + hv * dv)
        self.ab = torch.nn.Linear(d, 2 * hv)
        self.A_log = torch.nn.Parameter(torch.zeros(hv))
        self.dt_bias = torch.nn.Parameter(torch.zeros(hv))
        self.out = torch.nn.Linear(hv * dv, d)

    def forward(self, x, h0):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], -1)
        a, bb = self.ab(x).chunk(2, -1)
        q = q.reshape(b, t, self.hk, self.dk)
        k = k.reshape(b, t, self.hk, self.dk)
        v = v.reshape(b, t, self.hv, self.dv)
        o, fs = gdr.chunk_gated_delta_rule(q, k, v, a.contiguous(), bb.contiguous(),
                                           initial_state=h0, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True, A_log=self.A_log,
                                           dt_bias=self.dt_bias, use_beta_sigmoid_in_kernel=True)
        o2, _ = gdr.fused_recurrent_gated_delta_rule(q, k, v, g=torch.zeros_like(a), beta=None,
                                                     initial_state=fs,
                                                     use_qk_l2norm_in_kernel=True)
        return self.out((o + o2).reshape(b, t, -1)), fs


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    m = TinyMixer()
    x = torch.randn(2, 40, 32)
    h0 = torch.randn(2, 4, 8, 8, requires_grad=True)
    y_e, fs_e = m(x, h0)
    (y_e.square().sum() + fs_e.sum()).backward()
    grads_e = [p.grad.clone() for p in m.parameters()] + [h0.grad.clone()]
    m.zero_grad()
    h0.grad = None
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    y_c, fs_c = cm(x, h0)
    (y_c.square().sum() + fs_c.sum()).backward()
    grads_c = [p.grad for p in m.parameters()] + [h0.grad]
    assert rel_err(y_c, y_e) < 1e-6 and rel_err(fs_c, fs_e) < 1e-6
    for ge, gc in zip(grads_e, grads_c):
        assert rel_err(gc, ge) < 1e-6


def test_torch_compile_inductor_forward():
    torch.manual_seed(1)
    m = TinyMixer()
    x = torch.randn(1, 24, 32)
    h0 = torch.randn(1, 4, 8, 8)
    with torch.no_grad():
        y_e, fs_e = m(x, h0)
        y_c, fs_c = torch.compile(m, fullgraph=True)(x, h0)
    assert rel_err(y_c, y_e) < 1e-5 and rel_err(fs_c, fs_e) < 1e-6


def test_decode_step_under_compile_mutates_state():
    x = make_inputs(B=2, T=1, Hk=1, Hv=2, Dk=8, Dv=8)
    pool = torch.randn(3, 2, 8, 8)
    idx = torch.tensor([2, 0])
    pool_e = pool.clone()
    o_e = gdr.decode_step(x["q"], x["k"], x["v"], x["g"], x["beta"], pool_e, idx)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v, g, beta, state, idx):
        return gdr.decode_step(q, k, v, g, beta, state, idx) * 2.0

    pool_c = pool.clone()
    o_c = step(x["q"], x["k"], x["v"], x["g"], x["beta"], pool_c, idx)
    assert rel_err(o_c, 2.0 * o_e) < 1e-6
    assert torch.equal(pool_c, pool_e)
    assert torch.equal(pool_c[1], pool[1])  # an unused row is untouched
