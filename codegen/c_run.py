"""Running a compiled C backward: the boxed inputs in, callbacks, gradients out.

``CBackward(graph)`` generates the C (``compiled_autograd.codegen.c``), builds and loads it
(``compiled_autograd.runtime.cbuild``) and is called like every backend:
``fn(inputs, sizes, scalars, hooks, packed_data)``. A call takes the input arrays
out of the boxed list (C-contiguous, checked against the traced shapes), allocates
the arena and the output arrays, and calls ``ca_backward``. At each callback site
Python first does the deferred work the order requires -- dropping the arena
blocks and arrays whose last use has passed, gradient accumulations that come
before the site -- then runs the hook, hands C a pointer to each array it
returned, and allocates the arena blocks opened there (codegen/arena.py).

A program with a static memory plan and whole output arrays as its gradients --
the common case, callbacks or not -- is called in C instead: ``c_call.c``'s
Runner does the same steps, in the same order, without the Python glue
(benchmarks/c_breakdown.py times both calls). Its callback sites run in C too:
``_site_specs`` turns each site's work into ops the Runner interprets (folded
releases, accumulations, arena blocks, late outputs), and the hook is one
vectorcall of ``CALL_HOOK[kind]`` with its arguments made in C (an arena value
copied out, as here) and its results checked in C (a result in another layout
goes through ``_checked``, which raises or copies, as here). The Runner is built
once per machine like the cache hit's walk (``compiled_autograd.runtime.extension``); without a
compiler for it, with ``CA_C_CALL=0``, while ``ca.memory.profile()`` records, or
for a program whose layouts depend on sizes (``dynamic=True``), the Python code
below runs.

If the build fails, ``compile_graph`` raises the build error, or, with
``CA_C_FALLBACK=python`` in the environment, warns and returns the Python backend.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from compiled_autograd.codegen import arena as arena_plan
from compiled_autograd.codegen.c import generate
from compiled_autograd.codegen.c_layout import Val, contiguous_strides, value_of
from compiled_autograd.codegen.python import compile_graph as python_backend
from compiled_autograd.autograd.node import accumulate_into
from compiled_autograd.compiled.hook_calls import CALL_HOOK
from compiled_autograd.ir.symbolic import resolve
from compiled_autograd.runtime import cbuild, cthreads, memory, pool
from compiled_autograd.runtime.extension import Extension

C_CALL = Extension("_c_call", (Path(__file__).with_name("c_call.c"),
                               Path(__file__).with_name("c_sites.c")), "the C call",
                   "CA_C_CALL", numpy_headers=True,
                   on_load=lambda module: module.use_allocator(pool.api()))


CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_int))


def _unraisable(args, _previous=[None]):
    """sys.unraisablehook: an exception that escaped a C backward's callback (a
    KeyboardInterrupt landing on its first line, before its ``try``) goes to
    that call's frame, raised once C returns (``ca_call_back`` saw no *done);
    anything else to the hook that was there before."""
    callback = args.object
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, CBackward) and getattr(callback, "__func__", None) is \
            CBackward._on_callback:
        frames = getattr(owner._threads, "frames", None)
        if frames and frames[-1].error is None:
            frames[-1].error = args.exc_value
            return
    (_previous[0] or sys.__unraisablehook__)(args)


def _catch_escaped_callback_errors():
    if sys.unraisablehook is not _unraisable:
        _unraisable.__defaults__[0][0] = sys.unraisablehook
        sys.unraisablehook = _unraisable

_P = ctypes.c_void_p


class _Frame:
    __slots__ = ("py", "store", "arena", "arena_blocks", "outs", "out_objs", "sizes", "error",
                 "flushed")


class CBackward:
    """The compiled function of backend "c"."""

    def __init__(self, graph, build=True, part_lines=None):
        self.graph = graph
        self.prog = generate(graph) if part_lines is None else generate(graph, part_lines)
        self.c_code = self.prog.source
        self.build_seconds = 0.0
        self.built_now = False
        self.fn = self._runner = None
        if build:
            self.build()

    @property
    def memory_plan(self):
        return self.prog.plan

    def build(self):
        t0 = time.perf_counter()
        path, self.built_now = cbuild.build(self.prog.sources)
        lib = cbuild.load(path)
        # One thread pool for the loops and the GEMMs (runtime/cthreads.py).
        self.threads = cthreads.share_blas_threads() and cthreads.status()
        self.build_seconds = time.perf_counter() - t0
        self.library = path
        fn = lib.ca_backward
        fn.argtypes = [_P, _P, _P, _P, _P, _P, CALLBACK]
        fn.restype = ctypes.c_int
        self.fn = fn
        self._callback = CALLBACK(self._on_callback)
        _catch_escaped_callback_errors()
        self._threads = threading.local()   # each thread's running calls (frames)
        prog = self.prog
        # An output array becomes .grad itself (no copy) when this accumulation is
        # its only consumer: nothing reads it later and nothing else is handed it.
        handed = {}
        for step, _, v in prog.accumulations:
            handed[v.storage] = handed.get(v.storage, 0) + 1
        for out in prog.outputs:
            if out is not None and out[0] == "val":
                handed[out[1].storage] = handed.get(out[1].storage, 0) + 1
        self._whole = [_whole(v) for _, _, v in prog.accumulations]
        self._owned = [v.storage.kind == "out" and handed[v.storage] == 1
                       and v.storage.last <= step and whole
                       for (step, _, v), whole in zip(prog.accumulations, self._whole)]
        # An output array nothing reads after its accumulation is dropped from the
        # call's frame right after it: .grad then holds it alone, so a hook that
        # takes .grad away (ca.optim.in_backward) frees it during the backward.
        self._drop_after = [v.storage.kind == "out" and handed[v.storage] == 1
                            and v.storage.last <= step for step, _, v in prog.accumulations]
        self._out_shapes = [s.shape if all(isinstance(d, int) for d in s.shape) else None
                            for s in prog.out_storages]
        late = {s for site in prog.sites for s in site.alloc}
        self._outs_at_start = [s for s in prog.out_storages if s not in late]
        # Arena blocks (compiled_autograd.codegen.arena): the one held for the whole call is the
        # `arena` argument; every other is allocated at the start of the call or at
        # the end of the callback that opens it (site.open_blocks), and dropped at
        # the start of the callback that closes it (site.close_blocks).
        self._blocks_at_start = [k for k, (opened, _) in enumerate(prog.windows)
                                 if opened == 0 and k != prog.call_block]
        self._pyrefs = [(node, box, i, box not in ("sizes", "scalars"))
                        for node, (box, i) in prog.pyrefs.items()]
        self._plans: dict = {}
        self._input_nodes = {i: node for node, (box, i) in prog.pyrefs.items() if box == "inputs"}
        self._input_specs = []
        for i, storage in prog.inputs:
            static = all(isinstance(d, int) for d in storage.shape)
            self._input_specs.append((i, self._input_nodes[i], storage,
                                      tuple(storage.shape) if static else None, storage.dtype,
                                      storage_val(storage), _byte_strides(storage)))
        needed = {a for site in prog.sites for kind, a in site.args if kind == "py"}
        needed |= {variable for _, variable, _ in prog.accumulations}
        needed |= {out[1] for out in prog.outputs if out is not None and out[0] == "py"}
        self._array_only = [self._input_nodes[i] for i, _ in prog.inputs
                            if self._input_nodes[i] not in needed]
        self._runner = self._native_runner(fn)
        return self

    def _native_runner(self, fn):
        """The C call of this program (c_call.c's Runner), or None where the
        Python path is needed: a plan that depends on sizes, a gradient or result
        that is not a whole output array, or a callback argument or result whose
        layout depends on sizes."""
        prog = self.prog
        if (prog.plan is None or not all(self._whole)
                or any(v.storage.kind != "out" for _, _, v in prog.accumulations)
                or any(spec[3] is None for spec in self._input_specs)
                or any(shape is None for shape in self._out_shapes)):
            return None
        slot = {node: k for k, node in enumerate(prog.pyrefs)}
        results = []
        for out in prog.outputs:
            if out is None:
                results.append((0, 0))
            elif out[0] == "py":
                results.append((1, slot[out[1]]))
            elif out[1].storage.kind == "out" and _whole(out[1]):
                results.append((2, out[1].storage.index))
            else:
                return None
        sites = _site_specs(prog, slot) if prog.sites else ()
        if sites is None:
            return None
        module = C_CALL.module()
        if module is None:
            return None
        array_only = set(self._array_only)
        outputs = [None] * len(prog.out_storages)
        for s in prog.out_storages:
            outputs[s.index] = (self._out_shapes[s.index], np.dtype(s.dtype).num)
        late = {s for site in prog.sites for s in site.alloc}
        plan, start = prog.plan, set(self._blocks_at_start)
        if prog.sites:
            arena_bytes = (plan.block_sizes[prog.call_block] if prog.call_block is not None
                           else 0)
            blocks = tuple((plan.block_sizes[k], k in start) for k in range(len(prog.windows)))
        else:
            arena_bytes, blocks = plan.size, ()
        specs, checked = self._input_specs, self._checked

        def fix_input(j, arr, sizes):      # a value that is not the traced array: check it
            i, _, _, _, _, val, _ = specs[j]   # (not through self: the runner is self's)
            return checked(arr, val, sizes, f"input {i}")

        def fix_result(index, j, arr, sizes):   # a hook's result the C cannot read as is
            site = prog.sites[index]
            return checked(arr, site.results[j][1], sizes, f"{site.kind} '{site.node.name}'")
        return module.Runner(
            fn=ctypes.cast(fn, ctypes.c_void_p).value,
            refs=tuple((_BOXES.index(box), i, box not in ("sizes", "scalars"))
                       for box, i in prog.pyrefs.values()),
            inputs=tuple((slot[node], node not in array_only, (shape, np.dtype(dtype).num),
                          strides) for _, node, _, shape, dtype, _, strides in specs),
            outputs=tuple(outputs),
            accumulations=tuple((slot[variable], v.storage.index, owned, drop)
                                for (_, variable, v), owned, drop in zip(
                                    prog.accumulations, self._owned, self._drop_after)),
            results=tuple(results), arena_bytes=arena_bytes, errors=tuple(prog.errors),
            reads=(prog.reads_sizes, prog.reads_scalars),
            accumulate=accumulate_into, fix_input=fix_input,
            late=tuple(s in late for s in sorted(prog.out_storages, key=lambda s: s.index)),
            blocks=blocks, n_ext=len(prog.ext_storages), sites=sites, fix_result=fix_result)

    # ------------------------------------------------------------ values

    def _base(self, frame, storage):
        kind = storage.kind
        if kind == "arena":
            i = self.prog.arena_index[storage]
            k = self.prog.block_of[i]
            block = frame.arena if k == self.prog.call_block else frame.arena_blocks[k]
            return block[self._plan(frame.sizes).offsets[i]:]
        if kind == "out":
            return frame.outs[storage.index]
        return frame.store[storage]

    def _resolve(self, frame, v, copy, whole=None):
        storage = v.storage
        if whole if whole is not None else _whole(v):   # no view to build
            return frame.outs[storage.index] if storage.kind == "out" else frame.store[storage]
        arr = v.numpy(self._base(frame, storage), frame.sizes)
        if copy and v.storage.kind == "arena":
            arr = np.array(arr, order="C", copy=True)
            memory.on_array(arr, "c_callback_arg", "temporary")
        return arr

    def _plan(self, sizes):
        if self.prog.plan is not None:
            return self.prog.plan
        key = tuple(sizes)
        plan = self._plans.get(key)
        if plan is None:
            plan = arena_plan.plan(
                [(value_of(s.nbytes, sizes), s.first, s.last) for s in self.prog.arena_storages],
                self.prog.cuts, fill=False)
            # the C reads each buffer from the block it was compiled for
            if plan.block_of != self.prog.block_of or plan.windows != self.prog.windows:
                raise AssertionError("compiled C backward: the arena blocks depend on sizes")
            self._plans[key] = plan
        return plan

    def _open_blocks(self, frame, blocks):
        """Allocate arena ``blocks``, handed to C through ``out[]`` after the outputs."""
        sizes = self._plan(frame.sizes).block_sizes
        n_out = len(self.prog.out_storages)
        for k in blocks:
            arr = np.empty(max(sizes[k], 1), np.uint8)
            if memory.active():
                memory.on_array(arr, "c_arena", "temporary")
            frame.arena_blocks[k] = arr
            frame.out_objs[n_out + k] = id(arr)

    def _close_blocks(self, frame, blocks):
        n_out = len(self.prog.out_storages)
        for k in blocks:
            frame.arena_blocks[k] = None
            frame.out_objs[n_out + k] = 0

    # ------------------------------------------------------------ deferred work

    def _flush(self, frame, before_step):
        accs = self.prog.accumulations
        while frame.flushed < len(accs) and accs[frame.flushed][0] < before_step:
            k = frame.flushed
            step, variable, v = accs[k]
            frame.flushed += 1
            accumulate_into(frame.py[variable], self._resolve(frame, v, False, self._whole[k]),
                            owned=self._owned[k])
            if self._drop_after[k]:
                frame.outs[v.storage.index] = None

    def _allocate(self, frame, storages):
        """The output arrays of ``storages``, handed to C through ``out[]``."""
        for s in storages:
            shape = self._out_shapes[s.index]
            arr = np.empty(shape if shape is not None else
                           tuple(value_of(d, frame.sizes) for d in s.shape), s.dtype)
            if memory.active():
                memory.on_array(arr, "c_output", "gradient")
            frame.outs[s.index] = arr
            frame.out_objs[s.index] = id(arr)

    def _on_callback(self, index, results, done):
        try:
            frame = self._threads.frames[-1]
            site = self.prog.sites[index]
            for early in site.early:    # release callbacks folded into this one
                self._flush(frame, early.step)
                for s in early.release:
                    frame.store.pop(s, None)
            self._close_blocks(frame, site.close_blocks)
            self._allocate(frame, site.alloc)
            self._flush(frame, site.step)
            for s in site.release:
                frame.store.pop(s, None)
            if site.kind == "release":
                self._open_blocks(frame, site.open_blocks)
                done[0] = 1
                return 0
            args = []
            for kind, a in site.args:
                if kind == "py":
                    args.append(frame.py[a])
                elif kind == "val":
                    args.append(self._resolve(frame, a, True))
                else:
                    args.append(a)
            if site.kind == "unpack_hook":       # (eager's message for a wrong shape)
                args.append(resolve(tuple(site.node.meta["shape"]), frame.sizes, ()))
            value = CALL_HOOK[site.kind](*args)
            for j, (i, v) in enumerate(site.results):
                arr = value if i is None else value[i]
                arr = self._checked(arr, v, frame.sizes, f"{site.kind} '{site.node.name}'")
                frame.store[v.storage] = arr
                results[j] = arr.ctypes.data
            self._open_blocks(frame, site.open_blocks)
            done[0] = 1
            return 0
        except BaseException as e:  # re-raised by __call__ once C has returned
            self._threads.frames[-1].error = e
            return 1

    @staticmethod
    def _checked(arr, v, sizes, what):
        if not isinstance(arr, np.ndarray):
            raise RuntimeError(f"compiled C backward: {what} gave {type(arr).__name__}, "
                               "expected an array")
        shape = tuple(value_of(d, sizes) for d in v.shape)
        if arr.shape != shape or arr.dtype != v.dtype:
            raise RuntimeError(f"compiled C backward: {what} gave a {arr.dtype} tensor of shape "
                               f"{list(arr.shape)}, but the backward was compiled for "
                               f"{v.dtype} {list(shape)}")
        layout = tuple(value_of(st, sizes) * arr.itemsize for st in v.storage.strides)
        if arr.size > 1 and any(n > 1 and a != b for n, a, b in zip(arr.shape, arr.strides,
                                                                   layout)):
            # Not the layout the C was compiled for: copy it into that layout.
            extent = 1 + sum((n - 1) * st for n, st in zip(arr.shape, layout)) // arr.itemsize
            copy = np.lib.stride_tricks.as_strided(np.empty(max(extent, 1), arr.dtype),
                                                   arr.shape, layout)
            copy[...] = arr
            memory.on_array(copy.base, f"{what}:relaid")
            arr = copy
        return arr

    # ------------------------------------------------------------ the call

    def _take_inputs(self, frame):
        """The input arrays, checked (the traced shape, dtype and layout: contiguous,
        or the strides a saved view had), in ``frame.store`` -- their only owner
        once the call starts."""
        py, store, arrays = frame.py, frame.store, []
        for i, node, storage, shape, dtype, val, strides in self._input_specs:
            arr = py[node]
            if type(arr) is not np.ndarray:
                arr = getattr(arr, "_data", arr)      # a leaf Tensor read as an array
            if not (type(arr) is np.ndarray and arr.shape == shape and arr.dtype == dtype
                    and (arr.flags.c_contiguous if strides is None
                         else _same_layout(arr, strides))):
                arr = self._checked(arr, val, frame.sizes, f"input {i}")  # raises, or copies
            store[storage] = arr
            arrays.append(arr)
        for node in self._array_only:
            del py[node]     # the array in frame.store is all the call keeps
        return arrays

    def __call__(self, inputs, sizes, scalars, hooks, packed_data):
        if self._runner is not None and not memory.active():
            return self._runner(inputs, sizes if type(sizes) is list else list(sizes),
                                scalars if type(scalars) is list else list(scalars),
                                hooks if type(hooks) is list else list(hooks),
                                packed_data if type(packed_data) is list else list(packed_data))
        prog = self.prog
        boxes = {"inputs": inputs, "sizes": sizes, "scalars": scalars, "hooks": hooks,
                 "packed_data": packed_data}
        frame = _Frame()
        frame.sizes, frame.error, frame.flushed = list(sizes), None, 0
        py = frame.py = {}
        frame.store = {}
        for node, box, i, take in self._pyrefs:
            container = boxes[box]
            py[node] = container[i]
            if take:
                container[i] = None
        arrays = self._take_inputs(frame)
        plan = self._plan(frame.sizes)
        call_block = prog.call_block
        frame.arena = (None if call_block is None
                       else np.empty(max(plan.block_sizes[call_block], 1), np.uint8))
        if frame.arena is not None and memory.active():
            memory.on_array(frame.arena, "c_arena", "temporary")
        # The C reads each array's data pointer from its object (compiled_autograd.runtime.cbuild);
        # the outputs and arena blocks allocated at a callback are filled in there.
        n_out = len(prog.out_storages)
        frame.outs = [None] * n_out
        frame.arena_blocks = [None] * len(prog.windows)
        frame.out_objs = out_objs = np.zeros(n_out + len(prog.windows), np.uintp)
        self._allocate(frame, self._outs_at_start)
        self._open_blocks(frame, self._blocks_at_start)
        in_objs = np.fromiter(map(id, arrays), np.uintp, len(arrays))
        n_in = len(arrays)
        del arrays      # frame.store holds them, until their release callback
        size_arr = np.asarray(frame.sizes, np.int64) if frame.sizes else None
        scalar_arr = np.asarray([float(s) for s in scalars], np.float64) if scalars else None
        offsets = (np.asarray(plan.offsets, np.int64) if prog.dynamic and plan.offsets
                   else None)
        frames = self._threads.__dict__.setdefault("frames", [])
        frames.append(frame)
        try:
            rc = self.fn(in_objs.ctypes.data if n_in else None,
                         out_objs.ctypes.data if len(out_objs) else None,
                         None if frame.arena is None else frame.arena.ctypes.data,
                         None if size_arr is None else size_arr.ctypes.data,
                         None if scalar_arr is None else scalar_arr.ctypes.data,
                         None if offsets is None else offsets.ctypes.data, self._callback)
        finally:
            frames.pop()
        if rc != 0:
            if frame.error is not None:
                raise frame.error
            if rc > 0:    # (sys.unraisablehook replaced after this backend was made)
                raise RuntimeError("compiled C backward: a callback into Python failed; "
                                   "its exception was reported as unraisable")
            raise RuntimeError(f"compiled C backward: {prog.errors[-rc - 1]}")
        self._flush(frame, len(self.graph.nodes) + 1)
        results = []
        for out in prog.outputs:
            if out is None:
                results.append(None)
            elif out[0] == "py":
                results.append(py[out[1]])
            else:
                results.append(self._resolve(frame, out[1], False))
        return tuple(results)


_BOXES = ("inputs", "sizes", "scalars", "hooks", "packed_data")
# The Runner's callback work (c_call.c: OP_*, ARG_*, AT_*), as _on_callback does it
_FLUSH, _RELEASE_IN, _RELEASE_EXT, _CLOSE, _ALLOC, _OPEN = range(6)
_LITERAL, _REF, _WHOLE, _VIEW = range(4)
_AT = {"in": 0, "out": 1, "ext": 2, "arena": 3}


def _site_specs(prog, slot):
    """Each callback site's work for the Runner, in _on_callback's order: the
    folded releases (their accumulations, their arrays), the blocks closed,
    outputs allocated, accumulations before it, arrays released; the hook, its
    arguments and where its results go; the blocks opened. None if some layout
    depends on sizes (the Python path runs it)."""
    steps = [step for step, _, _ in prog.accumulations]
    in_index = {storage: j for j, (_, storage) in enumerate(prog.inputs)}

    def flush(step):      # the accumulations before ``step``: their number
        return (_FLUSH, sum(1 for s in steps if s < step))

    def released(storages):
        return [(_RELEASE_IN, in_index[s]) if s.kind == "in" else (_RELEASE_EXT, s.index)
                for s in storages]

    def static(*values):
        return all(isinstance(v, int) for value in values for v in value)

    def layout(v):
        return (tuple(v.shape), np.dtype(v.dtype).num)

    specs = []
    for site in prog.sites:
        pre = []
        for early in site.early:
            pre += [flush(early.step)] + released(early.release)
        pre += [(_CLOSE, k) for k in site.close_blocks]
        pre += [(_ALLOC, s.index) for s in site.alloc]
        pre += [flush(site.step)] + released(site.release)
        post = tuple((_OPEN, k) for k in site.open_blocks)
        if site.kind == "release":
            specs.append((None, tuple(pre), post, (), ()))
            continue
        args = []
        for kind, a in site.args:
            if kind == "lit":
                args.append((_LITERAL, a))
            elif kind == "py":
                if a not in slot:
                    return None
                args.append((_REF, slot[a]))
            else:
                s = a.storage
                if not static(a.shape, a.strides, (a.offset,)):
                    return None
                if _whole(a):
                    args.append((_WHOLE, _AT[s.kind], in_index[s] if s.kind == "in" else s.index))
                    continue
                size = a.dtype.itemsize
                offset, index = a.offset * size, s.index
                if s.kind == "arena":
                    i = prog.arena_index[s]
                    index = prog.block_of[i]
                    offset += prog.plan.offsets[i]
                    if index == prog.call_block:
                        index = -1
                elif s.kind == "in":
                    index = in_index[s]
                args.append((_VIEW, _AT[s.kind], index, offset, layout(a),
                             tuple(st * size for st in a.strides), s.kind == "arena"))
        if site.kind == "unpack_hook":       # (eager's message for a wrong shape)
            shape = tuple(site.node.meta["shape"])
            if not static(shape):
                return None
            args.append((_LITERAL, shape))
        results = []
        for i, v in site.results:
            if not static(v.shape, v.storage.strides):
                return None
            results.append((-1 if i is None else i, v.storage.index, layout(v),
                            tuple(st * v.dtype.itemsize for st in v.storage.strides)))
        specs.append((CALL_HOOK[site.kind], tuple(pre), post, tuple(args), tuple(results)))
    return tuple(specs)


def _whole(v) -> bool:
    """Is ``v`` all of its (non-arena) storage, so no view needs building?"""
    return (v.storage.kind != "arena" and v.offset == 0 and v.shape == v.storage.shape
            and all(n == 1 or a == b for n, a, b in zip(v.shape, v.strides, v.storage.strides)))


def _byte_strides(storage):
    """An input's strides in bytes where it is read strided (static sizes), else
    None: contiguous."""
    if storage.strides == contiguous_strides(storage.shape):
        return None
    return tuple(st * storage.dtype.itemsize for st in storage.strides)


def _same_layout(arr, strides):
    """Does ``arr`` have the byte ``strides`` (over its dims of more than one element)?"""
    return arr.size <= 1 or all(n == 1 or a == b for n, a, b in zip(arr.shape, arr.strides,
                                                                    strides))


def storage_val(storage):
    return Val(storage, storage.dtype, storage.shape, storage.strides)


def compile_graph(graph, build=True):
    """The backend entry point registered as "c"."""
    try:
        return CBackward(graph, build=build)
    except cbuild.CBuildError as e:
        if os.environ.get("CA_C_FALLBACK", "") != "python":
            raise
        warnings.warn(f"C backend unavailable, falling back to the Python backend: {e}",
                      RuntimeWarning, stacklevel=2)
        return python_backend(graph)
