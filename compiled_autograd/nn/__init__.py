"""ca.nn: Module, Parameter and the layers of DESIGN.md."""
from compiled_autograd.nn import functional
from compiled_autograd.nn.modules import (GELU, Dropout, Embedding, LayerNorm, Linear, Module,
                                          Parameter, ReLU, Sequential, Tanh)

__all__ = ["functional", "Module", "Parameter", "Linear", "LayerNorm", "Embedding",
           "Dropout", "Sequential", "GELU", "ReLU", "Tanh"]
