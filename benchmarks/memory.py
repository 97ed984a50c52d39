"""What checkpointing, offloading and a memory plan save and cost, side by side for
the bundled transformer and an MLP: the hand policies (none, per-layer
checkpointing, sqrt(n) segments, selective, disk offload) and
``ca.memory.plan_checkpoints`` at budgets 0.2 ... 0.9 of the peak without
checkpointing. Per row: the measured peak of forward+backward (ca's accounting, and
its tracemalloc witness), the recompute FLOPs (measured: see memory_policies.py)
and the median backward time on the eager engine and compiled on "python" and "c".
Then the planner's time, knapsack against min-cut, and the issue's claims checked.
Writes one SVG per model (peak against backward time on "c") into docs/.

    python benchmarks/memory.py [--reps N] [--svg-dir DIR]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import compiled_autograd as ca
from compiled_autograd.examples import build
from memory_policies import (BUDGETS, HAND_POLICIES, Unreachable, dominated_by, hand_row,
                             plan_row)

MODELS = {
    "transformer": dict(layers=4, d_model=128, heads=4, seq=64, batch=8),
    "mlp": dict(layers=16, width=256, batch=256, activation="gelu"),
}
BACKENDS = ("eager", "python", "c")
DOCS = Path(__file__).resolve().parent.parent / "docs"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mb(n) -> str:
    return f"{n / 2**20:.2f} MB"


def _ms(s) -> str:
    return f"{s * 1e3:.1f}ms"


def _smallest(e) -> str:
    """The planner's reason, briefly: the smallest peak it reaches."""
    tail = str(e).split("the smallest peak a plan reaches is ", 1)[1]
    return "unreachable: the smallest peak a plan reaches is " + tail.split(". Use")[0]


def print_rows(rows, base):
    print(f"{'policy':<24} {'peak (accounting)':>17} {'(tracemalloc)':>13} {'vs none':>7} "
          f"{'recompute':>12} {'planning':>9} " + " ".join(f"{b:>8}" for b in BACKENDS))
    for r in rows:
        planning = f"{r.plan.planning_seconds:.2f}s" if r.is_plan else "-"
        print(f"{r.label:<24} {_mb(r.peak):>17} {_mb(r.witness_peak):>13} "
              f"{r.peak / base:>7.3f} {r.flops / 1e9:>8.3f} GFL {planning:>9} "
              + " ".join(f"{_ms(r.times[b]):>8}" for b in BACKENDS))


def run_model(name, sizes, reps, svg_dir):
    print(f"{name} {sizes}")
    print(f"peaks: forward+backward under ca.memory.profile(), compiled \"python\", the run "
          f"after a warm one, every .grad None; backward: median of {reps} (forward untimed)")
    hands = {key: hand_row(name, sizes, key, BACKENDS, reps, witness=True)
             for key, _, _ in HAND_POLICIES}
    base = hands["none"].peak
    ex = build(name, **sizes)
    plans, unreachable = [], {}
    for budget in BUDGETS:
        try:
            plans.append(plan_row(ex, budget, "knapsack", BACKENDS, reps, witness=True,
                                  label=f"plan, budget {budget:.1f}"))
        except Unreachable as e:
            unreachable[budget] = _smallest(e)
    layer = hands["layer"]
    try:
        at_layer = plan_row(ex, layer.peak, "knapsack", BACKENDS, reps, witness=True,
                            key="plan @layer", label="plan, per-layer's peak")
    except Unreachable as e:
        at_layer, unreachable["per-layer's peak"] = None, _smallest(e)
    rows = list(hands.values()) + sorted(plans + ([at_layer] if at_layer else []),
                                         key=lambda r: -r.peak)
    print_rows(rows, base)
    for budget, reason in unreachable.items():
        label = f"budget {budget:.1f}" if isinstance(budget, float) else budget
        print(f"plan, {label}: {reason}")
    planned = plans + ([at_layer] if at_layer else [])
    if planned:
        baseline = planned[0].plan.baseline_peak_bytes
        print(f"the planner's baseline (profiled on \"python\"): {baseline:,} B; "
              f"measured without checkpointing here: {base:,} B")
        secs = [r.plan.planning_seconds for r in planned]
        prof = [r.plan.profiling_seconds for r in planned]
        print(f"planning (knapsack): median {statistics.median(secs):.3f} s, max "
              f"{max(secs):.3f} s over {len(secs)} plans; profiling (3 forward+backward): "
              f"median {statistics.median(prof):.2f} s")
    compare_formulations(ex, {r.budget: r for r in plans}, unreachable)
    check_claims(hands, planned, at_layer, unreachable)
    path = Path(svg_dir) / f"memory_pareto_{name}.svg"
    path.write_text(pareto_svg(f"{name} {sizes}", hands, planned, base))
    print(f"wrote {os.path.relpath(path, Path.cwd())}")
    t = accounting_overhead(name, sizes, reps)
    print(f"forward+backward (eager): {t['plain'] * 1e3:.1f} ms plain, "
          f"{t['accounting'] * 1e3:.1f} ms with the accounting "
          f"(x{t['accounting'] / t['plain']:.2f}), "
          f"{t['accounting+tracemalloc'] * 1e3:.1f} ms adding the tracemalloc witness "
          f"(x{t['accounting+tracemalloc'] / t['plain']:.2f})\n")


def compare_formulations(ex, knapsack, unreachable):
    print("knapsack against min-cut (measured peak, recompute FLOPs, planning time):")
    print(f"{'budget':>6}  {'knapsack':>33}  {'min-cut':>33}")
    for budget in BUDGETS:
        cells = []
        for formulation in ("knapsack", "mincut"):
            try:
                r = knapsack.get(budget) if formulation == "knapsack" else \
                    plan_row(ex, budget, "mincut")
                if r is None:
                    raise Unreachable(unreachable[budget])
                cells.append(f"{_mb(r.peak):>9} {r.flops / 1e9:>8.3f} GFL "
                             f"{r.plan.planning_seconds:>6.2f}s")
            except Unreachable as e:
                reason = str(e)
                cells.append("unreachable (smallest " + reason.split(" is ", 1)[1]
                             .split(" bytes")[0] + " B)" if " is " in reason else reason)
        print(f"{budget:>6.1f}  {cells[0]:>33}  {cells[1]:>33}")


def check_claims(hands, planned, at_layer, unreachable):
    print("claims:")
    fits = [(r.budget, r.peak, r.plan.budget_bytes) for r in planned]
    bad = [f for f in fits if f[1] > f[2]]
    print(f"(a) measured peak <= budget at every reachable budget: "
          f"{'yes' if not bad else 'NO'} ({len(fits) - len(bad)} of {len(fits)}; "
          f"largest use of the budget {max(p / b for _, p, b in fits):.4f})" if fits else
          "(a) no reachable budget")
    for budget, peak, limit in bad:
        print(f"    budget {budget}: measured {peak:,} B > {limit:,} B")
    rivals = [hands["layer"], hands["sqrt"]]
    dominated = [(r, dominated_by(r, rivals)) for r in planned]
    dominated = [(r, d) for r, d in dominated if d]
    print(f"(b) no plan dominated by per-layer checkpointing or sqrt(n) segments (both a "
          f"lower peak and fewer recompute FLOPs): {'yes' if not dominated else 'NO'}")
    for r, ds in dominated:
        for d in ds:
            print(f"    {r.label}: {r.peak:,} B, {r.flops:,} FLOPs; dominated by {d.label}: "
                  f"{d.peak:,} B, {d.flops:,} FLOPs")
    layer = hands["layer"]
    if at_layer is None:
        reason = unreachable["per-layer's peak"]
        print(f"(c) plan at per-layer checkpointing's peak ({layer.peak:,} B): {reason}")
        return
    a, b = at_layer.times["c"], layer.times["c"]
    print(f"(c) on \"c\", at per-layer checkpointing's peak ({layer.peak:,} B): plan "
          f"{_ms(a)} (peak {at_layer.peak:,} B, {at_layer.flops / 1e9:.3f} GFLOP recomputed), "
          f"per-layer {_ms(b)} ({layer.flops / 1e9:.3f} GFLOP): plan/per-layer {a / b:.2f} "
          f"({'faster' if a < b else 'NOT faster'})")


def pareto_svg(title, hands, planned, base) -> str:
    """Measured peak (x) against backward time on "c" (y): the plans joined by a
    line, the hand policies as labelled squares. Standalone SVG, no scripts."""
    w, h, left, right, top, bottom = 640, 400, 64, 150, 36, 48
    points = [(r.peak, r.times["c"]) for r in list(hands.values()) + planned]
    x_max = max(p for p, _ in points) * 1.05
    y_max = max(t for _, t in points) * 1.1

    def x(v):
        return left + v / x_max * (w - left - right)

    def y(v):
        return h - bottom - v / y_max * (h - top - bottom)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="13">{title}</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" '
           'stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>']
    for k in range(6):
        mb = x_max / 2**20 * k / 5
        ms = y_max * 1e3 * k / 5
        out.append(f'<text x="{x(mb * 2**20):.1f}" y="{h - bottom + 16}" '
                   f'text-anchor="middle">{mb:.1f}</text>')
        out.append(f'<text x="{left - 6}" y="{y(ms / 1e3) + 4:.1f}" '
                   f'text-anchor="end">{ms:.0f}</text>')
        out.append(f'<line x1="{left}" y1="{y(ms / 1e3):.1f}" x2="{w - right}" '
                   f'y2="{y(ms / 1e3):.1f}" stroke="#ddd"/>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">'
               f'measured peak of forward+backward, MB (no checkpointing: '
               f'{base / 2**20:.2f} MB)</text>')
    out.append(f'<text x="16" y="{(top + h - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + h - bottom) / 2})">backward on "c", ms '
               '(median)</text>')
    line = sorted((r.peak, r.times["c"]) for r in planned)
    out.append('<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="'
               + " ".join(f"{x(p):.1f},{y(t):.1f}" for p, t in line) + '"/>')
    out += [f'<circle cx="{x(p):.1f}" cy="{y(t):.1f}" r="3.5" fill="#1f77b4"/>'
            for p, t in line]
    for r in hands.values():
        px, py = x(r.peak), y(r.times["c"])
        out.append(f'<rect x="{px - 4:.1f}" y="{py - 4:.1f}" width="8" height="8" '
                   'fill="#d62728"/>')
        out.append(f'<text x="{px + 7:.1f}" y="{py + 4:.1f}">{r.label}</text>')
    lx = w - right + 14
    out.append(f'<circle cx="{lx}" cy="{top + 6}" r="3.5" fill="#1f77b4"/>'
               f'<text x="{lx + 8}" y="{top + 10}">plan_checkpoints</text>')
    out.append(f'<rect x="{lx - 4}" y="{top + 20}" width="8" height="8" fill="#d62728"/>'
               f'<text x="{lx + 8}" y="{top + 28}">hand policy</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def accounting_overhead(name, sizes, reps):
    """Median forward+backward time: plain, with ca's accounting alone, and with
    the tracemalloc witness as well (interleaved, so machine noise hits all three)."""
    ex = build(name, **sizes)
    times = {"plain": [], "accounting": [], "accounting+tracemalloc": []}
    contexts = {"plain": None, "accounting": dict(tracemalloc_witness=False),
                "accounting+tracemalloc": dict(tracemalloc_witness=True)}
    for _ in range(reps):
        for label, kwargs in contexts.items():
            start = time.perf_counter()
            if kwargs is None:
                ex.loss().backward()
            else:
                with ca.memory.profile(**kwargs):
                    ex.loss().backward()
            times[label].append(time.perf_counter() - start)
            ex.zero_grad()
    return {label: statistics.median(ts) for label, ts in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--svg-dir", default=str(DOCS))
    args = parser.parse_args()
    print(f"machine: {_cpu()}, {os.cpu_count()} cores, Python {platform.python_version()}\n")
    for name, sizes in MODELS.items():
        run_model(name, sizes, args.reps, args.svg_dir)


if __name__ == "__main__":
    main()
