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

for run in range(2):                # the second run is measured (the first compiles)
    ex.zero_grad()                  # every .grad None, as the plan assumes
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        with plan:
            loss = ex.loss()
        with ca.compiled_backward(backend=plan.backend):   # "python": where it was made
            loss.backward()
        del loss
print(f"{plan.backend}: predicted peak {plan.predicted_peak_bytes:,} B, measured "
      f"{prof.peak_bytes:,} B (budget {plan.budget_bytes:,} B, no plan "
      f"{plan.baseline_peak_bytes:,} B)")

# Its backward elsewhere is refused: another backend holds memory otherwise.
with plan:
    loss = ex.loss()
try:
    with ca.compiled_backward(backend="c"):
        loss.backward()
except RuntimeError as e:
    print(f"c: {e}")
del loss

# A plan for "c": the budget is a fraction of the peak measured on "c", and the
# plan is measured there (the C backend holds what it was handed, and its arena,
# for the whole call: docs/memory.md, Limits); over the budget, it is planned again
# for less, and a budget it cannot meet is refused.
for budget in (0.7, 0.9):
    try:
        plan_c = ca.memory.plan_checkpoints(ex.loss, budget=budget, backend="c")
    except ValueError as e:
        print(f"plan for c, budget {budget}: {e}")
        continue
    print(f"plan for c, budget {budget}: predicted peak {plan_c.predicted_peak_bytes:,} B, "
          f"measured on c {plan_c.measured_peak_bytes:,} B (budget {plan_c.budget_bytes:,} B, "
          f"no plan on c {plan_c.baseline_peak_bytes:,} B)")
