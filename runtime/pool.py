"""The caching allocator of compiled autograd's own arrays (``pool.c``): a numpy
memory handler (NEP 49) that keeps freed blocks for the next request of their
size class, so that a training step's memory is not given back to the kernel
and faulted in again by the next step. The C forward (``runtime/forward.c``)
makes a prim's result under it when an argument is as large as its blocks, the
C backward (``codegen/c_call.c``) its arena and large gradients; a user's own
numpy arrays keep numpy's handler. Built on first use
(``compiled_autograd.runtime.extension``); without a compiler, or with
``CA_POOL=0``, nothing is pooled and memory goes back to malloc as it is freed.
``compiled_autograd.memory`` gives users ``empty_cache``, ``cache_stats`` and
``set_cache_limit``."""
from __future__ import annotations

from pathlib import Path

from compiled_autograd.runtime.extension import Extension

POOL = Extension("_pool", (Path(__file__).with_name("pool.c"),),
                 "the caching allocator", "CA_POOL", numpy_headers=True)


def api():
    """The capsule the other extensions allocate through (``pool.h``), or None
    where the pool is off."""
    module = POOL.module()
    return None if module is None else module.api


def enter():
    """Make the pool this context's numpy handler, for the arrays a backward makes
    (``compiled_autograd.autograd.engine``): returns what ``leave`` takes back,
    None where the pool is off."""
    module = POOL.module()
    return None if module is None else module.enter()


def leave(previous) -> None:
    """Set back the handler ``enter`` replaced."""
    if previous is not None:
        POOL.loaded().leave(previous)


def empty_cache() -> int:
    """Free the blocks kept for reuse; returns their bytes."""
    module = POOL.loaded()
    return module.empty_cache() if module is not None else 0


def stats() -> dict:
    """Bytes of the pool's blocks in use and kept for reuse, the most it keeps,
    and how many requests found a kept block (hits) or made one (misses)."""
    module = POOL.module()
    if module is None:
        return {"in_use": 0, "cached": 0, "limit": 0, "hits": 0, "misses": 0}
    return module.stats()


def set_limit(nbytes: int) -> None:
    """Keep at most ``nbytes`` of freed blocks (1 GiB unless set); kept blocks
    past it are freed now, largest first."""
    module = POOL.module()
    if module is not None:
        module.set_limit(nbytes)
