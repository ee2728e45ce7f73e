"""The CUDA paths through the Python operators (skipped without a GPU or without a CUDA build):
forward (the chunked kernels through chunk_gated_delta_rule at T = 65, the recurrent kernel
through fused_recurrent_gated_delta_rule) and decode equal to the float64 CPU recurrence, on the current stream;
gradients of CUDA tensors (the CUDA chunked backward, through autograd) equal to the CPU ones."""

import pytest
import torch

import gdr
from gdr_testing import make_inputs, rel_err, torch_reference

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and gdr.cuda_available()),
    reason="needs a CUDA device and a CUDA build of gdr")

TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-3, torch.float16: 5e-3}


def _cuda(x):
    return {k: t.cuda() for k, t in x.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate", ["scalar", "per_key"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("layout", ["k_first", "v_first"])
def test_forward_matches_cpu_reference(dtype, gate, D, layout):
    x = make_inputs(B=2, T=65, Hk=2, Hv=4, Dk=D, Dv=D, gate=gate, h0=True, dtype=dtype,
                    decay="strong", state_layout=layout)
    xc = _cuda(x)
    o, fs = gdr.chunk_gated_delta_rule(xc["q"], xc["k"], xc["v"], xc["g"], xc["beta"],
                                       initial_state=xc["initial_state"], output_final_state=True,
                                       state_layout=layout)
    o2, fs2 = gdr.fused_recurrent_gated_delta_rule(
        xc["q"], xc["k"], xc["v"], **({"g": xc["g"]} if gate == "scalar" else {"gk": xc["g"]}),
        beta=xc["beta"], initial_state=xc["initial_state"], output_final_state=True,
        state_layout=layout)
    o_ref, fs_ref = torch_reference(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    initial_state=x["initial_state"], state_layout=layout)
    assert o.is_cuda and o.dtype == dtype
    for got_o, got_fs in ((o, fs), (o2, fs2)):
        assert rel_err(got_o.cpu(), o_ref) < TOL[dtype]
        assert rel_err(got_fs.cpu(), fs_ref) < TOL[dtype]


def test_forward_varlen_mask_fused_options():
    x = make_inputs(B=1, T=90, Hk=1, Hv=2, Dk=64, Dv=64, h0=True, N=3)
    cu = torch.tensor([0, 30, 30, 90], dtype=torch.int32)
    a, b = torch.randn(1, 90, 2), torch.randn(1, 90, 2)
    A_log, dt_bias = torch.rand(2), torch.rand(2)
    mask = torch.rand(1, 90) > 0.2
    xc = _cuda(x)
    o, fs = gdr.chunk_gated_delta_rule(
        xc["q"], xc["k"], xc["v"], a.cuda(), b.cuda(), initial_state=xc["initial_state"],
        output_final_state=True, cu_seqlens=cu.cuda(), mask=mask.cuda(),
        use_qk_l2norm_in_kernel=True, A_log=A_log.cuda(), dt_bias=dt_bias.cuda(),
        use_beta_sigmoid_in_kernel=True)
    o_ref, fs_ref = torch_reference(x["q"], x["k"], x["v"], a, b,
                                    initial_state=x["initial_state"], cu_seqlens=cu, mask=mask,
                                    use_qk_l2norm=True, A_log=A_log, dt_bias=dt_bias,
                                    beta_sigmoid=True)
    assert rel_err(o.cpu(), o_ref) < 1e-5 and rel_err(fs.cpu(), fs_ref) < 1e-5


@pytest.mark.parametrize("T", [1, 4])
def test_decode_step_pool_on_a_side_stream(T):
    x = make_inputs(B=3, T=T, Hk=2, Hv=4, Dk=128, Dv=128, h0=True)
    pool = torch.randn(5, 4, 128, 128)
    idx = torch.tensor([4, -1, 1])
    pool[4], pool[1] = x["initial_state"][0], x["initial_state"][2]
    pool_c, xc = pool.cuda(), _cuda(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        o = gdr.decode_step(xc["q"], xc["k"], xc["v"], xc["g"], xc["beta"], pool_c, idx.cuda())
    torch.cuda.current_stream().wait_stream(stream)
    o_ref, s_ref = torch_reference(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                   initial_state=x["initial_state"])
    o, pool_c = o.cpu(), pool_c.cpu()
    for b, row in ((0, 4), (2, 1)):
        assert rel_err(o[b], o_ref[b]) < 1e-5 and rel_err(pool_c[row], s_ref[b]) < 1e-5
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    for row in (0, 2, 3):
        assert torch.equal(pool_c[row], pool[row])


@pytest.mark.parametrize("T", [1, 4])
def test_decode_step_bf16_pool_cuda(T):
    # A bfloat16 pool (one token: the one-token kernel; four: the staged kernel): as on the CPU,
    # the pool equal to the float64 state rounded to bf16 up to elements across a rounding boundary.
    x = make_inputs(B=3, T=T, Hk=2, Hv=4, Dk=128, Dv=128, h0=True)
    pool = x["initial_state"].to(torch.bfloat16)
    h0 = pool.float()
    pool_c, xc = pool.cuda(), _cuda(x)
    o = gdr.decode_step(xc["q"], xc["k"], xc["v"], xc["g"], xc["beta"], pool_c)
    o_ref, s_ref = torch_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0)
    assert rel_err(o.cpu(), o_ref) < 1e-5
    assert rel_err(pool_c.cpu().float(), s_ref.to(torch.bfloat16).float()) < 5e-4


def _grads(x, dev, w, **kw):
    leaves = {k: t.to(dev).clone().requires_grad_() for k, t in x.items()}
    o, fs = gdr.chunk_gated_delta_rule(leaves["q"], leaves["k"], leaves["v"], leaves["g"],
                                       leaves["beta"], initial_state=leaves.get("initial_state"),
                                       output_final_state=True, **kw)
    ((o.float() * w.to(dev)).sum() + fs.sum()).backward()
    return leaves


# The CUDA chunked backward (no host copy, no warning) against the CPU path's gradients, through
# torch autograd; fp32 inputs (3xTF32) and bf16 (tf32 products).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gate", ["scalar", "per_key"])
@pytest.mark.parametrize("T", [40, 130])
def test_gradients_of_cuda_tensors_equal_cpu(dtype, gate, T):
    import warnings
    x = make_inputs(B=1, T=T, Hk=1, Hv=2, Dk=64, Dv=64, h0=True, gate=gate, decay="strong")
    x = {k: (t.to(dtype) if k in ("q", "k", "v") else t.float()) for k, t in x.items()}
    w = torch.randn(1, T, 2, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the host-copy warning is gone
        leaves_c = _grads(x, "cuda", w)
    leaves = _grads({k: t.double() for k, t in x.items()}, "cpu", w)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    for k in x:
        assert leaves_c[k].grad.is_cuda
        assert rel_err(leaves_c[k].grad.cpu().double(), leaves[k].grad) < tol, k


def test_gradients_cuda_empty_sequence():
    # T = 0: empty gradients, dh0 = the final state's upstream gradient (the state passes through).
    q = torch.randn(2, 0, 1, 64, device="cuda", requires_grad=True)
    k, v = torch.randn(2, 0, 1, 64, device="cuda"), torch.randn(2, 0, 2, 64, device="cuda")
    g, beta = -torch.rand(2, 0, 2, device="cuda"), torch.rand(2, 0, 2, device="cuda")
    h0 = torch.randn(2, 2, 64, 64, device="cuda", requires_grad=True)
    o, fs = gdr.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                       output_final_state=True)
    dfs = torch.randn_like(fs)
    (o.sum() + (fs * dfs).sum()).backward()
    assert q.grad.shape == q.shape
    assert torch.equal(h0.grad, dfs)


def test_gradients_cuda_varlen_fused_options():
    x = make_inputs(B=1, T=150, Hk=1, Hv=2, Dk=64, Dv=64, h0=True, N=3)
    cu = torch.tensor([0, 70, 70, 150], dtype=torch.int32)
    x["g"] = torch.randn(1, 150, 2, dtype=torch.float64)  # raw a (gate in kernel)
    x["beta"] = torch.randn(1, 150, 2, dtype=torch.float64)  # raw b (sigmoid)
    x["A_log"] = torch.rand(2, dtype=torch.float64)
    x["dt_bias"] = torch.rand(2, dtype=torch.float64)
    mask = torch.rand(1, 150) > 0.2
    w = torch.randn(1, 150, 2, 64)

    def run(dev, dt):
        leaves = {k: t.to(dev, dt).clone().requires_grad_() for k, t in x.items()}
        o, fs = gdr.chunk_gated_delta_rule(
            leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
            initial_state=leaves["initial_state"], output_final_state=True,
            cu_seqlens=cu.to(dev), mask=mask.to(dev), use_qk_l2norm_in_kernel=True,
            A_log=leaves["A_log"], dt_bias=leaves["dt_bias"], use_beta_sigmoid_in_kernel=True)
        ((o * w.to(dev, dt)).sum() + fs.sum()).backward()
        return leaves

    got, ref = run("cuda", torch.float32), run("cpu", torch.float64)
    for k in x:
        assert got[k].grad.is_cuda
        assert rel_err(got[k].grad.cpu().double(), ref[k].grad) < 1e-4, k


def test_check_values_refuses_positive_gate_on_cuda():
    # Opt-in on CUDA (a reduction kernel and a stream synchronisation): g > 0 refused with its
    # index and value under the public function's name; -inf and NaN not refused; off by default.
    x = _cuda(make_inputs(B=2, T=5, Hk=1, Hv=2, Dk=64, Dv=64))
    x["g"][1, 3, 1] = 0.5
    with pytest.raises(ValueError, match=r"^gdr\.chunk_gated_delta_rule: g\[1, 3, 1\] is 0\.5; "
                                         r"g must be <= 0"):
        gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], check_values=True)
    gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])  # not checked
    x["g"][1, 3, 1] = float("-inf")
    x["g"][0, 0, 0] = float("nan")
    gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], check_values=True)
    d = _cuda(make_inputs(B=2, T=1, Hk=1, Hv=2, Dk=64, Dv=64))
    d["g"][0, 0, 1] = 2.0
    pool = torch.zeros(2, 2, 64, 64, device="cuda")
    with pytest.raises(ValueError, match=r"^gdr\.decode_step: g\[0, 0, 1\] is 2;"):
        gdr.decode_step(d["q"], d["k"], d["v"], d["g"], d["beta"], pool, check_values=True)
    torch.cuda.synchronize()


def test_chunked_scratch_comes_from_torch_allocator():
    # The chunked kernels' device scratch is taken through torch's caching allocator (python
    # layer: gdr._ops._scratch), so that torch.cuda.max_memory_allocated sees it: a forward of
    # T = 2048 tokens, Hv = 4, D = 128 (bf16) needs at least W and U per chunk and value head
    # (2 x 64 x 128 bf16), 4 MiB beyond o, and a backward more again (fp32 per-chunk scratch).
    # With cudaMallocAsync (the C++ default) the peak would be o alone.
    x = _cuda(make_inputs(B=1, T=2048, Hk=2, Hv=4, Dk=128, Dv=128, dtype=torch.bfloat16))
    w_and_u = (2048 // 64) * 4 * 2 * 64 * 128 * 2
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o, _ = gdr.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base >= o.numel() * o.element_size() + w_and_u
    del o
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    o, _ = gdr.chunk_gated_delta_rule(q, k, v, x["g"], x["beta"])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o.sum().backward()
    torch.cuda.synchronize()
    grads = sum(t.grad.numel() * t.grad.element_size() for t in (q, k, v))
    assert torch.cuda.max_memory_allocated() - base >= grads + 2 * w_and_u


def test_varlen_chunked_under_compile_and_cuda_graph():
    # A varlen call on the chunked path (3 sequences, ~333 tokens each: above the recurrent
    # kernel's bound) traced by torch.compile(fullgraph=True) and captured in a CUDA graph: no
    # device-to-host copy or synchronisation anywhere (cu_seqlens stays on the device, the scratch
    # comes from torch's allocator, which a capture serves from the graph's pool). Both give the
    # eager call's outputs.
    x = _cuda(make_inputs(B=1, T=1000, Hk=2, Hv=4, Dk=64, Dv=64, h0=True, N=3,
                          dtype=torch.bfloat16))
    cu = torch.tensor([0, 400, 400, 1000], dtype=torch.int32, device="cuda")

    def f(q, k, v, g, beta, h0, cu_seqlens):
        return gdr.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu_seqlens)

    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu)
    o_e, fs_e = f(*args)
    o_c, fs_c = torch.compile(f, fullgraph=True)(*args)
    assert rel_err(o_c.float().cpu(), o_e.float().cpu()) < 1e-6
    assert rel_err(fs_c.cpu(), fs_e.cpu()) < 1e-6
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        f(*args)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, fs_g = f(*args)
    o_g.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(o_g.float().cpu(), o_e.float().cpu()) < 1e-6
    assert rel_err(fs_g.cpu(), fs_e.cpu()) < 1e-6
