"""compiled_autograd.memory.report: live series, HTML/text/JSON reports, atomic writes and
the PyTorch memory-viewer snapshot, on a real profile of a checkpointed MLP."""
import copy
import json
import os
import pickle
import re

import pytest

import compiled_autograd as ca
from compiled_autograd.memory import report
from compiled_autograd.examples import build
from compiled_autograd.memory.schedule import Step
from compiled_autograd.runtime.memory import CATEGORIES, Event


@pytest.fixture(scope="module")
def prof():
    ex = build("mlp", layers=3, width=32, batch=16, checkpoint="layer")
    with ca.memory.profile() as p:
        ex.loss().backward()
    return p


@pytest.fixture(scope="module")
def events(prof):
    return prof.timeline


def test_live_series_matches_the_profile(prof, events):
    series = report.live_series(events)
    assert len(series) == len(events)
    assert max(s["total"] for s in series) == prof.peak_bytes
    assert series[-1]["total"] == prof.live_bytes
    for s, e in zip(series, events):
        assert s["step"] == e.step
        assert s["total"] == sum(s["by_category"].values())
    own = {c: max(s["by_category"][c] for s in series) for c in CATEGORIES}
    assert own == prof.max_by_category
    peak_entry = next(s for s in series if s["total"] == prof.peak_bytes)
    assert peak_entry["by_category"] == prof.peak_by_category
    assert any(e.category == "recomputed" for e in events)   # checkpointing recomputed


def test_live_series_retag_and_mark():
    ev = [Event(1, "alloc", 100, "activation", "a", 1),
          Event(1, "alloc", 50, "activation", "b", 2),
          Event(2, "retag", 100, "saved", "activation", 1),
          Event(3, "mark", 0, "activation", "node3", 0),
          Event(4, "free", 100, "saved", "a", 1)]
    s = report.live_series(ev)
    assert [x["total"] for x in s] == [100, 150, 150, 150, 50]
    assert s[2]["by_category"]["saved"] == 100 and s[2]["by_category"]["activation"] == 50
    assert s[3] == {**s[2], "step": 3}
    assert s[4]["by_category"]["saved"] == 0 and s[4]["by_category"]["activation"] == 50


def test_html_is_self_contained_and_escaped(prof, events):
    planned = [Step(0, "node<1>", "call_function", "linear", None, 100, 100, 100),
               Step(1, "n2", "call_function", "tanh", None, 10, 10, prof.peak_bytes),
               Step(2, "n3", "call_function", "mul", None, 10, 10, 10)]
    html = report.render_html(events, title="<b>x</b>", peak_bytes=prof.peak_bytes,
                              planned=planned, summary_rows=[("rows & <cols>", "1")])
    assert "<svg" in html and "</svg>" in html
    for bad in ("http://", "https://", "<script", "//cdn"):
        assert bad not in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "node&lt;1&gt;" in html and "rows &amp; &lt;cols&gt;" in html
    assert "planned" in html and "stroke-dasharray" in html
    assert f"{prof.peak_bytes:,} bytes" in html
    assert "recompute starts" in html
    for cat in {e.category for e in events if e.action == "alloc"}:
        assert cat in html
    assert "KiB" in html and ">event (" in html and ">bytes<" in html


def test_html_markers_and_downsampling():
    ev, sid = [], 0
    for i in range(3000):                       # many events: downsampled
        sid += 1
        cat = "recomputed" if 1000 <= i < 1010 else ("reloaded" if i in (2000, 2001) else "gradient")
        ev.append(Event(i, "alloc", 8 + (i == 1500) * 10_000, cat, f"op{i}", sid))
        if i % 2:
            ev.append(Event(i, "free", ev[-2].bytes, ev[-2].category, "x", sid - 1))
    html = report.render_html(ev, title="big")
    polygons = re.findall(r'<polygon[^>]*points="([^"]*)"', html)
    assert polygons and all(len(p.split()) <= 2 * 2000 + 10 for p in polygons)
    series = report.live_series(ev)
    peak = max(s["total"] for s in series)
    keep = report._downsample(series)
    assert len(keep) <= 2000 and report._peak_index(series) in keep
    assert f"{peak:,} bytes" in html and "drawn with" in html
    assert report._activity_markers(ev) == ([next(i for i, e in enumerate(ev)
                                                  if e.category == "recomputed")],
                                            [i for i, e in enumerate(ev)
                                             if e.category == "reloaded" and e.action == "alloc"])
    assert "reload" in html
    assert "no events" in report.render_html([], title="empty")


def test_text_report(prof, events):
    text = report.render_text(events, title="mlp <ckpt>", peak_bytes=prof.peak_bytes)
    assert text.startswith("mlp <ckpt>\n")
    assert f"peak {prof.peak_bytes:,} bytes" in text
    for cat in CATEGORIES:
        assert re.search(rf"^{cat}\s+{prof.peak_by_category[cat]:,}\s+{prof.max_by_category[cat]:,}$",
                         text, re.M), cat
    section = text.split("largest values live at the peak", 1)[1].strip().splitlines()
    assert 1 < len(section) <= 11
    assert f"{max(r['bytes'] for r in report.largest_live(events)):,}" in section[1]


def test_json_report(events):
    data = json.loads(report.render_json(events, model="mlp", peak=123))
    assert data["meta"] == {"model": "mlp", "peak": 123}
    assert len(data["events"]) == len(events)
    first = events[0]
    assert data["events"][0] == {"step": first.step, "action": first.action, "bytes": first.bytes,
                                 "category": first.category, "name": first.name}


def test_write_report_dispatch(tmp_path, prof, events):
    report.write_report(events, tmp_path / "r.html", title="t", peak_bytes=prof.peak_bytes)
    report.write_report(events, str(tmp_path / "r.txt"), title="t")
    report.write_report(events, tmp_path / "r.json", model="mlp")
    assert "<svg" in (tmp_path / "r.html").read_text()
    assert (tmp_path / "r.txt").read_text().startswith("t\n")
    assert json.loads((tmp_path / "r.json").read_text())["meta"] == {"model": "mlp"}
    with pytest.raises(ValueError, match=r"report path must end in \.html, \.txt or \.json"):
        report.write_report(events, tmp_path / "r.csv")
    assert sorted(os.listdir(tmp_path)) == ["r.html", "r.json", "r.txt"]   # no temp files


def test_write_report_is_atomic(tmp_path, events, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("old")
    loop = {}
    loop["self"] = loop
    with pytest.raises(ValueError):
        report.write_report(events, path, bad=loop)          # fails while rendering
    with pytest.raises(TypeError):
        report.write_report(events, tmp_path / "r.html", title="t", no_such_arg=1)

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(report.os, "fsync", broken_fsync)    # fails half-way through writing
    with pytest.raises(OSError, match="disk full"):
        report.write_report(events, path, model="mlp")
    with pytest.raises(OSError, match="disk full"):
        report.export_memory_viz(events, tmp_path / "s.pickle")
    assert path.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def _check_snapshot(snap, events):
    assert set(snap) == {"segments", "device_traces"}
    trace = snap["device_traces"][0]
    allocs = [t for t in trace if t["action"] == "alloc"]
    assert len(allocs) == sum(e.action == "alloc" for e in events)
    assert len({t["addr"] for t in allocs}) == len(allocs)          # unique addresses
    for t in trace:
        assert set(t) == {"action", "addr", "size", "stream", "frames"}
        assert t["stream"] == 0 and t["frames"][0]["filename"] in CATEGORIES
    freed = [t for t in trace if t["action"] != "alloc"]
    assert [t["action"] for t in freed[::2]] == ["free_requested"] * (len(freed) // 2)
    assert [t["action"] for t in freed[1::2]] == ["free_completed"] * (len(freed) // 2)
    live_addrs = {t["addr"] for t in allocs} - {t["addr"] for t in freed}
    assert {s["address"] for s in snap["segments"]} == live_addrs
    for s in snap["segments"]:
        (b,) = s["blocks"]
        assert b["state"] == "active_allocated" and b["size"] == s["total_size"]


def test_memory_viz_snapshot_round_trip(tmp_path, prof, events):
    snap = report.memory_viz_snapshot(events)
    _check_snapshot(snap, events)
    assert sum(s["total_size"] for s in snap["segments"]) == prof.live_bytes
    path = tmp_path / "snap.pickle"
    report.export_memory_viz(events, path)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert loaded == snap
    assert pickle.dumps(snap, protocol=4)[:2] == b"\x80\x04"
    assert path.read_bytes()[:2] == b"\x80\x04"


def test_memory_viz_accepted_by_torch(events):
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    snap = report.memory_viz_snapshot(events)
    text = _memory_viz.trace(copy.deepcopy(snap))
    assert f"{len(snap['device_traces'][0])} entries" in text
    assert "free completed for" in text
    assert "total_allocated" in _memory_viz.segsum(copy.deepcopy(snap))
    flame = _memory_viz.memory(copy.deepcopy(snap), format_flamegraph=lambda s: s)
    assert "active_allocated" in flame or not snap["segments"]
    _memory_viz.segments(copy.deepcopy(snap), format_flamegraph=lambda s: s)
    assert "snapshot.pickle" in _memory_viz.trace_plot(copy.deepcopy(snap))
    assert "snapshot.pickle" in _memory_viz.segment_plot(copy.deepcopy(snap))
    filtered = _memory_viz.filter_alloc_free_pairs(copy.deepcopy(snap))
    assert all(t["action"] == "alloc" for t in filtered["device_traces"][0])
