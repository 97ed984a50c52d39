"""The chart of a memory report: live bytes after every event, stacked by category,
as numbers for the SVG of ``templates/report.html.j2`` (``render_html`` in
``compiled_autograd.memory.report`` renders it).

``live_series`` replays the events (``alloc``, ``free``, ``retag``; a ``mark``
changes nothing); ``chart`` computes every coordinate: the stacked areas, the peak,
the recompute and reload markers, the planned line (a ``MemorySchedule`` placed on
the events by ``align``), one hover column per drawn event, the axes and the legend.
"""
from __future__ import annotations

import math

from compiled_autograd.memory.align import made_by
from compiled_autograd.runtime.memory import CATEGORIES

# One colour per category (Tableau 10), and for the markers.
COLORS = {
    "parameter": "#4e79a7",
    "activation": "#f28e2c",
    "saved": "#e15759",
    "recomputed": "#76b7b2",
    "reloaded": "#59a14f",
    "gradient": "#edc949",
    "temporary": "#bab0ab",
}
_OTHER_COLOR = "#9c755f"
RECOMPUTE_COLOR = "#17706a"
RELOAD_COLOR = "#2d6a24"
PEAK_COLOR = "#b2182b"
PLANNED_COLOR = "#222222"
BUDGET_COLOR = "#1a9850"

MAX_POINTS = 2000


def _get(e, key):
    return e[key] if isinstance(e, dict) else getattr(e, key)


def _has(e, key):
    return key in e if isinstance(e, dict) else hasattr(e, key)


def format_bytes(n) -> str:
    """``1536`` -> ``"1.50 KiB"`` (B, KiB, MiB, GiB, TiB; two decimals, as the
    command line's tables)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


# ---------------------------------------------------------------- the series

def live_series(events) -> list:
    """Live bytes after every event: ``[{step, total, by_category}]``, one entry per
    event (a mark repeats the previous totals)."""
    by_cat = dict.fromkeys(CATEGORIES, 0)
    live: dict = {}            # storage -> (bytes, category)
    total = 0
    out = []
    for e in events:
        action, nbytes, cat = _get(e, "action"), int(_get(e, "bytes")), _get(e, "category")
        storage = _get(e, "storage") if _has(e, "storage") else None
        if action == "alloc":
            live[storage] = (nbytes, cat)
            by_cat[cat] = by_cat.get(cat, 0) + nbytes
            total += nbytes
        elif action == "free":
            entry = live.pop(storage, None)
            fcat = entry[1] if entry is not None else cat
            by_cat[fcat] = by_cat.get(fcat, 0) - nbytes
            total -= nbytes
        elif action == "retag":
            old = _get(e, "name")
            entry = live.get(storage)
            if entry is not None:
                old = entry[1]
                live[storage] = (entry[0], cat)
            by_cat[old] = by_cat.get(old, 0) - nbytes
            by_cat[cat] = by_cat.get(cat, 0) + nbytes
        # "mark" (and anything unknown): totals unchanged
        out.append({"step": int(_get(e, "step")), "total": total, "by_category": dict(by_cat)})
    return out


def _peak_index(series) -> int:
    """Index of the first entry with the largest total (0 when empty)."""
    best, idx = None, 0
    for i, s in enumerate(series):
        if best is None or s["total"] > best:
            best, idx = s["total"], i
    return idx


def _own_maxima(series) -> dict:
    out = dict.fromkeys(CATEGORIES, 0)
    for s in series:
        for cat, b in s["by_category"].items():
            if b > out.get(cat, 0):
                out[cat] = b
    return out


def _downsample(series, max_points=MAX_POINTS) -> list:
    """Indices to plot: all of them when few, else the min and max of each bucket,
    the first, the last and the peak."""
    n = len(series)
    if n <= max_points:
        return list(range(n))
    buckets = max(1, (max_points - 3) // 2)
    keep = {0, n - 1, _peak_index(series)}
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if hi <= lo:
            continue
        idx = range(lo, hi)
        keep.add(max(idx, key=lambda i: series[i]["total"]))
        keep.add(min(idx, key=lambda i: series[i]["total"]))
    return sorted(keep)


def _categories_present(events) -> list:
    seen = {_get(e, "category") for e in events if _get(e, "action") in ("alloc", "retag")}
    ordered = [c for c in CATEGORIES if c in seen]
    return ordered + sorted(seen - set(ordered))


def _activity_markers(events):
    """Event indices of the first alloc of each run of consecutive "recomputed"
    allocs, and of every "reloaded" alloc."""
    recompute, reload = [], []
    prev_recomputed = False
    for i, e in enumerate(events):
        if _get(e, "action") != "alloc":
            continue
        cat = _get(e, "category")
        if cat == "recomputed" and not prev_recomputed:
            recompute.append(i)
        if cat == "reloaded":
            reload.append(i)
        prev_recomputed = cat == "recomputed"
    return recompute, reload


# ---------------------------------------------------------------- axes

def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _byte_ticks(ymax: float, count: int = 6):
    """Ticks at round numbers of the binary unit that fits ``ymax``."""
    unit = 1
    while ymax / unit >= 1024 and unit < 1024 ** 4:
        unit *= 1024
    step = _nice_step(ymax / unit / count) * unit
    if unit == 1:
        step = max(1.0, math.ceil(step))
    top = math.ceil(ymax / step) * step if ymax > 0 else step
    ticks = [i * step for i in range(int(round(top / step)) + 1)]
    return ticks, top


def _index_ticks(n: int, count: int = 10):
    if n <= 1:
        return [0]
    step = max(1, int(_nice_step((n - 1) / count)))
    return list(range(0, n, step))



def _r(v: float) -> float:
    return round(float(v), 1)


def _legend_rows(items, x0: float, width: float, row_h: float):
    """Lay legend items (dicts with a ``label``) out in rows: sets ``x`` and ``y``."""
    x, y = x0, 0.0
    for it in items:
        w = 26 + 7.2 * len(it["label"]) + 22
        if x > x0 and x + w > x0 + width:
            x, y = x0, y + row_h
        it["x"], it["y"] = _r(x), _r(y)
        x += w
    return (y + row_h) if items else 0.0


def _planned_points(steps, alignment, X, Y):
    """The plan as steps on the event axis: at its first event a node holds its
    inputs and output together (``peak_bytes``), one event later what stays
    (``live_bytes``), until the next node."""
    pts = []
    xs = alignment.x
    for k, s in enumerate(steps):
        x = xs[k]
        nxt = xs[k + 1] if k + 1 < len(steps) else x + 1
        tip = f"planned, graph node {s.node} ({s.source or s.target}): " \
              f"{format_bytes(s.peak_bytes)} while it runs, {format_bytes(s.live_bytes)} after"
        pts.append({"x": _r(X(x)), "y": _r(Y(s.peak_bytes)), "label": tip})
        pts.append({"x": _r(X(min(x + 1, max(nxt, x)))), "y": _r(Y(s.live_bytes)), "label": tip})
    return pts


def _hover(events, series, keep, X, top, plot_h, steps, alignment):
    """One transparent column per drawn event, titled with what the event was."""
    cols = []
    for j, i in enumerate(keep):
        e = events[i]
        owner = alignment.node_of_event[i] if alignment is not None else None
        node, autograd_node, op = made_by(e, steps, owner)
        x0 = (X(keep[j - 1]) + X(i)) / 2 if j else X(i) - 2
        x1 = (X(i) + X(keep[j + 1])) / 2 if j + 1 < len(keep) else X(i) + 2
        action = _get(e, "action")
        what = {"alloc": "allocated", "free": "freed", "retag": "re-tagged"}.get(action, action)
        recipe = getattr(steps[owner], "recipe", None) if owner is not None else None
        if recipe is not None:   # a memory plan's recomputation
            node = f"{node} (recomputes forward prim #{recipe}: memory plan)"
        lines = [f"event {i} (kernel call {_get(e, 'step')}): {what} "
                 f"{format_bytes(_get(e, 'bytes'))} ({int(_get(e, 'bytes')):,} bytes), "
                 f"category {_get(e, 'category')}",
                 f"graph node: {node or '-'}", f"autograd node: {autograd_node or '-'}",
                 f"op: {op}", f"live after it: {format_bytes(series[i]['total'])}"]
        cols.append({"x": _r(x0), "w": _r(max(x1 - x0, 0.5)), "title": "\n".join(lines)})
    return cols


def chart(events, series, steps, alignment, budget=None):
    """Every number the template's SVG needs (see the module doc); ``budget``: a
    memory plan's budget in bytes, drawn as a horizontal line."""
    W = 1100
    left, right, top = 84, 24, 46
    plot_w = W - left - right
    plot_h = 400
    bottom = top + plot_h
    n = len(series)

    cats = _categories_present(events)
    planned = steps or []
    ymax = max([s["total"] for s in series] + [s.peak_bytes for s in planned] + [0]
               + ([budget] if budget else []))
    yticks, ytop = _byte_ticks(ymax if ymax > 0 else 1024)

    def X(i):
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def Y(b):
        return bottom - plot_h * b / ytop

    # stacked areas: category k spans [cum_{k-1}, cum_k] at every kept index
    keep = _downsample(series)
    layers = []
    base = [0] * len(keep)
    for cat in cats:
        vals = [max(0, series[i]["by_category"].get(cat, 0)) for i in keep]
        upper = [b + v for b, v in zip(base, vals)]
        if any(vals):
            pts = [(_r(X(i)), _r(Y(u))) for i, u in zip(keep, upper)]
            pts += [(_r(X(i)), _r(Y(b))) for i, b in zip(reversed(keep), reversed(base))]
            layers.append({"category": cat, "color": COLORS.get(cat, _OTHER_COLOR),
                           "points": pts})
        base = upper
    total_line = [(_r(X(i)), _r(Y(series[i]["total"]))) for i in keep]

    peak = None
    if n:
        pi = _peak_index(series)
        px = X(pi)
        anchor = "end" if px > left + plot_w * 0.7 else ("start" if px < left + plot_w * 0.3
                                                          else "middle")
        peak = {"x": _r(px), "y": _r(Y(series[pi]["total"])), "index": pi,
                "bytes": series[pi]["total"], "label": format_bytes(series[pi]["total"]),
                "anchor": anchor}

    recompute, reload = _activity_markers(events)
    marker_y = bottom + 3            # recompute ticks; reload triangles one row lower
    recompute_x = [_r(X(i)) for i in recompute]
    reload_x = [_r(X(i)) for i in reload]

    planned_pts = _planned_points(planned, alignment, X, Y) if planned and n else []
    hover = _hover(events, series, keep, X, top, plot_h, steps, alignment)

    y_ticks = [{"y": _r(Y(t)), "label": format_bytes(t)} for t in yticks]
    x_ticks = [{"x": _r(X(i)), "label": str(i)} for i in _index_ticks(n)]

    legend = [{"label": c, "kind": "swatch", "color": COLORS.get(c, _OTHER_COLOR)} for c in cats]
    legend.append({"label": "peak", "kind": "vline", "color": PEAK_COLOR})
    if recompute:
        legend.append({"label": "recompute starts", "kind": "tick", "color": RECOMPUTE_COLOR})
    if reload:
        legend.append({"label": "reload", "kind": "triangle", "color": RELOAD_COLOR})
    if planned:
        legend.append({"label": "planned", "kind": "dashed", "color": PLANNED_COLOR})
    budget_line = None
    if budget:
        budget_line = {"y": _r(Y(budget)), "label": f"budget {format_bytes(budget)}"}
        legend.append({"label": "budget", "kind": "dashed", "color": BUDGET_COLOR})
    legend_top = bottom + 76
    legend_h = _legend_rows(legend, left, plot_w, 22)

    return {
        "width": W, "height": int(legend_top + legend_h + 10),
        "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h, "bottom": bottom,
        "right_x": left + plot_w, "layers": layers, "total_line": total_line,
        "peak": peak, "recompute_x": recompute_x, "reload_x": reload_x,
        "marker_y": marker_y, "marker_len": 10, "reload_y": marker_y + 12,
        "planned": planned_pts, "planned_dots": 0 < len(planned_pts) <= 120, "hover": hover,
        "budget": budget_line,
        "y_ticks": y_ticks, "x_ticks": x_ticks,
        "legend": legend, "legend_top": legend_top, "empty": n == 0,
        "x_label_y": bottom + 60, "x_tick_label_y": bottom + 40, "y_label_x": 18, "y_label_y": _r(top + plot_h / 2),
        "colors": {"peak": PEAK_COLOR, "recompute": RECOMPUTE_COLOR, "reload": RELOAD_COLOR,
                   "planned": PLANNED_COLOR, "budget": BUDGET_COLOR},
        "downsampled": len(keep) < n, "points": len(keep), "events": n,
    }
