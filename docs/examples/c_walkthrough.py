"""The C backend, step by step: the generated C of a 2-layer MLP, its memory plan,
and how callbacks keep unpacking progressive. Run from the repository root:

    python docs/examples/c_walkthrough.py [mlp|plan|callbacks|run|parts|chunk]
"""
import sys

import numpy as np

import compiled_autograd as ca
from compiled_autograd.examples import build


def mlp():
    ex = build("mlp", layers=2, width=8, batch=4)
    g = ca.trace_backward(ex.loss())
    code = g.c_code
    print(code[code.index("int ca_backward"):])


def plan():
    ex = build("mlp", layers=2, width=8, batch=4)
    g = ca.trace_backward(ex.loss())
    p = g.c_memory_plan()
    print(p.summary())
    ex = build("transformer", checkpoint="layer")
    p = ca.trace_backward(ex.loss()).c_memory_plan()
    print("transformer, checkpoint=layer:", p.summary())


def callbacks():
    ex = build("transformer", layers=1, d_model=16, heads=2, seq=4, batch=2, vocab=10,
               checkpoint="layer")
    code = ca.trace_backward(ex.loss()).c_code
    body = code[code.index("int ca_backward"):].splitlines()
    shown = 0
    for i, line in enumerate(body):
        if "void *r[" in line and shown < 2:
            print("\n".join(body[max(0, i - 2):i + 6]))
            print("...")
            shown += 1
    print(sum("void *r[" in line for line in body), "unpack-hook callbacks,",
          sum("release:" in line for line in body), "release callbacks,",
          len(body), "lines of C")


def run():
    for how in (dict(checkpoint="layer"), dict(checkpoint="sqrt"), dict(offload=True)):
        print("transformer,", ", ".join(f"{k}={v}" for k, v in how.items()))
        for backend in ("python", "c"):
            ex = build("transformer", **how)
            loss = ex.loss()
            with ca.memory.profile(tracemalloc_witness=False) as prof:
                with ca.compiled_backward(backend=backend):
                    loss.backward()
            grads = [p.grad.numpy() for p in ex.parameters()]
            if backend == "python":
                reference = grads
            diff = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
                       for a, b in zip(grads, reference))
            print(f"  {backend:<7} backward peak {prof.peak_bytes:>12,} B   "
                  f"max |diff| / max |grad| vs python {diff:.1e}")


def parts():
    from compiled_autograd.codegen.c_run import CBackward
    graph = ca.trace_backward(build("transformer").loss()).graph
    fn = CBackward(graph, build=False)
    print("translation units (lines):", [len(s.splitlines()) for s in fn.prog.sources])
    fn.build()
    print(f"built in {fn.build_seconds:.2f} s (compiled now: {fn.built_now})")


def chunk():
    ca.manual_seed(0)
    x = ca.randn(4, 6, requires_grad=True)
    q, k, v = x.chunk(3, -1)
    code = ca.trace_backward((q * k + v).sum()).c_code
    print(code[code.index("  /* SliceBackward */"):code.index("  return 0;")].rstrip())


if __name__ == "__main__":
    {"mlp": mlp, "plan": plan, "callbacks": callbacks, "run": run, "parts": parts,
     "chunk": chunk}[
        sys.argv[1] if len(sys.argv) > 1 else "mlp"]()
