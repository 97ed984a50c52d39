"""Reentrant backwards nested deeper than the interpreter's stack allows: torch runs
them (past a depth, on another thread); so does the eager engine (reentrant.py)."""
import sys
import threading

import pytest

import compiled_autograd as ca
from compiled_autograd.autograd import engine, reentrant
from compiled_autograd.autograd.function import Function
from compiled_autograd.autograd.graph import disable_saved_tensors_hooks, saved_tensors_hooks
from helpers import needs_torch, torch


class DeepReentrant(Function):
    @staticmethod
    def forward(ctx, x):
        with ca.enable_grad():
            ctx.x = x.detach().requires_grad_()
            ctx.x = ctx.x - 1
        return ctx.x.detach()

    @staticmethod
    def backward(ctx, x):
        if ctx.x < 0:
            return x
        with ca.enable_grad():
            DeepReentrant.apply(ctx.x).sum().backward()
        return x


def _assert_clean():
    assert ca.is_grad_enabled()
    assert engine.current_graph_task() is None
    assert reentrant.depth() == 0


# torch: test_autograd.py::TestAutograd::test_deep_reentrant
def test_deep_reentrant():
    # Test stack overflow escape mechanism
    v = ca.tensor(2000.0, requires_grad=True)
    # This will cause stack overflow if reentrant calls are handled
    # in the same thread recursively
    DeepReentrant.apply(v).sum().backward()
    assert v.grad.item() == 1.0
    # Test stack overflow escape mechanism multiple times
    # to ensure reusing workers in the pool works fine
    v2 = ca.tensor(200.0, requires_grad=True)
    DeepReentrant.apply(v2).sum().backward()
    assert v2.grad.item() == 1.0
    _assert_clean()


@needs_torch
def test_deep_reentrant_as_torch():
    class TorchDeep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with torch.enable_grad():
                ctx.x = x.detach().requires_grad_() - 1
            return ctx.x.detach()

        @staticmethod
        def backward(ctx, x):
            if ctx.x < 0:
                return x
            with torch.enable_grad():
                TorchDeep.apply(ctx.x).sum().backward()
            return x

    t = torch.tensor(500.0, requires_grad=True)
    TorchDeep.apply(t).sum().backward()
    v = ca.tensor(500.0, requires_grad=True)
    DeepReentrant.apply(v).sum().backward()
    assert v.grad.item() == t.grad.item()


def test_deep_reentrant_from_deep_user_code():
    """Already half-way down the recursion limit: the hop comes earlier."""
    def recurse(n):
        if n == 0:
            v = ca.tensor(100.0, requires_grad=True)
            DeepReentrant.apply(v).sum().backward()
            return v.grad.item()
        return recurse(n - 1)

    assert recurse(sys.getrecursionlimit() // 2) == 1.0
    _assert_clean()


class Boom(Function):
    """Nests reentrant backwards; the deepest one raises."""
    threads = set()

    @staticmethod
    def forward(ctx, x):
        with ca.enable_grad():
            ctx.x = x.detach().requires_grad_() - 1
        return ctx.x.detach()

    @staticmethod
    def backward(ctx, x):
        Boom.threads.add(threading.get_ident())
        if ctx.x < 0:
            raise ValueError("bottom reached")
        with ca.enable_grad():
            Boom.apply(ctx.x).sum().backward()
        return x


def test_deep_reentrant_error_reaches_the_caller():
    Boom.threads = set()
    v = ca.tensor(300.0, requires_grad=True)
    with pytest.raises(ValueError, match="bottom reached"):
        Boom.apply(v).sum().backward()
    assert len(Boom.threads) > 1    # it did hop
    assert v.grad is None
    _assert_clean()
    # and the engine works on
    (v * 2).sum().backward()
    assert v.grad.item() == 2.0


class Probe(Function):
    """Each level saves one tensor (sin) in the forward its backward runs, and
    records what it sees."""
    seen = []

    @staticmethod
    def forward(ctx, x):
        with ca.enable_grad():
            ctx.x = x.detach().requires_grad_()
            ctx.y = ctx.x.sin()          # saves its input: the pack hook sees it
            ctx.x = ctx.x - 1
        return ctx.x.detach()

    @staticmethod
    def backward(ctx, x):
        Probe.seen.append((threading.get_ident(), engine.current_graph_task_id(),
                           engine.current_compiler()))
        if ctx.x < 0:
            return x
        with ca.enable_grad():
            Probe.apply(ctx.x).sum().backward()
        return x


class _EagerCompiler:
    """A compiler that counts the backwards it is handed and runs them eagerly."""

    def __init__(self):
        self.calls = 0

    def run(self, roots, retain_graph, input_edges=None, accumulate=True, create_graph=False):
        self.calls += 1
        return engine.execute(roots, retain_graph, create_graph, input_edges, accumulate)


def test_deep_reentrant_keeps_hooks_and_compiler_stack():
    Probe.seen = []
    packed = []
    compiler = _EagerCompiler()
    v = ca.tensor(300.0, requires_grad=True)
    with saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t):
        out = Probe.apply(v).sum()
        engine.push_compiler(compiler)
        try:
            out.backward()
        finally:
            engine.pop_compiler()
    assert v.grad.item() == 1.0
    levels = 301 + 1        # 300 .. -1, then the one whose ctx.x < 0
    assert len(Probe.seen) == levels - 1
    assert len({t for t, _, _ in Probe.seen}) > 1      # it did hop threads
    # every level's forward packed under the hooks entered outside the backward
    assert len(packed) == levels - 1
    # every nested backward went through the pushed compiler, on every thread
    assert compiler.calls == levels - 1
    assert all(c is compiler for _, _, c in Probe.seen)
    ids = [i for _, i, _ in Probe.seen]
    assert len(set(ids)) == len(ids) and min(ids) >= 0
    _assert_clean()


def test_deep_reentrant_keeps_disabled_saved_tensors_hooks():
    class Try(Function):
        errors = []

        @staticmethod
        def forward(ctx, x):
            with ca.enable_grad():
                ctx.x = x.detach().requires_grad_() - 1
            return ctx.x.detach()

        @staticmethod
        def backward(ctx, x):
            if ctx.x < 0:
                try:
                    with saved_tensors_hooks(lambda t: t, lambda t: t):
                        pass
                except RuntimeError as e:
                    Try.errors.append(str(e))
                return x
            with ca.enable_grad():
                Try.apply(ctx.x).sum().backward()
            return x

    v = ca.tensor(200.0, requires_grad=True)
    out = Try.apply(v).sum()
    with disable_saved_tensors_hooks("no hooks in here"):
        out.backward()
    assert Try.errors == ["no hooks in here"]
