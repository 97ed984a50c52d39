"""The forward's common case in C (``forward.c``): a prim called on Tensors, its
result and its backward node, made without a Python call per field. The front end
configures it (compiled_autograd/autograd/dispatch.py, whose
``apply_prim_reference`` is the reference and takes every uncommon case). Built on
first use (``compiled_autograd.runtime.extension``); without a compiler, or with ``CA_C_FORWARD=0``,
``forward`` returns None and the Python reference runs."""
from __future__ import annotations

from pathlib import Path

from compiled_autograd.runtime import pool
from compiled_autograd.runtime.extension import Extension

FORWARD = Extension("_forward", (Path(__file__).with_name("forward_objects.c"),
                                 Path(__file__).with_name("forward.c")),
                    "the forward's C path", "CA_C_FORWARD", numpy_headers=True,
                    on_load=lambda module: module.use_allocator(pool.api()))

# The fields forward.c writes, in its enums' order.
TENSOR_SLOTS = ("_data", "_requires_grad", "_grad_fn", "_output_nr", "_version_counter",
                "_base", "_view_version", "_grad", "_grad_acc_ref", "_retains_grad",
                "_backward_hooks", "_post_accumulate_grad_hooks", "_creation", "_grad_lock")
NODE_SLOTS = ("next_functions", "input_metadata", "_sequence_nr", "_metadata", "saved",
              "params", "shapes", "dtypes")
SAVED_SLOTS = ("_tensor", "_data", "_version_counter", "saved_version", "is_output",
               "_requires_grad", "_output_nr", "_grad_fn_name", "released", "shape", "dtype",
               "packed", "unpack_hook", "_grad_fn", "_leaf", "packed_kind", "_tensor_ref")
SAVE_KINDS = {"arg": 0, "out": 1, "tail": 2}


def descriptors(classes, names):
    """The ``__slots__`` member descriptor of each name, from the first of
    ``classes`` (a class and its bases) that defines it."""
    out = []
    for name in names:
        out.append(next(c.__dict__[name] for c in classes if name in c.__dict__))
    return tuple(out)


def save_items(spec):
    """A prim's save spec as forward.c reads it: (kind, index, cond) per entry."""
    items = []
    for entry in spec:
        item, cond = entry if entry.__class__ is tuple else (entry, -1)
        if item.__class__ is int:
            items.append((SAVE_KINDS["arg"], item, cond))
        else:
            items.append((SAVE_KINDS[item], 0, cond))
    return tuple(items)


def forward(*config):
    """forward.c's ``Forward(*config)``, or None where the extension is off or
    cannot be built."""
    module = FORWARD.module()
    return None if module is None else module.Forward(*config)
