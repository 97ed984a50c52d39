"""runtime: primitive ops with numpy kernels, memory accounting, code loading.

Importing the package fills the prim table (``compiled_autograd.runtime.prims.PRIMS``).
"""
from compiled_autograd.runtime import prims_elementwise, prims_reduce, prims_shape  # noqa: F401  (register)
from compiled_autograd.runtime.prims import PRIMS, Prim, VJPContext, ops  # noqa: F401
