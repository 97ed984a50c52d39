"""ca.nn.parallel: DistributedDataParallel (needs the optional ``mpi`` extra)."""
from compiled_autograd.nn.parallel.distributed import DistributedDataParallel
from compiled_autograd.nn.parallel.reducer import GradBucket

__all__ = ["DistributedDataParallel", "GradBucket"]
