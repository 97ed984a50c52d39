"""The walk-through of docs/compiled.md: trace the backward of a 2-layer MLP whose
layers run under checkpointing, print it, run it, and measure what progressive
unpacking saves."""
import compiled_autograd as ca
from compiled_autograd.examples import build

ex = build("mlp", layers=2, width=4, batch=3, checkpoint="layer")
g = ca.trace_backward(ex.loss())
print("== the graph")
print(g.graph)
print()
print("== print_tabular (first 12 rows)")
print("\n".join(g.graph.tabular().splitlines()[:14]))
print()
ex.zero_grad()
with ca.compiled_backward(backend="eager"):
    for _ in range(3):
        ex.loss().backward()
print("== stats after three compiled backwards:", {k: (round(v, 4) if isinstance(v, float) else v)
                                                     for k, v in ca.compiled_autograd_stats().items()})
print()
print("== peak bytes of the backward of the checkpointed transformer (4 layers, d_model 128)")
for mode in ("eager autograd", "progressive", "upfront"):
    t = build("transformer", checkpoint="layer")
    loss = t.loss()
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        if mode == "eager autograd":
            loss.backward()
        else:
            with ca.compiled_backward(backend="eager", unpack=mode):
                loss.backward()
    print(f"{mode:<16} {prof.peak_bytes:>12,} bytes")
