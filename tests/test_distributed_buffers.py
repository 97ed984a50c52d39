"""``ca.nn.Module.register_buffer`` (which DDP's ``broadcast_buffers`` copies from
rank 0), against torch's: buffers in ``state_dict``, ``named_buffers()``, ``buffers()``,
its errors. One process; no MPI."""
from __future__ import annotations

import numpy as np
import pytest

import compiled_autograd as ca

torch = pytest.importorskip("torch")   # the oracle (.ci/run installs it)


def _pair(lib, tensor):
    class Net(lib.Module):
        def __init__(self):
            super().__init__()
            self.lin = lib.Linear(2, 2)
            self.register_buffer("running", tensor([1.0, 2.0]))
            self.register_buffer("scratch", tensor([0.0]), persistent=False)
            self.register_buffer("empty", None)
    outer = lib.Sequential(Net())
    outer[0].lin.register_buffer("mask", tensor([1.0, 0.0]))
    return outer


def test_buffers_are_listed_as_torch_lists_them():
    ours, theirs = _pair(ca.nn, ca.tensor), _pair(torch.nn, torch.tensor)
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours[0].named_buffers(recurse=False)] == \
        [n for n, _ in theirs[0].named_buffers(recurse=False)]
    assert len(list(ours.buffers())) == len(list(theirs.buffers())) == 3
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]


def test_buffers_load_and_reassign():
    net = _pair(ca.nn, ca.tensor)
    state = {k: ca.tensor(np.full(v.shape, 7.0, np.float32)) for k, v in net.state_dict().items()}
    net.load_state_dict(state)
    assert net[0].running.numpy().tolist() == [7.0, 7.0]
    assert net[0].scratch.numpy().tolist() == [0.0]          # not persistent: not loaded
    net[0].running = ca.tensor([3.0])                        # assignment replaces the buffer
    assert dict(net.named_buffers())["0.running"].numpy().tolist() == [3.0]
    net[0].running = None
    assert "0.running" not in dict(net.named_buffers())


@pytest.mark.parametrize("name, value, exc, message", [
    ("a.b", [1.0], KeyError, 'buffer name can\'t contain "."'),
    ("", [1.0], KeyError, 'buffer name can\'t be empty string ""'),
    ("lin", [1.0], KeyError, "attribute 'lin' already exists"),
    ("x", 3, TypeError, "cannot assign 'int' object to buffer 'x'"),
])
def test_bad_buffers_are_refused_as_torch_refuses_them(name, value, exc, message):
    for lib, tensor in ((ca.nn, ca.tensor), (torch.nn, torch.tensor)):
        net = _pair(lib, tensor)[0]
        before = [n for n, _ in net.named_buffers()]
        with pytest.raises(exc) as e:
            net.register_buffer(name, tensor(value) if isinstance(value, list) else value)
        assert message in (e.value.args[0] if exc is KeyError else str(e.value)), (lib, e.value)
        assert [n for n, _ in net.named_buffers()] == before
    with pytest.raises(TypeError, match="cannot assign 'int' as buffer 'running'"):
        _pair(ca.nn, ca.tensor)[0].running = 3
