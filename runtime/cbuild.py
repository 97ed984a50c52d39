"""Building and loading generated C: the system compiler, a private cache, ctypes.

``build(source)`` compiles one translation unit into a shared library and returns
its path. Libraries live in a per-user cache directory (``$CA_CACHE_DIR``, else
``$XDG_CACHE_HOME/compiled_autograd/c``, else ``~/.cache/compiled_autograd/c``),
created with mode 0700, and are named by the SHA-256 of everything that decides the
binary: the source, the compiler command and flags (with ``$CA_C_EXTRA_FLAGS``,
e.g. ``-fsanitize=address``), and the BLAS headers. A second
process finds the library and loads it without compiling. Two processes building
the same source at once each write a private temporary file and ``os.replace`` it
into place, which is atomic: both end with the same complete library.

Matrix products call OpenBLAS through ``scipy-openblas32`` (a wheel that ships the
library and its headers for exactly this use; its symbols carry a ``scipy_`` prefix,
so they never clash with numpy's own OpenBLAS).

A missing compiler or a failed build raises ``CBuildError`` naming the command and
quoting the compiler's stderr.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

WARNING_FLAGS = ("-Wall", "-Wextra")
OPT_FLAGS = ("-O3", "-fno-math-errno", "-fPIC", "-shared", "-std=c11")

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


class CBuildError(RuntimeError):
    """The C compiler is missing or rejected the generated source."""


def cache_dir() -> Path:
    root = os.environ.get("CA_CACHE_DIR")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "compiled_autograd" / "c"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def compiler() -> str:
    """The C compiler command: ``$CC``, else ``cc``."""
    return os.environ.get("CC", "cc")


def blas():
    """(include dir, library dir, library name) of scipy-openblas32."""
    try:
        import scipy_openblas32 as sob
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise CBuildError("the C backend needs the scipy-openblas32 package "
                          "(pip install scipy-openblas32)") from e
    return sob.get_include_dir(), sob.get_lib_dir(), sob.get_library()


def env_flags() -> list[str]:
    """Extra compiler flags from ``$CA_C_EXTRA_FLAGS`` (e.g. "-fsanitize=address");
    part of the command, so of the library's name."""
    return shlex.split(os.environ.get("CA_C_EXTRA_FLAGS", ""))


def command(src: str, out: str, extra=()) -> list[str]:
    include, libdir, lib = blas()
    return (shlex.split(compiler()) + list(OPT_FLAGS) + list(WARNING_FLAGS) + env_flags()
            + list(extra) + [f"-I{include}", src, "-o", out, f"-L{libdir}", f"-l{lib}",
                             f"-Wl,-rpath,{libdir}", "-lm"])


def library_path(source: str, extra=()) -> Path:
    cmd = command("SRC", "OUT", extra)
    digest = hashlib.sha256("\0".join(cmd + [source]).encode()).hexdigest()[:32]
    return cache_dir() / f"ca_{digest}.so"


def build(source: str, extra=()) -> tuple[Path, bool]:
    """(path of the shared library, whether this call compiled it)."""
    path = library_path(source, extra)
    if path.exists():
        return path, False
    directory = path.parent
    fd, tmp_src = tempfile.mkstemp(suffix=".c", prefix=".build_", dir=directory)
    tmp_out = tmp_src[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        cmd = command(tmp_src, tmp_out, extra)
        if shutil.which(cmd[0]) is None:
            raise CBuildError(f"C compiler not found: {cmd[0]!r} (set $CC, or install "
                              f"a C compiler such as gcc); command: {shlex.join(cmd)}")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise CBuildError(f"C compilation failed (exit code {done.returncode}): "
                              f"{shlex.join(cmd)}\n{done.stderr.strip()}")
        os.chmod(tmp_out, 0o600)
        os.replace(tmp_out, path)
    finally:
        for leftover in (tmp_src, tmp_out):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return path, True


def load(path: Path) -> ctypes.CDLL:
    """The loaded library (one handle per path in this process)."""
    key = str(path)
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            blas()  # make sure OpenBLAS itself is importable first
            lib = _loaded[key] = ctypes.CDLL(key)
        return lib
