"""Dynamic shapes: a graph traced with symbolic sizes is reused only where it is
right (batch sweeps of the bundled models, guards, lifted scalars). User code
that computes with a size is specialised; user code and hooks that only pass
gradients on keep the graph dynamic; arithmetic that cannot stay symbolic
records a guard."""
import numpy as np
import pytest

import compiled_autograd as ca
import fuzz_ops
from compiled_autograd.examples import build
from compiled_autograd.ir.symbolic import ShapeEnv, SymFloat, SymInt
from helpers import BACKENDS, assert_backend_matches

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")

def _model_sweep(backend, make, batches, dynamic=False):
    captures = []
    for batch in batches:
        ex = make(batch)
        ex.loss().backward()
        expected = [p.grad.numpy().copy() for p in ex.parameters()]
        ex.zero_grad()
        with ca.compiled_backward(backend=backend, dynamic=dynamic):
            ex.loss().backward()
        for e, p in zip(expected, ex.parameters()):
            assert_backend_matches(backend, e, p.grad.numpy())
        captures.append(ca.compiled_autograd_stats()["captures"])
    return captures


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_dynamic_batch_sweep(backend, name):
    def make(batch):
        if name == "mlp":
            return build("mlp", layers=3, width=8, batch=batch)
        return build("transformer", layers=1, d_model=16, heads=2, seq=8, batch=batch,
                     vocab=20, checkpoint="layer")
    # 3 and 4 capture (the size that changed becomes dynamic); 5 and 6 do not.
    assert _model_sweep(backend, make, [3, 4, 5, 6]) == [1, 2, 2, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_true_starts_dynamic_and_prints_symbols(backend):
    # (width 8: a batch equal to another size would flip a guard comparing the two)
    def make(batch):
        return build("mlp", layers=2, width=8, batch=batch)
    assert _model_sweep(backend, make, [3, 4, 5], dynamic=True) == [1, 1, 1]
    g = build("mlp", layers=2, width=4, batch=3)
    ca.reset_compiled_autograd()
    with ca.compiled_backward(backend=backend, dynamic=True):
        g.loss().backward()
    (family,) = __import__("compiled_autograd").compiled.cache.families.values()
    text = str(family.entries[0][2].graph)
    assert "shape=(s" in text and ": f32[s" in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_lifted_scalars_do_not_recompile(backend):
    x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for scale in (0.5, 2.5, -1.0):
        with ca.compiled_backward(backend=backend):
            (x * scale).exp().sum().backward()
        expected = scale * np.exp(scale * np.array([1.0, 2.0, 3.0]))
        np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)
        x.grad = None
    assert ca.compiled_autograd_stats()["captures"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_guards_force_a_recompile_instead_of_a_wrong_graph(backend):
    # layer_norm's derivative needs 1/n over the normalised dims: once that size is
    # dynamic it is guarded (specialised), so a third size recompiles.
    def run(n):
        x = ca.tensor(np.linspace(-1, 1, 4 * n).reshape(4, n), requires_grad=True)
        w = ca.tensor(np.linspace(0.5, 1.5, n))
        out = (ca.nn.functional.layer_norm(x, (n,)) * w).sum()
        x_eager = x.detach().requires_grad_()
        (ca.nn.functional.layer_norm(x_eager, (n,)) * w).sum().backward()
        with ca.compiled_backward(backend=backend):
            out.backward()
        assert_backend_matches(backend, x.grad.numpy(), x_eager.grad.numpy())
    for n in (3, 4, 5, 6):
        run(n)
    assert ca.compiled_autograd_stats()["captures"] == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_sweep_over_stack_dims_and_size_one(backend):
    with ca.compiled_backward(backend=backend, dynamic=True):
        for d in (2, 3, 4):
            x = ca.ones(2, 3, 4, 5, requires_grad=True)
            ca.stack([x, x * 2], d).sum().backward()
            assert_backend_matches(backend, x.grad.numpy(), np.full((2, 3, 4, 5), 3.0))
        for batch in (3, 1, 4):
            x = ca.ones(batch, 4, requires_grad=True)
            w = ca.ones(4, 4, requires_grad=True)
            (x @ w).tanh().sum().backward()
            expected = x.detach().requires_grad_()
            (expected @ w.detach()).tanh().sum().backward()
            assert_backend_matches(backend, x.grad.numpy(), expected.grad.numpy())


# Its backward computes with a size: grad * (1.0 / grad.shape[-1]). The Functions
# below declare inline_backward (traced into prims): what they read of a size is
# baked into the graph, which must then be specialised. (Run as Python, the
# default, a backward reads the real sizes at every call: see the last test.)
PerRow = fuzz_ops._functions(ca)["per_row_inline"]
PerRowAsPython = fuzz_ops._functions(ca)["per_row"]


class BySavedWidth(ca.autograd.Function):
    """Its backward computes with the size of a saved tensor that needs no
    gradient (so no returned gradient has that size)."""
    inline_backward = True

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return grad * (1.0 / w.shape[0]), None


class TwoOutputs(ca.autograd.Function):
    """With one output unused, its gradient is materialised as zeros."""
    inline_backward = True

    @staticmethod
    def forward(ctx, x):
        return x * 2.0, x * 3.0

    @staticmethod
    def backward(ctx, g_used, g_unused):
        return g_used * 2.0 + g_unused * 3.0


class TwoOutputsReadsWidth(TwoOutputs):
    @staticmethod
    def backward(ctx, g_used, g_unused):
        return g_used * (1.0 / g_unused.shape[-1])


class Double(ca.autograd.Function):
    """Its backward reads no size."""
    inline_backward = True

    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, grad):
        return grad * 2.0


def _sweep(backend, loss_of, sizes, dynamic):
    ca.reset_compiled_autograd()
    for n in sizes:
        x = ca.tensor(np.linspace(-1.0, 1.0, 2 * n).reshape(2, n), requires_grad=True)
        x_eager = x.detach().requires_grad_()
        loss_of(x_eager).backward()
        with ca.compiled_backward(backend=backend, dynamic=dynamic):
            loss_of(x).backward()
        np.testing.assert_allclose(x.grad.numpy(), x_eager.grad.numpy(), rtol=1e-6)
    return ca.compiled_autograd_stats()["compiles"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [True, False])
def test_a_custom_backward_that_computes_with_a_size_is_specialised(backend, dynamic):
    # Before: the graph traced at n=3 baked 1/3 and was reused at n=4 and 5.
    compiles = _sweep(backend, lambda x: (PerRow.apply(x) * x).sum(), (3, 4, 5), dynamic)
    assert compiles == 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [True, False])
def test_a_custom_backward_run_as_python_reads_the_real_sizes(backend, dynamic):
    # Not traced: nothing to specialise. One graph with dynamic sizes serves
    # every size (the second size makes them dynamic when dynamic=False).
    compiles = _sweep(backend, lambda x: (PerRowAsPython.apply(x) * x).sum(), (3, 4, 5),
                      dynamic)
    assert compiles == (1 if dynamic else 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [True, False])
def test_a_custom_backward_that_computes_with_a_saved_size_is_specialised(backend, dynamic):
    # Before: wrong from the second size on (dynamic=True) or the third (the
    # cache's own): x keeps its shape, and nothing pinned w's size.
    ca.reset_compiled_autograd()
    for n in (3, 4, 5):
        x = ca.tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3), requires_grad=True)
        with ca.compiled_backward(backend=backend, dynamic=dynamic):
            (BySavedWidth.apply(x, ca.ones(n)) * x).sum().backward()
        # d/dx of (f(x) * x).sum() with f's backward grad / n: x / n + x
        np.testing.assert_allclose(x.grad.numpy(), (1.0 / n + 1.0) * x.detach().numpy(),
                                   rtol=1e-6)
    assert ca.compiled_autograd_stats()["compiles"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_materialised_zeros_have_the_symbolic_shape(backend):
    # Before: the zeros for the unused output were a constant of the first size:
    # reading their width baked it in (wrong gradients), adding them recompiled.
    reads = _sweep(backend, lambda x: (TwoOutputsReadsWidth.apply(x)[0] * x).sum(), (3, 4, 5),
                   True)
    assert reads == 3
    assert _sweep(backend, lambda x: (TwoOutputs.apply(x)[0] * x).sum(), (3, 4, 5), True) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_custom_backward_that_reads_no_size_stays_dynamic(backend):
    # Its gradients are checked against its inputs' shapes: symbolic ones.
    assert _sweep(backend, lambda x: (Double.apply(x) * x).sum(), (3, 4, 5), True) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_post_hook_keeps_the_graph_dynamic(backend):
    def loss_of(x):
        y = x.exp()
        y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0] * 3.0,))
        return (y * x).sum()
    assert _sweep(backend, loss_of, (3, 4, 5), True) == 1


def test_arithmetic_that_cannot_stay_symbolic_records_a_guard():
    with ShapeEnv() as env:
        n, m, c = SymInt.size(3, 0), SymInt.size(5, 1), SymFloat.scalar(0.5, 2)
        kept = {"n + 1": n + 1, "n * 2": n * 2, "n * m": n * m, "n * c": n * c,
                "c / n": c / n, "-c": -c}
        assert all(hasattr(v, "expr") for v in kept.values()), kept
        assert env.guards == []
        n_is_3, m_is_5, c_is_half = (("s", 0), "==", 3, True), (("s", 1), "==", 5, True), \
            (("c", 2), "==", 0.5, True)
        pinned = {"n * 0.5": (lambda: n * 0.5, 1.5, [n_is_3]),
                  "n / 2": (lambda: n / 2, 1.5, [n_is_3]),
                  "n ** 2": (lambda: n ** 2, 9, [n_is_3]),
                  "-n": (lambda: -n, -3, [n_is_3]),
                  "abs(n)": (lambda: abs(n), 3, [n_is_3]),
                  "n % 2": (lambda: n % 2, 1, [n_is_3]),
                  "n * np.int64(2)": (lambda: n * np.int64(2), 6, [n_is_3]),
                  "n / m": (lambda: n / m, 0.6, [m_is_5, n_is_3]),
                  "m % n": (lambda: m % n, 2, [n_is_3, m_is_5]),
                  "c ** 2": (lambda: c ** 2, 0.25, [c_is_half]),
                  "float(c)": (lambda: float(c), 0.5, [c_is_half])}
        for name, (f, value, guards) in pinned.items():
            env.guards.clear()
            result = f()
            assert result == value and not hasattr(result, "expr"), name
            assert env.guards == guards, (name, env.guards)
