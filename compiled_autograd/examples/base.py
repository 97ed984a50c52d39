"""The Example container shared by the bundled models."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass
class Example:
    name: str
    model: object                 # a ca.nn.Module
    inputs: dict                  # name -> Tensor (fixed, seeded)
    forward: Callable             # (model, **inputs) -> scalar loss Tensor
    sizes: dict = field(default_factory=dict)

    def loss(self):
        """Run the forward pass; returns the scalar loss."""
        return self.forward(self.model, **self.inputs)

    def parameters(self):
        return list(self.model.parameters())

    def zero_grad(self):
        self.model.zero_grad()

    def num_parameters(self) -> int:
        return int(sum(np.prod(p.shape) for p in self.parameters()))
