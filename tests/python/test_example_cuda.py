"""The example language model (examples/gated_deltanet_lm.py) trains on the GPU through gdr's
CUDA chunked forward and backward: from the same initial weights and the same batches, its loss
curve over the first steps matches the CPU run's (skipped without a GPU or a CUDA build)."""

import copy

import pytest
import torch

import gdr
from gdr_testing import load_example

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and gdr.cuda_available()),
    reason="needs a CUDA device and a CUDA build of gdr")

lm = load_example("gated_deltanet_lm_cuda")


@pytest.mark.parametrize("seq_len", [100, 300])  # recurrent and chunked CUDA forward (> 256)
def test_example_trains_on_cuda_like_on_cpu(seq_len, monkeypatch):
    # fp32 everywhere; cuDNN's TF32 convolutions off so that only summation order differs
    # (monkeypatch restores the process-wide flags afterwards).
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    # Synthetic tokens (no download on the GPU machine) with a learnable rule:
    # x_t = (3 x_{t-1} + e_t) mod 40, e_t in {0, 1}.
    noise = torch.randint(0, 2, (20000,)).tolist()
    seq = [0]
    for e in noise[1:]:
        seq.append((3 * seq[-1] + e) % 40)
    data = torch.tensor(seq)
    cfg = lm.Config(vocab_size=40, d_model=64, n_heads=2, n_v_heads=4, head_k_dim=64,
                    head_v_dim=64)
    model_cpu = lm.GatedDeltaNetLM(cfg)
    model_gpu = copy.deepcopy(model_cpu).cuda()
    steps = 12
    losses_cpu = lm.train(model_cpu, data, steps=steps, batch=4, seq_len=seq_len, seed=3)
    losses_gpu = lm.train(model_gpu, data, steps=steps, batch=4, seq_len=seq_len, seed=3)
    assert losses_gpu[-1] < losses_gpu[0]  # it learns
    for a, b in zip(losses_gpu, losses_cpu):
        assert abs(a - b) <= 2e-3 * abs(b), (losses_gpu, losses_cpu)
    for (n, p), (_, r) in zip(model_gpu.named_parameters(), model_cpu.named_parameters()):
        assert torch.allclose(p.cpu(), r, rtol=1e-2, atol=1e-4), n
