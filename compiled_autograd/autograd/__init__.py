"""ca.autograd: backward, grad, gradcheck (torch.autograd's names)."""
from compiled_autograd.engine import backward, grad
from compiled_autograd.autograd.gradcheck import gradcheck

__all__ = ["backward", "grad", "gradcheck"]
