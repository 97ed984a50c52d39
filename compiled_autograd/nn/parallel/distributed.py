"""DistributedDataParallel: torch's, over ``compiled_autograd.distributed`` (MPI).

Every rank runs the same model on its share of the batch; the backward averages
the gradients over the ranks (``reducer.Reducer``), so that after it every rank
holds the full batch's gradient and an optimizer step keeps the replicas equal.
"""
from __future__ import annotations

import contextlib
import zlib

import numpy as np

from compiled_autograd.autograd.grad_mode import is_grad_enabled
from compiled_autograd.distributed import world as _world
from compiled_autograd.nn.modules import Module
from compiled_autograd.nn.parallel.reducer import Reducer


class DistributedDataParallel(Module):
    """Wraps ``module`` for data-parallel training over the MPI world.

    When made, rank 0's parameters and buffers are copied to every rank. A
    forward is the module's; a backward through it averages the gradients over
    the ranks in buckets of about ``bucket_cap_mb`` MB, each all-reduced as soon as
    its gradients are final (inside the compiled backward, under
    ``ca.compiled_backward``). ``find_unused_parameters=True`` allows a forward
    that leaves parameters without a gradient (on some ranks: they get the
    average; on every rank: ``.grad`` stays None). ``broadcast_buffers``: rank 0's
    buffers are copied to every rank before each training forward."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, **kwargs):
        super().__init__()
        _world.world()    # the "not initialized" error, before anything else
        if process_group is not None:
            raise ValueError("compiled_autograd.distributed has one process group (the MPI "
                             "world): pass process_group=None")
        if kwargs:
            raise TypeError(f"DistributedDataParallel got unexpected keyword arguments "
                            f"{sorted(kwargs)}")
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps a ca.nn.Module, got "
                            f"{type(module).__name__}")
        if bucket_cap_mb is None or not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
        self.module = module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")
        object.__setattr__(self, "broadcast_buffers", broadcast_buffers)
        object.__setattr__(self, "find_unused_parameters", find_unused_parameters)
        object.__setattr__(self, "bucket_cap_mb", bucket_cap_mb)
        object.__setattr__(self, "require_backward_grad_sync", True)
        _verify_same_model(module)
        self._sync_module_states()
        reducer = Reducer([p for _, p in named], [n for n, _ in named],
                          int(bucket_cap_mb * 1024 * 1024), find_unused_parameters)
        object.__setattr__(self, "reducer", reducer)
        object.__setattr__(self, "_comm_hook_set", False)

    def _sync_module_states(self):
        """Rank 0's parameters and buffers, on every rank."""
        for _, t in list(self.module.named_parameters()) + list(self.module.named_buffers()):
            _world.broadcast(t, 0)

    def forward(self, *inputs, **kwargs):
        grad = is_grad_enabled()
        if self.training and self.broadcast_buffers and _world.get_world_size() > 1:
            for b in self.module.buffers():
                _world.broadcast(b, 0)
        if grad and self.require_backward_grad_sync:
            self.reducer.rebuild()
        out = self.module(*inputs, **kwargs)
        if grad and self.require_backward_grad_sync:
            self.reducer.prepare(out)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards inside accumulate into ``.grad`` without communicating; the
        first synchronised backward after averages what they accumulated."""
        previous = self.require_backward_grad_sync
        object.__setattr__(self, "require_backward_grad_sync", False)
        try:
            yield
        finally:
            object.__setattr__(self, "require_backward_grad_sync", previous)

    def register_comm_hook(self, state, hook):
        """``hook(state, bucket)`` reduces each bucket instead of the default
        average; see ``compiled_autograd.distributed.algorithms``. Once only."""
        if self._comm_hook_set:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be "
                               "called once.")
        if not callable(hook):
            raise TypeError(f"comm hook must be callable, got {type(hook).__name__}")
        object.__setattr__(self, "_comm_hook_set", True)
        self.reducer.comm_hook, self.reducer.comm_state = hook, state

    def bucket_layout(self):
        """The buckets, by parameter name, in the order they are reduced."""
        return self.reducer.describe()


def _verify_same_model(module):
    """Every rank's parameters have the same names, shapes and dtypes (torch's
    ``_verify_param_shape_across_processes``), else an error on every rank."""
    mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()]
    crc = zlib.crc32(repr(mine).encode())
    rows = _world.all_gather_array(np.array([crc, len(mine)]), "DistributedDataParallel()")
    if (rows[:, 0] == rows[0, 0]).all():
        return
    models = _world.all_gather_object(mine, "DistributedDataParallel()")
    rank = _world.get_rank()
    for r, theirs in enumerate(models):
        if theirs == mine:
            continue
        if len(theirs) != len(mine):
            raise RuntimeError(f"DDP expects same model across all ranks, but Rank {rank} has "
                               f"{len(mine)} params, while rank {r} has inconsistent "
                               f"{len(theirs)} params.")
        for k, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                raise RuntimeError(f"DDP expects same model across all ranks, but parameter "
                                   f"{k} is {a[0]} {list(a[1])} {a[2]} on rank {rank} and "
                                   f"{b[0]} {list(b[1])} {b[2]} on rank {r}.")
