"""What the memory report tells a reader (issue 19's usability list): one vocabulary
explained on the page, which run it shows, one list of the largest values live at
the peak, the plan placed on the measured events, a tooltip per event, the
captures and compiles inside a profile."""
import re
import warnings

import pytest

import compiled_autograd as ca
from compiled_autograd.cli import _leaves
from compiled_autograd.examples import build
from compiled_autograd.memory import report
from compiled_autograd.memory.align import align
from compiled_autograd.memory.profile import CompileInProfileWarning

TRANSFORMER = dict(layers=2, d_model=32, heads=4, seq=8, batch=2, vocab=20, checkpoint="layer")


def _compiled_profile(backend="python", **sizes):
    """A plan and a profile of a cache hit of the checkpointed transformer."""
    ex = build("transformer", **(sizes or TRANSFORMER))
    warm = ex.loss()
    with ca.compiled_backward(backend=backend):
        warm.backward()
    for leaf in _leaves(warm):
        leaf.grad = None
    del warm
    loss = ex.loss()
    plan = ca.trace_backward(loss).memory_schedule()
    with ca.memory.profile() as prof:
        with ca.compiled_backward(backend=backend):
            loss.backward()
    return plan, prof


@pytest.fixture(scope="module")
def compiled():
    return _compiled_profile()


def test_one_vocabulary_explained_on_the_page(compiled):
    plan, prof = compiled
    html = report.render_html(prof.timeline, title="t", planned=plan)
    assert "(step " not in html and "step" not in re.sub(r"<[^>]*>", "", html).split("Reading")[0]
    assert "Reading the chart" in html
    for word in ("<dt>event</dt>", "<dt>kernel call</dt>", "<dt>graph node</dt>",
                 "<dt>planned</dt>"):
        assert word in html
    assert re.search(r"event \d+, after [\d,]+ kernel calls, in graph node \w+", html)
    text = report.render_text(prof.timeline, title="t", planned=plan)
    assert "(step " not in text and re.search(r"after [\d,]+ kernel calls", text)


def test_the_page_names_the_run(compiled, tmp_path):
    plan, prof = compiled
    prof.report(tmp_path / "c.html", planned=plan)
    html = (tmp_path / "c.html").read_text()
    assert "compiled (backend and unpacking not seen by the profile: pass run= to report()); " \
           "a cache hit" in html
    ex = build("mlp", layers=2, width=8, batch=4)
    with ca.compiled_backward(backend="eager", unpack="upfront"):
        ex.loss().backward()           # (warms the cache)
        with ca.memory.profile() as inside:
            ex.loss().backward()
    inside.report(tmp_path / "i.txt")
    assert "run: compiled, backend eager, upfront unpacking; a cache hit" in \
        (tmp_path / "i.txt").read_text()
    ex = build("mlp", layers=2, width=8, batch=4)
    loss = ex.loss()
    with ca.memory.profile() as eager:
        loss.backward()
    eager.report(tmp_path / "e.html")
    assert "eager autograd (no compiled backward ran inside the profile)" in \
        (tmp_path / "e.html").read_text()
    prof.report(tmp_path / "n.html", run="my run <3>")
    assert "my run &lt;3&gt;" in (tmp_path / "n.html").read_text()


def test_largest_values_live_at_the_peak_one_list(compiled):
    plan, prof = compiled
    rows = report.largest_live(prof.timeline, plan)
    html = report.render_html(prof.timeline, title="t", planned=plan)
    text = report.render_text(prof.timeline, title="t", planned=plan)
    assert "Largest values live at the peak" in html and "largest allocations" not in html.lower()
    # the storages live at the measured peak: their bytes add up to at most the peak
    assert rows and sum(r["bytes"] for r in rows) <= prof.peak_bytes
    for r in rows:
        assert r["graph_node"] and r["made_by"].startswith("graph node ")
        assert f"<td>{r['made_by']}</td>" in html
        assert r["made_by"] in text


def test_plan_is_placed_on_the_events_it_made():
    """Backend "eager" marks each graph node: the allocation matching used for
    generated code must place every node where the marks say, and the plan's
    recompute must be where the measured recomputation starts."""
    plan, prof = _compiled_profile("eager")
    events = prof.timeline
    by_marks = align(plan.steps, events)
    assert by_marks.method == "marks"
    first = next(i for i, e in enumerate(events) if e.category == "recomputed")
    owner = plan.steps[by_marks.node_of_event[first]]
    assert owner.event == "recompute", owner      # the segment's first unpack
    no_marks = [e for e in events if e.action != "mark"]
    index = [i for i, e in enumerate(events) if e.action != "mark"]
    by_allocs = align(plan.steps, no_marks)
    assert by_allocs.method == "allocations"
    allocating = [k for k, s in enumerate(plan.steps)
                  if (s.op == "call_function" and s.allocated) or s.event == "recompute"]
    assert all(by_allocs.matched[k] for k in allocating)
    for k in allocating:        # the same event as the node's own first allocation
        assert events[index[int(by_allocs.x[k])]].action == "alloc"
        assert by_marks.node_of_event[index[int(by_allocs.x[k])]] == k, plan.steps[k]


def test_planned_line_follows_the_events_not_the_width(compiled):
    plan, prof = compiled
    html = report.render_html(prof.timeline, title="t", planned=plan)
    line = re.search(r'stroke-dasharray="7 4"\s+points="([^"]*)"', html).group(1).split()
    xs = [float(p.split(",")[0]) for p in line]
    assert xs == sorted(xs)
    # the recompute's burst is drawn where the measured recomputation starts
    events = [e for e in prof.timeline if e.action != "mark"]
    first = next(i for i, e in enumerate(events) if e.category == "recomputed")
    k = next(k for k, s in enumerate(plan.steps) if s.event == "recompute")
    n = len(events)
    x_first = 84 + (1100 - 84 - 24) * first / (n - 1)
    assert abs(xs[2 * k] - x_first) < 0.2


def test_every_drawn_event_has_a_tooltip(compiled):
    plan, prof = compiled
    html = report.render_html(prof.timeline, title="t", planned=plan)
    tips = re.findall(r'<rect class="hover"[^>]*><title>([^<]*)</title>', html)
    assert len(tips) == sum(e.action != "mark" for e in prof.timeline)
    alloc = next(t for t in tips if "allocated" in t and "graph node: matmul" in t)
    for part in ("kernel call", "category gradient", "bytes", "autograd node: ",
                 "graph node: matmul"):
        assert part in alloc
    assert "autograd node: -" not in alloc


def test_a_profile_of_a_first_compiled_backward_warns_and_says_so(tmp_path):
    ca.reset_compiled_autograd()
    ex = build("mlp", layers=2, width=8, batch=4)
    loss = ex.loss()
    with pytest.warns(CompileInProfileWarning, match="1 capture"):
        with ca.memory.profile() as prof:
            with ca.compiled_backward():
                loss.backward()
    assert prof.compiles == 1 and "captured and compiled inside the profile" in prof.run
    prof.report(tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "includes 1 capture(s) and compile(s)" in html and 'class="warn"' in html
    for leaf in _leaves(loss):
        leaf.grad = None
    loss = ex.loss()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ca.memory.profile() as hit:
            with ca.compiled_backward():
                loss.backward()
    assert hit.compiles == 0 and hit.compile_note() is None and "a cache hit" in hit.run
