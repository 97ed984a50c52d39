"""Reports of a memory profile: HTML (inline SVG), plain text, JSON, and a snapshot
for PyTorch's memory viewer.

    with ca.memory.profile() as prof:
        loss = model(x); loss.backward()
    from compiled_autograd.memory import report
    report.write_report(prof.timeline, "mem.html", title="my model",
                        peak_bytes=prof.peak_bytes, planned=g.memory_schedule(),
                        run="compiled, backend python, progressive unpacking")
    report.export_memory_viz(prof.timeline, "mem.pickle")   # pytorch.org/memory_viz

Events are ``runtime.memory.Event`` (or dicts with the same keys): ``alloc`` adds a
storage's bytes to its category, ``free`` removes them, ``retag`` moves them from
the old category (``name``) to the new one (``category``), ``mark`` only labels a
point in time (a graph node's end, with the "eager" graph backend; marks are not
drawn).

The words, as the page explains them: an **event** is one allocation, free or
re-tag of a storage, in order (the x axis); a **kernel call** is ``Event.step``, the
number of kernels run so far; a **graph node** is a node of the traced backward
graph (``MemorySchedule.steps``), an **autograd node** the node of the autograd
graph it comes from (``MulBackward``).

The HTML page is self-contained: no script, no external URL; the chart's
coordinates are computed here (numbers only) and the markup lives in
``templates/report.html.j2``, rendered by jinja2 with autoescaping on.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import tempfile
from pathlib import Path

from compiled_autograd.memory.align import align, live_at, made_by, without_marks
from runtime.memory import CATEGORIES

__all__ = ["live_series", "render_html", "render_text", "render_json",
           "memory_viz_snapshot", "write_report", "export_memory_viz", "format_bytes"]

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

MAX_POINTS = 2000

def _get(e, key):
    return e[key] if isinstance(e, dict) else getattr(e, key)


def _has(e, key):
    return key in e if isinstance(e, dict) else hasattr(e, key)


def format_bytes(n) -> str:
    """``1536`` -> ``"1.5 KiB"`` (B, KiB, MiB, GiB, TiB)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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


# ---------------------------------------------------------------- HTML

_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        import jinja2
        loader = jinja2.PackageLoader("compiled_autograd.memory", "templates")
        _ENV = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined,
                                  trim_blocks=True, lstrip_blocks=True)
    return _ENV


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
        lines = [f"event {i} (kernel call {_get(e, 'step')}): {what} "
                 f"{format_bytes(_get(e, 'bytes'))} ({int(_get(e, 'bytes')):,} bytes), "
                 f"category {_get(e, 'category')}",
                 f"graph node: {node or '-'}", f"autograd node: {autograd_node or '-'}",
                 f"op: {op}", f"live after it: {format_bytes(series[i]['total'])}"]
        cols.append({"x": _r(x0), "w": _r(max(x1 - x0, 0.5)), "title": "\n".join(lines)})
    return cols


def _chart(events, series, steps, alignment):
    W = 1100
    left, right, top = 84, 24, 46
    plot_w = W - left - right
    plot_h = 400
    bottom = top + plot_h
    n = len(series)

    cats = _categories_present(events)
    planned = steps or []
    ymax = max([s["total"] for s in series] + [s.peak_bytes for s in planned] + [0])
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
    legend_top = bottom + 76
    legend_h = _legend_rows(legend, left, plot_w, 22)

    return {
        "width": W, "height": int(legend_top + legend_h + 10),
        "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h, "bottom": bottom,
        "right_x": left + plot_w, "layers": layers, "total_line": total_line,
        "peak": peak, "recompute_x": recompute_x, "reload_x": reload_x,
        "marker_y": marker_y, "marker_len": 10, "reload_y": marker_y + 12,
        "planned": planned_pts, "planned_dots": 0 < len(planned_pts) <= 120, "hover": hover,
        "y_ticks": y_ticks, "x_ticks": x_ticks,
        "legend": legend, "legend_top": legend_top, "empty": n == 0,
        "x_label_y": bottom + 60, "x_tick_label_y": bottom + 40, "y_label_x": 18, "y_label_y": _r(top + plot_h / 2),
        "colors": {"peak": PEAK_COLOR, "recompute": RECOMPUTE_COLOR, "reload": RELOAD_COLOR,
                   "planned": PLANNED_COLOR},
        "downsampled": len(keep) < n, "points": len(keep), "events": n,
    }


def _category_rows(series, peak_index):
    at_peak = series[peak_index]["by_category"] if series else {}
    own = _own_maxima(series)
    cats = list(CATEGORIES) + sorted(set(own) - set(CATEGORIES))
    return [{"category": c, "at_peak": at_peak.get(c, 0), "own_max": own.get(c, 0),
             "at_peak_h": format_bytes(at_peak.get(c, 0)), "own_max_h": format_bytes(own.get(c, 0))}
            for c in cats]


LARGEST_TITLE = "largest values live at the peak"


def _prepare(events, planned):
    """(events without marks, the plan's steps or None, their alignment or None)."""
    events = list(events)
    steps = None if planned is None else list(getattr(planned, "steps", planned))
    alignment = align(steps, events) if steps else None
    events, alignment = without_marks(events, alignment)
    return events, steps, alignment


def _made_by(row) -> str:
    """"graph node mul_3 (MulBackward)", or "MulBackward, op mul" without a graph."""
    if row["graph_node"]:
        return f"graph node {row['graph_node']}" + (f" ({row['autograd_node']})"
                                                    if row["autograd_node"] else "")
    return (f"{row['autograd_node']}, " if row["autograd_node"] else "") + f"op {row['op']}"


def largest_live(events, planned=None, k=10) -> list:
    """The ``k`` largest storages live at the measured peak (``LARGEST_TITLE``), each
    ``{bytes, category, graph_node, autograd_node, op, made_by}``; with ``planned``
    (a ``MemorySchedule``) the graph node that made each one is known."""
    events, steps, alignment = _prepare(events, planned)
    series = live_series(events)
    if not series:
        return []
    rows = live_at(events, _peak_index(series), steps, alignment, k)
    for r in rows:
        r["made_by"] = _made_by(r)
        r["bytes_h"] = format_bytes(r["bytes"])
    return rows


def _peak_row(events, series, pi, steps, alignment):
    node, autograd_node, _ = made_by(events[pi], steps,
                                     alignment.node_of_event[pi] if alignment else None)
    where = f"event {pi}, after {series[pi]['step']:,} kernel calls"
    if node:
        where += f", in graph node {node}" + (f" ({autograd_node})" if autograd_node else "")
    elif autograd_node:
        where += f", in {autograd_node}"
    return where


def render_html(events, *, title, peak_bytes=None, planned=None, summary_rows=None,
                run=None, notes=()) -> str:
    """A self-contained HTML page: which run (``run``), summary table, stacked SVG
    chart of live bytes by category over the events (peak, recompute/reload
    markers, the plan ``planned`` -- a ``MemorySchedule`` -- placed on the same
    events, a tooltip per event), what the words mean, bytes by category and the
    largest values live at the peak. ``notes``: lines shown under the summary."""
    events, steps, alignment = _prepare(events, planned)
    series = live_series(events)
    pi = _peak_index(series)
    peak_series = series[pi]["total"] if series else 0
    peak = peak_bytes if peak_bytes is not None else peak_series
    rows = [("run", str(run) if run else "not given")]
    rows += [("events", f"{len(events):,} (allocations, frees and re-tags of storages)"),
             ("peak live bytes", f"{format_bytes(peak)} ({int(peak):,} bytes)")]
    if series:
        rows.append(("peak at", _peak_row(events, series, pi, steps, alignment)))
        rows.append(("live at end", f"{format_bytes(series[-1]['total'])} "
                                    f"({series[-1]['total']:,} bytes)"))
    if alignment is not None:
        how = {"marks": "exactly, by the graph nodes' marks (backend eager)",
               "allocations": "by matching each graph node's allocation (prim, bytes, kernel "
                              "call)",
               "none": "not at all: no graph node's allocation was seen (spread evenly)"}
        rows.append(("plan placed on the events",
                     f"{how[alignment.method]}; {alignment.n_matched} of {len(steps)} graph "
                     f"nodes placed"))
    rows += [(str(a), str(b)) for a, b in (summary_rows or [])]
    largest = live_at(events, pi, steps, alignment) if series else []
    for r in largest:
        r["made_by"] = _made_by(r)
    return _env().get_template("report.html.j2").render(
        title=str(title), summary=rows, chart=_chart(events, series, steps, alignment),
        categories=_category_rows(series, pi), largest=largest, largest_title=LARGEST_TITLE,
        colors=COLORS, notes=[str(n) for n in notes], planned=bool(steps),
        recompute=any(s.event == "recompute" for s in steps or ()))


# ---------------------------------------------------------------- text, JSON

def render_text(events, *, title, peak_bytes=None, planned=None, run=None, notes=()) -> str:
    """Plain text: title, the run, peak, bytes by category (at the peak and own
    maximum) and the largest values live at the peak (as the HTML page)."""
    events, steps, alignment = _prepare(events, planned)
    series = live_series(events)
    pi = _peak_index(series)
    peak = peak_bytes if peak_bytes is not None else (series[pi]["total"] if series else 0)
    lines = [str(title), "=" * max(3, len(str(title)))]
    if run:
        lines.append(f"run: {run}")
    lines += [str(n) for n in notes]
    lines += [f"peak {int(peak):,} bytes ({format_bytes(peak)})"
              + (f" at {_peak_row(events, series, pi, steps, alignment)} of {len(events)} "
                 f"events" if series else ""),
              "(an event is one allocation, free or re-tag of a storage; a kernel call is "
              "one op run)",
              "",
             f"{'category':<12} {'at the peak':>14} {'own maximum':>14}"]
    for row in _category_rows(series, pi):
        lines.append(f"{row['category']:<12} {row['at_peak']:>14,} {row['own_max']:>14,}")
    lines += ["", LARGEST_TITLE, f"{'bytes':>14}  {'category':<12} made by"]
    for a in (live_at(events, pi, steps, alignment) if series else []):
        lines.append(f"{a['bytes']:>14,}  {a['category']:<12} {_made_by(a)}")
    return "\n".join(lines) + "\n"


def render_json(events, **meta) -> str:
    """``{"meta": meta, "events": [{step, action, bytes, category, name}]}``."""
    out = {"meta": meta,
           "events": [{"step": int(_get(e, "step")), "action": str(_get(e, "action")),
                       "bytes": int(_get(e, "bytes")), "category": str(_get(e, "category")),
                       "name": str(_get(e, "name"))} for e in events]}
    return json.dumps(out, indent=1, default=str)


# ---------------------------------------------------------------- PyTorch memory viewer

def memory_viz_snapshot(events) -> dict:
    """A snapshot in the format of ``torch.cuda.memory._snapshot()`` (what
    pytorch.org/memory_viz and ``torch.cuda._memory_viz`` read).

    Every storage gets a fake address (cumulative offsets, never reused); device 0
    gets an ``alloc`` trace entry per allocation and ``free_requested`` +
    ``free_completed`` per free. A frame names the category (as the file name) and
    the allocating op. ``segments`` has one segment per storage still live at the
    end, holding one ``active_allocated`` block.
    """
    trace = []
    live: dict = {}          # storage -> (addr, size, frames)
    next_addr = 0
    for e in events:
        action = _get(e, "action")
        if action not in ("alloc", "free"):
            continue
        size = int(_get(e, "bytes"))
        storage = _get(e, "storage") if _has(e, "storage") else None
        frames = [{"filename": str(_get(e, "category")), "line": 0, "name": str(_get(e, "name"))}]
        if action == "alloc":
            if storage is None or size <= 0:
                continue
            addr = next_addr
            next_addr += size
            live[storage] = (addr, size, frames)
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                          "frames": frames})
        else:
            entry = live.pop(storage, None)
            if entry is None:        # allocated before the profile: nothing to pair
                continue
            addr, size, _ = entry
            for act in ("free_requested", "free_completed"):
                trace.append({"action": act, "addr": addr, "size": size, "stream": 0,
                              "frames": frames})
    segments = []
    for addr, size, frames in sorted(live.values(), key=lambda t: t[0]):
        segments.append({
            "device": 0, "address": addr, "total_size": size, "stream": 0,
            "segment_type": "large" if size > 1024 * 1024 else "small",
            "segment_pool_id": (0, 0), "allocated_size": size, "active_size": size,
            "requested_size": size, "is_expandable": False, "frames": frames,
            "blocks": [{"address": addr, "size": size, "requested_size": size,
                        "state": "active_allocated", "frames": frames}],
        })
    return {"segments": segments, "device_traces": [trace]}


# ---------------------------------------------------------------- files

def _atomic_write(path, data) -> None:
    """Write ``data`` (str or bytes) to ``path`` through a temporary file in the same
    directory and ``os.replace``: a failure leaves no partial file."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_report(events, path, **kw) -> None:
    """Write a report chosen by the suffix of ``path``: ``.html`` (``render_html``),
    ``.txt`` (``render_text``) or ``.json`` (``render_json``, ``kw`` as meta)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".html":
        kw.setdefault("title", "memory report")
        text = render_html(events, **kw)
    elif suffix == ".txt":
        kw.setdefault("title", "memory report")
        kw.pop("summary_rows", None)    # the page's extra rows: not in text
        text = render_text(events, **kw)
    elif suffix == ".json":
        kw.pop("planned", None)         # the plan is not part of the events
        if "notes" in kw:
            kw["notes"] = [str(n) for n in kw["notes"]]
        text = render_json(events, **kw)
    else:
        raise ValueError("report path must end in .html, .txt or .json")
    _atomic_write(path, text)


def export_memory_viz(events, path) -> None:
    """Pickle ``memory_viz_snapshot(events)`` (protocol 4) to ``path``: drop it on
    pytorch.org/memory_viz or read it with ``python -m torch.cuda._memory_viz``."""
    _atomic_write(path, pickle.dumps(memory_viz_snapshot(events), protocol=4))
