"""Building and loading generated C: the system compiler, a private cache, ctypes.

``build(sources)`` compiles one translation unit, or several at once (one process
per core), into a shared library and returns its path. Libraries live in a
per-user cache directory (``$CA_CACHE_DIR``, else
``$XDG_CACHE_HOME/compiled_autograd/c``, else ``~/.cache/compiled_autograd/c``),
created with mode 0700, and are named by the SHA-256 of everything that decides the
binary: the source, the compiler command and flags (with ``$CA_C_EXTRA_FLAGS``,
e.g. ``-fsanitize=address``), and the BLAS headers. A second
process finds the library and loads it without compiling. Two processes building
the same source at once each build in a private temporary directory and
``os.replace`` the result into place, which is atomic; the build is reproducible
(the same file names every time), so both write the same bytes.

Matrix products call the OpenBLAS that numpy itself uses: numpy's wheels bundle
``scipy-openblas64`` (symbols ``scipy_cblas_sgemm64_``..., 64-bit ints), and linking
the generated library against that same file means one BLAS and one thread pool in
the process (two OpenBLAS copies, each with its own spinning threads, slowed each
other down). A numpy without a bundled OpenBLAS (conda, a source build) falls back
to the ``scipy-openblas32`` wheel if it is installed. The generated C declares the
two prototypes it calls itself, so no BLAS header is needed.

The generated loops run on several threads through OpenMP (``-fopenmp``, GCC's
libgomp) where the compiler can build and link an OpenMP library: ``openmp()``
finds out once (building the threads library, ``cthreads.c``) and says why not
otherwise, and the build then goes on without (one thread, the same source). The
flags are part of the command, so of the library's name. ``compiled_autograd.runtime.cthreads``
runs the BLAS on the same threads.

Each library has a content hash beside it (``<library>.sha256``: the SHA-256 of
its bytes and its own name), written before the library is moved into place. A
library is loaded only after its bytes match that hash: a file cut short, filled
with other bytes, or another graph's library copied under this name would crash
the process inside ``dlopen`` (SIGBUS, SIGSEGV), so it is found before that,
rebuilt with a warning, and replaced atomically. A library without its hash (a
build interrupted between the two) is rebuilt quietly.

Every failure to build or load C raises ``CBuildError`` saying what to do: a
missing compiler or a failed build (naming the command and quoting the
compiler's stderr), a cache directory that cannot be created or written, a
library that does not load. ``CA_C_FALLBACK=python`` (``compiled_autograd.codegen.c_run``) turns
each of them into a warning and the Python backend.

Arrays are handed to the generated code as the addresses of their ndarray objects
(``id(arr)``: a few nanoseconds each, against about a microsecond for
``arr.ctypes.data``); the C reads each data pointer at ``array_data_offset()``, the
place of ``data`` in numpy's public ``PyArrayObject_fields`` (right after the
object header). The offset is found on real arrays, not assumed.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

WARNING_FLAGS = ("-Wall", "-Wextra")
# -fno-trapping-math: nothing reads the floating-point exception flags, and without
# it GCC will not turn the selects of the inline exp/erf into vector blends.
# (-std=c11 keeps -ffp-contract=off: no a*b+c is fused behind numpy's back.)
# -fopenmp-simd: the `omp simd` pragmas of the sum loops; -fopenmp (OPENMP_FLAGS,
# where compiled_autograd.runtime.cthreads finds that it works) adds the threads of the others.
OPT_FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp-simd", "-fPIC",
             "-shared", "-std=c11")
OPENMP_FLAGS = ("-fopenmp",)


@functools.cache
def cpu_identity():
    """The host CPU's model name and feature flags (Linux ``/proc/cpuinfo``), or
    None where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break                      # the first processor is enough
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    flags = fields.get("flags") or fields.get("Features")
    return None if not flags else f"{fields.get('model name', '')}|{flags}"


def arch_flags() -> list[str]:
    """``-march=native`` where the CPU can be identified: its identity is part of
    the library's hash, so a cache shared between machines never hands code built
    for one CPU to another. Elsewhere, or with ``CA_C_NATIVE=0``, the compiler's
    generic target.

    With AVX-512, also 512-bit vectors: GCC and clang prefer 256 bits there by
    default (older Xeons lower their clock while running 512-bit code). The BLAS
    (OpenBLAS's AVX-512 kernels) runs 512-bit code anyway, and the loops that call
    exp and erf gain most: GELU's backward in the transformer 2.8 -> 1.5 ms,
    log_softmax's 0.56 -> 0.36 ms (benchmarks/c_steps.py, docs/performance.md)."""
    identity = cpu_identity()
    if not identity or os.environ.get("CA_C_NATIVE", "1") != "1":
        return []
    wide = "avx512f" in identity.partition("|")[2].split()
    return ["-march=native"] + (["-mprefer-vector-width=512"] if wide else [])

_lock = threading.RLock()   # (reentrant: a build's flags may build the threads library)
_loaded: dict[str, ctypes.CDLL] = {}


_data_offset = None


def array_data_offset() -> int:
    """The byte offset of the data pointer inside an ndarray object, checked on
    three arrays (found at the first pointer slot where all three agree)."""
    global _data_offset
    if _data_offset is None:
        import numpy as np
        probes = [np.empty(1, np.uint8), np.empty((2, 3), np.float64), np.arange(4.0)[1:]]
        word = ctypes.sizeof(ctypes.c_void_p)
        for offset in range(word, 8 * word, word):  # the struct's first fields only
            if all(ctypes.c_void_p.from_address(id(a) + offset).value == a.ctypes.data
                   for a in probes):
                _data_offset = offset
                break
        else:
            raise CBuildError("cannot find the data pointer inside a numpy array object; "
                              "the C backend needs it to hand arrays to generated code")
    return _data_offset


class CBuildError(RuntimeError):
    """C could not be built or loaded: the message says why and what to do."""


_WHAT_TO_DO = ("set CA_CACHE_DIR to a writable directory, or CA_C_FALLBACK=python to run "
               "the Python backend instead")


def cache_dir() -> Path:
    """The build cache directory (created with mode 0700); ``CBuildError`` if it
    cannot be created or used."""
    root = os.environ.get("CA_CACHE_DIR")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "compiled_autograd" / "c"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(f"not a directory: {str(path)!r}")
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as e:
        raise CBuildError(f"cannot use {str(path)!r} as the C build cache "
                          f"({e.strerror or e}); {_WHAT_TO_DO}") from None
    return path


def compiler() -> str:
    """The C compiler command: ``$CC``, else ``cc``."""
    return os.environ.get("CC", "cc")


@dataclass(frozen=True)
class Blas:
    """The BLAS the generated code links: where, and its symbol and int names."""
    name: str
    lib_dir: str
    link: str            # the -l argument
    sgemm: str
    dgemm: str
    int_type: str        # the C type of its sizes
    threads: str         # openblas_get_num_threads: its threads, as OpenBLAS counts them
    threads_callback: str  # openblas_set_threads_callback_function (OpenBLAS >= 0.3.27)


_blas = None


def blas() -> Blas:
    """numpy's bundled OpenBLAS, else the scipy-openblas32 wheel."""
    global _blas
    if _blas is None:
        _blas = _find_blas()
    return _blas


def blas_library() -> ctypes.CDLL:
    """The BLAS of ``blas()``, loaded in this process (numpy has loaded it already)."""
    lib = blas()
    name = lib.link[1:] if lib.link.startswith(":") else f"lib{lib.link}.so"
    return ctypes.CDLL(os.path.join(lib.lib_dir, name))


def _find_blas(bundled_first=True) -> Blas:
    import numpy as np
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    bundled = sorted(libs.glob("libscipy_openblas64_*.so*")) if bundled_first else []
    if bundled:
        lib = bundled[0]
        return Blas("numpy's scipy-openblas64", str(libs), f":{lib.name}",
                    "scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", "int64_t",
                    "scipy_openblas_get_num_threads64_",
                    "scipy_openblas_set_threads_callback_function64_")
    try:
        import scipy_openblas32 as sob
    except ImportError:
        raise CBuildError("the C backend needs an OpenBLAS: this numpy does not bundle one; "
                          "pip install scipy-openblas32") from None
    return Blas("scipy-openblas32", sob.get_lib_dir(), sob.get_library(),
                "scipy_cblas_sgemm", "scipy_cblas_dgemm", "int",
                "scipy_openblas_get_num_threads",
                "scipy_openblas_set_threads_callback_function")


def env_flags() -> list[str]:
    """Extra compiler flags from ``$CA_C_EXTRA_FLAGS`` (e.g. "-fsanitize=address");
    part of the command, so of the library's name."""
    return shlex.split(os.environ.get("CA_C_EXTRA_FLAGS", ""))


def _base_flags(threads, extra) -> list[str]:
    return (shlex.split(compiler()) + list(OPT_FLAGS) + list(threads) + arch_flags()
            + list(WARNING_FLAGS) + env_flags() + list(extra))


def _flags(extra) -> list[str]:
    return _base_flags(OPENMP_FLAGS if openmp()[0] else (), extra)


THREADS_SOURCE = Path(__file__).with_name("cthreads.c")
_threads: dict = {}      # compiler -> (enabled, status, the loaded threads library or None)


def openmp() -> tuple[bool, str]:
    """(whether generated code is built with OpenMP, a one-line status saying why
    or why not). Found once per process and compiler: the threads library
    (``cthreads.c``, used by ``compiled_autograd.runtime.cthreads``) must build with ``-fopenmp``,
    load (libgomp found) and run a parallel region. ``CA_C_OPENMP=0``: off."""
    enabled, status, _ = threads_library()
    return enabled, status


def threads_library():
    """(enabled, status, the loaded threads library or None): see ``openmp``."""
    key = compiler()
    if key not in _threads:
        with _lock:
            if key not in _threads:
                _threads[key] = _load_threads()
    return _threads[key]


def _load_threads():
    if os.environ.get("CA_C_OPENMP", "1") == "0":
        return False, "one thread: OpenMP disabled by CA_C_OPENMP=0", None
    source = THREADS_SOURCE.read_text()
    cmd = _base_flags(OPENMP_FLAGS, ())
    try:
        path, _ = _publish(library_path(source, flags=cmd, name="ca_threads"), [source],
                           lambda srcs, out: [[cmd + [srcs[0], "-o", out, "-lpthread"]]])
        lib = load(path)
        ok = lib.ca_openmp_probe() > 0
    except (CBuildError, OSError) as e:
        return False, f"one thread: no OpenMP ({str(e).splitlines()[0]})", None
    if not ok:
        return False, "one thread: the OpenMP probe ran no parallel region", None
    return True, f"OpenMP ({' '.join(OPENMP_FLAGS)})", lib


def _libs() -> list[str]:
    lib = blas()
    return [f"-L{lib.lib_dir}", f"-l{lib.link}", f"-Wl,-rpath,{lib.lib_dir}", "-lm"]


def command(src: str, out: str, extra=()) -> list[str]:
    """The command that builds one translation unit into a shared library."""
    return _flags(extra) + [src, "-o", out] + _libs()


def object_command(src: str, obj: str, extra=()) -> list[str]:
    return _flags(extra) + ["-c", src, "-o", obj]


def link_command(objs, out: str, extra=()) -> list[str]:
    return _flags(extra) + list(objs) + ["-o", out] + _libs()


def library_path(sources, extra=(), flags=None, name="ca") -> Path:
    """Where the library of ``sources`` built by ``command`` (or by ``flags``)
    lives: ``<name>_<hash>.so`` in the cache."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    cmd = command("SRC", "OUT", extra) if flags is None else list(flags)
    digest = hashlib.sha256("\0".join(cmd + [cpu_identity() or ""] + sources).encode()
                            ).hexdigest()[:32]
    return cache_dir() / f"{name}_{digest}.so"


def build(sources, extra=()) -> tuple[Path, bool]:
    """(path of the shared library, whether this call compiled it). ``sources``: one
    translation unit, or several, compiled at once (one process per core) and
    linked into one library."""
    sources = [sources] if isinstance(sources, str) else list(sources)

    def steps(srcs, out):
        if len(srcs) == 1:
            return [[command(srcs[0], out, extra)]]
        objs = [src[:-2] + ".o" for src in srcs]
        return [[object_command(src, obj, extra) for src, obj in zip(srcs, objs)],
                [link_command(objs, out, extra)]]
    return _publish(library_path(sources, extra), sources, steps)


def hash_path(path: Path) -> Path:
    """Where the content hash of the library ``path`` is kept."""
    return path.with_name(path.name + ".sha256")


def _digest_line(path: Path, data: bytes) -> str:
    return f"{hashlib.sha256(data).hexdigest()} {path.name}\n"


def check(path: Path) -> str | None:
    """None if the library ``path`` is intact (its bytes and name match the hash
    beside it), else why not: "missing", "no hash", or what differs. Reads the
    file; never loads it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    try:
        recorded = hash_path(path).read_text()
    except FileNotFoundError:
        return "no hash"
    except (OSError, UnicodeDecodeError) as e:
        return f"its hash is unreadable ({e})"
    if recorded != _digest_line(path, data):
        return (f"its content does not match its hash ({len(data)} bytes; damaged, "
                f"truncated or replaced)")
    return None


_building: dict[str, threading.Lock] = {}    # one lock per library path


def _publish(path: Path, sources, steps) -> tuple[Path, bool]:
    """Build ``path`` unless it is in the cache and intact (``check``): the
    sources go to a private temporary directory, ``steps(srcs, out)`` gives the
    command batches (each run at once) that build ``out`` (objects are named
    ``src[:-2] + ".o"``); its hash is written beside ``path``, then ``out``
    replaces ``path`` atomically. Nothing is left behind. A damaged entry is
    rebuilt with a warning.

    Builds are reproducible: the files in the private directory have the same
    names every time (the compiler writes the source's name into the library), so
    two processes building the same library at once write the same bytes and the
    same hash, and a reader between one's two replaces and the other's still finds
    them matching. Threads of one process build a library once (a lock per path)."""
    with _lock:
        building = _building.setdefault(str(path), threading.Lock())
    with building:
        problem = check(path)
        if problem is None:
            return path, False
        if problem not in ("missing", "no hash"):
            warnings.warn(f"compiled autograd: the C build cache entry {str(path)!r} is "
                          f"damaged ({problem}); rebuilding it", RuntimeWarning, stacklevel=3)
        workdir = None
        try:
            workdir = Path(tempfile.mkdtemp(prefix=".build_", dir=path.parent))
            srcs = []
            for i, source in enumerate(sources):
                src = workdir / f"unit{i}.c"
                src.write_text(source)
                srcs.append(str(src))
            tmp_out, tmp_hash = workdir / "library.so", workdir / "library.sha256"
            for batch in steps(srcs, str(tmp_out)):
                _run(batch)
            os.chmod(tmp_out, 0o600)
            tmp_hash.write_text(_digest_line(path, tmp_out.read_bytes()))
            os.chmod(tmp_hash, 0o600)
            # The hash first: a reader between the two replaces sees the old library
            # with the new hash, a mismatch, and rebuilds; never a wrong library loaded.
            os.replace(tmp_hash, hash_path(path))
            os.replace(tmp_out, path)
        except OSError as e:
            raise CBuildError(f"cannot write to the C build cache {str(path.parent)!r} "
                              f"({e.strerror or e}); {_WHAT_TO_DO}") from None
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
    return path, True


# An extension of numerical loops (``optimize=True``: runtime/kernels.c) is built
# as the generated C is: -O3, vectorised exp/erf (no errno, no trapping math), the
# `omp simd` pragmas of its sums, the host's vector width (``arch_flags``);
# -std=c11 keeps -ffp-contract=off.
KERNEL_FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp-simd")


def extension_command(src: str, out: str, include_dirs=(), optimize=False) -> list[str]:
    """The command that builds a CPython extension module against this
    interpreter's headers, and ``include_dirs`` (``$CA_C_EXTRA_FLAGS`` apply too);
    ``optimize``: with ``KERNEL_FLAGS`` and ``arch_flags()``."""
    import sysconfig
    include = sysconfig.get_paths()["include"]
    opt = [*KERNEL_FLAGS, *arch_flags()] if optimize else ["-O2"]
    return shlex.split(compiler()) + [*opt, "-fPIC", "-shared", "-std=c11", *WARNING_FLAGS,
                                      *env_flags(), f"-I{include}",
                                      *(f"-I{d}" for d in include_dirs), src, "-o", out]


def build_extension(source: str, name: str, include_dirs=(), tag: str = "",
                    optimize: bool = False) -> tuple[Path, bool]:
    """(path, whether this call compiled it) of a CPython extension module ``name``
    built from ``source`` (``extension_command``), in the same cache. Its name
    carries the hash of the source, the command, the interpreter's ABI
    (``EXT_SUFFIX``) and ``tag`` (e.g. the numpy version whose headers it was
    built against), so another Python or numpy never loads it; ``optimize``d, the
    CPU's identity too (``-march=native`` code is for this CPU only)."""
    import sysconfig
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise CBuildError(f"Python.h not found in {include}: install the Python development "
                          f"headers (e.g. python3-dev) to build {name}")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    cmd = extension_command("SRC", "OUT", include_dirs, optimize)
    cpu = [cpu_identity() or ""] if optimize else []
    digest = hashlib.sha256("\0".join(cmd + cpu + [suffix, tag, source]).encode()
                            ).hexdigest()[:32]
    return _publish(cache_dir() / f"{name}_{digest}{suffix}", [source],
                    lambda srcs, out: [[extension_command(srcs[0], out, include_dirs,
                                                          optimize)]])


def _run(commands) -> None:
    """Run the commands at once (at most one per core); raise on the first failure."""
    if shutil.which(commands[0][0]) is None:
        raise CBuildError(f"C compiler not found: {commands[0][0]!r} (set $CC, or install "
                          f"a C compiler such as gcc); command: {shlex.join(commands[0])}")
    workers = max(1, min(len(commands), os.cpu_count() or 1))
    try:
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda cmd: subprocess.run(cmd, capture_output=True,
                                                               text=True), commands))
    except OSError as e:
        raise CBuildError(f"cannot run the C compiler ({e.strerror or e}); command: "
                          f"{shlex.join(commands[0])}; set $CC to a working compiler") from None
    for cmd, done in zip(commands, results):
        if done.returncode != 0:
            raise CBuildError(f"C compilation failed (exit code {done.returncode}): "
                              f"{shlex.join(cmd)}\n{done.stderr.strip()}")


def load(path: Path) -> ctypes.CDLL:
    """The loaded library (one handle per path in this process), checked against
    its hash before it is loaded (``check``); ``CBuildError`` if it is damaged or
    does not load."""
    key = str(path)
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            problem = check(Path(path))
            if problem is not None:
                raise CBuildError(f"not loading the C library {key!r}: {problem}; delete it "
                                  f"and it is rebuilt on the next use")
            try:
                lib = ctypes.CDLL(key)
            except OSError as e:
                raise CBuildError(f"cannot load the C library {key!r} ({e}); delete it and "
                                  f"it is rebuilt on the next use, or set "
                                  f"CA_C_FALLBACK=python") from None
            _loaded[key] = lib
        return lib
