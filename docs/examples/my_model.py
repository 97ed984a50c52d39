"""A model for `compiled-autograd --script`: two Linear layers with a checkpoint
around the first. Parameters and data are made once, at module level; model()
only computes the loss, so every call builds the same computation."""
import compiled_autograd as ca
from compiled_autograd.utils.checkpoint import checkpoint

ca.manual_seed(0)
layer1 = ca.nn.Linear(64, 128)
layer2 = ca.nn.Linear(128, 10)
x = ca.randn(32, 64)


def block(h):
    return ca.nn.functional.gelu(layer1(h))


def model():
    h = checkpoint(block, x)
    return layer2(h).tanh().pow(2).mean()
