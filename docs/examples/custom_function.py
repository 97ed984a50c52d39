"""A custom Function under compiled_backward: run as Python (the default) or
traced into prims (inline_backward = True). Shown in docs/compiled.md."""
import compiled_autograd as ca

log = []


class ClippedScale(ca.autograd.Function):
    """Scales by 3; its backward logs, reads a value and branches on it."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 3.0

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        norm = float((g * g).sum().item()) ** 0.5
        log.append(f"backward: |g| = {norm:.3f}")
        return g * 3.0 if norm < 20 else g * (60.0 / norm)   # clip at 20


class Square(ca.autograd.Function):
    inline_backward = True      # a pure function of ctx and g: trace it

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2.0 * x


def loss_of(x):
    y = ClippedScale.apply(x)
    y.register_hook(lambda g: log.append("tensor hook on y"))
    return Square.apply(y).sum()


x = ca.tensor([0.5, -1.0, 2.0], requires_grad=True)
print("== the graph")
print(ca.trace_backward(loss_of(x)))

for backend in ("eager", "python", "c"):
    ca.reset_compiled_autograd()
    for scale in (1.0, 1.0, 10.0):
        log.clear()
        x = ca.tensor([0.5 * scale, -1.0, 2.0], requires_grad=True)
        with ca.compiled_backward(backend=backend):
            loss_of(x).backward()
        print(f"{backend:>6} x.grad = {x.grad.numpy().round(3)}  {log}")
    print(f"{backend:>6} {ca.compiled_autograd_stats()['captures']} capture, "
          f"{ca.compiled_autograd_stats()['cache_hits']} cache hits")
log.clear()
x = ca.tensor([5.0, -1.0, 2.0], requires_grad=True)
loss_of(x).backward()
print(f"engine x.grad = {x.grad.numpy().round(3)}  {log}")
