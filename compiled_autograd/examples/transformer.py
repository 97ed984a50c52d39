"""A small decoder-only transformer language model: token and position embeddings,
``layers`` pre-LayerNorm blocks (causal multi-head attention, GELU MLP), a final
LayerNorm and a linear head over ``vocab`` classes, cross-entropy on next tokens."""
from __future__ import annotations

import numpy as np

import compiled_autograd as ca
from compiled_autograd import nn
from compiled_autograd.examples.base import CHECKPOINT_MODES, Example, run_blocks

F = nn.functional


class Attention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).chunk(3, -1)
        q, k, v = (t.reshape(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, layers, d_model, heads, seq, vocab, checkpoint="none"):
        super().__init__()
        if checkpoint not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint must be one of {CHECKPOINT_MODES}, got {checkpoint!r}")
        self.checkpoint = checkpoint
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        with ca.no_grad():  # small embeddings keep the initial loss near log(vocab)
            self.tok.weight.mul_(0.02)
            self.pos.weight.mul_(0.02)

    def forward(self, tokens):
        b, s = tokens.shape
        x = self.tok(tokens) + self.pos(ca.arange(s))
        x = run_blocks(list(self.blocks), x, self.checkpoint)
        return self.head(self.ln(x))


def _forward(model, tokens, targets):
    logits = model(tokens)
    b, s, v = logits.shape
    return F.cross_entropy(logits.reshape(b * s, v), targets.reshape(b * s))


def make_transformer(layers=4, d_model=128, heads=4, seq=64, batch=8, vocab=1000,
                     seed=0, checkpoint="none", offload=False) -> Example:
    """The benchmark transformer (4 layers, d_model 128, 4 heads, seq 64, batch 8).
    ``checkpoint``: "none", "layer", "sqrt" or "selective" (per block);
    ``offload``: save the forward's saved tensors to disk."""
    for name, value in (("layers", layers), ("d_model", d_model), ("heads", heads),
                        ("seq", seq), ("batch", batch), ("vocab", vocab)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    ca.manual_seed(seed)
    model = Transformer(layers, d_model, heads, seq, vocab, checkpoint)
    rng = np.random.default_rng(seed + 1)
    data = rng.integers(0, vocab, size=(batch, seq + 1))
    tokens = ca.from_numpy(np.ascontiguousarray(data[:, :-1]))
    targets = ca.from_numpy(np.ascontiguousarray(data[:, 1:]))
    return Example("transformer", model, {"tokens": tokens, "targets": targets}, _forward,
                   dict(layers=layers, d_model=d_model, heads=heads, seq=seq, batch=batch,
                        vocab=vocab, checkpoint=checkpoint, offload=offload), offload)
