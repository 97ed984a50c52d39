"""ca.nn: Module, Parameter and the layers of DESIGN.md."""
from compiled_autograd.nn import functional
from compiled_autograd.nn.modules import (GELU, Dropout, Embedding, LayerNorm, Linear, Module,
                                          Parameter, ReLU, Sequential, Tanh)
# Step 13: the loss modules and nn.utils (clip_grad_norm_, clip_grad_value_).
from compiled_autograd.nn.loss import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss,
                                       HuberLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss)
from compiled_autograd.nn import utils

__all__ = ["functional", "Module", "Parameter", "Linear", "LayerNorm", "Embedding",
           "Dropout", "Sequential", "GELU", "ReLU", "Tanh",
           "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "NLLLoss", "CrossEntropyLoss",
           "BCELoss", "BCEWithLogitsLoss", "utils"]
