"""An MLP regression model: ``layers`` Linear layers of ``width`` with tanh (or
another activation) between them, mean-squared error against a fixed target."""
from __future__ import annotations

import numpy as np

import compiled_autograd as ca
from compiled_autograd import nn
from compiled_autograd.examples.base import CHECKPOINT_MODES, Example, run_blocks

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


class MLP(nn.Module):
    def __init__(self, layers, width, in_features, out_features, activation="tanh",
                 checkpoint="none"):
        super().__init__()
        if layers < 1:
            raise ValueError(f"an MLP needs at least one layer, got layers={layers}")
        if checkpoint not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint must be one of {CHECKPOINT_MODES}, got {checkpoint!r}")
        dims = [in_features] + [width] * (layers - 1) + [out_features]
        blocks = []
        for i in range(layers):
            blocks.append(nn.Linear(dims[i], dims[i + 1]))
            if i < layers - 1:
                blocks.append(ACTIVATIONS[activation]())
        self.net = nn.Sequential(*blocks)
        self.checkpoint = checkpoint

    def layer_blocks(self):
        """One block per layer: Linear followed by its activation."""
        mods = list(self.net)
        return [nn.Sequential(*mods[i:i + 2]) for i in range(0, len(mods), 2)]

    def forward(self, x):
        if self.checkpoint == "none":
            return self.net(x)
        return run_blocks(self.layer_blocks(), x, self.checkpoint)


def _forward(model, x, target):
    return nn.functional.mse_loss(model(x), target)


def make_mlp(layers=8, width=64, batch=32, activation="tanh", seed=0,
             dtype=np.float32, checkpoint="none", offload=False) -> Example:
    """The small MLP of the benchmarks (8 x 64, batch 32) by default.
    ``checkpoint``: "none", "layer", "sqrt" or "selective"; ``offload``: save the
    forward's saved tensors to disk."""
    for name, value in (("width", width), ("batch", batch)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    ca.manual_seed(seed)
    model = MLP(layers, width, width, width, activation, checkpoint)
    if dtype != np.float32:
        for p in model.parameters():
            p._data = p._data.astype(dtype)
    rng = np.random.default_rng(seed + 1)
    x = ca.tensor(rng.standard_normal((batch, width)), dtype=dtype)
    target = ca.tensor(rng.standard_normal((batch, width)), dtype=dtype)
    return Example("mlp", model, {"x": x, "target": target}, _forward,
                   dict(layers=layers, width=width, batch=batch, checkpoint=checkpoint,
                        offload=offload), offload)
