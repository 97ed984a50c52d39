"""Bundled example models: ``mlp`` and ``transformer``.

``build(name, **sizes)`` returns an ``Example``: the model, its fixed inputs and a
``loss()`` that runs the forward pass and returns a scalar loss. Seeded, so every
benchmark, test and command builds the same numbers.
"""
from compiled_autograd.examples.base import Example
from compiled_autograd.examples.mlp import make_mlp
from compiled_autograd.examples.transformer import make_transformer

EXAMPLES = {"mlp": make_mlp, "transformer": make_transformer}


def build(name: str, **sizes) -> Example:
    try:
        make = EXAMPLES[name]
    except KeyError:
        raise ValueError(f"unknown example {name!r}; choose from {sorted(EXAMPLES)}") from None
    return make(**sizes)


__all__ = ["Example", "EXAMPLES", "build", "make_mlp", "make_transformer"]
