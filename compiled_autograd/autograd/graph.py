"""Saved-tensor hooks (torch.autograd.graph's names).

``saved_tensors_hooks(pack, unpack)``: while active, every tensor saved for backward
is replaced by ``pack(tensor)`` (run once, at save time) and restored by
``unpack(packed)`` (run at every access). Hooks are thread-local and nest: the
innermost pair wins. ``save_on_disk`` is such a pair writing each saved tensor to a
private file; checkpointing (``ca.utils.checkpoint``) is another.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import numpy as np

from compiled_autograd.autograd.node import Node
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.runtime import memory
from compiled_autograd.autograd.saved_hooks import (current_hooks, disable_saved_tensors_hooks,
                                           saved_tensors_hooks)

# Node: the base every autograd node is an instance of (torch.autograd.graph.Node):
# name(), next_functions, metadata, register_hook, register_prehook
__all__ = ["Node", "saved_tensors_hooks", "disable_saved_tensors_hooks", "save_on_disk",
           "current_hooks"]

class _PrivateDirectory:
    """A private temporary directory, removed when nothing refers to it: neither
    the save_on_disk context nor any file handle in it."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="ca-offload-")
        weakref.finalize(self, shutil.rmtree, self.path, True)


class _OffloadedTensor:
    """A saved tensor living in a private file; the file is removed when this
    handle is freed (after the backward that used it, or with its graph)."""

    __slots__ = ("path", "shape", "dtype", "nbytes", "directory", "_finalizer",
                 "__weakref__")

    def __init__(self, path, shape, dtype, nbytes, directory):
        self.path, self.shape, self.dtype, self.nbytes = path, shape, dtype, nbytes
        self.directory = directory  # keeps a private directory alive
        self._finalizer = weakref.finalize(self, _remove, path)

    def __repr__(self):
        return f"<offloaded {list(self.shape)} {self.dtype} at {self.path}>"


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class save_on_disk(saved_tensors_hooks):
    """Offload every tensor saved for backward to disk, reload it on unpack.

    Files are created with ``tempfile.mkstemp`` (owner-only permissions,
    unpredictable names) in ``directory`` or in a private temporary directory, and
    removed as soon as nothing refers to them any more (after their backward, or
    when the graph is freed); the private directory goes at interpreter exit.
    """

    def __init__(self, directory=None):
        if directory is not None and not os.path.isdir(directory):
            raise RuntimeError(f"save_on_disk: directory {directory!r} does not exist")
        self.directory = directory
        self._private_dir = None
        super().__init__(self._pack, self._unpack)

    kind = "offload"   # packed data: an _OffloadedTensor

    def _dir(self):
        if self.directory is not None:
            return self.directory, None
        if self._private_dir is None:
            self._private_dir = _PrivateDirectory()
        return self._private_dir.path, self._private_dir

    def _pack(self, tensor):
        path_dir, keep_alive = self._dir()
        # Raw bytes in C order (tofile's order for any layout): the handle keeps
        # shape and dtype, so no .npy header.
        # (np.load parses its header with ast, which CPython 3.11 does not make safe
        # for two threads at once: "AST constructor recursion depth mismatch".)
        fd, path = tempfile.mkstemp(suffix=".raw", dir=path_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                tensor._data.tofile(f)
        except BaseException:
            _remove(path)
            raise
        return _OffloadedTensor(path, tensor.shape, tensor._data.dtype, tensor._data.nbytes,
                                keep_alive)

    @staticmethod
    def _unpack(handle):
        # Read into an array of the saved shape: it owns its memory (no reshape of
        # a flat array, and no ``arr.shape = ...``, which numpy 2.5 deprecates).
        arr = np.empty(handle.shape, dtype=handle.dtype)
        with open(handle.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            read = f.readinto(arr.reshape(-1).view(np.uint8)) if size == handle.nbytes else -1
        if read != handle.nbytes:
            raise RuntimeError(f"save_on_disk: the file {handle.path} holding a saved tensor "
                               f"was changed: {size} bytes, expected {handle.nbytes}")
        memory.on_array(arr, "reload", "reloaded")
        return Tensor._make(arr)
