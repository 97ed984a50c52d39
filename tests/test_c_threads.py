"""Threads in the C backend (codegen/c_threads.py, runtime/cthreads.py): a program
whose loops run on several threads gives the same gradients, bit for bit, as the
same program on one (the BLAS's thread count held fixed: OpenBLAS's own
threaded GEMM rounds differently from its one-thread GEMM, as numpy's does);
the build goes on without OpenMP and says why; the flags are part of the
library's name; a forked child still runs; the BLAS's jobs on the OpenMP pool
give numpy the same bits."""
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen import c_threads
from helpers import needs_cc
from compiled_autograd.runtime import cbuild, cthreads

pytestmark = [needs_cc, pytest.mark.usefixtures("fresh_compiled_cache")]
ROOT = Path(__file__).resolve().parent.parent
F = ca.nn.functional


def _needs_openmp():
    enabled, status = cthreads.openmp()
    if not enabled:
        pytest.skip(status)


def _chain(rng):
    """A long elementwise chain over 300,000 elements (fused and unfused loops)."""
    x = ca.tensor(rng.standard_normal((600, 500)), requires_grad=True)
    y = ca.tensor(rng.standard_normal((600, 500)), requires_grad=True)
    h = (x * y).tanh()
    h = (h.exp() * 0.5 + y.sigmoid()) * x
    return (h * h).sum() + h.sum(0).pow(2).sum(), [x, y]


def _rows(rng):
    """softmax, log_softmax and layer_norm over 2,048 rows; a column sum (a
    reduction keeping the last dim) and a row sum; amax."""
    x = ca.tensor(rng.standard_normal((2048, 96)), requires_grad=True)
    w = ca.tensor(rng.standard_normal(96), requires_grad=True)
    b = ca.tensor(rng.standard_normal(96), requires_grad=True)
    h = F.layer_norm(x, (96,), w, b)
    s = F.softmax(h * 2.0, dim=-1) * F.log_softmax(h, dim=-1)
    return (s.sum(0) * w).sum() + s.sum(-1).pow(2).sum() + h.amax(-1).sum(), [x, w, b]


def _attention(rng):
    """A batch of 64 small products (each kept on one thread by the BLAS) and
    a softmax over the scores; causal, a batch of block-triangular products."""
    q = ca.tensor(rng.standard_normal((16, 4, 64, 32)), requires_grad=True)
    k = ca.tensor(rng.standard_normal((16, 4, 64, 32)), requires_grad=True)
    v = ca.tensor(rng.standard_normal((16, 4, 64, 32)), requires_grad=True)
    y = F.scaled_dot_product_attention(q, k, v) + F.scaled_dot_product_attention(
        q, k, v, is_causal=True)
    return (y * y).sum(), [q, k, v]


CASES = {"chain": _chain, "rows": _rows, "attention": _attention}


def _grads(make, loops, eager=False):
    loss, params = make(np.random.default_rng(0))
    with cthreads.threads(loops=loops, blas=2):
        if eager:
            loss.backward()
        else:
            with ca.compiled_backward(backend="c"):
                loss.backward()
    return [p.grad.numpy().copy() for p in params]


@pytest.mark.parametrize("case", sorted(CASES))
def test_threaded_loops_give_the_bits_of_one_thread(case):
    _needs_openmp()
    make = CASES[case]
    loss, _ = make(np.random.default_rng(0))
    source = ca.trace_backward(loss).c_code
    assert "CA_OMP(omp parallel" in source     # large enough to cross the threshold
    one, two, again = _grads(make, 1), _grads(make, 2), _grads(make, 1)
    for a, b, c in zip(one, two, again):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    for got, want in zip(two, _grads(make, 2, eager=True)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_every_kind_of_parallel_loop_is_covered():
    """The cases above reach each kind of loop that gets threads."""
    _needs_openmp()
    sources = "\n".join(ca.trace_backward(make(np.random.default_rng(0))[0]).c_code
                        for make in CASES.values())
    assert "ca_share(" in sources                                  # column shares
    assert "schedule(static) collapse(" in sources                 # nests and batches
    assert sources.count("CA_OMP(omp parallel for") > 10
    batch = r"CA_OMP\(omp parallel for [^\n]*\)\n(\s*for [^\n]*\n)+\s*ca_[sd]gemm\("
    assert re.search(batch, sources)                               # a batch of products
    tri = r"CA_OMP\(omp parallel for [^\n]*\)\n(\s*for [^\n]*\n)+\s*\{\n\s*const \w+ \*ca_a"
    assert re.search(tri, sources)                      # a batch of block-triangular products


def test_small_loops_get_no_pragma_and_symbolic_ones_test_their_size():
    assert c_threads.pragma(c_threads.MIN_WORK - 1) == ""
    assert "if(ca_nt > 1)" in c_threads.pragma(c_threads.MIN_WORK)
    symbolic = c_threads.pragma(("*", ("s", 0), 4), collapse=2)
    assert f"(sizes[0] * 4)) >= {c_threads.MIN_WORK}" in symbolic and "collapse(2)" in symbolic
    assert c_threads.cost("a[i] + b[i]") == 1
    assert c_threads.cost("ca_gelu_grad_f(x[i])") == c_threads.HEAVY
    # A store that writes an element twice (an overlapping window) stays on one thread.
    assert c_threads.no_overlap([4, 8], [8, 1]) and not c_threads.no_overlap([4, 8], [2, 1])
    assert not c_threads.no_overlap([4, 8], [0, 1])


def test_two_python_threads_at_once():
    """Two backwards at once (the C call drops the GIL): each on its own OpenMP
    team, the BLAS calls taking turns; the gradients of one thread alone."""
    _needs_openmp()
    want = _grads(_rows, 2)
    results = {}

    def run(i):
        loss, params = _rows(np.random.default_rng(0))
        with ca.compiled_backward(backend="c"):
            loss.backward()
        results[i] = [p.grad.numpy() for p in params]
    workers = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    with cthreads.threads(blas=2):
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    for got in results.values():
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_openmp_flags_are_part_of_the_library_name(monkeypatch):
    _needs_openmp()
    threaded = cbuild.library_path("int f(void) { return 1; }")
    assert "-fopenmp" in cbuild.command("a.c", "a.so")
    monkeypatch.setitem(cbuild._threads, cbuild.compiler(), (False, "off", None))
    assert "-fopenmp" not in cbuild.command("a.c", "a.so")
    assert cbuild.library_path("int f(void) { return 1; }") != threaded


def _run(script, **env):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **env), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


GRADS = """
    import numpy as np
    import compiled_autograd as ca
    from compiled_autograd.runtime import cthreads
    rng = np.random.default_rng(0)
    x = ca.tensor(rng.standard_normal((2048, 96)), requires_grad=True)
    w = ca.tensor(rng.standard_normal((96, 96)), requires_grad=True)
    def grads(compiled):
        loss = ca.nn.functional.softmax((x @ w).tanh(), dim=-1).pow(2).sum()
        if compiled:
            with ca.compiled_backward(backend="c"):
                loss.backward()
        else:
            loss.backward()
        out = x.grad.numpy().copy(), w.grad.numpy().copy()
        x.grad = w.grad = None
        return out
"""


def test_without_openmp_the_build_goes_on_and_says_why(tmp_path):
    out = _run(GRADS + """
    from compiled_autograd.runtime import cbuild
    assert "-fopenmp" not in cbuild.command("a.c", "a.so")
    for c, e in zip(grads(True), grads(False)):
        np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-5)
    print(cthreads.status())
    """, CA_C_OPENMP="0", CA_CACHE_DIR=str(tmp_path))
    assert "one thread: OpenMP disabled by CA_C_OPENMP=0" in out


def test_a_forked_child_runs_the_backward_and_the_blas(tmp_path):
    """libgomp's pool does not survive fork: the child's loops take one thread
    and its BLAS OpenBLAS's own threads, and both finish with the same bits."""
    _needs_openmp()
    _run(GRADS + """
    import os
    want = grads(True)
    a = x.detach().numpy()
    product = a @ a.T
    pid = os.fork()
    if pid == 0:
        same = all(np.array_equal(a, b) for a, b in zip(grads(True), want))
        same &= np.array_equal(a @ a.T, product)
        os._exit(0 if same else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    """, CA_CACHE_DIR=str(tmp_path), OPENBLAS_NUM_THREADS="2")


def test_blas_jobs_on_the_openmp_pool_give_numpy_the_same_bits(tmp_path):
    """The callback runs OpenBLAS's own partition of a GEMM: numpy's products
    before and after it is installed are equal bit for bit."""
    _needs_openmp()
    out = _run("""
    import numpy as np
    from compiled_autograd.runtime import cthreads
    rng = np.random.default_rng(0)
    a = rng.standard_normal((700, 600)).astype(np.float32)
    b = rng.standard_normal((600, 500)).astype(np.float32)
    before = a @ b, a.astype(np.float64) @ b.T.astype(np.float64).T
    print(cthreads.share_blas_threads())
    after = a @ b, a.astype(np.float64) @ b.T.astype(np.float64).T
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    """, CA_CACHE_DIR=str(tmp_path), OPENBLAS_NUM_THREADS="2")
    assert "BLAS threads on the OpenMP pool" in out
