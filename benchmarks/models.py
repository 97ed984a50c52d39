"""The benchmarks' models, each written once for both libraries (``lib`` is
``compiled_autograd`` or ``torch``) as a loss of a parameter dict: the small and
large MLPs, the 200-op elementwise chain, the transformer (the bundled example's
weights) and an MLP of custom Functions (run as Python, or ``_inlined``)."""
from __future__ import annotations

SIZES = {"small_mlp": dict(layers=8, width=64, batch=32),
         "large_mlp": dict(layers=8, width=1024, batch=256),
         "custom_fn_python": dict(layers=8, width=64, batch=32),
         "custom_fn_inlined": dict(layers=8, width=64, batch=32)}


def arrays(case, **sizes):
    """The case's parameter arrays (float32) and inputs, from one seed; ``sizes``:
    the transformer's other than the benchmark's (make_transformer's arguments)."""
    import numpy as np
    rng = np.random.default_rng(0)
    if case == "chain":
        return {"x": rng.standard_normal(16).astype(np.float32)}, {}
    if case in SIZES:
        s = SIZES[case]
        w, n = s["width"], s["layers"]
        params = {}
        for i in range(n):
            if case.startswith("custom_fn"):
                params[f"w{i}"] = (rng.standard_normal((w, w)) * 0.2).astype(np.float32)
                continue
            params[f"w{i}"] = (rng.standard_normal((w, w)) / np.sqrt(w)).astype(np.float32)
            params[f"b{i}"] = (rng.standard_normal(w) * 0.1).astype(np.float32)
        inputs = {"x": rng.standard_normal((s["batch"], w)).astype(np.float32),
                  "t": rng.standard_normal((s["batch"], w)).astype(np.float32)}
        return params, inputs
    from compiled_autograd.examples import build
    ex = build("transformer", **sizes)
    params = {n: p.detach().numpy().copy() for n, p in ex.model.named_parameters()}
    inputs = {"tokens": ex.inputs["tokens"].numpy(), "targets": ex.inputs["targets"].numpy(),
              "sizes": ex.sizes}
    return params, inputs


def custom_tanh(lib, inline=False):
    """A custom tanh saving its output, written once for ca and torch; ``inline``:
    it declares inline_backward (torch ignores the attribute)."""
    class Tanh(lib.autograd.Function):
        inline_backward = inline

        @staticmethod
        def forward(ctx, h):
            y = h.tanh()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * (1.0 - y * y)
    return Tanh


def model(lib, case, inputs):
    """``loss(P)``: the case's loss as a function of its parameter dict."""
    F = lib.nn.functional
    if case == "chain":
        ops = (lambda h: h * 1.001, lambda h: h.sin(), lambda h: h + 0.1, lambda h: h.tanh())

        def chain(P):
            h = P["x"]
            for i in range(200):
                h = ops[i % 4](h)
            return h.sum()
        return chain
    if case in SIZES:
        x, t = lib.from_numpy(inputs["x"]), lib.from_numpy(inputs["t"])
        layers = SIZES[case]["layers"]
        if case.startswith("custom_fn"):
            tanh = custom_tanh(lib, inline=case.endswith("inlined")).apply

            def custom(P):
                h = x
                for i in range(layers):
                    h = tanh(h @ P[f"w{i}"])
                return (h * h).mean()
            return custom

        def mlp(P):
            h = x
            for i in range(layers):
                h = F.linear(h, P[f"w{i}"], P[f"b{i}"])
                if i < layers - 1:
                    h = lib.tanh(h)
            return F.mse_loss(h, t)
        return mlp
    tokens, targets = lib.from_numpy(inputs["tokens"]), lib.from_numpy(inputs["targets"])
    s = inputs["sizes"]

    def transformer(P):
        b, n = tokens.shape
        d, heads = s["d_model"], s["heads"]
        x = P["tok.weight"][tokens] + P["pos.weight"][lib.arange(n)]
        for i in range(s["layers"]):
            p = lambda k: P[f"blocks.{i}.{k}"]  # noqa: E731
            h = F.layer_norm(x, (d,), p("ln1.weight"), p("ln1.bias"))
            q, k, v = F.linear(h, p("attn.qkv.weight"), p("attn.qkv.bias")).chunk(3, -1)
            q, k, v = (z.reshape(b, n, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(y.transpose(1, 2).reshape(b, n, d), p("attn.proj.weight"),
                             p("attn.proj.bias"))
            h = F.layer_norm(x, (d,), p("ln2.weight"), p("ln2.bias"))
            x = x + F.linear(F.gelu(F.linear(h, p("fc1.weight"), p("fc1.bias"))),
                             p("fc2.weight"), p("fc2.bias"))
        logits = F.linear(F.layer_norm(x, (d,), P["ln.weight"], P["ln.bias"]),
                          P["head.weight"], P["head.bias"])
        return F.cross_entropy(logits.reshape(b * n, -1), targets.reshape(b * n))
    return transformer


def wrap(lib, arrays):
    """New leaf tensors that require grad, one per array (copies, as a user's would be)."""
    return {n: lib.tensor(a, requires_grad=True) for n, a in arrays.items()}


def count_nodes(loss):
    """Autograd nodes of a loss's graph, without the leaves' AccumulateGrad."""
    seen, stack, n = set(), [loss.grad_fn], 0
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if "AccumulateGrad" not in type(fn).__name__:
            n += 1
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return n
