"""ca.autograd: backward, grad, gradcheck (torch.autograd's names)."""
from compiled_autograd.autograd.engine import backward, grad
from compiled_autograd.autograd.gradcheck import gradcheck
from compiled_autograd.autograd.function import Function
from compiled_autograd.autograd import graph

__all__ = ["backward", "grad", "gradcheck", "Function", "graph"]
