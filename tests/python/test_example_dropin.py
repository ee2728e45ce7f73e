"""The drop-in check: examples/gated_deltanet_lm.py trained with gdr and with a plain PyTorch
recurrence (written here) gives the same losses; greedy generation gives the same tokens whether
the prompt goes through the chunked or the step-by-step path, and with either backend."""

import copy

import pytest
import torch

from gdr_testing import load_example, torch_reference

lm = load_example()


class TorchBackend:
    """The same two calls as the example's GdrBackend, as a plain PyTorch float64 recurrence."""

    @staticmethod
    def chunk(q, k, v, g, beta, initial_state=None, output_final_state=False):
        o, s = torch_reference(q, k, v, g, beta, initial_state=initial_state, use_qk_l2norm=True)
        return o.to(q.dtype), (s.float() if output_final_state else None)

    @staticmethod
    def step(q, k, v, g, beta, state):
        o, s = torch_reference(q, k, v, g, beta, initial_state=state, use_qk_l2norm=True)
        state.copy_(s)
        return o.to(q.dtype)


CFG = dict(d_model=32, n_layers=2, n_heads=2, n_v_heads=4, head_k_dim=8, head_v_dim=8)


@pytest.fixture(scope="module")
def corpus():
    return lm.load_corpus(download=True)


def test_training_losses_match_plain_pytorch(corpus):
    tok, data = corpus
    torch.manual_seed(0)
    model_gdr = lm.GatedDeltaNetLM(lm.Config(vocab_size=tok.vocab_size, **CFG))
    model_ref = copy.deepcopy(model_gdr)
    model_ref.backend = TorchBackend
    losses_gdr = lm.train(model_gdr, data, steps=3, batch=4, seq_len=32, seed=1)
    losses_ref = lm.train(model_ref, data, steps=3, batch=4, seq_len=32, seed=1)
    assert losses_gdr[-1] < losses_gdr[0]  # it learns
    for a, b in zip(losses_gdr, losses_ref):
        assert abs(a - b) <= 1e-4 * abs(b), (losses_gdr, losses_ref)
    for (n, p), (_, r) in zip(model_gdr.named_parameters(), model_ref.named_parameters()):
        assert torch.allclose(p, r, rtol=1e-3, atol=1e-5), n


def test_greedy_generation_chunk_prompt_equals_step_prompt(corpus):
    tok, data = corpus
    torch.manual_seed(0)
    model = lm.GatedDeltaNetLM(lm.Config(vocab_size=tok.vocab_size, **CFG))
    lm.train(model, data, steps=2, batch=4, seq_len=32, seed=2)
    prompt = torch.stack([tok.encode("Alice was beginning "),
                          tok.encode("`and what is the use")])
    out_chunk = model.generate(prompt, 12, prompt_mode="chunk")
    out_step = model.generate(prompt, 12, prompt_mode="step")
    assert out_chunk.shape == (2, 12)
    assert torch.equal(out_chunk, out_step), (tok.decode(out_chunk[0]), tok.decode(out_step[0]))
    model.backend = TorchBackend
    out_ref = model.generate(prompt, 12, prompt_mode="chunk")
    assert torch.equal(out_chunk, out_ref), (tok.decode(out_chunk[0]), tok.decode(out_ref[0]))


def test_text_is_located_without_download_once_cached(corpus):
    path = lm.locate_text(download=False)
    assert path.is_file() and "ALICE'S ADVENTURES IN WONDERLAND" in path.read_text("latin-1")
