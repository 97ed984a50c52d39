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
import math
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


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _mb(n) -> str:
    return f"{n / 2**20:.2f} MB"


def _ms(s) -> str:
    return f"{s * 1e3:.1f}ms"


def _smallest(e) -> str:
    """The planner's reason, briefly: the smallest peak it reaches."""
    tail = str(e).split("the smallest peak the planner reaches is ", 1)[1]
    return (f"unreachable: the smallest peak the planner reaches is {tail.split('. Use')[0]} "
            f"(said after {e.seconds:.2f} s, profiling included)")


def print_rows(rows, base):
    print(f"{'':<24} {'peak, python':>23} {'':>8} {'peak, c':>9} {'recompute':>9} "
          f"{'':>8} {'backward (median)':>26}")
    print(f"{'policy':<24} {'accounting':>11} {'tracemalloc':>11} {'vs none':>8} "
          f"{'accounting':>10} {'GFLOP':>8} {'planning':>8} "
          + " ".join(f"{b:>8}" for b in BACKENDS))
    for r in rows:
        planning = f"{r.plan.planning_seconds:.2f}s" if r.is_plan else "-"
        print(f"{r.label:<24} {_mb(r.peak):>11} {_mb(r.witness_peak):>11} "
              f"{r.peak / base:>8.3f} {_mb(r.other_peaks['c']):>10} {r.flops / 1e9:>8.3f} "
              f"{planning:>8} " + " ".join(f"{_ms(r.times[b]):>8}" for b in BACKENDS))


def run_model(name, sizes, reps, svg_dir):
    print(f"{name} {sizes}")
    print("peaks: forward+backward under ca.memory.profile(), backward compiled on \"python\" "
          "(the budgets' measure) or \"c\", the run after a warm one, every .grad None; "
          f"recompute: FLOPs measured; backward: median of {reps}, forward untimed")
    measure = dict(backends=BACKENDS, reps=reps, witness=True, peak_backends=("c",))
    hands = {key: hand_row(name, sizes, key, **measure) for key, _, _ in HAND_POLICIES}
    base = hands["none"].peak
    ex = build(name, **sizes)
    plans, unreachable = [], {}
    for budget in BUDGETS:
        try:
            plans.append(plan_row(ex, budget, "knapsack", label=f"plan, budget {budget:.1f}",
                                  **measure))
        except Unreachable as e:
            unreachable[budget] = _smallest(e)
    layer = hands["layer"]
    try:
        at_layer = plan_row(ex, layer.peak, "knapsack", label="plan, per-layer's peak",
                            **measure)
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
    title = f"{name}: " + ", ".join(f"{k}={v}" for k, v in sizes.items())
    path.write_text(pareto_svg(title, hands, planned, base))
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
                smallest = str(e).split("reaches is ", 1)[1].split(" bytes")[0]
                cells.append(f"unreachable (smallest {smallest} B)")
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
          f"({'faster' if a < b else 'NOT faster'}); their peaks measured on \"c\": plan "
          f"{at_layer.other_peaks['c']:,} B, per-layer {layer.other_peaks['c']:,} B")


def _ticks(top, most=8) -> list:
    """Round tick values from 0 to ``top``: steps of 1, 2 or 5 times a power of ten."""
    step = 10 ** math.floor(math.log10(top / most))
    step *= next(m for m in (1, 2, 5, 10) if top / (step * m) <= most)
    return [round(k * step, 10) for k in range(int(top / step) + 1)]


def pareto_svg(title, hands, planned, base) -> str:
    """Measured peak (x) against backward time on "c" (y): the plans joined by a
    line, the hand policies as labelled squares; filled, the peak measured with the
    backward on "python" (what budgets refer to), hollow and dashed, on "c".
    A standalone SVG: no scripts, no fonts or styles from outside."""
    w, h, left, right, top, bottom = 680, 420, 60, 170, 40, 50
    rows = list(hands.values()) + planned
    x_max = max(max(r.peak, r.other_peaks["c"]) for r in rows) * 1.05
    y_max = max(r.times["c"] for r in rows) * 1.1

    def x(nbytes):
        return left + nbytes / x_max * (w - left - right)

    def y(seconds):
        return h - bottom - seconds / y_max * (h - top - bottom)

    def text(px, py, s, anchor="start", extra=""):
        s = s.replace("&", "&amp;").replace("<", "&lt;")
        return f'<text x="{px:.1f}" y="{py:.1f}" text-anchor="{anchor}"{extra}>{s}</text>'
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           text(left, 22, title, extra=' font-size="13"')]
    for mb in _ticks(x_max / 2**20):
        out.append(text(x(mb * 2**20), h - bottom + 16, f"{mb:g}", "middle"))
    for ms in _ticks(y_max * 1e3):
        out.append(text(left - 6, y(ms / 1e3) + 4, f"{ms:g}", "end"))
        out.append(f'<line x1="{left}" y1="{y(ms / 1e3):.1f}" x2="{w - right}" '
                   f'y2="{y(ms / 1e3):.1f}" stroke="#ddd"/>')
    out.append(f'<path d="M{left},{top} V{h - bottom} H{w - right}" fill="none" stroke="black"/>')
    out.append(text((left + w - right) / 2, h - 14, "peak of forward+backward, MB (no "
                    f"checkpointing, python: {base / 2**20:.2f} MB)", "middle"))
    mid = (top + h - bottom) / 2
    out.append(text(16, mid, 'backward on "c", ms (median)', "middle",
                    f' transform="rotate(-90 16 {mid:.1f})"'))
    blue, red = "#1f77b4", "#d62728"
    for backend, dash, fill in (("c", ' stroke-dasharray="5,4"', "white"),
                                ("python", "", blue)):
        line = sorted((r.peak if backend == "python" else r.other_peaks["c"], r.times["c"])
                      for r in planned)
        out.append(f'<polyline fill="none" stroke="{blue}" stroke-width="1.5"{dash} points="'
                   + " ".join(f"{x(p):.1f},{y(t):.1f}" for p, t in line) + '"/>')
        out += [f'<circle cx="{x(p):.1f}" cy="{y(t):.1f}" r="3.5" fill="{fill}" '
                f'stroke="{blue}"/>' for p, t in line]
    for r in hands.values():
        py = y(r.times["c"])
        out.append(f'<rect x="{x(r.other_peaks["c"]) - 4:.1f}" y="{py - 4:.1f}" width="8" '
                   f'height="8" fill="white" stroke="{red}"/>')
        out.append(f'<rect x="{x(r.peak) - 4:.1f}" y="{py - 4:.1f}" width="8" height="8" '
                   f'fill="{red}"/>')
        out.append(text(x(r.peak) + 7, py - 6, r.label))
    lx = w - right + 16
    for i, (shape, label) in enumerate((
            (f'<circle cx="{lx}" cy="{top + 6}" r="3.5" fill="{blue}"/>', "plan_checkpoints"),
            (f'<rect x="{lx - 4}" y="{top + 22}" width="8" height="8" fill="{red}"/>',
             "hand policy"),
            ("", "filled: peak measured"), ("", 'on "python"'),
            (f'<rect x="{lx - 4}" y="{top + 70}" width="8" height="8" fill="white" '
             f'stroke="{red}"/>', 'hollow, dashed: on "c"'))):
        out.append(shape + text(lx + 10, top + 10 + 16 * i, label))
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
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(f"machine: {_cpu()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"OPENBLAS_NUM_THREADS={threads}; load average {_load()}\n")
    for name, sizes in MODELS.items():
        run_model(name, sizes, args.reps, args.svg_dir)
    print(f"load average at the end {_load()}")


if __name__ == "__main__":
    main()
