"""ca.utils: checkpoint (torch.utils.checkpoint's names)."""
from compiled_autograd.utils import checkpoint

__all__ = ["checkpoint"]
