"""The claims benchmarks/memory.py prints, asserted on small models with the same
measuring code (benchmarks/memory_policies.py, loaded by path): (a) a plan's
measured peak fits its budget at every reachable budget; (b) no plan is dominated
by per-layer checkpointing or sqrt(n) segments (a lower measured peak *and* fewer
recompute FLOPs). Bytes and FLOPs are deterministic; no time is asserted."""
import importlib.util
import pathlib
import sys

import pytest

from compiled_autograd.examples import build
from compiled_autograd.planning.profile import prim_flops

pytestmark = pytest.mark.usefixtures("fresh_compiled_cache")

_PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "memory_policies.py"
_spec = importlib.util.spec_from_file_location("memory_policies", _PATH)
mp = sys.modules.setdefault("memory_policies", importlib.util.module_from_spec(_spec))
if not hasattr(mp, "plan_row"):
    _spec.loader.exec_module(mp)   # (registered first: its dataclasses look it up)

# Activations, not parameter gradients, make most of the peak (room to plan); four
# layers, so that sqrt(n) segments checkpoint something (2 segments of 2).
TRANSFORMER = dict(layers=4, d_model=32, heads=2, seq=16, batch=4, vocab=50)
MLP = dict(layers=4, width=32, batch=64, activation="gelu")


def test_hand_recompute_flops_are_the_prims_rerun_in_the_backward():
    """Per block of the MLP: linear (2 * batch * width^2) and GELU (20 per element),
    the last block a linear alone. Per-layer recomputes every block, sqrt(n) the
    first segment (2 blocks), selective only the GELUs (it keeps linear outputs)."""
    b, w = MLP["batch"], MLP["width"]
    linear = prim_flops("linear", [(b, w), (w, w), (w,)], (b, w))
    gelu = prim_flops("gelu", [(b, w)], (b, w))
    assert (linear, gelu) == (2 * b * w * w, 20 * b * w)
    flops = {key: mp.hand_row("mlp", MLP, key).flops for key, _, _ in mp.HAND_POLICIES}
    assert flops == {"none": 0, "offload": 0, "layer": 4 * linear + 3 * gelu,
                     "sqrt": 2 * linear + 2 * gelu, "selective": 3 * gelu}


@pytest.mark.parametrize("name,sizes", [("transformer", TRANSFORMER), ("mlp", MLP)])
def test_plans_fit_their_budget_and_are_not_dominated_by_hand_checkpointing(name, sizes):
    hands = {key: mp.hand_row(name, sizes, key) for key in ("none", "layer", "sqrt")}
    assert hands["layer"].flops > 0 and hands["sqrt"].flops > 0
    ex = build(name, **sizes)
    # The lowest budget is out of reach; the planner names the smallest peak it
    # reaches, and every budget from there on must be planned.
    with pytest.raises(mp.Unreachable, match="the smallest peak the planner reaches is") as e:
        mp.plan_row(ex, min(mp.BUDGETS))
    smallest = int(str(e.value).split("reaches is ")[1].split(" bytes")[0].replace(",", ""))
    base = hands["none"].peak
    budgets = [b for b in mp.BUDGETS if int(b * base) >= smallest]
    assert len(budgets) >= 3
    rows = [mp.plan_row(ex, b) for b in budgets]          # (checks recompute_flops too)
    if smallest <= hands["layer"].peak:      # (an int budget: per-layer's bytes)
        rows.append(mp.plan_row(ex, hands["layer"].peak))
    for r in rows:
        plan = r.plan
        assert plan.baseline_peak_bytes == base
        # (a) the measured peak fits the budget (and is the predicted one)
        assert r.peak == plan.predicted_peak_bytes <= plan.budget_bytes, (r.budget, r.peak)
        # (b) neither hand policy has both a lower peak and fewer recompute FLOPs
        assert not mp.dominated_by(r, [hands["layer"], hands["sqrt"]]), (
            f"{name}: the plan for budget {r.budget} ({r.peak:,} B, {r.flops:,} FLOPs) is "
            "dominated: " + ", ".join(f"{h.label} ({h.peak:,} B, {h.flops:,} FLOPs)"
                                      for h in mp.dominated_by(r, [hands["layer"],
                                                                   hands["sqrt"]])))
