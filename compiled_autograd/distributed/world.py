"""The process group: the MPI world, its collectives, and the guards that keep a
job from hanging.

Every collective is started non-blocking and waited for by ``_wait``, so that one
optional timeout (``init_process_group(timeout=...)``) covers them all. With a
timeout, each rank also tells the others, on a side communicator, which collective
it has reached: a rank whose wait times out names the ranks that never arrived.
An uncaught exception on any rank aborts the whole job (``MPI_Abort``) after
printing its traceback, so the other ranks never wait for it forever.
"""
from __future__ import annotations

import datetime
import pickle
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from compiled_autograd.autograd.tensor import Tensor


class ReduceOp:
    """torch.distributed.ReduceOp's names for the ops ``all_reduce`` takes."""
    SUM = "sum"
    AVG = "avg"


_OPS = ("sum", "avg")


class _World:
    def __init__(self, timeout, abort_on_exception):
        self.comm = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = timeout
        self.seq = 0                       # collectives started by this rank so far
        self.arrivals = self.comm.Dup() if timeout is not None else None
        self.seen = [0] * self.size        # the last collective each rank said it reached
        self.sends = []                    # (request, buffer) of arrival messages in flight
        self.hooks = None
        if abort_on_exception:
            self.hooks = (sys.excepthook, threading.excepthook)
            sys.excepthook = _abort_on_exception
            threading.excepthook = _abort_on_thread_exception

    def free(self):
        if self.hooks is not None:
            sys.excepthook, threading.excepthook = self.hooks
        for req, _ in self.sends:
            req.Cancel()
        for comm in (self.arrivals, self.comm):
            if comm is not None:
                comm.Free()


_world: _World | None = None


def _abort(rank_line):
    sys.stderr.write(rank_line)
    sys.stderr.flush()
    sys.stdout.flush()
    MPI.COMM_WORLD.Abort(1)


def _abort_on_exception(exc_type, exc, tb):
    rank = MPI.COMM_WORLD.Get_rank()
    sys.__excepthook__(exc_type, exc, tb)
    _abort(f"compiled_autograd.distributed: rank {rank} raised {exc_type.__name__} (its "
           "traceback is above); aborting every rank of the job\n")


def _abort_on_thread_exception(args):
    rank = MPI.COMM_WORLD.Get_rank()
    sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)
    _abort(f"compiled_autograd.distributed: rank {rank}, thread {args.thread.name!r}, raised "
           f"{args.exc_type.__name__} (its traceback is above); aborting every rank of the job\n")


def is_available() -> bool:
    """True: importing this module needs mpi4py, which is here."""
    return True


def is_initialized() -> bool:
    return _world is not None


def world() -> _World:
    if _world is None:
        raise RuntimeError("Default process group has not been initialized, please make sure "
                           "to call init_process_group.")
    return _world


def init_process_group(backend="mpi", timeout=None, abort_on_exception=True):
    """Join the MPI world (every process that ``mpiexec`` started is a rank).

    ``timeout`` (seconds, or a ``datetime.timedelta``; default none): a collective
    that waits longer raises RuntimeError naming the ranks that did not reach it.
    ``abort_on_exception``: an uncaught exception on this rank prints its traceback
    and aborts the whole job, so that no other rank waits for it forever."""
    global _world
    if backend not in ("mpi", None):
        raise ValueError(f"compiled_autograd.distributed supports the 'mpi' backend only, "
                         f"got {backend!r}")
    if _world is not None:
        raise RuntimeError("trying to initialize the default process group twice!")
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    _world = _World(None if timeout is None else float(timeout), abort_on_exception)


def destroy_process_group():
    """Leave the process group (MPI itself is finalized when the process exits)."""
    global _world
    w = world()
    _world = None
    w.free()


def get_rank() -> int:
    return world().rank


def get_world_size() -> int:
    return world().size


# ------------------------------------------------------------------ waiting

def _arrive(w, what):
    """Count a collective; with a timeout, tell the other ranks we reached it."""
    w.seq += 1
    if w.arrivals is not None:
        _drain(w)
        for r in range(w.size):
            if r != w.rank:
                buf = np.array([w.seq], dtype=np.int64)
                w.sends.append((w.arrivals.Isend(buf, dest=r, tag=0), buf))
    return w.seq


def _drain(w):
    """Read the arrival messages received so far; let go of delivered sends."""
    status = MPI.Status()
    buf = np.empty(1, dtype=np.int64)
    while w.arrivals.Iprobe(source=MPI.ANY_SOURCE, tag=0, status=status):
        src = status.Get_source()
        w.arrivals.Recv(buf, source=src, tag=0)
        w.seen[src] = max(w.seen[src], int(buf[0]))
    w.sends = [(req, b) for req, b in w.sends if not req.Test()]


def _wait(request, what, seq):
    w = world()
    if w.timeout is None:
        request.Wait()
        return
    deadline = time.monotonic() + w.timeout
    pause = 1e-5
    while not request.Test():
        if time.monotonic() > deadline:
            _drain(w)
            w.seen[w.rank] = seq
            missing = [r for r in range(w.size) if w.seen[r] < seq]
            if missing:
                where = ", ".join(f"rank {r} (last reached #{w.seen[r]})" for r in missing)
                why = f"these ranks did not reach it: {where}"
            else:
                why = "every rank reached it, but the transfer did not finish"
            raise RuntimeError(f"compiled_autograd.distributed: {what} (collective #{seq}) "
                               f"timed out after {w.timeout:g} s on rank {w.rank}: {why}")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


class Work:
    """A collective in flight (torch's ``Work``/``Future``): ``wait()`` blocks until
    it is done and returns its result (the reduced Tensor)."""

    def __init__(self, request, what, seq, result, finish=None):
        self._request, self._what, self._seq = request, what, seq
        self._result, self._finish, self._done = result, finish, False

    def is_completed(self) -> bool:
        return self._done or bool(self._request.Test())

    def wait(self):
        if not self._done:
            _wait(self._request, self._what, self._seq)
            if self._finish is not None:
                self._result = self._finish()
            self._done = True
        return self._result

    def value(self):
        return self.wait()

    def then(self, callback):
        """A Work whose result is ``callback(self)``, run when it is waited for."""
        return Work(self._request, self._what, self._seq, None,
                    lambda: callback(_Done(self.wait())))


class _Done:
    def __init__(self, value):
        self._value = value

    def value(self):
        return self._value

    def wait(self):
        return self._value


# ------------------------------------------------------------------ collectives

def _buffer(tensor, what):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(tensor).__name__}")
    arr = tensor._data
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _written(tensor, buf, scale=None):
    """Put a collective's result into the tensor (in place, as torch)."""
    def finish():
        if scale is not None:
            np.multiply(buf, scale, out=buf, casting="unsafe")
        if buf is not tensor._data:
            tensor._data[...] = buf
        tensor._version_counter.bump()
        return tensor
    return finish


def all_reduce(tensor, op="sum", async_op=False):
    """Reduce ``tensor`` over every rank, in place: ``op`` "sum" or "avg".
    ``async_op=True`` returns a ``Work`` (``.wait()``); otherwise None, once done."""
    if op not in _OPS:
        raise ValueError(f"all_reduce: op must be one of {_OPS}, got {op!r}")
    w = world()
    buf = _buffer(tensor, "all_reduce")
    if op == "avg" and not np.issubdtype(buf.dtype, np.floating):
        raise RuntimeError(f"all_reduce: op 'avg' needs a floating-point tensor, got {buf.dtype}")
    seq = _arrive(w, "all_reduce")
    req = w.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    work = Work(req, "all_reduce", seq, tensor,
                _written(tensor, buf, 1.0 / w.size if op == "avg" else None))
    if async_op:
        return work
    work.wait()
    return None


def broadcast(tensor, src=0, async_op=False):
    """Copy rank ``src``'s ``tensor`` into every rank's, in place."""
    w = world()
    if not 0 <= src < w.size:
        raise ValueError(f"broadcast: src must be a rank in [0, {w.size}), got {src}")
    buf = _buffer(tensor, "broadcast")
    seq = _arrive(w, "broadcast")
    req = w.comm.Ibcast(buf, root=src)
    work = Work(req, "broadcast", seq, tensor, _written(tensor, buf))
    if async_op:
        return work
    work.wait()
    return None


def barrier():
    """Wait until every rank has reached this call."""
    w = world()
    seq = _arrive(w, "barrier")
    _wait(w.comm.Ibarrier(), "barrier", seq)


def all_reduce_array(arr, what="all_reduce"):
    """Start a sum all-reduce of a contiguous numpy array, in place: a ``Work``."""
    w = world()
    seq = _arrive(w, what)
    return Work(w.comm.Iallreduce(MPI.IN_PLACE, arr, op=MPI.SUM), what, seq, arr)


def broadcast_array(arr, src=0, what="broadcast"):
    w = world()
    seq = _arrive(w, what)
    _wait(w.comm.Ibcast(arr, root=src), what, seq)
    return arr


def all_gather_array(arr, what="all_gather"):
    """Every rank's copy of a small int64 array, stacked (one row per rank)."""
    w = world()
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    out = np.empty((w.size,) + arr.shape, dtype=np.int64)
    seq = _arrive(w, what)
    _wait(w.comm.Iallgather(arr, out), what, seq)
    return out


def all_gather_object(obj, what="all_gather_object"):
    """Every rank's ``obj`` (picklable), as a list indexed by rank."""
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = all_gather_array(np.array([data.size]), what)[:, 0]
    w = world()
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    seq = _arrive(w, what)
    _wait(w.comm.Iallgatherv(data, [out, (sizes, offsets), MPI.BYTE]), what, seq)
    return [pickle.loads(out[o:o + s].tobytes()) for o, s in zip(offsets, sizes)]
