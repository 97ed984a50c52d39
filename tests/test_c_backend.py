"""Backend "c" itself: its templates, warnings, memory safety (AddressSanitizer),
build cache, build errors, hook callbacks and arena plan. The scenarios that every
backend runs live in test_compiled.py; this file does not repeat them."""
import os
import random
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import compiled_autograd as ca
from codegen import arena
from codegen.c import generate
from codegen.c_run import CBackward
from compiled_autograd.examples import build
from compiled_autograd.interpreter import Interpreter
from op_cases import CASES, make_inputs
from runtime import cbuild
from runtime.prims import PRIMS

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "codegen" / "templates" / "c"
MLP = dict(layers=2, width=8, batch=4)
TRANSFORMER = dict(layers=2, d_model=16, heads=2, seq=4, batch=2, vocab=20)
needs_cc = pytest.mark.skipif(shutil.which(cbuild.compiler().split()[0]) is None,
                              reason="no C compiler")


@pytest.fixture(autouse=True)
def fresh_cache():
    ca.reset_compiled_autograd()
    yield
    ca.reset_compiled_autograd()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty build cache for this test."""
    path = tmp_path / "cache"
    monkeypatch.setenv("CA_CACHE_DIR", str(path))
    monkeypatch.delenv("CA_C_FALLBACK", raising=False)
    monkeypatch.delenv("CA_C_EXTRA_FLAGS", raising=False)
    return path


def _fake_cc(tmp_path, body):
    script = tmp_path / "fake-cc"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def _case_graph(fn, specs):
    arrays, grads = make_inputs(specs, seed=5)
    out = fn(ca, *[ca.tensor(a, requires_grad=True) if g else ca.from_numpy(a)
                   for a, g in zip(arrays, grads)])
    return ca.trace_backward(out, grad_outputs=ca.tensor(np.ones(out.shape)))


def _hooked_loss():
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = ca.tensor([0.5, -1.0, 2.0], requires_grad=True)
    with ca.autograd.graph.saved_tensors_hooks(lambda t: t * 1.0, lambda t: t):
        x = a * b
    x.register_hook(lambda g: g * 2)
    a.register_post_accumulate_grad_hook(lambda t: None)
    x.grad_fn.register_prehook(lambda gs: (gs[0] + 1,))
    x.grad_fn.register_hook(lambda gi, go: None)
    return (x.exp() * x).sum()


def _dynamic_graph():
    graphs, w = [], ca.randn(5, 3, requires_grad=True)
    with ca.compiled_backward(backend=lambda g: graphs.append(g) or Interpreter(g),
                              dynamic=True):
        (ca.randn(4, 5) @ w).tanh().sum(0).sum().backward()
    return graphs[0]


# ---------------------------------------------------------------- 1. templates

def test_every_prim_in_a_backward_has_a_c_template():
    graphs = [_case_graph(fn, specs) for _, fn, specs in CASES]
    for name, sizes in (("mlp", MLP), ("transformer", TRANSFORMER)):
        for checkpoint in ("none", "layer", "selective"):
            for offload in (False, True):
                ex = build(name, checkpoint=checkpoint, offload=offload, **sizes)
                graphs.append(ca.trace_backward(ex.loss()))
    used = {n.target for g in graphs for n in g.graph.nodes
            if n.op == "call_function" and n.target in PRIMS}
    assert {"matmul", "scatter_add", "index_accumulate", "sum"} <= used
    # every prim used above, and every prim at all, names an expression or a file
    missing = {name: p.c_template for name, p in PRIMS.items()
               if not p.c_template or (p.c_template.endswith(".j2")
                                       and not (TEMPLATES / p.c_template).is_file())}
    assert not (used & set(missing)), f"prims in backwards without a C template: {missing}"
    assert not missing, f"prims whose C template is missing: {missing}"


# ---------------------------------------------------------------- 2. warnings

@needs_cc
def test_generated_c_compiles_without_warnings(tmp_path, monkeypatch):
    monkeypatch.delenv("CA_C_EXTRA_FLAGS", raising=False)
    a = ca.tensor(np.linspace(-1, 1, 6), dtype=np.float64, requires_grad=True)
    dyn = _dynamic_graph()
    graphs = {
        "mlp": ca.trace_backward(build("mlp", **MLP).loss()).graph,
        "transformer_ckpt": ca.trace_backward(
            build("transformer", checkpoint="layer", **TRANSFORMER).loss()).graph,
        "hooks": ca.trace_backward(_hooked_loss()).graph,
        "float64": ca.trace_backward((a.tanh() * a.reshape(2, 3).t().sum(1).sum()).sum()).graph,
        "dynamic": dyn,
    }
    programs = {name: generate(g) for name, g in graphs.items()}
    # and one split into parts (translation units compiled apart, then linked)
    programs["parts"] = generate(graphs["transformer_ckpt"], part_lines=100)
    assert len(programs["parts"].sources) > 2 and len(programs["mlp"].sources) == 1
    assert "double" in programs["float64"].source and "cb(" in programs["hooks"].source
    assert "sizes[" in programs["dynamic"].source
    procs = {}
    for name, prog in programs.items():
        for k, src in enumerate(prog.sources):
            c = tmp_path / f"{name}_{k}.c"
            c.write_text(src)
            cmd = cbuild.object_command(str(c), str(tmp_path / f"{name}_{k}.o"), ["-Werror"])
            procs[name, k] = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True)
    for name, p in procs.items():
        _, err = p.communicate()
        assert p.returncode == 0 and err == "", f"{name}: {err}"


# ---------------------------------------------------------------- 3. AddressSanitizer

ASAN_SCRIPT = textwrap.dedent("""
    import contextlib, os
    from pathlib import Path
    import numpy as np
    import compiled_autograd as ca
    from compiled_autograd.examples import build

    def grads(name, sizes, compiled):
        ex = build(name, **sizes)
        with ca.compiled_backward(backend="c") if compiled else contextlib.nullcontext():
            ex.loss().backward()
        return [p.grad.numpy() for p in ex.parameters()]

    for name, sizes in [("transformer", dict(checkpoint="layer", **%r)), ("mlp", %r)]:
        for e, c in zip(grads(name, sizes, False), grads(name, sizes, True)):
            np.testing.assert_allclose(c, e, rtol=1e-4, atol=1e-5, err_msg=name)
    libs = list(Path(os.environ["CA_CACHE_DIR"]).glob("*.so"))
    assert len(libs) == 2, libs
    assert all(b"__asan_" in p.read_bytes() for p in libs), "not built with ASan"
    print("ASAN-OK")
""" % (TRANSFORMER, MLP))


def _libasan():
    out = shutil.which("gcc") and subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


def test_address_sanitizer_finds_no_errors(tmp_path):
    libasan = _libasan()
    if libasan is None:
        pytest.skip("libasan not found (gcc -print-file-name=libasan.so)")
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               CA_CACHE_DIR=str(tmp_path / "cache"), CC="gcc",
               CA_C_EXTRA_FLAGS="-fsanitize=address -fno-omit-frame-pointer",
               PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    env.pop("CA_C_FALLBACK", None)
    done = subprocess.run([sys.executable, "-c", ASAN_SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert "ERROR: AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0 and "ASAN-OK" in done.stdout, done.stderr[-4000:]


# ---------------------------------------------------------------- 4. build cache

@needs_cc
def test_second_cbackward_loads_the_cached_library(cache):
    graph = ca.trace_backward(build("mlp", **MLP).loss()).graph
    first = CBackward(graph)
    second = CBackward(graph)
    assert first.built_now and not second.built_now
    assert second.library == first.library and first.library.parent == cache
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(first.library.stat().st_mode) == 0o600
    assert [p.name for p in cache.iterdir()] == [first.library.name]


def test_extra_flags_are_part_of_the_library_name(cache, monkeypatch):
    plain = cbuild.library_path("int f(void) { return 1; }")
    monkeypatch.setenv("CA_C_EXTRA_FLAGS", "-DCA_X=1 -g")
    assert {"-DCA_X=1", "-g"} <= set(cbuild.command("a.c", "a.so"))
    assert cbuild.library_path("int f(void) { return 1; }") != plain


@needs_cc
def test_two_processes_building_the_same_source_at_once(cache, tmp_path):
    # A compiler that takes a while: both processes find no library and compile.
    slow = _fake_cc(tmp_path, f'sleep 0.5\nexec {shlex.join(shlex.split(cbuild.compiler()))} "$@"')
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, time
        from runtime import cbuild
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        path, built = cbuild.build("int ca_answer(void) {{ return 42; }}\\n")
        assert cbuild.load(path).ca_answer() == 42
        print(built)
    """)
    env = dict(os.environ, CA_CACHE_DIR=str(cache), CC=slow, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    go.touch()
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [(rc, out.strip()) for out, _, rc in results] == [(0, "True")] * 2, results
    files = sorted(p.name for p in cache.iterdir())
    assert len(files) == 1 and files[0].endswith(".so"), files


# ---------------------------------------------------------------- 5. build errors

def _tiny():
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = ca.tensor([0.5, -1.0, 2.0], requires_grad=True)
    return a, b, (a.exp() * b).sum()


def test_missing_compiler_names_the_command(cache, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(cbuild.CBuildError, match="/nonexistent/cc") as info:
        cbuild.build("int f(void) { return 0; }")
    assert "-shared" in str(info.value)      # the whole command, not just the name
    assert list(cache.iterdir()) == []


def test_failing_compiler_quotes_stderr_and_leaves_nothing(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", _fake_cc(tmp_path, 'echo "fake-cc: broken toolchain 17" >&2\n'
                                                'exit 3'))
    with pytest.raises(cbuild.CBuildError, match="broken toolchain 17") as info:
        cbuild.build("int f(void) { return 0; }")
    assert "exit code 3" in str(info.value) and "fake-cc" in str(info.value)
    assert list(cache.iterdir()) == []
    # Through the backend: the backward fails before it runs, and changes nothing.
    a, b, loss = _tiny()
    with pytest.raises(cbuild.CBuildError):
        with ca.compiled_backward(backend="c"):
            loss.backward()
    assert a.grad is None and b.grad is None
    assert list(cache.iterdir()) == []
    # Once the toolchain works, the same graph (not freed) runs.
    monkeypatch.delenv("CC")
    if shutil.which("cc") is not None:
        with ca.compiled_backward(backend="c"):
            loss.backward()
        np.testing.assert_allclose(a.grad.numpy(), np.exp([1.0, 2.0, 3.0]) * [0.5, -1, 2],
                                   rtol=1e-6)


def test_fallback_to_python_warns_and_gives_eager_gradients(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", _fake_cc(tmp_path, 'echo "no compiler here" >&2\nexit 1'))
    monkeypatch.setenv("CA_C_FALLBACK", "python")
    a, b, loss = _tiny()
    with pytest.warns(RuntimeWarning, match="falling back to the Python backend"):
        with ca.compiled_backward(backend="c"):
            loss.backward()
    ea, eb, eloss = _tiny()
    eloss.backward()
    for t, e in ((a, ea), (b, eb)):
        np.testing.assert_array_equal(t.grad.numpy(), e.grad.numpy())
    assert list(cache.iterdir()) == []


# ---------------------------------------------------------------- 6. callbacks

def _on_c(fn):
    with ca.compiled_backward(backend="c"):
        return fn()


def test_tensor_hook_replaces_the_gradient():
    def run(compiled):
        a = ca.tensor([1.0, -2.0, 3.0], requires_grad=True)
        x = a * a
        x.register_hook(lambda g: g * 0 + ca.tensor([10.0, 20.0, 30.0]))
        loss = (x.sin() * 5).sum()
        (_on_c(loss.backward) if compiled else loss.backward())
        return a.grad.numpy()
    np.testing.assert_allclose(run(True), run(False), rtol=1e-6)
    np.testing.assert_allclose(run(True), [20.0, -80.0, 180.0], rtol=1e-6)


def test_hook_returning_a_wrong_shape_is_a_clear_error():
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = a * 2
    x.register_hook(lambda g: g.sum())
    with pytest.raises(RuntimeError, match=r"changed the size.*expected \[3\], got \[\]"):
        _on_c(lambda: (x * x).sum().backward())
    assert a.grad is None


def test_unpack_hook_returning_another_shape_is_a_clear_error():
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: ca.ones(5)):
        loss = a.exp().sum()
    with pytest.raises(RuntimeError, match=r"unpack_hook.*shape \[5\].*\[3\]"):
        _on_c(loss.backward)
    assert a.grad is None


def test_post_accumulate_hook_sees_accumulated_grad_and_grads_add_up():
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    seen = []
    a.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    _on_c(lambda: (a * a).sum().backward())
    first = a.grad
    _on_c(lambda: (a * a * 3).sum().backward())
    assert a.grad is first
    np.testing.assert_allclose(seen[0], [2.0, 4.0, 6.0])
    np.testing.assert_allclose(seen[1], [8.0, 16.0, 24.0])
    np.testing.assert_allclose(a.grad.numpy(), [8.0, 16.0, 24.0])


def test_autograd_grad_returns_values_like_eager():
    def run(compiled):
        ca.manual_seed(3)
        x, w = ca.randn(4, 5, requires_grad=True), ca.randn(5, 3, requires_grad=True)
        loss = (x @ w).tanh().pow(2).mean()
        f = lambda: ca.autograd.grad(loss, [x, w])
        grads = _on_c(f) if compiled else f()
        assert x.grad is None and w.grad is None
        return [g.numpy() for g in grads]
    for c, e in zip(run(True), run(False)):
        np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-7)


def test_float64_gradients_match_eager_closely():
    def run(compiled):
        rng = np.random.default_rng(0)
        x, w = (ca.tensor(rng.standard_normal(s), dtype=np.float64, requires_grad=True)
                for s in ((6, 5), (4, 5)))
        F = ca.nn.functional
        loss = F.log_softmax(F.linear(F.layer_norm(x, (5,)), w).sigmoid(), 1).exp().sum()
        (_on_c(loss.backward) if compiled else loss.backward())
        return x.grad.numpy(), w.grad.numpy()
    for c, e in zip(run(True), run(False)):
        assert c.dtype == np.float64
        np.testing.assert_allclose(c, e, rtol=1e-10, atol=1e-12)


def test_embedding_and_cross_entropy_gather_scatter():
    def run(compiled):
        ca.manual_seed(0)
        emb = ca.nn.Embedding(10, 4)
        ids = ca.from_numpy(np.array([[1, 3, 3], [0, 9, 2]]))
        target = ca.from_numpy(np.array([1, 2, 0, 3, 3, 1]))
        loss = ca.nn.functional.cross_entropy(emb(ids).reshape(6, 4), target)
        (_on_c(loss.backward) if compiled else loss.backward())
        return emb.weight.grad.numpy()
    c, e = run(True), run(False)
    np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-7)
    assert np.all(c[[4, 5, 6, 7, 8]] == 0) and np.any(c[3] != 0)


class Boom(Exception):
    pass


def test_exception_in_a_hook_propagates_unchanged():
    a = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = a * 2

    def hook(g):
        raise Boom("kaboom 42")
    x.register_hook(hook)
    with pytest.raises(Boom, match="^kaboom 42$"):
        _on_c(lambda: (x * x).sum().backward())
    assert a.grad is None


def test_full_range_slice_backward_is_not_clobbered():
    # slice_backward fills its result with zeros, then copies the gradient in: a
    # full-range slice must not reuse the dying gradient's buffer for the result.
    def run(compiled):
        x = ca.tensor(np.arange(12.0).reshape(4, 3) / 7, requires_grad=True)
        loss = (x * 2).exp().narrow(0, 0, 4).sin().sum()
        (_on_c(loss.backward) if compiled else loss.backward())
        return x.grad.numpy()
    np.testing.assert_allclose(run(True), run(False), rtol=1e-5)


# ---------------------------------------------------------------- 7. arena plan

def test_transformer_arena_plan_is_between_the_bounds():
    graph = ca.trace_backward(build("transformer", **TRANSFORMER).loss()).graph
    prog = CBackward(graph, build=False).prog
    plan = prog.plan
    assert plan.lower_bound <= plan.size <= plan.total
    assert plan.size < plan.total            # buffers really share bytes
    buffers = [(s.nbytes, s.first, s.last) for s in prog.arena_storages]
    _assert_no_overlap(buffers, plan)


def _assert_no_overlap(buffers, plan):
    assert len(plan.offsets) == len(buffers)
    spans = [(o, o + n, f, l) for o, (n, f, l) in zip(plan.offsets, buffers)]
    for i, (o1, e1, f1, l1) in enumerate(spans):
        assert o1 % arena.ALIGN == 0 and e1 <= plan.size
        for o2, e2, f2, l2 in spans[i + 1:]:
            if f1 <= l2 and f2 <= l1 and e1 > o1 and e2 > o2:
                assert e1 <= o2 or e2 <= o1, (spans, (o1, e1, f1, l1), (o2, e2, f2, l2))


def test_arena_plan_on_random_intervals():
    rng = random.Random(1234)
    for _ in range(300):
        buffers = []
        for first in (rng.randint(0, 30) for _ in range(rng.randint(0, 25))):
            buffers.append((rng.choice([0, 1, 8, 64, 100, rng.randint(1, 5000)]),
                            first, first + rng.randint(0, 8)))
        plan = arena.plan(buffers)
        assert plan.size >= plan.lower_bound == arena.lower_bound(buffers)
        assert plan.size <= plan.total
        _assert_no_overlap(buffers, plan)


# ---------------------------------------------------------------- 7. BLAS and handing arrays over

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


# ---------------------------------------------------------------- 8. memory: in place, late outputs

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

        def compiler(graph):
            compiled.append(CBackward(graph, part_lines=part_lines))
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
    def run(results, i):
        ex = build("mlp", layers=3, width=8, batch=4, checkpoint="layer")
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
    ex = build("mlp", layers=3, width=8, batch=4, checkpoint="layer")
    ex.loss().backward()
    for grads in results.values():
        for g, p in zip(grads, ex.parameters()):
            np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5, atol=1e-6)
