"""Threads of the C backend: whether the generated loops get OpenMP, and one pool.

``openmp()`` (``compiled_autograd.runtime.cbuild``'s) says, once per process and compiler, whether
generated code is built with ``-fopenmp``: the threads library (``cthreads.c``)
must build with it, load (libgomp found) and run a parallel region. Otherwise, or
with ``CA_C_OPENMP=0``, the code is built without and runs on the calling thread;
the status says why.

``share_blas_threads()`` (at the first C backward's build) hands the BLAS's
threaded parts to the same OpenMP pool: OpenBLAS's callback
(``openblas_set_threads_callback_function``) runs each GEMM's jobs on an OpenMP
team (``ca_blas_jobs``). Two pools on the same cores fight: OpenBLAS's idle
workers spin for about 2^28 cycles after each call, and an OpenMP team that
starts meanwhile waits for a core (the transformer's backward at 2 threads went
from 25 to 235 ms). With one pool, the GEMMs and the loops take turns on the
same threads. OpenBLAS splits a GEMM as before, so its results are the same bits.
The callback holds for the whole process (numpy's own matmuls use it too): the
forward's GEMMs would otherwise leave OpenBLAS's workers spinning into the
backward.

How many threads: as many as the BLAS uses (``openblas_get_num_threads``, which
follows ``OPENBLAS_NUM_THREADS``, else ``OMP_NUM_THREADS``, else the cores; and
threadpoolctl's limits), and at most OpenMP's ``omp_get_max_threads()``; read by
the generated code at each call. After ``fork`` the child's calling thread runs
its loops on one thread (libgomp's pool does not survive a fork: its next team
would wait forever), and its BLAS goes back to OpenBLAS's own threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading

from compiled_autograd.runtime import cbuild

_lock = threading.Lock()
_shared = None            # the BLAS callback: None (not tried), or its status line


def openmp() -> tuple[bool, str]:
    """(whether generated code is built with OpenMP, a one-line status)."""
    return cbuild.openmp()


def share_blas_threads() -> str:
    """Run the BLAS's threaded parts on the OpenMP pool (once per process); the
    status line of what happened."""
    global _shared
    if _shared is None:
        with _lock:
            if _shared is None:
                _shared = _install()
    return _shared


def _install() -> str:
    enabled, status, lib = cbuild.threads_library()
    if not enabled:
        return "BLAS on its own threads (no OpenMP)"
    blas = cbuild.blas()
    try:
        setter = getattr(cbuild.blas_library(), blas.threads_callback)
    except (OSError, AttributeError):
        return (f"BLAS on its own threads ({blas.name} has no {blas.threads_callback}: "
                f"OpenBLAS >= 0.3.27 has)")
    setter.argtypes = [ctypes.c_void_p]
    _place_jobs(lib)
    callback = ctypes.cast(lib.ca_blas_jobs, ctypes.c_void_p)
    setter(callback)

    def after_fork_in_child():
        setter(None)
        lib.ca_after_fork_in_child()
    os.register_at_fork(after_in_child=after_fork_in_child)
    return "BLAS threads on the OpenMP pool"


def _place_jobs(lib):
    """Tell the callback where OpenBLAS's pool size is and how many thread slots
    it has (its MAX_THREADS), so that the jobs keep off the pool's slots
    (cthreads.c); where either cannot be read, the jobs take slots from 0."""
    blas_lib = cbuild.blas_library()
    names = cbuild.blas()
    try:
        pool = ctypes.c_int.in_dll(blas_lib, "blas_num_threads")
        get_config = getattr(blas_lib, names.threads.replace("get_num_threads", "get_config"))
    except (ValueError, AttributeError):
        return
    get_config.restype = ctypes.c_char_p
    found = re.search(rb"MAX_THREADS=(\d+)", get_config() or b"")
    if found:
        lib.ca_blas_slots(ctypes.byref(pool), int(found.group(1)))


def status() -> str:
    """One line: how the generated code runs its loops and its GEMMs."""
    enabled, line, _ = cbuild.threads_library()
    return f"{line}; {_shared or 'BLAS on its own threads (no C backward built yet)'}" \
        if enabled else line


@contextlib.contextmanager
def threads(loops=None, blas=None):
    """For the duration: the generated loops of backwards called from this thread
    on at most ``loops`` threads (OpenMP's limit, per calling thread), and the
    BLAS on ``blas`` (``openblas_set_num_threads``: the whole process). For
    comparing thread counts in one process (tests, benchmarks); needs OpenMP."""
    enabled, status, lib = cbuild.threads_library()
    if not enabled:
        raise RuntimeError(f"compiled autograd: no threads to set ({status})")
    names = cbuild.blas()
    blas_lib = cbuild.blas_library()
    get_blas = getattr(blas_lib, names.threads)
    set_blas = getattr(blas_lib, names.threads.replace("get_num", "set_num"))
    old = lib.ca_loop_threads(), get_blas()
    try:
        if loops is not None:
            lib.ca_set_loop_threads(int(loops))
        if blas is not None:
            set_blas(int(blas))
        yield
    finally:
        lib.ca_set_loop_threads(old[0])
        if blas is not None:
            set_blas(old[1])
