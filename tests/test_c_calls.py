"""Backend "c" at its boundary with Python: how arrays cross it (data pointers,
layouts), which BLAS it links, when its memory is allocated and freed, and a
backward split into parts, or run from two threads. The rest of the backend is in
test_c_backend.py."""
import os
from pathlib import Path

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.codegen.c_run import CBackward
from compiled_autograd.examples import build
from helpers import MLP, TRANSFORMER, needs_cc
from helpers import on_c as _on_c
from compiled_autograd.runtime import cbuild

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")


# ---------------------------------------------------------------- 1. BLAS and handing arrays over

def test_data_pointer_offset_reads_every_kind_of_array():
    import ctypes
    offset = cbuild.array_data_offset()
    base = np.arange(24.0).reshape(4, 6)
    for arr in (base, base[1:, 2:], base.T, np.empty(0, np.float32), np.float32(3) * np.ones(5)):
        assert ctypes.c_void_p.from_address(id(arr) + offset).value == arr.ctypes.data


@needs_cc
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
def test_generated_code_shares_numpys_openblas(cache):
    """One BLAS (one thread pool) in the process: the library links numpy's own."""
    lib = cbuild.blas()
    if not lib.name.startswith("numpy"):
        pytest.skip(f"this numpy bundles no OpenBLAS ({lib.name} is used)")
    ex = build("mlp", **MLP)
    _on_c(ex.loss().backward)
    maps = Path("/proc/self/maps").read_text()
    openblas = {line.split()[-1] for line in maps.splitlines() if "openblas" in line}
    assert len(openblas) == 1 and Path(openblas.pop()).parent == Path(lib.lib_dir).resolve()


@needs_cc
def test_scipy_openblas32_fallback_gives_eager_gradients(cache, monkeypatch):
    pytest.importorskip("scipy_openblas32")
    monkeypatch.setattr(cbuild, "_blas", cbuild._find_blas(bundled_first=False))
    assert cbuild.blas().name == "scipy-openblas32"

    def run(compiled, dtype):
        rng = np.random.default_rng(1)
        x, w = (ca.tensor(rng.standard_normal(s), dtype=dtype, requires_grad=True)
                for s in ((6, 5), (4, 5)))
        loss = ca.nn.functional.linear(x, w).tanh().sum()
        (_on_c(loss.backward) if compiled else loss.backward())
        return x.grad.numpy(), w.grad.numpy()
    for dtype, rtol in ((np.float32, 1e-5), (np.float64, 1e-10)):
        for c, e in zip(run(True, dtype), run(False, dtype)):
            np.testing.assert_allclose(c, e, rtol=rtol, atol=rtol)
    code = CBackward(ca.trace_backward(build("mlp", **MLP).loss()).graph, build=False).c_code
    assert "#define ca_sgemm scipy_cblas_sgemm\n" in code


# ---------------------------------------------------------------- 2. memory: in place, late outputs

def _transposed_saved(how):
    """A backward whose saved value is a transposed view (x.t(), strides (1, 3)),
    saved by a checkpoint or under identity saved-tensor hooks."""
    from compiled_autograd.utils.checkpoint import checkpoint
    rng = np.random.default_rng(3)
    x = ca.tensor(rng.standard_normal((5, 3)), dtype=np.float32, requires_grad=True)
    w = ca.tensor(rng.standard_normal((5, 4)), dtype=np.float32, requires_grad=True)
    if how == "checkpoint":
        y = checkpoint(lambda a, b: (a.t() @ b).tanh(), x, w)
    else:
        with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            y = (x.t() @ w).tanh()
    return y.sum(), (x, w)


@pytest.mark.parametrize("how", ["checkpoint", "hooks"])
def test_recomputed_strided_values_are_read_in_place(how):
    """A checkpoint's recomputation gives a saved value back in its saved layout, and
    C reads it there. Other unpack hooks promise no layout: their arrays are copied
    to contiguous ones (here the identity hook's transposed view)."""
    loss, leaves = _transposed_saved(how)
    layouts = {n.meta["strides"] for n in ca.trace_backward(loss).graph.nodes
               if n.op == "call_hook" and n.target == "unpack_hook"}
    assert ((1, 3) in layouts) == (how == "checkpoint")
    loss.backward()
    expected = [t.grad.numpy().copy() for t in leaves]
    loss, leaves = _transposed_saved(how)
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        _on_c(loss.backward)
    for t, e in zip(leaves, expected):
        np.testing.assert_allclose(t.grad.numpy(), e, rtol=1e-5, atol=1e-6)
    names = [e.name for e in prof.timeline if e.action == "alloc"]
    assert any(n.endswith(":relaid") for n in names) == (how == "hooks")


def test_offloaded_slice_of_a_large_tensor_costs_only_the_slice(tmp_path):
    """A reloaded value is read as the contiguous array it comes back as: no copy
    into the (large) layout it had when saved."""
    from compiled_autograd.autograd.graph import save_on_disk
    peaks = {}
    for backend in ("python", "c"):
        x = ca.tensor(np.random.default_rng(0).standard_normal((256, 4096)), dtype=np.float32)
        w = ca.tensor(np.ones((256, 4), np.float32), requires_grad=True)
        with save_on_disk(str(tmp_path)):
            loss = (x[:, :4] * w).sum()          # saves a 4 KB slice, strides (4096, 1)
        del x
        with ca.memory.profile(tracemalloc_witness=False) as prof:
            with ca.compiled_backward(backend=backend):
                loss.backward()
        peaks[backend] = prof.peak_bytes
    assert peaks["c"] <= peaks["python"] + 64, peaks


def test_gradients_are_allocated_as_the_backward_reaches_them():
    """With callbacks, an output array is allocated at the last callback before
    its first write, not at the start of the call."""
    ex = build("mlp", layers=3, width=8, batch=4, checkpoint="layer")
    loss = ex.loss()
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        _on_c(loss.backward)
    steps = [e.step for e in prof.timeline if e.action == "alloc" and e.name == "c_output"]
    assert len(set(steps)) > 1


@needs_cc
def test_arena_blocks_are_freed_at_the_callbacks_that_close_them():
    """With callbacks, the arena is blocks (compiled_autograd.codegen.arena): each freed at the first
    callback after its buffers' last use, not all held to the end."""
    ex = build("transformer", layers=2, d_model=16, heads=2, seq=8, batch=2, vocab=20,
               checkpoint="layer")
    loss = ex.loss()
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        _on_c(loss.backward)
    arena_events = [e for e in prof.timeline if e.name == "c_arena"]
    allocs = [e for e in arena_events if e.action == "alloc"]
    assert len(allocs) > 2 and sum(e.action == "free" for e in arena_events) == len(allocs)
    # some block is freed while the backward still allocates (not all at the end)
    last_step = prof.timeline[-1].step
    assert any(e.action == "free" and e.step < last_step for e in arena_events)


@needs_cc
def test_arena_blocks_with_symbolic_sizes():
    """A dynamic graph with callbacks: its blocks are fixed at compile time (the C
    reads each buffer from one), their sizes and offsets computed per call;
    gradients match eager at every size."""
    compiled = []

    def compiler(gm):
        compiled.append(CBackward(gm.graph))
        return compiled[-1]

    for batch in (3, 4, 6, 2, 5):
        def make():
            return build("transformer", layers=2, d_model=16, heads=2, seq=8, batch=batch,
                         vocab=20, checkpoint="layer")
        ex = make()
        ex.loss().backward()
        expected = [p.grad.numpy() for p in ex.parameters()]
        ex = make()
        with ca.compiled_backward(backend=compiler, dynamic=True):
            ex.loss().backward()
        for e, p in zip(expected, ex.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), e, rtol=1e-4, atol=1e-6)
    (fn,) = compiled
    assert fn.prog.dynamic and len(fn.prog.windows) > 1


@needs_cc
def test_checkpointed_transformer_peaks_no_higher_than_python():
    """The issue's measure: the bundled checkpointed transformer's backward peak
    (ca.memory.profile) under "c" is no higher than under "python"."""
    peaks = {}
    for backend in ("python", "c"):
        loss = build("transformer", checkpoint="layer").loss()
        with ca.memory.profile(tracemalloc_witness=False) as prof:
            with ca.compiled_backward(backend=backend):
                loss.backward()
        peaks[backend] = prof.peak_bytes
    assert peaks["c"] <= peaks["python"], peaks


@needs_cc
def test_a_backward_split_into_parts_gives_the_same_gradients(cache):
    """A long function is split into translation units sharing a frame of pointers;
    callbacks, late outputs and unpacked values cross the parts' boundaries."""
    def grads(part_lines):
        ex = build("transformer", checkpoint="layer", **TRANSFORMER)
        compiled = []

        def compiler(gm):
            compiled.append(CBackward(gm.graph, part_lines=part_lines))
            return compiled[-1]
        with ca.compiled_backward(backend=compiler):
            ex.loss().backward()
        return [p.grad.numpy() for p in ex.parameters()], compiled[0].prog.sources
    whole, one = grads(10 ** 9)
    split, many = grads(60)
    assert len(one) == 1 and len(many) > 5
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(a, b)


@needs_cc
def test_matmul_with_one_row_and_a_broadcast_gradient(capfd):
    """M == 1 and a gradient broadcast over the batch: the rows cannot merge into
    one gemm (lda would be 0, which BLAS rejects, leaving the output unwritten)."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((3, 1, 4)).astype(np.float32)
    W = rng.standard_normal((4, 5)).astype(np.float32)
    C = rng.standard_normal((1, 5)).astype(np.float32)
    x, w = ca.tensor(X, requires_grad=True), ca.tensor(W, requires_grad=True)
    _on_c(((x @ w).sum(0) * ca.tensor(C)).sum().backward)
    # d loss / d (x @ w) is C broadcast over the batch of 3
    np.testing.assert_allclose(x.grad.numpy(), np.broadcast_to(C @ W.T, (3, 1, 4)), rtol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), X.sum(0).T @ C, rtol=1e-5)
    assert "illegal value" not in capfd.readouterr().err


@needs_cc
def test_two_threads_run_one_compiled_backward_with_callbacks():
    """Callbacks find their own thread's call (each thread has its frames)."""
    import threading
    # Built here, not in the threads: build() seeds and draws from ca's one global
    # RNG, so two threads building at once would interleave draws (as torch's would).
    models = [build("mlp", layers=3, width=8, batch=4, checkpoint="layer") for _ in range(2)]
    def run(results, i):
        ex = models[i]
        for _ in range(5):
            ex.zero_grad()
            _on_c(ex.loss().backward)
        results[i] = [p.grad.numpy().copy() for p in ex.parameters()]
    results = {}
    threads = [threading.Thread(target=run, args=(results, i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1], "a thread raised"
    ex = build("mlp", layers=3, width=8, batch=4, checkpoint="layer")
    ex.loss().backward()
    for grads in results.values():
        for g, p in zip(grads, ex.parameters()):
            np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_release_callback_with_nothing_else_to_do_is_folded_into_the_next():
    g = ca.trace_backward(build("transformer", checkpoint="layer", **TRANSFORMER).loss())
    prog = CBackward(g.graph, build=False).prog
    folded = [early for site in prog.sites for early in site.early]
    assert folded and all(e.kind == "release" and not (e.alloc or e.open_blocks or
                                                      e.close_blocks) for e in folded)
    calls = prog.source.count("if (ca_call_back(cb, ")
    assert calls == len(prog.sites) - len(folded)
    for e in folded:       # not in the C: the next callback drops its arrays first
        assert f"if (ca_call_back(cb, {e.index}, NULL))" not in prog.source
