"""Saved values' arrays read, and released, in one C pass (``slots.c``): the
hand-over of a compiled backward's saved values (``SavedVariable.arrays``, whose
Python loop is the reference). Built on first use (``compiled_autograd.runtime.extension``); without
a compiler, or with ``CA_C_SLOTS=0``, ``reader`` returns None and the Python loop
runs."""
from __future__ import annotations

from pathlib import Path

from compiled_autograd.runtime.extension import Extension

SLOTS = Extension("_slots", (Path(__file__).with_name("slots.c"),),
                  "the saved values' C pass", "CA_C_SLOTS")


def reader(held, data, released, inner):
    """``slots.c``'s Reader over these four ``__slots__`` descriptors -- a saved
    value's tensor, array and released flag, and the tensor's array -- or None
    where the extension is off or cannot be built."""
    module = SLOTS.module()
    return None if module is None else module.Reader(held, data, released, inner)
