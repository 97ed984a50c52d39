"""Reports of a memory profile: HTML (inline SVG), plain text, JSON, and a snapshot
for PyTorch's memory viewer.

    with ca.memory.profile() as prof:
        loss = model(x); loss.backward()
    from compiled_autograd.memory import report
    report.write_report(prof.timeline, "mem.html", title="my model",
                        peak_bytes=prof.peak_bytes, planned=g.memory_schedule(),
                        run="compiled, backend python, progressive unpacking")
    report.export_memory_viz(prof.timeline, "mem.pickle")   # pytorch.org/memory_viz

Events are ``compiled_autograd.runtime.memory.Event`` (or dicts with the same keys): ``alloc`` adds a
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
coordinates are computed in ``chart`` (numbers only) and the markup lives in
``templates/report.html.j2``, rendered by jinja2 with autoescaping on.
"""
from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path

from compiled_autograd.memory.align import Alignment, align, live_at, made_by, without_marks
# The chart's numbers (and the series helpers, re-exported here as they were).
from compiled_autograd.memory.chart import (COLORS, _activity_markers, _downsample,  # noqa: F401
                                            _get, _has, _own_maxima, _peak_index, chart,
                                            format_bytes, live_series)
from compiled_autograd.runtime.memory import CATEGORIES

__all__ = ["live_series", "render_html", "render_text", "render_json",
           "memory_viz_snapshot", "write_report", "export_memory_viz", "format_bytes"]

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


def _category_rows(series, peak_index):
    at_peak = series[peak_index]["by_category"] if series else {}
    own = _own_maxima(series)
    cats = list(CATEGORIES) + sorted(set(own) - set(CATEGORIES))
    return [{"category": c, "at_peak": at_peak.get(c, 0), "own_max": own.get(c, 0),
             "at_peak_h": format_bytes(at_peak.get(c, 0)), "own_max_h": format_bytes(own.get(c, 0))}
            for c in cats]


LARGEST_TITLE = "largest values live at the peak"


RECOMPUTED_TITLE = "recomputed by the memory plan"


def _prepare(events, planned, planned_start=0):
    """(events without marks, the plan's steps or None, their alignment or None).
    The plan is placed on the events from ``planned_start`` on (those before it,
    a forward, are not the plan's graph nodes)."""
    events = list(events)
    steps = None if planned is None else list(getattr(planned, "steps", planned))
    alignment = None
    if steps:
        start = max(0, min(int(planned_start), len(events)))
        alignment = align(steps, events[start:])
        if start:
            alignment = Alignment([x + start for x in alignment.x], alignment.matched,
                                  [None] * start + alignment.node_of_event, alignment.method)
    events, alignment = without_marks(events, alignment)
    return events, steps, alignment


def _recomputed_rows(recomputed, steps=None, alignment=None) -> list:
    """The values a memory plan recomputes (``plan.recomputed``: objects or dicts
    with node, index, prim, shape, bytes, flops), each with the event its graph
    node's allocation was placed at (None: not placed)."""
    placed = {}
    if steps and alignment is not None:
        placed = {s.node: int(x) for s, x, m in zip(steps, alignment.x, alignment.matched) if m}
    return [{"node": str(_get(r, "node")), "index": int(_get(r, "index")),
             "prim": str(_get(r, "prim")), "shape": [int(d) for d in _get(r, "shape")],
             "bytes": int(_get(r, "bytes")), "flops": int(_get(r, "flops")),
             "event": placed.get(str(_get(r, "node")))} for r in recomputed or ()]


def _made_by(row) -> str:
    """"graph node mul_3 (MulBackward)", or "MulBackward, op mul" without a graph."""
    if row["graph_node"]:
        return f"graph node {row['graph_node']}" + (f" ({row['autograd_node']})"
                                                    if row["autograd_node"] else "")
    return (f"{row['autograd_node']}, " if row["autograd_node"] else "") + f"op {row['op']}"


def largest_live(events, planned=None, k=10, planned_start=0) -> list:
    """The ``k`` largest storages live at the measured peak (``LARGEST_TITLE``), each
    ``{bytes, category, graph_node, autograd_node, op, made_by}``; with ``planned``
    (a ``MemorySchedule``, placed from event ``planned_start`` on) the graph node
    that made each one is known."""
    events, steps, alignment = _prepare(events, planned, planned_start)
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
                run=None, notes=(), recomputed=None, planned_start=0, budget=None) -> str:
    """A self-contained HTML page: which run (``run``), summary table, stacked SVG
    chart of live bytes by category over the events (peak, recompute/reload
    markers, the plan ``planned`` -- a ``MemorySchedule`` -- placed on the same
    events from event ``planned_start`` on, a tooltip per event), what the words
    mean, bytes by category and the largest values live at the peak. ``notes``:
    lines shown under the summary. ``recomputed``: the values a memory plan
    recomputes (``plan.recomputed``), listed under ``RECOMPUTED_TITLE``; ``budget``
    its budget in bytes, drawn on the chart."""
    events, steps, alignment = _prepare(events, planned, planned_start)
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
        title=str(title), summary=rows, chart=chart(events, series, steps, alignment, budget),
        peak_calls=series[pi]["step"] if series else 0,
        categories=_category_rows(series, pi), largest=largest, largest_title=LARGEST_TITLE,
        colors=COLORS, notes=[str(n) for n in notes], planned=bool(steps),
        recompute=any(s.event == "recompute" for s in steps or ()),
        planned_start=int(planned_start) if steps else 0,
        recomputed=_recomputed_rows(recomputed, steps, alignment) if recomputed else None,
        recomputed_title=RECOMPUTED_TITLE)


# ---------------------------------------------------------------- text, JSON

def render_text(events, *, title, peak_bytes=None, planned=None, run=None, notes=(),
                recomputed=None, planned_start=0) -> str:
    """Plain text: title, the run, peak, bytes by category (at the peak and own
    maximum), the largest values live at the peak and what a memory plan
    recomputes (as the HTML page)."""
    events, steps, alignment = _prepare(events, planned, planned_start)
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
    if recomputed:
        lines += ["", f"{RECOMPUTED_TITLE} ({len(recomputed)} values, each by a prim node of "
                      "the backward graph; event: where its allocation is)",
                  f"{'graph node':<22} {'forward prim':<20} {'shape':<18} {'bytes':>12} "
                  f"{'FLOPs':>14}  event"]
        for r in _recomputed_rows(recomputed, steps, alignment):
            lines.append(f"{r['node'][:22]:<22} {'#%d %s' % (r['index'], r['prim']):<20} "
                         f"{str(r['shape']):<18} {r['bytes']:>12,} {r['flops']:>14,}  "
                         f"{'-' if r['event'] is None else r['event']}")
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
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:        # (named by the user's path, not the temporary one's)
        raise type(e)(e.errno, e.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.filename == tmp:
            raise type(e)(e.errno, e.strerror, str(path)) from None
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
        kw.pop("budget", None)          # (in the text, a row of the summary)
        text = render_text(events, **kw)
    elif suffix == ".json":
        kw.pop("planned", None)         # the plan is not part of the events
        kw.pop("planned_start", None)
        if kw.get("recomputed") is not None:
            kw["recomputed"] = [{k: v for k, v in r.items() if k != "event"}
                                for r in _recomputed_rows(kw["recomputed"])]
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
