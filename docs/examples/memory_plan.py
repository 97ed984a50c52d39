"""The worked example of docs/memory.md, "Planning recomputation for a budget": a
3-layer GELU MLP planned for 70% of its peak, run under the plan, measured."""
import compiled_autograd as ca
from compiled_autograd.examples import build

ex = build("mlp", layers=3, width=128, batch=1024, activation="gelu")
plan = ca.memory.plan_checkpoints(ex.loss, budget=0.7)
print(plan.table())

# Under the plan, the forward saves recipes for the recomputed values; the
# backward graph recomputes them as prim nodes (meta "recipe").
with plan:
    loss = ex.loss()
graph = ca.trace_backward(loss).graph
print("\nrecomputation in the backward graph:")
nodes = list(graph.nodes)
for i, node in enumerate(nodes):
    if "recipe" in node.meta:
        before = next(n for n in nodes[i:] if "recipe" not in n.meta)
        print(f"  {node.name} = {node.target}({', '.join(map(str, node.args))})  "
              f"# forward #{node.meta['recipe']}, {node.meta['nbytes']:,} B; "
              f"before {before.meta.get('source')}")
del loss

for backend in ("python", "c"):
    for run in range(2):            # the second run is measured (the first compiles)
        ex.zero_grad()              # every .grad None, as the plan assumes
        with ca.memory.profile(tracemalloc_witness=False) as prof:
            with plan:
                loss = ex.loss()
            with ca.compiled_backward(backend=backend):
                loss.backward()
            del loss
    print(f"{backend}: predicted peak {plan.predicted_peak_bytes:,} B, measured "
          f"{prof.peak_bytes:,} B (budget {plan.budget_bytes:,} B, no plan "
          f"{plan.baseline_peak_bytes:,} B)")

# A plan for "c": the budget is a fraction of the peak measured on "c"; the
# prediction is still the schedule of the Python backend (docs/memory.md, Limits).
plan_c = ca.memory.plan_checkpoints(ex.loss, budget=0.7, backend="c")
for run in range(2):
    ex.zero_grad()
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        with plan_c:
            loss = ex.loss()
        with ca.compiled_backward(backend="c"):
            loss.backward()
        del loss
print(f"plan for c: predicted peak {plan_c.predicted_peak_bytes:,} B, measured on c "
      f"{prof.peak_bytes:,} B (budget {plan_c.budget_bytes:,} B, no plan on c "
      f"{plan_c.baseline_peak_bytes:,} B)")
