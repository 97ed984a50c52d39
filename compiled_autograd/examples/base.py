"""The Example container shared by the bundled models."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from compiled_autograd.autograd.graph import save_on_disk
from compiled_autograd.utils.checkpoint import checkpoint as ckpt
from compiled_autograd.utils.checkpoint import (checkpoint_sequential,
                                                create_selective_checkpoint_contexts)


@dataclass
class Example:
    name: str
    model: object                 # a ca.nn.Module
    inputs: dict                  # name -> Tensor (fixed, seeded)
    forward: Callable             # (model, **inputs) -> scalar loss Tensor
    sizes: dict = field(default_factory=dict)
    offload: bool = False         # save the forward's saved tensors to disk

    def loss(self):
        """Run the forward pass; returns the scalar loss."""
        if self.offload:
            with save_on_disk():
                return self.forward(self.model, **self.inputs)
        return self.forward(self.model, **self.inputs)

    def parameters(self):
        return list(self.model.parameters())

    def zero_grad(self):
        self.model.zero_grad()

    def num_parameters(self) -> int:
        return int(sum(np.prod(p.shape) for p in self.parameters()))


CHECKPOINT_MODES = ("none", "layer", "sqrt", "selective")


def run_blocks(blocks, x, checkpoint="none"):
    """Run ``blocks`` in sequence, checkpointed as ``checkpoint`` says: "layer" (one
    checkpoint per block), "sqrt" (checkpoint_sequential with sqrt(n) segments),
    "selective" (per block, keeping linear/matmul outputs instead of recomputing them)."""
    if checkpoint == "none":
        for block in blocks:
            x = block(x)
        return x
    if checkpoint == "layer":
        for block in blocks:
            x = ckpt(block, x)
        return x
    if checkpoint == "sqrt":
        return checkpoint_sequential(list(blocks), max(1, round(len(blocks) ** 0.5)), x)
    if checkpoint == "selective":
        for block in blocks:
            x = ckpt(block, x, context_fn=lambda: create_selective_checkpoint_contexts(
                ["linear", "matmul"]))
        return x
    raise ValueError(f"checkpoint must be one of {CHECKPOINT_MODES}, got {checkpoint!r}")
