"""DistributedDataParallel's reducer (torch's ``reducer.cpp``, in small).

Gradients are averaged in buckets. Each parameter has a post-accumulate-grad hook
(``GradReady``): when its gradient is final, the hook copies it into its bucket's
flat buffer; when a bucket is full, its all-reduce starts (buckets start in index
order, the same on every rank, as MPI needs). The hook of the last parameter to
become ready hands the averaged gradients over: it waits for every bucket and
writes them back into ``.grad``; what waits for a parameter's average
(``GradReady.after_reduce``: ``ca.optim.in_backward``'s update) runs right after its
bucket's wait, while later buckets are still in flight.

Under ``ca.compiled_backward`` each hook is a ``call_hook[post_acc_grad_hook]``
node right after its parameter's gradient, named by what it does in the learned
layout (``bucket_<i>_grad``, ``bucket_<i>_allreduce``, ``wait_buckets``), so a
bucket's transfer overlaps the rest of the backward, and the graph dump shows
where. The first backward uses buckets in reverse parameter order; the order
in which gradients became ready there (rank 0's) fixes the buckets of every later
backward, whose hooks are then registered anew (one more trace, then cache hits).

Before the first all-reduce of every backward the ranks compare their bucket
layout and which parameters they used (one small all-gather): a difference
that would make them wait for each other forever is an error, on every rank,
that says what differs.
"""
from __future__ import annotations

import zlib

import numpy as np

from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.distributed import world as _world
from compiled_autograd.distributed.algorithms import allreduce_hook


class GradBucket:
    """What a comm hook gets (torch's ``GradBucket``)."""

    def __init__(self, index, n_buckets, flat, params, slices):
        self._index, self._n = index, n_buckets
        self._flat, self._params, self._slices = flat, params, slices

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._index == self._n - 1

    def buffer(self) -> Tensor:
        """This rank's flat gradient of the bucket (not yet averaged)."""
        return self._flat

    def gradients(self):
        """The bucket's gradients, as views of ``buffer()``."""
        return [Tensor._make(self._flat._data[s].reshape(p.shape))
                for p, s in zip(self._params, self._slices)]

    def parameters(self):
        return list(self._params)


class GradReady:
    """The post-accumulate-grad hook of parameter ``i``; ``graph_name`` names its
    node in a compiled backward's graph."""

    def __init__(self, reducer, i, graph_name):
        self.reducer, self.i, self.graph_name = reducer, i, graph_name
        self.__qualname__ = f"DistributedDataParallel.{graph_name}"

    def __call__(self, param):
        self.reducer.ready(self.i)

    def after_reduce(self, fn) -> bool:
        """Run ``fn(param)`` once this parameter's averaged gradient is in ``.grad``
        in this backward (right after its bucket's all-reduce is waited for, before
        the next bucket's): how ``ca.optim.in_backward`` updates a parameter DDP
        averages. False outside a syncing backward (``no_sync``): nothing is averaged."""
        st = self.reducer.state
        if st is None:
            return False
        st.after_reduce.setdefault(self.i, []).append(fn)
        return True


class HandOver:
    """The hook after the last gradient's: wait for every bucket, write ``.grad``."""

    graph_name = "wait_buckets"
    __qualname__ = "DistributedDataParallel.wait_buckets"

    def __init__(self, reducer):
        self.reducer = reducer

    def __call__(self, param):
        self.reducer.hand_over_hook()


def assign_buckets(params, order, cap_bytes):
    """Buckets (lists of parameter indices) filled in ``order`` up to ``cap_bytes``,
    one dtype per bucket (torch's ``compute_bucket_assignment_by_size``)."""
    buckets, open_ = [], {}
    for i in order:
        p = params[i]
        dt = np.dtype(p.dtype)
        cur = open_.get(dt)
        if cur is None:
            cur = open_[dt] = [[], 0]
        cur[0].append(i)
        cur[1] += p._data.nbytes
        if cur[1] >= cap_bytes:
            buckets.append(cur[0])
            del open_[dt]
    buckets.extend(c[0] for c in open_.values())
    return buckets


class _Backward:
    """One backward's progress."""

    def __init__(self, reducer, used, graph_crc):
        n = len(reducer.params)
        self.used = used                       # bool per parameter: in this rank's graph
        self.graph_crc = graph_crc
        self.ready = np.zeros(n, dtype=bool)
        self.pending = [len(b) for b in reducer.buckets]
        self.next = 0                          # the next bucket to start
        self.works = [None] * len(reducer.buckets)
        self.checked = False
        self.global_used = None
        self.order = []                        # ready order (learned on the first backward)
        last = reducer.buckets[-1][-1]
        self.hand_over_hook = bool(used[last])  # will HandOver run?
        self.reached = False                    # has it run?
        self.after_reduce = {}                  # parameter -> what runs once it is averaged


class Reducer:
    def __init__(self, params, names, cap_bytes, find_unused_parameters):
        self.params, self.names = params, names
        self.index = {id(p): i for i, p in enumerate(params)}
        self.cap_bytes = cap_bytes
        self.find_unused = find_unused_parameters
        self.comm_hook, self.comm_state = None, None
        self.handles = []
        self.rebuilt = False
        self.state = None
        self._set_buckets(assign_buckets(params, list(reversed(range(len(params)))), cap_bytes))

    # ------------------------------------------------------------ layout

    def _set_buckets(self, buckets):
        self.buckets = buckets
        self.bucket_of, self.slices, self.flats = {}, {}, []
        for b, members in enumerate(buckets):
            offset = 0
            for i in members:
                n = self.params[i]._data.size
                self.bucket_of[i] = b
                self.slices[i] = slice(offset, offset + n)
                offset += n
            self.flats.append(np.zeros(offset, dtype=self.params[members[0]].dtype))
        self.layout_crc = zlib.crc32(repr(buckets).encode())
        for h in self.handles:
            h.remove()
        self.handles = []
        for b, members in enumerate(buckets):
            for k, i in enumerate(members):
                name = f"bucket_{b}_allreduce" if k == len(members) - 1 else f"bucket_{b}_grad"
                self.handles.append(self.params[i].register_post_accumulate_grad_hook(
                    GradReady(self, i, name)))
        last = self.params[buckets[-1][-1]]
        self.handles.append(last.register_post_accumulate_grad_hook(HandOver(self)))

    def describe(self, buckets=None):
        """The buckets, by parameter name (for messages and docs)."""
        return [[self.names[i] for i in b] for b in (buckets or self.buckets)]

    # ------------------------------------------------------------ per backward

    def prepare(self, outputs):
        """Called by the forward (grad enabled, syncing): which parameters this
        rank's graph reaches. Local only: a forward never blocks."""
        if self.state is not None and self.state.next > 0:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting "
                "a new one: the previous backward started its buckets' all-reduces but did "
                "not reach every parameter's gradient")
        self.rebuild()
        used, crc = reachable(outputs, self.index)
        self.state = _Backward(self, used, crc)

    rebuild_order = None

    def rebuild(self):
        """Use the learned buckets (and register their hooks) if the first backward
        learned new ones; DDP's forward calls this before the module's forward, so
        that the graph it builds sees the hooks its backward will run."""
        if self.rebuild_order is not None:
            self._set_buckets(assign_buckets(self.params, self.rebuild_order, self.cap_bytes))
            self.rebuild_order = None

    def ready(self, i):
        st = self.state
        if st is None:     # a backward that no syncing DDP forward prepared (no_sync)
            return
        if not st.checked:
            self._check(st)
        if st.ready[i]:
            raise RuntimeError(
                f"Expected to mark a variable ready only once: parameter {self.names[i]} "
                "received its gradient twice in one backward (a second backward through the "
                "same DDP forward, retain_graph=True?)")
        st.order.append(i)
        self._mark(st, i)
        self._start(st)
        if st.next == len(self.buckets) and (st.reached or not st.hand_over_hook):
            self._hand_over(st)

    def hand_over_hook(self):
        """The learned layout's last gradient is in: hand over, unless a bucket
        still waits for a gradient (the order differs from the learned one); then
        the hook that fills it hands over."""
        st = self.state
        if st is None:
            return
        st.reached = True
        if st.next == len(self.buckets):
            self._hand_over(st)

    def _mark(self, st, i):
        st.ready[i] = True
        p, b = self.params[i], self.bucket_of[i]
        dst = self.flats[b][self.slices[i]]
        if p.grad is None:
            dst[...] = 0
        else:
            dst[...] = p.grad._data.reshape(-1)
        st.pending[b] -= 1

    def _start(self, st):
        """Start every full bucket, in index order (the same order on every rank)."""
        while st.next < len(self.buckets) and st.pending[st.next] == 0:
            b = st.next
            members = self.buckets[b]
            bucket = GradBucket(b, len(self.buckets), Tensor._make(self.flats[b]),
                                [self.params[i] for i in members],
                                [self.slices[i] for i in members])
            hook = self.comm_hook or allreduce_hook
            st.works[b] = hook(self.comm_state, bucket)
            st.next += 1
        # Open MPI moves a non-blocking collective on only inside MPI calls
        for w in st.works[:st.next]:
            if hasattr(w, "is_completed"):
                w.is_completed()

    def _check(self, st):
        """Compare the bucket layout and the used parameters across ranks, before
        the first all-reduce (one small all-gather): a difference the ranks would
        hang on is a RuntimeError on every rank."""
        st.checked = True
        mine = np.concatenate([[self.layout_crc, st.graph_crc, len(self.params)],
                               st.used.astype(np.int64)])
        rows = _world.all_gather_array(mine, "DistributedDataParallel's layout check")
        if (rows[:, 0] != rows[0, 0]).any():
            self.state = None
            layouts = _world.all_gather_object(self.describe(), "layout check")
            lines = "\n".join(f"  rank {r}: {layout}" for r, layout in enumerate(layouts))
            raise RuntimeError("DistributedDataParallel: the ranks' gradient buckets differ "
                               f"(they would wait for each other forever):\n{lines}")
        used = rows[:, 3:].astype(bool)
        st.global_used = used.any(axis=0)
        if not self.find_unused and not used.all():
            self.state = None
            lines = "\n".join(
                f"  rank {r}: " + (", ".join(self.names[i] for i in np.flatnonzero(~u))
                                   or "none")
                for r, u in enumerate(used))
            graphs = "the same" if (rows[:, 1] == rows[0, 1]).all() else "different"
            raise RuntimeError(
                "DistributedDataParallel: some parameters were not used in producing the loss "
                "(unused parameters); without find_unused_parameters=True every rank must give "
                "every parameter a gradient, or the ranks wait for each other forever. The "
                f"ranks' backward graphs are {graphs}. Parameters that received no gradient:\n"
                f"{lines}\nPass find_unused_parameters=True to DistributedDataParallel to "
                "allow this.")
        for i in np.flatnonzero(~st.used):    # contributes zeros (or what it accumulated)
            self._mark(st, i)

    def _hand_over(self, st):
        """Wait for every bucket and write the averaged gradients into ``.grad``."""
        self.state = None
        for b, work in enumerate(st.works):
            out = work.wait() if hasattr(work, "wait") else work
            flat = self.flats[b]
            arr = out._data if isinstance(out, Tensor) else None
            if arr is None or arr.shape != flat.shape:
                what = type(out).__name__ if arr is None else f"shape {list(arr.shape)}"
                raise RuntimeError(f"DistributedDataParallel: the comm hook returned {what} "
                                   f"for bucket {b}, expected a Tensor of shape "
                                   f"{list(flat.shape)} (the bucket's flat gradient)")
            for i in self.buckets[b]:
                if not st.global_used[i]:
                    continue      # no rank used it: .grad stays as it was (None), as torch
                p = self.params[i]
                value = arr[self.slices[i]].reshape(p.shape).astype(p.dtype, copy=False)
                if p.grad is None:
                    p.grad = Tensor._make(value.copy())
                else:
                    p.grad._data[...] = value
                    p.grad._version_counter.bump()
            for i in self.buckets[b]:     # (a parameter no rank used has no update)
                if st.global_used[i]:
                    for fn in st.after_reduce.get(i, ()):
                        fn(self.params[i])
        if not self.rebuilt:
            self.rebuilt = True
            self._learn_order(st)

    def _learn_order(self, st):
        """Rank 0's ready order (then the parameters it did not use, in reverse
        order) fixes the buckets from the next forward on, on every rank."""
        seen = set(st.order)
        order = np.array(st.order + [i for i in reversed(range(len(self.params)))
                                     if i not in seen], dtype=np.int64)
        _world.broadcast_array(order, 0, "DistributedDataParallel's bucket order")
        buckets = assign_buckets(self.params, [int(i) for i in order], self.cap_bytes)
        if buckets != self.buckets:
            self.rebuild_order = [int(i) for i in order]


def reachable(outputs, index):
    """(which parameters the autograd graph of ``outputs`` reaches, a crc of the
    graph's node names in walk order)."""
    used = np.zeros(len(index), dtype=bool)
    crc = 0
    stack, seen = [], set()
    for t in _tensors(outputs):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif id(t) in index:
            used[index[id(t)]] = True
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        crc = zlib.crc32(fn.name().encode(), crc)
        variable = getattr(fn, "variable", None)
        if variable is not None and id(variable) in index:
            used[index[id(variable)]] = True
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return used, crc


def _tensors(value):
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
