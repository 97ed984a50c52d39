"""A LayerNorm over a new width every call: the compiled cache's bound (docs/compiled.md).

    python docs/examples/ln_widths.py [N]
"""
import time, sys
import numpy as np
import compiled_autograd as ca
from compiled_autograd.compiled import cache
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
def run(w):
    x = ca.randn(4, w, requires_grad=True)
    return ca.nn.functional.layer_norm(x, (w,)).sum()
with ca.compiled_backward(backend="python"):
    for w in range(8, 8 + N):
        run(w).backward()
fams = cache.families
print("families", len(fams), "entries", sum(len(f.entries) for f in fams.values()))
def hit(w, reps=200):
    ts = []
    with ca.compiled_backward(backend="python"):
        for _ in range(reps):
            loss = run(w)
            t0 = time.perf_counter(); loss.backward(); ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts)//2] * 1e6
print("hit first %.1f us, last %.1f us" % (hit(8), hit(8 + N - 1)))
print(ca.compiled_autograd_stats())
