"""docs/memory.md, "The lowest peak": the GELU MLP of benchmarks/memory.py planned
for 0.55 of its peak, below the 0.577 the greedy order's prefixes reach -- the
planner's plan recomputes every linear output and keeps every GELU output --
and that plan built by hand, simulated from the planner's own profile and
measured."""
import compiled_autograd as ca
from compiled_autograd.examples import build
from compiled_autograd.planning.plan import MemoryPlan
from compiled_autograd.planning.profile import profile_for_planning
from compiled_autograd.planning.simulate import simulate

ex = build("mlp", layers=16, width=256, batch=256, activation="gelu")
planned = ca.memory.plan_checkpoints(ex.loss, budget=0.55)
print(f"plan_checkpoints, budget 0.55: measured peak {planned.measured_peak_bytes:,} B "
      f"({planned.measured_peak_bytes / planned.baseline_peak_bytes:.3f}), recomputes "
      + ", ".join(sorted({f'{sum(r.prim == p for r in planned.recomputed)} {p}'
                          for p in {r.prim for r in planned.recomputed}})))

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
