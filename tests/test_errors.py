"""Bad use fails loudly, with torch's messages, and changes nothing."""
import numpy as np
import pytest

import compiled_autograd as ca


def _mlp():
    ca.manual_seed(0)
    w = ca.randn(4, 3, requires_grad=True)
    x = ca.randn(5, 4)
    return w, (x @ w).tanh().sum()


def test_backward_twice_without_retain_graph():
    w, loss = _mlp()
    loss.backward()
    first = w.grad.numpy().copy()
    with pytest.raises(RuntimeError, match=r"Trying to backward through the graph a second "
                       r"time .* Specify retain_graph=True"):
        loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), first)  # untouched


def test_retain_graph_allows_second_backward():
    w, loss = _mlp()
    loss.backward(retain_graph=True)
    first = w.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * first, rtol=1e-6)


def test_inplace_on_saved_tensor_names_versions():
    a = ca.randn(3, 4, requires_grad=True)
    b = a * 2
    c = b.tanh()           # saves its output c
    d = (c * c).sum()      # mul saves c (twice)
    c.add_(1.0)            # c is now at version 1, its grad_fn AddBackward
    with pytest.raises(RuntimeError) as err:
        d.backward()
    msg = str(err.value)
    assert "modified by an inplace operation" in msg
    assert "[ca.FloatTensor [3, 4]]" in msg and "output 0 of AddBackward" in msg  # its current grad_fn, as torch
    assert "is at version 1; expected version 0 instead" in msg
    assert a.grad is None  # nothing ran


def test_version_error_leaves_graph_usable_after_the_fix():
    a = ca.randn(3, requires_grad=True)
    b = a * 1.0
    c = b.exp()
    loss = (c * b).sum()
    b.mul_(2.0)
    with pytest.raises(RuntimeError, match="expected version 0"):
        loss.backward()
    # The failed call released nothing: the other branch is still intact.
    (c.sum()).backward()
    np.testing.assert_allclose(a.grad.numpy(), np.exp(a.detach().numpy()), rtol=1e-6)


def test_inplace_on_leaf_requiring_grad():
    a = ca.randn(3, requires_grad=True)
    before = a.detach().numpy().copy()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used "
                                           "in an in-place operation."):
        a.add_(1.0)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        a[0:2].mul_(2.0)
    np.testing.assert_array_equal(a.detach().numpy(), before)
    assert a._version == 0
    with ca.no_grad():
        a.add_(1.0)  # allowed (an optimizer step)
    assert a._version == 1


def test_grad_of_non_scalar_needs_gradient():
    a = ca.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar "
                                           "outputs"):
        (a * 2).backward()
    assert a.grad is None


def test_supplied_gradient_shape_mismatch():
    a = ca.randn(2, 3, requires_grad=True)
    out = a * 2
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of "
                       r"torch.Size\(\[3\]\) and output\[0\] has a shape of "
                       r"torch.Size\(\[2, 3\]\)\.$"):
        out.backward(ca.ones(3))
    assert a.grad is None
    out.backward(ca.ones(2, 3))  # the graph is intact
    np.testing.assert_allclose(a.grad.numpy(), np.full((2, 3), 2.0))


def test_backward_on_tensor_without_grad():
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and "
                                           "does not have a grad_fn"):
        ca.ones(2).sum().backward()


def test_grad_unused_input():
    a, b = ca.randn(2, requires_grad=True), ca.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        ca.autograd.grad((a * 2).sum(), [a, b])
    ga, gb = ca.autograd.grad((a * 2).sum(), [a, b], allow_unused=True)
    assert gb is None and np.allclose(ga.numpy(), 2.0)


def test_requires_grad_rules():
    with pytest.raises(RuntimeError, match="only Tensors of floating point"):
        ca.tensor([1, 2], requires_grad=True)
    a = ca.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf"):
        (a * 2).requires_grad = False


def test_shape_errors():
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 "
                                           r"and 4x5\)"):
        ca.randn(2, 3) @ ca.randn(4, 5)
    with pytest.raises(RuntimeError, match=r"shape '\[5, -1\]' is invalid for input of size 6"):
        ca.randn(2, 3).reshape(5, -1)
    with pytest.raises(IndexError, match="Dimension out of range"):
        ca.randn(2, 3).sum(2)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        ca.randn(3).add_(ca.randn(2, 3))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        ca.randn(3, 1).expand(3, 4).mul_(2.0)


@pytest.mark.parametrize("dims, error, message", [
    ((0, 0), RuntimeError, "permute(): duplicate dims are not allowed."),
    ((1, -1), RuntimeError, "permute(): duplicate dims are not allowed."),
    ((0,), RuntimeError, "permute(sparse_coo): number of dimensions in the tensor input does "
                         "not match the length of the desired ordering of dimensions i.e. "
                         "input.dim() = 2 is not equal to len(dims) = 1"),
    ((0, 1, 2), RuntimeError, "permute(sparse_coo): number of dimensions in the tensor input "
                              "does not match the length of the desired ordering of dimensions "
                              "i.e. input.dim() = 2 is not equal to len(dims) = 3"),
    ((0, 5), IndexError, "Dimension out of range (expected to be in range of [-2, 1], but "
                         "got 5)"),
])
def test_permute_errors_are_torchs_in_torchs_order(dims, error, message):
    """The number of dims is checked first, then each one's range, then repeats
    (torch 2.13's messages, compared with torch's own where it is installed)."""
    x = ca.randn(2, 3, requires_grad=True)
    with pytest.raises(error) as got:
        x.permute(*dims)
    assert str(got.value) == message
    assert x.grad_fn is None and x._version == 0
    torch = pytest.importorskip("torch")
    with pytest.raises(error) as expected:
        torch.zeros(2, 3).permute(*dims)
    assert str(expected.value) == message

