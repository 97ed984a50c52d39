"""ca.memory: accounting of tensor storage (``profile``), the planned schedule of a
traced backward (``schedule``), the reports (``report``), and the caching
allocator of compiled autograd's own arrays (``empty_cache``, ``cache_stats``,
``set_cache_limit``: compiled_autograd/runtime/pool.c)."""
import operator
import sys

from compiled_autograd.memory.profile import (CATEGORIES, Event, category, profile,
                                              retag_saved, source)
from compiled_autograd.runtime import pool as _pool


def empty_cache() -> int:
    """Free the memory compiled autograd keeps for reuse (the blocks of arrays its
    ops made, given back), as ``torch.cuda.empty_cache()`` frees torch's cache;
    returns its bytes. Arrays still alive are not touched."""
    return _pool.empty_cache()


def cache_stats() -> dict:
    """The caching allocator's counters: ``in_use`` (bytes of its blocks held by
    live arrays), ``cached`` (bytes kept for reuse), ``limit`` (the most it
    keeps), ``hits`` and ``misses`` (requests served by a kept block, or by a new
    one)."""
    return _pool.stats()


def set_cache_limit(nbytes: int) -> None:
    """Keep at most ``nbytes`` bytes of freed blocks for reuse (default 1 GiB; 0
    keeps none); blocks kept past it are freed now."""
    if isinstance(nbytes, bool) or not hasattr(type(nbytes), "__index__"):
        raise TypeError("set_cache_limit: expected an integer number of bytes, got "
                        f"{type(nbytes).__name__} {nbytes!r}")
    nbytes = operator.index(nbytes)         # (numpy's integers too)
    if nbytes < 0:
        raise ValueError(f"set_cache_limit: expected a number of bytes >= 0, got {nbytes!r}")
    _pool.set_limit(min(nbytes, sys.maxsize))   # (more than an address space: no limit)


__all__ = ["profile", "category", "source", "retag_saved", "CATEGORIES", "Event",
           "empty_cache", "cache_stats", "set_cache_limit"]
