"""docs/memory.md, "Limits": the GELU MLP of benchmarks/memory.py has a plan below
the smallest peak the knapsack planner reports -- recompute every linear output,
keep every GELU output -- simulated from the planner's own profile and measured."""
import compiled_autograd as ca
from compiled_autograd.examples import build
from compiled_autograd.planning.plan import MemoryPlan
from compiled_autograd.planning.profile import profile_for_planning
from compiled_autograd.planning.simulate import simulate

ex = build("mlp", layers=16, width=256, batch=256, activation="gelu")
try:
    ca.memory.plan_checkpoints(ex.loss, budget=0.55)
except ValueError as e:
    print(str(e).split(": ", 1)[1])

profile = profile_for_planning(ex.loss, (), {}, "python")
linears = {v.index for v in profile.values if v.prim == "linear"}
sim = simulate(profile, linears)
plan = MemoryPlan(profile, sim, sim.peak, sim.peak, "by hand", 0.0, len(profile.values))
for run in range(2):           # measured as benchmarks/memory.py measures
    ex.zero_grad()
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        with plan:
            loss = ex.loss()
        with ca.compiled_backward(backend="python"):
            loss.backward()
        del loss
print(f"recompute every linear output ({len(plan.recomputed)} values): predicted peak "
      f"{sim.peak:,} B ({sim.peak / profile.baseline_peak:.3f}), measured {prof.peak_bytes:,} B, "
      f"{sim.flops:,} FLOPs recomputed")
