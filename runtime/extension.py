"""A CPython extension module of the project's own C, built on first use.

``Extension(name, sources, what, env_var)`` describes one: its C files (joined
into one translation unit, each behind a ``#line`` directive so that compiler
messages name the right file), and the environment variable that turns it off
(``=0``); ``optimize``: built as the generated C is (-O3, the host's vector
width: ``cbuild.KERNEL_FLAGS``), for numerical loops. ``module()`` builds it with
the system compiler against this interpreter's headers
(``cbuild.build_extension``: the C backend's private cache, so a second process
loads it without compiling) and imports it (then calls ``on_load(module)``, if
given); without a compiler or the headers it returns None and ``status()`` says
why, so the caller's Python code runs instead. Used by the C backend's call (``compiled_autograd.codegen.c_run``), the forward's C path
(``compiled_autograd.runtime.forward``) and its kernels (``compiled_autograd.runtime.kernels``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import threading
from pathlib import Path

import numpy as np

from compiled_autograd.runtime.cbuild import CBuildError, build_extension

log = logging.getLogger("compiled_autograd")


_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_./]+)"\s*$')


def _pasted(path: Path) -> str:
    out = [f'#line 1 "{path.name}"\n']
    for number, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        match = _LOCAL_INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        out.append(_pasted((path.parent / match.group(1)).resolve()))
        out.append(f'#line {number + 1} "{path.name}"\n')
    return "".join(out)


class Extension:
    def __init__(self, name: str, sources: tuple[Path, ...], what: str, env_var: str,
                 numpy_headers: bool = False, optimize: bool = False, on_load=None):
        self.name, self.sources, self.what, self.env_var = name, sources, what, env_var
        self.numpy_headers, self.optimize = numpy_headers, optimize
        self.on_load = on_load              # on_load(module): set-up once it is loaded
        self._lock = threading.Lock()
        self._module = None
        self._status = None                 # "native: <path>" or "python: <why>"
        self._enabled = os.environ.get(env_var, "1") != "0"   # read once: calls are hot
        self._listeners = []                # called when the module may have changed

    def on_change(self, fn) -> None:
        """Call ``fn()`` whenever what ``module()`` returns may change (``disabled``,
        ``reset``): for callers that keep the module's functions."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        for fn in self._listeners:
            fn()

    def source(self) -> str:
        """The one translation unit: each file behind a ``#line`` directive, and
        each ``#include "path"`` of a project file (relative to the including one) pasted in (so that the
        header's text, e.g. ca_math.h, is part of the source and of its hash)."""
        return "".join(_pasted(path) for path in self.sources)

    def enabled(self) -> bool:
        return self._enabled

    def module(self):
        """The loaded module, or None (disabled, or it could not be built)."""
        if not self._enabled:
            return None
        if self._status is None:
            with self._lock:
                if self._status is None:
                    self._load()
        return self._module

    def loaded(self):
        """The module if it is already loaded, else None; never builds it."""
        return self._module

    @contextlib.contextmanager
    def disabled(self):
        """The Python code, for the duration (as ``<env_var>=0`` does for a whole
        process): for comparing the two."""
        old, self._enabled = self._enabled, False
        try:
            self._changed()
            yield
        finally:
            self._enabled = old
            self._changed()

    def status(self) -> str:
        """``native: <library>`` or ``python: <reason>``."""
        if not self._enabled:
            return f"python: disabled by {self.env_var}=0"
        self.module()
        return self._status

    def reset(self) -> None:
        """Forget the loaded module (tests: build it again, or under other settings)."""
        with self._lock:
            self._module = self._status = None
        self._changed()

    def _load(self) -> None:
        try:
            include, tag = [], ""
            if self.numpy_headers:
                include, tag = [np.get_include()], f"numpy {np.__version__}"
            path, _ = build_extension(self.source(), self.name, include, tag,
                                      self.optimize)
            spec = importlib.util.spec_from_file_location(self.name, path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            if self.on_load is not None:
                self.on_load(mod)
        except (CBuildError, OSError, ImportError) as e:
            self._status = f"python: {self.what} could not be built ({str(e).splitlines()[0]})"
            log.info("compiled autograd: %s", self._status)
            return
        self._module, self._status = mod, f"native: {path}"
