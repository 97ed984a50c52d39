"""runtime/slots.c: a compiled backward's saved values read and released in one C
pass (``SavedVariable.arrays``), against its reference, the Python loop."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd import engine
from compiled_autograd.autograd import node as _node
from compiled_autograd.autograd.node import SavedVariable
from compiled_autograd.autograd.tensor_base import TensorBase
from compiled_autograd.compiled import collection
from compiled_autograd.runtime import slots

from helpers import BACKENDS


@pytest.fixture
def reader():
    if not slots.SLOTS.enabled():
        pytest.skip("CA_C_SLOTS=0")
    made = slots.reader(SavedVariable._tensor, SavedVariable._data, SavedVariable.released,
                        TensorBase._data)
    assert made is not None, slots.SLOTS.status()
    return made


@pytest.fixture(params=["c", "python"])
def path(request, monkeypatch, reader):
    """SavedVariable.arrays through the C pass or the Python loop."""
    monkeypatch.setattr(_node, "_reader", [reader if request.param == "c" else None])
    return request.param


def _saved_values():
    """The saved values of a small graph: inputs (a leaf, a non-leaf) and outputs."""
    x = ca.tensor(np.linspace(-1, 1, 6).astype(np.float32), requires_grad=True)
    h = x.sin()            # saves x (a leaf: its tensor)
    y = h.tanh()           # saves its output (the array)
    z = (y * h).exp()      # saves y and h (non-leaves), and its output
    loss = z.sum()
    roots = engine.make_root_grads([loss], None, False)
    task = engine.make_task(roots, keep_graph=True, create_graph=False)
    collected = collection.collect(task, roots, record=False)
    return loss, collected.saved


def test_the_arrays_are_the_values_arrays(path):
    loss, saved = _saved_values()
    assert any(sv._tensor is None for sv in saved) and any(sv._tensor is not None for sv in saved)
    expected = [_node.plain_array(sv) for sv in saved]
    arrays = SavedVariable.arrays(saved, False)
    assert len(arrays) == len(expected) and all(a is b for a, b in zip(arrays, expected))
    assert not any(sv.released for sv in saved)


def test_release_leaves_what_release_leaves(path):
    loss, saved = _saved_values()
    expected = [_node.plain_array(sv) for sv in saved]
    arrays = SavedVariable.arrays(saved, True)
    assert all(a is b for a, b in zip(arrays, expected))
    for sv in saved:
        assert sv.released and sv._tensor is None and sv._data is None
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second"):
        loss.backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_c_and_python_agree_on_a_compiled_backward(backend, reader, monkeypatch):
    """On every backend, a miss then a hit: the same gradients either way, and
    eager's."""
    grads = {}
    for name, made in (("c", reader), ("python", None)):
        monkeypatch.setattr(_node, "_reader", [made])
        ca.reset_compiled_autograd()
        x = ca.tensor(np.linspace(-1, 1, 8).astype(np.float32), requires_grad=True)
        for _ in range(2):          # a miss, then a hit
            x.grad = None
            h = x
            for i in range(12):
                h = h.sin() if i % 2 else (h * 1.5).tanh()
            with ca.compiled_backward(backend=backend):
                h.sum().backward()
        grads[name] = x.grad.numpy()
    np.testing.assert_array_equal(grads["c"], grads["python"])
    x.grad = None
    h = x
    for i in range(12):
        h = h.sin() if i % 2 else (h * 1.5).tanh()
    h.sum().backward()
    np.testing.assert_allclose(grads["c"], x.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_errors_name_the_value(reader):
    with pytest.raises(TypeError, match="expected SavedVariable, got int"):
        reader([1], False)
    with pytest.raises(TypeError, match="list"):
        reader((), False)
    loss, saved = _saved_values()
    with pytest.raises(TypeError, match="expected SavedVariable"):
        reader(saved[:1] + ["not a saved value"], True)
    assert saved[0].released        # (the values before it are released, as a loop leaves them)
    assert not saved[1].released


def test_a_reader_wants_object_slots():
    module = slots.SLOTS.module()
    if module is None:
        pytest.skip(slots.SLOTS.status())
    with pytest.raises(TypeError, match="member descriptor"):
        module.Reader(SavedVariable.check, SavedVariable._data, SavedVariable.released,
                      TensorBase._data)
    with pytest.raises(TypeError, match="one class"):
        module.Reader(SavedVariable._tensor, TensorBase._grad, SavedVariable.released,
                      TensorBase._data)
    made = module.Reader(SavedVariable._tensor, SavedVariable._data, SavedVariable.released,
                         TensorBase._data)
    with pytest.raises(TypeError, match="one class"):     # a failed __init__ changes nothing
        made.__init__(SavedVariable._tensor, TensorBase._grad, SavedVariable.released,
                      TensorBase._data)
    loss, saved = _saved_values()
    assert all(a is _node.plain_array(sv) for a, sv in zip(made(saved, False), saved))


def test_off_by_the_environment(monkeypatch):
    with slots.SLOTS.disabled():
        assert slots.reader(SavedVariable._tensor, SavedVariable._data,
                            SavedVariable.released, TensorBase._data) is None
        assert slots.SLOTS.status() == "python: disabled by CA_C_SLOTS=0"


def test_a_value_released_since_its_collection_fails_as_eager(path):
    """Another thread's backward may release a value between this backward's
    collection and its hand-over: eager's message, never a None array."""
    loss, saved = _saved_values()
    saved[1].release()
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        SavedVariable.arrays(saved, True)
