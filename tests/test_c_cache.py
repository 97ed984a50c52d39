"""The C build cache under damage (issue 29, items 1 and 2): a library cut short,
emptied, filled with other bytes or swapped for another graph's is found before
it is loaded and rebuilt with a warning, in a fresh process (where a damaged
library used to kill the interpreter with SIGBUS or SIGSEGV); a cache directory
that cannot be created or written, or a library that does not load, is a
``CBuildError`` that says what to do, and ``CA_C_FALLBACK=python`` applies to
each of them."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import compiled_autograd as ca
from helpers import needs_cc
from compiled_autograd.runtime import cbuild

ROOT = Path(__file__).resolve().parent.parent

# Five graphs, each its own library; prints each one's gradient.
SCRIPT = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    import compiled_autograd as ca
    warnings.simplefilter("always")
    for k in range(5):
        x = ca.tensor(np.linspace(-1, 1, 4), requires_grad=True, dtype=np.float64)
        y = x
        for _ in range(k + 1):                  # another structure: another library
            y = (y * 1.5).tanh() * x
        with ca.compiled_backward(backend="c"):
            y.sum().backward()
        print(k, " ".join(f"{v:.12g}" for v in x.grad.numpy()))
""")


def _run(cache, **env):
    env = dict({k: v for k, v in os.environ.items() if k != "CA_C_FALLBACK"},
               CA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _backward_libraries(cache):
    """The five graphs' libraries, in the order the script builds them."""
    return sorted((p for p in cache.glob("ca_*.so") if not p.name.startswith("ca_threads_")),
                  key=lambda p: p.stat().st_mtime_ns)


@needs_cc
def test_damaged_libraries_are_rebuilt_with_a_warning_in_a_fresh_process(tmp_path):
    cache = tmp_path / "cache"
    first = _run(cache)
    assert first.returncode == 0, first.stderr[-3000:]
    libs = _backward_libraries(cache)
    assert len(libs) == 5 and all(cbuild.hash_path(p).exists() for p in libs), libs
    assert all(cbuild.check(p) is None for p in libs)
    a, b, c, d, e = libs
    os.truncate(a, a.stat().st_size // 2)                       # SIGBUS before
    b.write_bytes(b"")                                          # "file too short"
    c.write_bytes(np.random.default_rng(0).bytes(c.stat().st_size))  # "invalid ELF header"
    d.write_bytes(e.read_bytes())                               # another graph's: SIGSEGV
    extension = next(cache.glob("_c_call_*.so"))                # the C call, an extension
    os.truncate(extension, extension.stat().st_size // 2)
    for p in (a, b, c, d):
        assert cbuild.check(p) is not None
    second = _run(cache)
    assert second.returncode == 0, (second.returncode, second.stderr[-3000:])
    assert second.stdout == first.stdout
    assert second.stderr.count("is damaged") == 5, second.stderr
    assert "rebuilding it" in second.stderr and str(a) in second.stderr
    assert all(cbuild.check(p) is None for p in libs + [extension])
    # Rebuilt once: the third run warns of nothing.
    third = _run(cache)
    assert third.returncode == 0 and third.stdout == first.stdout
    assert "damaged" not in third.stderr, third.stderr


@needs_cc
def test_a_library_with_its_hash_swapped_in_is_still_refused(tmp_path):
    # Copying another graph's library *and* its hash file under this name: the hash
    # records the library's own name.
    cache = tmp_path / "cache"
    first = _run(cache)
    assert first.returncode == 0, first.stderr[-3000:]
    a, *_, e = _backward_libraries(cache)
    a.write_bytes(e.read_bytes())
    cbuild.hash_path(a).write_bytes(cbuild.hash_path(e).read_bytes())
    assert "does not match" in cbuild.check(a)
    second = _run(cache)
    assert second.returncode == 0 and second.stdout == first.stdout, second.stderr[-3000:]
    assert second.stderr.count("is damaged") == 1


def test_load_checks_the_hash_before_loading(tmp_path):
    lib = tmp_path / "ca_x.so"
    lib.write_bytes(b"\x7fELF" + b"\0" * 60)
    with pytest.raises(cbuild.CBuildError, match="no hash.*delete it"):
        cbuild.load(lib)
    cbuild.hash_path(lib).write_text("0" * 64 + " ca_x.so\n")
    with pytest.raises(cbuild.CBuildError, match="does not match its hash"):
        cbuild.load(lib)


@needs_cc
def test_a_library_that_does_not_load_is_a_cbuild_error(cache):
    path, _ = cbuild.build("int ca_answer(void) { return 42; }\n")
    # Intact bytes, but not a library: what dlopen says, and what to do.
    path.write_bytes(b"not a library")
    cbuild.hash_path(path).write_text(cbuild._digest_line(path, b"not a library"))
    with pytest.raises(cbuild.CBuildError, match="cannot load the C library.*delete it"):
        cbuild.load(path)


def _tiny():
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    return a, (a.exp() * a).sum()


@pytest.mark.parametrize("where", ["under_a_file", "a_file", "proc"])
def test_an_unusable_cache_directory_is_a_cbuild_error_and_falls_back(tmp_path, monkeypatch,
                                                                     fresh_compiled_cache,
                                                                     where):
    afile = tmp_path / "afile"
    afile.write_text("x")
    root = {"under_a_file": afile / "sub", "a_file": afile,
            "proc": Path("/proc/self/ca_cache")}[where]         # not creatable, even by root
    monkeypatch.setenv("CA_CACHE_DIR", str(root))
    monkeypatch.delenv("CA_C_FALLBACK", raising=False)
    with pytest.raises(cbuild.CBuildError, match="CA_CACHE_DIR") as info:
        cbuild.build("int f(void) { return 0; }")
    assert str(root) in str(info.value) and "CA_C_FALLBACK=python" in str(info.value)
    a, loss = _tiny()
    with pytest.raises(cbuild.CBuildError):
        with ca.compiled_backward(backend="c"):
            loss.backward(retain_graph=True)
    assert a.grad is None
    monkeypatch.setenv("CA_C_FALLBACK", "python")
    with pytest.warns(RuntimeWarning, match="falling back to the Python backend"):
        with ca.compiled_backward(backend="c"):
            loss.backward()
    np.testing.assert_allclose(a.grad.numpy(), np.exp([1.0, 2, 3]) * [2.0, 3, 4], rtol=1e-6)


def test_an_unwritable_cache_directory_is_a_cbuild_error(tmp_path, monkeypatch):
    # (root writes through mode 0500, so the write itself fails here)
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setenv("CA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cbuild.tempfile, "mkdtemp", refuse)
    with pytest.raises(cbuild.CBuildError, match="cannot write to the C build cache.*"
                       "Permission denied.*CA_CACHE_DIR"):
        cbuild.build("int f(void) { return 0; }")


@needs_cc
def test_builds_are_reproducible_so_concurrent_builders_agree(tmp_path, monkeypatch):
    # Two processes building the same library at once each replace the other's
    # hash and library; a reader in between still finds them matching only if both
    # wrote the same bytes. (Before, each build's temporary source name was written
    # into the library: a thread loading between the replaces saw "does not match".)
    sources = ["int ca_one(void) { return 1; }\n", "int ca_two(void) { return 2; }\n"]
    built = {}
    for name in ("first", "second"):
        monkeypatch.setenv("CA_CACHE_DIR", str(tmp_path / name))
        single, compiled = cbuild.build(sources[0])
        several, _ = cbuild.build(sources)             # objects, then a link
        assert compiled
        built[name] = [(p.name, p.read_bytes(), cbuild.hash_path(p).read_text())
                       for p in (single, several)]
        assert sorted(os.listdir(tmp_path / name)) == sorted(
            [single.name, several.name, single.name + ".sha256", several.name + ".sha256"]
            + [p.name for p in (tmp_path / name).glob("ca_threads_*")])   # nothing left
    assert built["first"] == built["second"]


@needs_cc
def test_threads_building_one_library_build_it_once(tmp_path, monkeypatch):
    import threading
    monkeypatch.setenv("CA_CACHE_DIR", str(tmp_path / "cache"))
    source = "int ca_three(void) { return 3; }\n"
    results, errors = [], []

    def build_and_load():
        try:
            path, compiled = cbuild.build(source)
            results.append(compiled)
            assert cbuild.load(path).ca_three() == 3
        except BaseException as e:     # noqa: BLE001 -- reported below
            errors.append(e)
    threads = [threading.Thread(target=build_and_load) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == [False] * 5 + [True]
