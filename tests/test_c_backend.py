"""Backend "c" itself: its templates, warnings, memory safety (AddressSanitizer),
build cache, build errors, hook callbacks and arena plan. The scenarios that every
backend runs live in test_compiled.py; this file does not repeat them."""
import contextlib
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
from compiled_autograd.codegen import arena
from compiled_autograd.codegen.c import generate
from compiled_autograd.codegen.c_ops import EMITTERS, LAYOUTS
from compiled_autograd.codegen.c_run import CBackward
from compiled_autograd.examples import build
from compiled_autograd.compiled.interpreter import Interpreter
from compiled_autograd.runtime.kernels import MATH_HEADER
from helpers import MLP, TRANSFORMER, needs_cc
from helpers import on_c as _on_c
from op_cases import CASES, make_inputs
from compiled_autograd.runtime import cbuild
from compiled_autograd.runtime.prims import PRIMS

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "codegen" / "templates" / "c"
pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")


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
    with ca.compiled_backward(backend=lambda gm: graphs.append(gm.graph) or gm,
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
    # every prim used above, and every prim at all, has an expression or a file
    # (a view prim needs none: it becomes strides)
    missing = {name: p.c for name, p in PRIMS.items() if p.c.kind not in ("view", "elementwise")
               and not (p.c.template and (TEMPLATES / p.c.template).is_file())}
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
    from compiled_autograd.runtime import cthreads

    def grads(name, sizes, compiled):
        ex = build(name, **sizes)
        with ca.compiled_backward(backend="c") if compiled else contextlib.nullcontext():
            ex.loss().backward()
        return [p.grad.numpy() for p in ex.parameters()]

    for name, sizes in [("transformer", dict(checkpoint="layer", **%r)), ("mlp", %r)]:
        for e, c in zip(grads(name, sizes, False), grads(name, sizes, True)):
            np.testing.assert_allclose(c, e, rtol=1e-4, atol=1e-5, err_msg=name)
    libs = list(Path(os.environ["CA_CACHE_DIR"]).glob("*.so"))
    # the two backward libraries, the C call that runs the MLP's backward (it has
    # no callbacks; the checkpointed one has), the saved values' hand-over
    # (runtime/slots.c), the forward's C path (runtime/forward.c) and its kernels
    # (runtime/kernels.c: GELU, layer_norm, softmax), the caching allocator
    # (runtime/pool.c), and the threads library (runtime/cthreads.c), if OpenMP works
    threads = int(cthreads.openmp()[0])
    assert len(libs) == 7 + threads, libs
    assert [sum(p.name.startswith(f"{m}_") for p in libs)
            for m in ("_c_call", "_slots", "_forward", "_kernels", "_pool", "ca_threads")
            ] == [1, 1, 1, 1, 1, threads]
    assert all(b"__asan_" in p.read_bytes() for p in libs), "not built with ASan"
    print("ASAN-OK")
""" % (TRANSFORMER, MLP))


def _libasan():
    out = shutil.which("gcc") and subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


def _asan_env(tmp_path, **more):
    """The environment of a Python process whose C is built and run under
    AddressSanitizer (skips the test where gcc has no libasan)."""
    libasan = _libasan()
    if libasan is None:
        pytest.skip("libasan not found (gcc -print-file-name=libasan.so)")
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               CA_CACHE_DIR=str(tmp_path / "cache"), CC="gcc",
               CA_C_EXTRA_FLAGS="-fsanitize=address -fno-omit-frame-pointer",
               PYTHONPATH=str(ROOT), **more)
    env.pop("CA_C_FALLBACK", None)
    return env


def test_address_sanitizer_finds_no_errors(tmp_path):
    env = _asan_env(tmp_path, OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", ASAN_SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert "ERROR: AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0 and "ASAN-OK" in done.stdout, done.stderr[-4000:]


POOL_OVERFLOW_SCRIPT = textwrap.dedent("""
    import ctypes
    import numpy as np
    import compiled_autograd as ca
    x = ca.tensor(np.ones(40_000, np.float32), requires_grad=True)
    y = (x * 2.0).sin().detach().numpy()         # from the pool (runtime/pool.c)
    assert np._core.multiarray.get_handler_name(y) == "compiled_autograd_pool"
    print("WRITING", flush=True)
    ctypes.memset(y.ctypes.data + y.nbytes, 0, 4)  # past its end, inside its block's class
    print("NOT-CAUGHT", flush=True)
""")


def test_address_sanitizer_catches_an_overflow_inside_a_pooled_block(tmp_path):
    """The pool poisons what a taken block holds past the bytes asked for."""
    done = subprocess.run([sys.executable, "-c", POOL_OVERFLOW_SCRIPT], env=_asan_env(tmp_path),
                          cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert "WRITING" in done.stdout, done.stderr[-4000:]
    assert "NOT-CAUGHT" not in done.stdout
    assert "ERROR: AddressSanitizer: use-after-poison" in done.stderr, done.stderr[-4000:]


POOL_USE_AFTER_FREE_SCRIPT = textwrap.dedent("""
    import ctypes
    import numpy as np
    import compiled_autograd as ca
    x = ca.tensor(np.ones(40_000, np.float32), requires_grad=True)
    y = (x * 2.0).sin().detach().numpy()         # from the pool (runtime/pool.c)
    assert np._core.multiarray.get_handler_name(y) == "compiled_autograd_pool"
    address = y.ctypes.data
    del y                                        # its block is kept for reuse
    assert ca.memory.cache_stats()["cached"] > 0
    print("WRITING", flush=True)
    ctypes.memset(address, 0, 4)                 # its first element, freed
    print("NOT-CAUGHT", flush=True)
""")


def test_address_sanitizer_catches_a_write_to_the_start_of_a_kept_block(tmp_path):
    """A kept block's data is poisoned from its first byte (the free list's link
    lives in the block's header, not in its data): a write to a freed array's
    first element is caught, and cannot corrupt the list."""
    done = subprocess.run([sys.executable, "-c", POOL_USE_AFTER_FREE_SCRIPT],
                          env=_asan_env(tmp_path), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert "WRITING" in done.stdout, done.stderr[-4000:]
    assert "NOT-CAUGHT" not in done.stdout
    assert "ERROR: AddressSanitizer: use-after-poison" in done.stderr, done.stderr[-4000:]


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
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith("ca_threads_")
                  ) == [first.library.name, first.library.name + ".sha256"]
    assert stat.S_IMODE(cbuild.hash_path(first.library).stat().st_mode) == 0o600


def test_extra_flags_are_part_of_the_library_name(cache, monkeypatch):
    plain = cbuild.library_path("int f(void) { return 1; }")
    monkeypatch.setenv("CA_C_EXTRA_FLAGS", "-DCA_X=1 -g")
    assert {"-DCA_X=1", "-g"} <= set(cbuild.command("a.c", "a.so"))
    assert cbuild.library_path("int f(void) { return 1; }") != plain


def test_native_flags_follow_the_cpu(monkeypatch):
    monkeypatch.delenv("CA_C_NATIVE", raising=False)
    monkeypatch.setattr(cbuild, "cpu_identity", lambda: "Some Xeon|fpu sse2 avx2 avx512f fma")
    assert cbuild.arch_flags() == ["-march=native", "-mprefer-vector-width=512"]
    monkeypatch.setattr(cbuild, "cpu_identity", lambda: "Some Core|fpu sse2 avx2 fma")
    assert cbuild.arch_flags() == ["-march=native"]
    monkeypatch.setenv("CA_C_NATIVE", "0")
    assert cbuild.arch_flags() == []
    monkeypatch.setattr(cbuild, "cpu_identity", lambda: None)
    monkeypatch.delenv("CA_C_NATIVE")
    assert cbuild.arch_flags() == []


@needs_cc
def test_two_processes_building_the_same_source_at_once(cache, tmp_path):
    # A compiler that takes a while: both processes find no library and compile.
    slow = _fake_cc(tmp_path, f'sleep 0.5\nexec {shlex.join(shlex.split(cbuild.compiler()))} "$@"')
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, time
        from compiled_autograd.runtime import cbuild
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
    # (importing compiled_autograd.runtime.cbuild runs the package's __init__,
    # which builds the project's own extension, _forward_*, into this cache too)
    files = sorted(p.name for p in cache.iterdir()
                   if p.name.startswith("ca_") and not p.name.startswith("ca_threads_"))
    assert len(files) == 2 and files[0].endswith(".so"), files     # and its hash
    assert files[1] == files[0] + ".sha256" and cbuild.check(cache / files[0]) is None


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


def test_a_small_batched_product_with_a_transposed_operand_copies_it_first():
    """q @ k^T over a batch of small matrices (attention's scores), and its
    backward's products: the transposed right operand is copied row-major before
    the GEMM (OpenBLAS's small a @ b^T is slower than the copy and a @ b); the
    gradients are eager's."""
    def run(compiled):
        rng = np.random.default_rng(0)
        q, k = (ca.tensor(rng.standard_normal((2, 3, 8, 4)).astype(np.float32),
                          requires_grad=True) for _ in range(2))
        loss = (q @ k.transpose(-2, -1)).tanh().sum()
        (_on_c(loss.backward) if compiled else loss.backward())
        return q.grad.numpy(), k.grad.numpy()
    want = run(False)
    for _ in range(2):                          # compiling, then a cache hit
        for c, e in zip(run(True), want):
            np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-6)
    q, k = (ca.tensor(np.ones((2, 3, 8, 4), np.float32), requires_grad=True) for _ in range(2))
    prog = generate(ca.trace_backward((q @ k.transpose(-2, -1)).tanh().sum()).graph)
    assert [(g.ta, g.tb) for g in prog.gemms if g.batch > 1] and all(
        g.tb == "CblasNoTrans" for g in prog.gemms if g.batch > 1 and g.ta == "CblasNoTrans")


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
    assert len(plan.offsets) == len(buffers) == len(plan.block_of)
    spans = [(o, o + n, f, l, b) for o, (n, f, l), b in zip(plan.offsets, buffers, plan.block_of)]
    for i, (o1, e1, f1, l1, b1) in enumerate(spans):
        assert o1 % arena.ALIGN == 0 and e1 <= plan.block_sizes[b1] <= plan.size
        for o2, e2, f2, l2, b2 in spans[i + 1:]:
            if b1 == b2 and f1 <= l2 and f2 <= l1 and e1 > o1 and e2 > o2:
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


def test_arena_blocks_hold_only_what_lives_across_each_callback():
    """With callbacks (cuts), each buffer's block is allocated after the last
    callback before its first write and freed at the first one after its last
    read; so while Python runs a callback the C side holds exactly the buffers
    live across it, whatever the rest of the backward needs."""
    rng = random.Random(99)
    for _ in range(300):
        buffers = [(rng.choice([0, 8, 64, 100, rng.randint(1, 5000)]), first,
                    first + rng.randint(0, 8))
                   for first in (rng.randint(0, 30) for _ in range(rng.randint(0, 25)))]
        cuts = sorted(rng.sample([x + 0.5 * rng.randint(0, 1) for x in range(32)],
                                 rng.randint(0, 6)))
        cuts = sorted(set(cuts))
        plan = arena.plan(buffers, cuts)
        _assert_no_overlap(buffers, plan)
        assert plan.lower_bound <= plan.size <= plan.total
        for (nbytes, first, last), b in zip(buffers, plan.block_of):
            opened, closed = plan.windows[b]
            assert opened == 0 or cuts[opened - 1] < first
            assert closed == len(cuts) or last < cuts[closed]
        for c, at in enumerate(cuts):
            held = sum(n for (o, e), n in zip(plan.windows, plan.block_sizes) if o <= c < e)
            live = sum(arena._align(n) for n, f, l in buffers if f <= at <= l)
            assert held == live, (buffers, cuts, c)
        # Without filling gaps (symbolic sizes), the blocks do not depend on sizes.
        fixed = arena.plan(buffers, cuts, fill=False)
        resized = arena.plan([(rng.randint(0, 5000), f, l) for _, f, l in buffers], cuts,
                             fill=False)
        assert (fixed.block_of, fixed.windows) == (resized.block_of, resized.windows)
        _assert_no_overlap(buffers, fixed)
    # A buffer between two callbacks goes to the block whose gap fits it best,
    # and takes room in that one only (the 400 bytes fit block (1, 2) at 0).
    plan = arena.plan([(1000, 5, 11), (1000, 15, 25), (600, 12, 13), (400, 12, 13)], [10, 20])
    assert plan.windows == [(0, 1), (1, 2)] and plan.block_sizes == [1024, 1024]
    assert plan.block_of == [0, 1, 0, 1] and plan.size == 2048
    # Without callbacks: one block, the arena of the whole call.
    plan = arena.plan([(64, 0, 2), (64, 1, 3)])
    assert plan.windows == [(0, 0)] and plan.block_of == [0, 0] and plan.size == 128



# ---------------------------------------------------------------- 8. wrong code found by fuzzing
# (tests/fuzz_programs.py; tests/test_fuzz_backends.py runs a fixed set of its programs)


def _scatter_over_all_of_the_output():
    x = ca.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    v = x.narrow(0, 1, 1)
    b = v.clone()
    b.select(0, 0).mul_(v.select(0, 0))   # CopySlices: its scatter covers all of b
    return x, (b * ca.tensor([[1.0, 10.0]])).sum()


@needs_cc
def test_a_scatter_over_its_whole_output_does_not_write_over_its_source():
    """as_strided_scatter copies its base into the output, then its source: the
    output may not share its buffer with the dying source (it did: the base copy
    overwrote the source before the scatter read it)."""
    x, loss = _scatter_over_all_of_the_output()
    _on_c(loss.backward)
    assert x.grad.numpy().tolist() == [[0.0, 0.0], [6.0, 80.0]]   # d(v*v)/dv = 2v, times w


def _masked_sum_over_a_middle_dim(backend=None):
    rng = np.random.default_rng(1)
    x = ca.tensor(rng.standard_normal((2, 3)), dtype=np.float64, requires_grad=True)
    y = ca.tensor(rng.standard_normal((2, 3)), dtype=np.float64, requires_grad=True)
    e = ((x * 1.0) @ y.transpose(0, 1)).unsqueeze(1).expand(2, 3, 2).clone()
    e.relu_()
    loss = ((e * e + 1.0).log() * ca.tensor(rng.standard_normal((2, 3, 2)), dtype=np.float64)).sum()
    if backend:
        with ca.compiled_backward(backend=backend):
            loss.backward()
    else:
        loss.backward()
    return x.grad.numpy(), y.grad.numpy()


@needs_cc
def test_a_masked_sum_over_a_middle_dim_is_right_at_o3():
    """ReluBackward's select fused into ExpandBackward's sum over the middle dim
    (2x3x2): GCC 12 at -O3 with AVX2 or AVX-512 vectorised `m ? a*b : 0` in that
    nest wrongly (masked loads), and row 1 of both gradients was off by up to 100%.
    where/masked_fill now call ca_select, whose arguments load unconditionally."""
    for ours, eager in zip(_masked_sum_over_a_middle_dim("c"), _masked_sum_over_a_middle_dim()):
        np.testing.assert_allclose(ours, eager, rtol=1e-12, atol=1e-14)


def test_c_lowering_is_by_kind_and_rendered_once():
    """The C backend dispatches on the lowering records' kinds, never on prim
    names, and never rewrites C it has emitted (no regular expressions)."""
    assert not set(EMITTERS) & set(PRIMS) and not set(LAYOUTS) & set(PRIMS)
    for name in ("c.py", "c_ops.py", "c_memory.py", "c_text.py"):
        text = (ROOT / "codegen" / name).read_text()
        assert "import re\n" not in text, name
        assert not [p for p in PRIMS if f'target == "{p}"' in text or f'"{p}":' in text], name


def test_selects_evaluate_their_operands_unconditionally():
    # The guard of the test above on compilers that happen to get it right.
    for name in ("where", "masked_fill"):
        assert PRIMS[name].c.expr.startswith("ca_select_{{ sfx }}("), name
    assert "ca_select_f(" in MATH_HEADER.read_text()


@needs_cc
def test_nested_helpers_do_not_grow_the_source(tmp_path):
    """A chain of relus fuses into one expression of nested helper calls; each
    level adds a call, not a copy of the levels below. (A _Generic macro writes
    its argument out again: the preprocessed source doubled at every level, and
    at 16 levels cc took 1.7 s and 547 MB.)"""
    x = ca.randn(4, requires_grad=True)
    h = x
    for _ in range(14):
        h = h.relu() * 1.5
    source = tmp_path / "chain.c"
    source.write_text(ca.trace_backward(h.sum()).c_code)
    done = subprocess.run(shlex.split(cbuild.compiler()) + ["-E", "-P", str(source)],
                          capture_output=True, text=True, check=True)
    body = done.stdout[done.stdout.index("int ca_backward"):]
    assert len(body) < 20_000, len(body)


@needs_cc
@pytest.mark.parametrize("cond", [np.array([0.5, 0.0, -2.0]), np.array([2 ** 32, 0, 1])])
def test_where_on_a_condition_that_is_not_bool(cond):
    """numpy's where takes nonzero as true: 0.5 and 2**32 too (ca_select's
    condition is a _Bool, not an int that would truncate them to 0)."""
    def grads(backend=None):
        a = ca.tensor([1.0, 2.0, 3.0], dtype=np.float64, requires_grad=True)
        b = ca.tensor([4.0, 5.0, 6.0], dtype=np.float64, requires_grad=True)
        loss = (ca.where(ca.from_numpy(cond), a, b) * ca.tensor([1.0, 10.0, 100.0],
                                                                dtype=np.float64)).sum()
        with ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext():
            loss.backward()
        return a.grad.numpy().tolist(), b.grad.numpy().tolist()
    assert grads("c") == grads() == ([1.0, 0.0, 100.0], [0.0, 10.0, 0.0])


@needs_cc
@pytest.mark.parametrize("a_shape,b_shape", [((2, 3), (3, 0)), ((0, 3), (3, 0)), ((2, 0), (0, 3)),
                                             ((0, 0), (0, 3)), ((2, 3), (4, 3, 0))])
def test_a_matmul_with_an_empty_dim(a_shape, b_shape):
    # (Generating the C once failed: no BLAS layout fit an empty matrix.)
    def grads(compiled):
        a = ca.tensor(np.ones(a_shape), requires_grad=True)
        b = ca.tensor(np.ones(b_shape), requires_grad=True)
        with ca.compiled_backward(backend="c") if compiled else contextlib.nullcontext():
            ((a @ b) * 2.0).sum().backward()
        return a.grad.numpy(), b.grad.numpy()
    for want, got in zip(grads(False), grads(True)):
        np.testing.assert_array_equal(got, want)


@needs_cc
@pytest.mark.parametrize("k", [2**100, 2**60 + 2**36 + 1, -(2**70) - 1, 2**31 + 1])
def test_a_large_int_constant_is_cast_as_numpy_casts_it(k):
    """An int constant in a float computation goes through float64, as numpy casts a
    Python int: 2**100 was a C ``long long`` literal (no such number: inf), and
    2**60 + 2**36 + 1 was rounded once to float, one ulp from numpy's two roundings."""
    from compiled_autograd.compiled.api import backward_on
    grads = []
    for backend in (None, "c"):
        x = ca.tensor(np.array([1.0, -2.0, 3.0], np.float32), requires_grad=True)
        backward_on((x * k).sum(), backend)
        grads.append(x.grad.numpy().tobytes())
    assert grads[0] == grads[1]


def test_a_negative_nan_constant_keeps_its_sign():
    from compiled_autograd.codegen.c_text import literal
    assert literal(float("-nan"), "float") == "((float)(-NAN))"
    assert literal(float("nan"), "float") == "((float)NAN)"
    assert literal(2**100, "float") == "((float)1.2676506002282294e+30)"
    assert literal(2**100, "int64_t") == "((int64_t)1267650600228229401496703205376LL)"


@needs_cc
def test_a_cheap_value_with_several_users_is_recomputed_in_their_loops(monkeypatch):
    """A layer norm's backward reads x - mean in the variance's sum and in x-hat,
    and g * w in two sums and dx: such a cheap value (plain arithmetic, at most
    MAX_RECOMPUTE users, each a loop over its shape) is recomputed in each loop
    instead of written once and read back; a transcendental one never is. The
    gradients are the same bits either way."""
    from compiled_autograd.codegen import c as c_emitter
    from compiled_autograd.codegen import c_fusion
    from compiled_autograd.codegen.c_threads import cost
    rng = np.random.default_rng(0)
    x, w, b = (ca.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True)
               for s in ((6, 16), (16,), (16,)))
    t = ca.tensor(rng.standard_normal((6, 16)).astype(np.float32))

    def make_loss():
        return (ca.nn.functional.layer_norm(x, (16,), w, b) * t).exp().sum()

    emitter = c_emitter.Emitter(ca.trace_backward(make_loss()).graph)
    shared = [n for n in emitter.fused if len(n.users) > 1]
    assert shared and all(len(n.users) <= c_fusion.MAX_RECOMPUTE
                          and cost(PRIMS[n.target].c.options["expr"]) == 1 for n in shared)
    grads = {}
    for limit in (1, c_fusion.MAX_RECOMPUTE):     # 1: every such value stored
        monkeypatch.setattr(c_fusion, "MAX_RECOMPUTE", limit)
        ca.reset_compiled_autograd()
        for p in (x, w, b):
            p.grad = None
        with ca.compiled_backward(backend="c"):
            make_loss().backward()
        grads[limit] = [p.grad.numpy().tobytes() for p in (x, w, b)]
    assert grads[1] == grads[c_fusion.MAX_RECOMPUTE]
    for p in (x, w, b):
        p.grad = None
    make_loss().backward()
    for p, got in zip((x, w, b), grads[1]):
        np.testing.assert_allclose(np.frombuffer(got, np.float32).reshape(p.shape), p.grad.numpy(),
                                   rtol=1e-5, atol=1e-5)


@needs_cc
def test_float32_sums_over_leading_dims_are_eagers_bit_for_bit():
    """numpy sums a float32 array over its leading dims a row at a time, in
    float32; the C backend's sum keeping the last dim accumulates the same way
    (not in double), so a bias's gradient, the sum of the same upstream values, is
    eager's exactly. 20,000 rows: a double sum would differ from numpy's in the
    last bits."""
    rng = np.random.default_rng(7)
    x_a, w_a, b_a, r_a, g1, g2 = (rng.standard_normal(s).astype(np.float32) for s in (
        (20_000, 24), (16, 24), (16,), (5, 300, 16), (20_000, 16), (5, 300, 16)))

    def grads(backend):
        x, w, b, r = (ca.tensor(a, requires_grad=True) for a in (x_a, w_a, b_a, r_a))
        y1 = ca.nn.functional.linear(x, w, b)
        y2 = r + b                          # b broadcast over two leading dims
        with ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext():
            ca.autograd.backward([y1, y2], [ca.tensor(g1), ca.tensor(g2)])
        return b.grad.numpy()

    want = grads(None)
    for _ in range(2):                  # the second backward a cache hit
        got = grads("c")
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
