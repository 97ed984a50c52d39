"""A custom Function's backward under compiled_backward: by default one
``call_hook[call_backward]`` node that runs the user's Python at run time (as
torch's compiled autograd does); with ``inline_backward = True``, traced into prims.

Every test runs on each backend and compares with eager autograd on the same
program: gradients, how many times the backward ran, and the order of everything
it and the hooks did."""
import contextlib
import logging
import warnings

import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd import Function
from helpers import BACKENDS, assert_backend_matches

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")


def _maybe(backend):
    return ca.compiled_backward(backend=backend) if backend else contextlib.nullcontext()


def _logged_square(log):
    class LoggedSquare(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            log.append("node")
            return g * 2 * x
    return LoggedSquare


def _run_logged(backend, log):
    fn = _logged_square(log)
    x = ca.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = fn.apply(x)
    y.register_hook(lambda g: log.append("y_tensor_hook"))
    y.grad_fn.register_prehook(lambda g: log.append("y_pre_hook"))
    y.grad_fn.register_hook(lambda gi, go: log.append("y_post_hook"))
    x.register_hook(lambda g: log.append("x_tensor_hook"))
    x.register_post_accumulate_grad_hook(lambda t: log.append("x_post_acc_grad_hook"))
    with _maybe(backend):
        (y * y).sum().backward()
    return x.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_side_effects_run_at_every_backward_in_eagers_order(backend):
    want_log = []
    want = _run_logged(None, want_log)
    assert want_log == ["y_tensor_hook", "y_pre_hook", "node", "y_post_hook",
                        "x_tensor_hook", "x_post_acc_grad_hook"]   # torch's order
    for _ in range(3):
        log = []
        assert_backend_matches(backend, want, _run_logged(backend, log))
        assert log == want_log
    # (the same class each time would hit from the second call: here each run
    # defines its own, so each is a new structure; see the next test for hits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_hit_runs_the_backward_again(backend):
    calls = []
    fn = _logged_square(calls)
    for i in range(4):
        x = ca.tensor([1.0, 2.0 + i], requires_grad=True)
        with _maybe(backend):
            fn.apply(x * 3.0).sum().backward()
        assert_backend_matches(backend, [18.0, 18.0 * (2 + i)], x.grad.numpy())
    assert len(calls) == 4
    stats = ca.compiled_autograd_stats()
    assert (stats["captures"], stats["cache_hits"]) == (1, 3)   # (the first ran eagerly)


class ReadsValues(Function):
    """What a traced backward cannot do: read values, branch on them, mutate."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 3.0

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        assert np.isfinite(g.numpy()).all()
        scale = 3.0 if g.sum().item() > 0 else -3.0
        out = g.clone()
        out.mul_(scale)
        out.add_(x * 0.0)
        return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_that_reads_values_runs(backend):
    for sign in (1.0, -1.0, 1.0):
        x = ca.tensor([0.5, 1.5], requires_grad=True)
        with _maybe(backend):
            (ReadsValues.apply(x) * sign).sum().backward()
        assert_backend_matches(backend, [3.0, 3.0], x.grad.numpy())   # (3 * sign) * sign


def test_the_graph_shows_the_node_and_unpacks_its_saved_values_right_before_it():
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    with ca.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = _logged_square([]).apply(x * 2)
    g = ca.trace_backward((y * 3).sum())
    g.graph.lint()
    nodes = g.graph.nodes
    (call,) = [n for n in nodes if n.target == "call_backward"]
    assert call.op == "call_hook" and call.meta["source"] == "LoggedSquareBackward"
    assert "call_hook[call_backward]" in str(g) and "# LoggedSquareBackward" in str(g)
    unpack = next(n for n in nodes if n.target == "unpack_hook")
    assert nodes.index(call) == nodes.index(unpack) + 1       # progressive unpacking
    assert unpack in g.graph.last_uses()[call]                # freed after its last use
    assert "_h_call_backward(" in g.code


def test_an_inlined_backward_is_traced_into_prims():
    class Inlined(Function):
        inline_backward = True

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2 * x
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    g = ca.trace_backward(Inlined.apply(x).sum())
    assert not [n for n in g.graph.nodes if n.op == "call_hook" and n.target != "accumulate_grad"]
    assert [n.target for n in g.graph.nodes if n.op == "call_function"
            and n.meta.get("source") == "InlinedBackward"].count("mul") == 2


class InlinedButReadsValues(ReadsValues):
    inline_backward = True


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inlined_backward_that_cannot_be_traced_falls_back_and_says_why(
        backend, monkeypatch, caplog):
    monkeypatch.setenv("CA_LOGS", "verbose")
    x = ca.tensor([0.5, 1.5], requires_grad=True)
    g = ca.trace_backward(InlinedButReadsValues.apply(x).sum())
    assert [n.target for n in g.graph.nodes if n.op == "call_hook"] == [
        "call_backward", "accumulate_grad"]
    assert not [n for n in g.graph.nodes if n.op == "call_function"
                and n.meta.get("source") == "InlinedButReadsValuesBackward"
                and n.target != "getitem"]               # what the attempt traced is gone
    with caplog.at_level(logging.INFO, logger="compiled_autograd"):
        for _ in range(2):
            x = ca.tensor([0.5, 1.5], requires_grad=True)
            with ca.compiled_backward(backend=backend):
                InlinedButReadsValues.apply(x).sum().backward()
            assert_backend_matches(backend, [3.0, 3.0], x.grad.numpy())
    assert "InlinedButReadsValuesBackward: inline_backward could not be traced " \
           "(RuntimeError: compiled autograd: the values of a traced tensor cannot be read" \
           in caplog.text


def _drop_y(calls):
    class DropY(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            calls.append(1)
            return g * 2, None          # y requires grad, but gets none from here
    return DropY


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_returned_as_none_is_none_as_in_eager(backend):
    calls = []
    fn = _drop_y(calls)
    y_hooks = []
    for _ in range(3):
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        y = ca.tensor([3.0, 4.0], requires_grad=True)
        y.register_hook(lambda g: y_hooks.append(g))
        with warnings.catch_warnings():
            warnings.simplefilter("error")           # no zeros-and-retrace on the way
            with ca.compiled_backward(backend=backend):
                fn.apply(x, y).sum().backward()
        assert y.grad is None and y_hooks == []
        assert_backend_matches(backend, [2.0, 2.0], x.grad.numpy())
    assert len(calls) == 3
    # The first (eager) run showed the graph wrong about y: traced again, then a hit.
    stats = ca.compiled_autograd_stats()
    assert (stats["captures"], stats["cache_hits"]) == (2, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_none_that_depends_on_values_is_warned_about_and_learned(backend):
    class DropsWhenNegative(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g, (g * 5 if g.sum().item() > 0 else None)

    def run(sign):
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        y = ca.tensor([3.0, 4.0], requires_grad=True)
        with ca.compiled_backward(backend=backend):
            (DropsWhenNegative.apply(x, y) * sign).sum().backward()
        return y.grad

    assert run(1.0).numpy().tolist() == [5.0, 5.0]        # eager run: learns "not None"
    assert run(1.0).numpy().tolist() == [5.0, 5.0]        # compiled, a hit
    with pytest.warns(RuntimeWarning, match="DropsWhenNegativeBackward returned None for "
                      "gradient 1, which its compiled graph goes on with: this backward used "
                      "zeros there"):
        assert run(-1.0).numpy().tolist() == [0.0, 0.0]   # (eager: None)
    assert run(-1.0) is None                              # traced again with None
    with pytest.raises(RuntimeError, match="DropsWhenNegativeBackward returned a gradient "
                       "for input 1, for which it returned None when this backward was "
                       "compiled: the compiled graph has no use for it"):
        run(1.0)                                          # (never a lost gradient)
    assert run(1.0).numpy().tolist() == [5.0, 5.0]        # traced again with it


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
@pytest.mark.parametrize("case,error,match", [
    ("raises", ValueError, "from the user's backward"),
    ("count", RuntimeError, "function BadBackward returned an incorrect number of gradients "
                            r"\(expected 1, got 2\)"),
    ("shape", RuntimeError, "Function BadBackward returned an invalid gradient at index 0 - "
                            r"got \[3\] but expected shape compatible with \[2\]"),
])
def test_errors_of_a_backward_are_eagers(backend, case, error, match):
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            if case == "raises":
                raise ValueError("from the user's backward")
            if case == "count":
                return g, g
            return ca.ones(3)
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(error, match=match):
        with _maybe(backend):
            for _ in range(2):          # (the second, compiled, when the first is eager)
                Bad.apply(x).sum().backward(retain_graph=True)


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
def test_saved_tensors_are_as_eager_gives_them(backend):
    seen = []

    class Saves(Function):
        @staticmethod
        def forward(ctx, x, w):
            out = x * w
            ctx.save_for_backward(out, w, x)
            return out

        @staticmethod
        def backward(ctx, g):
            out, w, x = ctx.saved_tensors
            seen.append((out.grad_fn is ctx, out.requires_grad, w.requires_grad,
                         x.requires_grad))
            return g * w, g * x
    for _ in range(2):
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        w = ca.tensor([3.0, 4.0])
        with _maybe(backend):
            Saves.apply(x, w).sum().backward()
    assert seen == [(True, True, False, True)] * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("returns", ["itself", "view", "transpose", "broadcast"])
def test_a_backward_may_return_what_it_was_given_or_a_view_of_it(backend, returns):
    class PassThrough(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            if returns == "itself":
                return g
            if returns == "view":
                return g[:]
            if returns == "transpose":
                return g.t().t()
            return g.expand(2, 3)                # summed back to g's shape by validation

    def grads(compiled):
        x = ca.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
        mid = x.exp() if returns != "broadcast" else x.sum(0, keepdim=True).exp()
        out = PassThrough.apply(mid)
        if returns == "broadcast":
            out = out.expand(2, 3)
        with _maybe(backend if compiled else None):
            (out * out.sin()).sum().backward()
        return x.grad.numpy()
    want = grads(False)
    for _ in range(2):
        assert_backend_matches(backend, want, grads(True))


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
def test_saved_values_are_freed_as_the_backward_goes_and_nothing_is_kept(backend):
    import gc
    import weakref
    alive_at = {}
    refs = {}

    class Saves(Function):
        @staticmethod
        def forward(ctx, x, name):
            y = x * 2.0
            ctx.tag = name
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            data = y.numpy()
            refs[ctx.tag] = weakref.ref(data.base if data.base is not None else data)
            alive_at[ctx.tag] = sorted(k for k, r in refs.items() if k != ctx.tag and r())
            return g * 2.0, None

    gc.disable()
    try:
        for _ in range(3):      # the first compiled one runs eagerly; then compiled
            refs.clear()
            x = ca.tensor(np.ones(100, np.float32), requires_grad=True)
            loss = Saves.apply(Saves.apply(Saves.apply(x * 1.0, "A"), "B"), "C").sum()
            ctx = weakref.ref(loss.grad_fn.next_functions[0][0])
            with _maybe(backend):
                loss.backward()
            del loss
            assert alive_at == {"C": [], "B": [], "A": []}   # each freed after its node
            assert not any(r() for r in refs.values()) and ctx() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_a_none_is_saved_is_part_of_the_key(backend):
    class SavesANone(Function):
        @staticmethod
        def forward(ctx, x, first):
            ctx.save_for_backward(*((x, None) if first else (None, x)))
            return x * x

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * 2.0 * (a if a is not None else b), None
    for first in (True, True, False, False):
        x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with ca.compiled_backward(backend=backend):
            SavesANone.apply(x, first).sum().backward()
        assert_backend_matches(backend, [2.0, 4.0, 6.0], x.grad.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_first_backward_that_fails_learns_at_the_next(backend):
    calls = []
    fn = _drop_y(calls)
    fail = [True]

    def hook(g):
        if fail.pop() if fail else False:
            raise KeyboardInterrupt("interrupted")
    for i in range(3):
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        y = ca.tensor([3.0, 4.0], requires_grad=True)
        out = fn.apply(x, y)
        out.register_hook(hook)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with ca.compiled_backward(backend=backend):
                if i == 0:
                    with pytest.raises(KeyboardInterrupt):
                        out.sum().backward()
                    continue
                out.sum().backward()
        assert y.grad is None


@pytest.mark.parametrize("backend", (None,) + BACKENDS)
def test_post_hooks_see_validated_gradients(backend):
    # torch validates a node's gradients (sums a broadcast one back) before its
    # post hooks run.
    seen = []

    class Bigger(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g.unsqueeze(0).expand(2, 3) * 1.0
    for _ in range(2):
        x = ca.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = Bigger.apply(x * 1.0)
        y.grad_fn.register_hook(lambda gi, go: seen.append(tuple(gi[0].shape)))
        with _maybe(backend):
            y.sum().backward()
        assert_backend_matches(backend or "eager", [2.0, 2.0, 2.0], x.grad.numpy())
    assert seen == [(3,), (3,)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_inline_trace_leaves_ctx_as_it_was(backend):
    seen = []

    class SetsAnAttribute(Function):
        inline_backward = True

        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            seen.append(hasattr(ctx, "calls"))
            ctx.calls = 1
            if g.sum().item() > 0:       # (cannot be traced: it runs as Python)
                return g * 2.0
            return g
    x = ca.tensor([1.0, 2.0], requires_grad=True)
    with ca.compiled_backward(backend=backend):
        SetsAnAttribute.apply(x).sum().backward()
        SetsAnAttribute.apply(x).sum().backward()
    # The failed trace attempt, then the first backward's eager run, then the
    # second's compiled run (a cache hit): each finds ctx without what the
    # attempt set.
    assert seen == [False, False, False]
    assert_backend_matches(backend, [4.0, 4.0], x.grad.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_none_decided_by_a_flag_on_ctx_is_exact(backend):
    class MaybeY(Function):
        @staticmethod
        def forward(ctx, x, y, flag):
            ctx.flag = flag
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g, (g * 5 if ctx.flag else None), None
    for flag in (True, True, False, True, False, False):
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        y = ca.tensor([3.0, 4.0], requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with ca.compiled_backward(backend=backend):
                MaybeY.apply(x, y, flag).sum().backward()
        assert (y.grad.numpy().tolist() if flag else y.grad) == ([5.0, 5.0] if flag else None)
    stats = ca.compiled_autograd_stats()
    # A graph per flag (the flag is keyed), learned by its first backward (eager):
    # flag=False's returned a None its graph did not expect, so it was traced
    # again at its second backward; every other backward is a hit.
    assert (stats["captures"], stats["cache_hits"]) == (3, 3)


def test_a_user_compiler_gets_the_node_and_runs_it():
    seen = []

    def compiler(gm):
        seen.append([n.target for n in gm.graph.nodes if n.op == "call_hook"])
        assert "_h_call_backward(" in gm.code
        return gm
    calls = []
    fn = _logged_square(calls)
    for i in range(3):
        x = ca.tensor([1.0, 2.0 + i], requires_grad=True)
        with ca.compiled_backward(backend=compiler):
            fn.apply(x).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0 * (2 + i)])
    assert seen == [["call_backward", "accumulate_grad"]] and len(calls) == 3


def _key_of(loss):
    from compiled_autograd.autograd import engine
    from compiled_autograd.compiled import collection
    roots = engine.make_root_grads([loss], None, False)
    task = engine.make_task(roots, keep_graph=True, create_graph=False)
    return collection.collect(task, roots, record=False).freeze()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctx_flags_are_keyed_and_its_own_state_is_no_user_attribute(backend):
    """ctx's own state lives in slots, apart from the user's attributes in its
    __dict__ (which compiled_args scans at every backward): its flags are keyed
    (materialize_grads, needs_input_grad, which saved values are None), the
    user's bools and Nones too, and nothing else of ctx."""
    class Scaled(Function):
        @staticmethod
        def forward(ctx, x, y, materialize, flag):
            ctx.set_materialize_grads(materialize)
            ctx.save_for_backward(x, None if flag is None else y)
            ctx.note, ctx.flag = "a note", flag     # (a str: not keyed)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, _ = ctx.saved_tensors
            return g * 2.0, (g * x if ctx.needs_input_grad[1] else None), None, None
    keys, grads = [], []
    for materialize, y_grad, flag, note in [(True, True, True, "a"), (True, True, True, "b"),
                                            (False, True, True, "a"), (True, False, True, "a"),
                                            (True, True, False, "a"), (True, True, None, "a")]:
        x = ca.tensor([1.0, 2.0], requires_grad=True)
        y = ca.tensor([3.0, 4.0], requires_grad=y_grad)
        out = Scaled.apply(x, y, materialize, flag)
        ctx = out.grad_fn
        ctx.note = note
        assert ctx._user_attrs() == [("flag", flag), ("note", note)]
        assert not {"needs_input_grad", "materialize_grads", "_saved"} & set(vars(ctx))
        loss = (out * out).sum()
        keys.append(_key_of(loss))
        with _maybe(backend):
            loss.backward()
        grads.append((x.grad.tolist(), None if y.grad is None else y.grad.tolist()))
    assert keys[0] == keys[1] and len(set(keys)) == 5
    assert grads[0] == ([12.0, 32.0], [6.0, 32.0]) and grads[3] == ([12.0, 32.0], None)
