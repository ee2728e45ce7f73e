"""A small Gated DeltaNet language model written with gdr's operators.

Each layer: q/k/v/a/b projections, a short causal depthwise convolution (+ SiLU) on q, k and v,
gate g = -exp(A_log) * softplus(a + dt_bias) (natural log of the decay), beta = sigmoid(b), the
gated delta rule (gdr.chunk_gated_delta_rule, keys and queries L2-normalised in the kernel),
an output RMSNorm gated by SiLU(x W_gate), the output projection, then an MLP.

Greedy generation runs the prompt through the chunked operator (final state out), then each new
token through the decode operator (gdr.decode_step: the state pool is updated in place).

The text is Lewis Carroll's "Alice's Adventures in Wonderland" (public domain; the Project
Gutenberg "Millennium Fulcrum Edition 2.9"), which ships as test data (tests/testdata/alice29.txt)
inside the source distribution of the `brotli` package on PyPI. locate_text() finds it in the
cache, or fetches that sdist with pip and extracts the one file.

    python examples/gated_deltanet_lm.py --steps 200        # train on the CPU, then generate
    python examples/gated_deltanet_lm.py --device cuda      # the same on the GPU (gdr's CUDA
                                                            # chunked forward and backward)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import gdr

TEXT_SDIST = "brotli==1.2.1"
TEXT_MEMBER = "brotli-1.2.1/tests/testdata/alice29.txt"
TEXT_NAME = "alice29.txt"


# ---- data ----------------------------------------------------------------------------------------


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "gdr-example"


def locate_text(download: bool = True) -> pathlib.Path:
    """Path of alice29.txt: $GDR_EXAMPLE_TEXT, the cache, or fetched from the brotli sdist."""
    env = os.environ.get("GDR_EXAMPLE_TEXT")
    if env:
        p = pathlib.Path(env)
        if not p.is_file():
            raise FileNotFoundError(f"GDR_EXAMPLE_TEXT={env} is not a file")
        return p
    target = _cache_dir() / TEXT_NAME
    if target.is_file():
        return target
    how = (f"get it with: pip download --no-deps --no-binary :all: {TEXT_SDIST} and extract "
           f"{TEXT_MEMBER} to {target} (or point GDR_EXAMPLE_TEXT at any plain-text file)")
    if not download:
        raise FileNotFoundError(f"the example text {TEXT_NAME} is not in {target.parent}; {how}")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--no-binary", ":all:", "--no-build-isolation", TEXT_SDIST, "-d", tmp]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            raise RuntimeError(f"could not fetch the example text ({TEXT_NAME} in the {TEXT_SDIST} "
                               f"sdist from PyPI): {detail.strip()[-500:]}; {how}") from e
        sdists = sorted(pathlib.Path(tmp).glob("*.tar.gz"))
        if not sdists:
            raise RuntimeError(f"pip download of {TEXT_SDIST} gave no .tar.gz; {how}")
        with tarfile.open(sdists[0]) as tar:
            try:
                member = tar.getmember(TEXT_MEMBER)
            except KeyError as e:
                raise RuntimeError(f"{sdists[0].name} has no {TEXT_MEMBER}; {how}") from e
            data = tar.extractfile(member).read()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_target = target.with_suffix(".part")
    tmp_target.write_bytes(data)
    tmp_target.replace(target)
    return target


class CharTokenizer:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in s if c in self.index], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def load_corpus(download: bool = True) -> tuple[CharTokenizer, torch.Tensor]:
    text = locate_text(download).read_text(encoding="latin-1")
    tok = CharTokenizer(text)
    return tok, tok.encode(text)


def get_batch(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator):
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=generator)
    x = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts.tolist()])
    return x, y


# ---- the recurrence, pluggable ------------------------------------------------------------------


class GdrBackend:
    """The gated delta rule through gdr (what a model using FLA would import instead)."""

    @staticmethod
    def chunk(q, k, v, g, beta, initial_state=None, output_final_state=False):
        return gdr.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                          output_final_state=output_final_state,
                                          use_qk_l2norm_in_kernel=True)

    @staticmethod
    def step(q, k, v, g, beta, state):
        """T new tokens; state [B, Hv, Dk, Dv] fp32 updated in place; returns o."""
        return gdr.decode_step(q, k, v, g, beta, state, use_qk_l2norm_in_kernel=True)


# ---- model ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    vocab_size: int = 96
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2      # query/key heads
    n_v_heads: int = 4    # value heads (GVA when > n_heads)
    head_k_dim: int = 16
    head_v_dim: int = 16
    conv_size: int = 4
    mlp_mult: int = 4
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ShortConv(nn.Module):
    """Causal depthwise conv over time + SiLU; a cache of the last (K-1) inputs for decoding."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.size = size
        self.weight = nn.Parameter(torch.randn(channels, 1, size) / math.sqrt(size))

    def forward(self, x, cache: Optional[torch.Tensor] = None):
        # x [B, T, C]; cache [B, K-1, C] (the inputs before x) or None (zeros).
        b, t, c = x.shape
        if cache is None:
            cache = x.new_zeros(b, self.size - 1, c)
        xp = torch.cat([cache, x], dim=1)
        y = F.conv1d(xp.transpose(1, 2), self.weight, groups=c).transpose(1, 2).contiguous()
        return F.silu(y), xp[:, -(self.size - 1):]


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        hk, hv, dk, dv = cfg.n_heads, cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim
        d = cfg.d_model
        self.q_proj = nn.Linear(d, hk * dk, bias=False)
        self.k_proj = nn.Linear(d, hk * dk, bias=False)
        self.v_proj = nn.Linear(d, hv * dv, bias=False)
        self.a_proj = nn.Linear(d, hv, bias=False)
        self.b_proj = nn.Linear(d, hv, bias=False)
        self.gate_proj = nn.Linear(d, hv * dv, bias=False)
        self.o_proj = nn.Linear(hv * dv, d, bias=False)
        self.q_conv = ShortConv(hk * dk, cfg.conv_size)
        self.k_conv = ShortConv(hk * dk, cfg.conv_size)
        self.v_conv = ShortConv(hv * dv, cfg.conv_size)
        # Decay rates spread over heads (A in [1, 16]); dt = softplus(dt_bias) in [1e-3, 1e-1].
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, hv)))
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), hv))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.o_norm = RMSNorm(dv, cfg.norm_eps)

    def forward(self, x, backend, cache=None, mode: str = "chunk"):
        """x [B, T, d]. cache: None or dict(state=[B,Hv,Dk,Dv] fp32, conv=(3 tensors)).

        mode 'chunk': the chunked operator (training, prompt); returns (y, new cache).
        mode 'step': the decode operator, cache['state'] updated in place.
        """
        cfg = self.cfg
        b, t, _ = x.shape
        convs = cache["conv"] if cache is not None else (None, None, None)
        q, cq = self.q_conv(self.q_proj(x), convs[0])
        k, ck = self.k_conv(self.k_proj(x), convs[1])
        v, cv = self.v_conv(self.v_proj(x), convs[2])
        q = q.view(b, t, cfg.n_heads, cfg.head_k_dim)
        k = k.view(b, t, cfg.n_heads, cfg.head_k_dim)
        v = v.view(b, t, cfg.n_v_heads, cfg.head_v_dim)
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
        beta = torch.sigmoid(self.b_proj(x))
        if mode == "chunk":
            state = cache["state"] if cache is not None else None
            o, state = backend.chunk(q, k, v, g, beta, initial_state=state,
                                     output_final_state=True)
        elif mode == "step":
            state = cache["state"]
            o = backend.step(q, k, v, g, beta, state)
        else:
            raise ValueError(f"mode is {mode!r}; allowed: 'chunk', 'step'")
        gate = self.gate_proj(x).view(b, t, cfg.n_v_heads, cfg.head_v_dim)
        o = self.o_norm(o) * F.silu(gate)
        y = self.o_proj(o.reshape(b, t, -1))
        return y, {"state": state, "conv": (cq, ck, cv)}


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = GatedDeltaNet(cfg)
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_mult * cfg.d_model), nn.GELU(),
                                 nn.Linear(cfg.mlp_mult * cfg.d_model, cfg.d_model))

    def forward(self, x, backend, cache=None, mode="chunk"):
        h, cache = self.mixer(self.norm1(x), backend, cache, mode)
        x = x + h
        return x + self.mlp(self.norm2(x)), cache


class GatedDeltaNetLM(nn.Module):
    def __init__(self, cfg: Config, backend=GdrBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx, caches=None, mode="chunk"):
        """idx [B, T] -> logits [B, T, vocab], new caches (one per layer)."""
        x = self.embed(idx)
        new = []
        for i, blk in enumerate(self.blocks):
            x, c = blk(x, self.backend, None if caches is None else caches[i], mode)
            new.append(c)
        return self.head(self.norm(x)), new

    def loss(self, x, y):
        logits, _ = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def empty_caches(self, batch: int, device=None):
        cfg = self.cfg
        st = (batch, cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim)
        z = lambda c: torch.zeros(batch, cfg.conv_size - 1, c, device=device)  # noqa: E731
        return [{"state": torch.zeros(st, dtype=torch.float32, device=device),
                 "conv": (z(cfg.n_heads * cfg.head_k_dim), z(cfg.n_heads * cfg.head_k_dim),
                          z(cfg.n_v_heads * cfg.head_v_dim))} for _ in range(cfg.n_layers)]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, new_tokens: int, prompt_mode: str = "chunk"):
        """Greedy continuation of prompt [B, T0]: returns the new tokens [B, new_tokens].

        prompt_mode 'chunk': the prompt goes through the chunked operator in one call;
        'step': token by token through the decode operator. New tokens always use the decoder.
        """
        if prompt.shape[1] < 1:
            raise ValueError("generate: the prompt needs at least one token")
        if prompt_mode == "chunk":
            logits, caches = self(prompt, None, "chunk")
            for c in caches:  # the decode operator updates the state in place: own it
                c["state"] = c["state"].contiguous()
        elif prompt_mode == "step":
            caches = self.empty_caches(prompt.shape[0], prompt.device)
            for t in range(prompt.shape[1]):
                logits, caches = self(prompt[:, t:t + 1], caches, "step")
        else:
            raise ValueError(f"prompt_mode is {prompt_mode!r}; allowed: 'chunk', 'step'")
        out = []
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new_tokens):
            out.append(nxt)
            logits, caches = self(nxt, caches, "step")
            nxt = logits[:, -1].argmax(-1, keepdim=True)
        return torch.cat(out, dim=1)


def train(model, data, steps: int, batch: int = 8, seq_len: int = 64, lr: float = 3e-3,
          seed: int = 0, log_every: int = 0):
    """AdamW for `steps` steps on random windows; returns the list of losses. The windows come
    from a CPU generator whatever the model's device, so a CPU and a GPU run see the same data."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        x, y = get_batch(data, batch, seq_len, gen)
        loss = model.loss(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {loss.item():.4f}", flush=True)
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--prompt", default="Alice was beginning to get very tired")
    ap.add_argument("--new-tokens", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-download", action="store_true", help="fail if the text is not cached")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--head-dim", type=int, default=None,
                    help="key and value head dim (default 16 on the CPU, 64 on cuda, the "
                         "smallest gdr's CUDA kernels take)")
    ap.add_argument("--losses-json", default=None, help="write the training losses here")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    try:
        tok, data = load_corpus(download=not args.no_download)
    except (OSError, RuntimeError) as e:
        sys.exit(f"gated_deltanet_lm: {e}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gated_deltanet_lm: --device cuda but torch sees no CUDA device")
    head_dim = args.head_dim or (64 if args.device.startswith("cuda") else 16)
    model = GatedDeltaNetLM(Config(vocab_size=tok.vocab_size, head_k_dim=head_dim,
                                   head_v_dim=head_dim)).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"text: {data.numel()} characters, vocab {tok.vocab_size}; model: {n_params} parameters")
    t0 = time.time()
    losses = train(model, data, args.steps, args.batch, args.seq_len, args.lr, args.seed,
                   log_every=max(1, args.steps // 10))
    print(f"trained {args.steps} steps in {time.time() - t0:.1f} s on {args.device}")
    if args.losses_json:
        import json
        with open(args.losses_json, "w") as f:
            json.dump({"device": args.device, "head_dim": head_dim, "seed": args.seed,
                       "batch": args.batch, "seq_len": args.seq_len, "losses": losses}, f)
    prompt = tok.encode(args.prompt)[None].to(args.device)
    out = model.generate(prompt, args.new_tokens)
    print(args.prompt + tok.decode(out[0].cpu()))


if __name__ == "__main__":
    main()
