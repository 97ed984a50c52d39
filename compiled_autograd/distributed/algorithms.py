"""Communication hooks for DistributedDataParallel (torch's
``torch.distributed.algorithms.ddp_comm_hooks``).

A hook is ``hook(state, bucket)``; ``bucket.buffer()`` is this rank's flat
gradient of the bucket (a Tensor, not yet averaged). It returns the bucket's
averaged flat gradient: a Tensor, or an object whose ``.wait()`` returns one
(a ``Work``), so that the transfer can run while the backward goes on.
"""
from __future__ import annotations

import numpy as np

from compiled_autograd.distributed import world as _world


def allreduce_hook(state, bucket):
    """Divide by the world size, then sum over the ranks: the average (DDP's
    default)."""
    buf = bucket.buffer()
    arr = buf._data
    arr /= _world.get_world_size()
    return _world.all_reduce_array(arr, "allreduce_hook").then(lambda fut: buf)


def fp16_compress_hook(state, bucket):
    """Divide by the world size, cast to float16, sum over the ranks, cast back:
    half the bytes on the wire, at float16's precision."""
    buf = bucket.buffer()
    compressed = (buf._data / _world.get_world_size()).astype(np.float16)

    def decompress(fut):
        buf._data[...] = compressed.astype(buf._data.dtype)
        return buf
    return _world.all_reduce_array(compressed, "fp16_compress_hook").then(decompress)


def noop_hook(state, bucket):
    """No communication: each rank keeps its own gradients (to measure what the
    communication costs)."""
    return bucket.buffer()


__all__ = ["allreduce_hook", "fp16_compress_hook", "noop_hook"]
