"""The bundled models: every parameter gradient against a torch twin with the same
weights, and nn.Module behaviour."""
import numpy as np
import pytest

import compiled_autograd as ca
from compiled_autograd.examples import build
from helpers import assert_close, needs_torch, torch


def _torch_params(example):
    return {name: torch.tensor(p.detach().numpy(), requires_grad=True)
            for name, p in example.model.named_parameters()}


def _torch_mlp_loss(P, x, target, layers):
    F = torch.nn.functional
    h = x
    for i in range(layers):
        h = F.linear(h, P[f"net.{2 * i}.weight"], P[f"net.{2 * i}.bias"])
        if i < layers - 1:
            h = torch.tanh(h)
    return F.mse_loss(h, target)


def _torch_transformer_loss(P, tokens, targets, layers, heads):
    F = torch.nn.functional
    b, s = tokens.shape
    x = P["tok.weight"][tokens] + P["pos.weight"][torch.arange(s)]
    d = x.shape[-1]
    for i in range(layers):
        p = lambda n: P[f"blocks.{i}.{n}"]  # noqa: E731
        h = F.layer_norm(x, (d,), p("ln1.weight"), p("ln1.bias"))
        q, k, v = F.linear(h, p("attn.qkv.weight"), p("attn.qkv.bias")).chunk(3, -1)
        q, k, v = (t.reshape(b, s, heads, d // heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(y.transpose(1, 2).reshape(b, s, d), p("attn.proj.weight"),
                         p("attn.proj.bias"))
        h = F.layer_norm(x, (d,), p("ln2.weight"), p("ln2.bias"))
        h = F.gelu(F.linear(h, p("fc1.weight"), p("fc1.bias")))
        x = x + F.linear(h, p("fc2.weight"), p("fc2.bias"))
    logits = F.linear(F.layer_norm(x, (d,), P["ln.weight"], P["ln.bias"]), P["head.weight"],
                      P["head.bias"])
    return F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(b * s))


@needs_torch
def test_mlp_gradients_match_torch():
    ex = build("mlp", layers=4, width=16, batch=8)
    loss = ex.loss()
    loss.backward()
    P = _torch_params(ex)
    t_loss = _torch_mlp_loss(P, torch.from_numpy(ex.inputs["x"].numpy()),
                             torch.from_numpy(ex.inputs["target"].numpy()), 4)
    t_loss.backward()
    assert_close(loss.item(), t_loss.item())
    for name, p in ex.model.named_parameters():
        assert_close(p.grad.numpy(), P[name].grad.numpy(), what=name)


@needs_torch
def test_transformer_gradients_match_torch():
    ex = build("transformer", layers=2, d_model=32, heads=4, seq=8, batch=2, vocab=50)
    loss = ex.loss()
    loss.backward()
    P = _torch_params(ex)
    t_loss = _torch_transformer_loss(P, torch.from_numpy(ex.inputs["tokens"].numpy()),
                                     torch.from_numpy(ex.inputs["targets"].numpy()), 2, 4)
    t_loss.backward()
    assert_close(loss.item(), t_loss.item())
    for name, p in ex.model.named_parameters():
        assert_close(p.grad.numpy(), P[name].grad.numpy(), rtol=1e-4, atol=2e-5, what=name)


def test_examples_are_seeded():
    a, b = build("mlp", layers=2, width=8, batch=4), build("mlp", layers=2, width=8, batch=4)
    assert a.loss().item() == b.loss().item()


def test_bad_sizes_are_clear():
    with pytest.raises(ValueError, match="divisible"):
        build("transformer", d_model=30, heads=4)
    with pytest.raises(ValueError, match="unknown example"):
        build("resnet")


def test_module_registration_and_state_dict():
    ex = build("mlp", layers=3, width=8, batch=2)
    names = [n for n, _ in ex.model.named_parameters()]
    assert names == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias",
                     "net.4.weight", "net.4.bias"]
    state = ex.model.state_dict()
    other = build("mlp", layers=3, width=8, batch=2, seed=5)
    other.model.load_state_dict(state)
    x = ex.inputs["x"]
    np.testing.assert_array_equal(other.model(x).detach().numpy(), ex.model(x).detach().numpy())
    ex.loss().backward()
    assert all(p.grad is not None for p in ex.parameters())
    ex.zero_grad()
    assert all(p.grad is None for p in ex.parameters())
    with pytest.raises(RuntimeError, match="Missing key"):
        other.model.load_state_dict({})


def test_dropout_is_seeded_and_scaled():
    x = ca.ones(1000)
    ca.manual_seed(3)
    a = ca.nn.functional.dropout(x, 0.25)
    ca.manual_seed(3)
    b = ca.nn.functional.dropout(x, 0.25)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert set(np.unique(a.numpy())) <= {0.0, np.float32(1 / 0.75)}
    state = ca.get_rng_state()
    c = ca.nn.functional.dropout(x, 0.5)
    ca.set_rng_state(state)
    np.testing.assert_array_equal(ca.nn.functional.dropout(x, 0.5).numpy(), c.numpy())
    drop = ca.nn.Dropout(0.5).eval()
    assert drop(x) is x


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_checkpoint_and_offload_switches_keep_gradients_bitwise(name):
    sizes = (dict(layers=2, d_model=32, seq=8, batch=2, vocab=50) if name == "transformer"
             else dict(layers=4, width=16, batch=4))
    reference = None
    for mode in ("none", "layer", "sqrt", "selective"):
        for offload in (False, True):
            ex = build(name, checkpoint=mode, offload=offload, **sizes)
            ex.loss().backward()
            grads = [p.grad.numpy() for p in ex.parameters()]
            if reference is None:
                reference = grads
            for a, b in zip(grads, reference):
                np.testing.assert_array_equal(a, b, err_msg=f"{mode} offload={offload}")
