"""The command line: ``compiled-autograd {demo,trace,run,memory}``.

A model is a bundled example (``--example mlp|transformer`` with sizes,
``--checkpoint``, ``--offload``) or a user script (``--script model.py`` defining
``model()`` that returns a scalar loss). Bad input gives one line and exit code 2.
``memory --budget B`` plans what to recompute (``ca.memory.plan_checkpoints``) and
measures forward and backward under the plan.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import sys
import tempfile
import time
from contextlib import nullcontext

import numpy as np

import compiled_autograd as ca
from compiled_autograd import demo
from compiled_autograd.autograd.node import AccumulateGrad
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.compiled.api import backward_on
from compiled_autograd.examples import build
from compiled_autograd.memory.report import LARGEST_TITLE, largest_live, write_report


class UsageError(Exception):
    """A one-line message for the user; exit code 2."""


# ---------------------------------------------------------------- models


class Model:
    """A way to build a fresh loss, and a description of it."""

    def __init__(self, make_loss, description):
        self.make_loss = make_loss
        self.description = description

    def loss(self):
        try:
            loss = self.make_loss()
        except UsageError:
            raise
        except Exception as exc:
            raise UsageError(f"model() raised {type(exc).__name__}: {exc}") from None
        if not isinstance(loss, Tensor):
            raise UsageError(f"model() must return a ca.Tensor, got {type(loss).__name__}")
        if loss.numel() != 1:
            raise UsageError(f"model() must return a scalar loss, got shape {list(loss.shape)}")
        if not loss.requires_grad:
            raise UsageError("model() returned a loss that does not require grad")
        return loss


def _example(args):
    sizes = {}
    if args.example == "mlp":
        names = ("layers", "width", "batch")
    else:
        names = ("layers", "d_model", "heads", "seq", "batch", "vocab")
    for name in names:
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
            sizes[name] = value
    checkpoint = "layer" if args.checkpoint else "none"
    try:
        ex = build(args.example, checkpoint=checkpoint, offload=args.offload, **sizes)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    shown = {k: v for k, v in ex.sizes.items() if k not in ("checkpoint", "offload")}
    extras = [w for w, on in (("per-layer checkpointing", args.checkpoint),
                              ("disk offload", args.offload)) if on]
    shown = ", ".join(f"{k}={v}" for k, v in shown.items())
    description = f"{args.example} ({shown})" + (f", {', '.join(extras)}" if extras else "")
    return Model(ex.loss, description)


def _script(path):
    if not os.path.isfile(path):
        raise UsageError(f"no such script: {path}")
    spec = importlib.util.spec_from_file_location("ca_user_model", path)
    module = importlib.util.module_from_spec(spec)
    # As ``python model.py`` does: the script's folder comes first on sys.path, so
    # that it can import the modules next to it.
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise UsageError(f"{path} failed to load: {type(exc).__name__}: {exc}") from None
    make = getattr(module, "model", None)
    if not callable(make):
        raise UsageError(f"{path} must define a function model() returning a scalar loss")
    return Model(make, f"script {path}")


_SIZE_FLAGS = {"mlp": ("layers", "width", "batch"),
               "transformer": ("layers", "d_model", "heads", "seq", "batch", "vocab")}


def load_model(args):
    given = [n for n in ("layers", "width", "d_model", "heads", "seq", "batch", "vocab")
             if getattr(args, n) is not None]
    if args.script is not None:
        extra = given + [n for n in ("example", "checkpoint", "offload") if getattr(args, n)]
        if extra:
            raise UsageError(f"--script cannot be combined with "
                             f"{', '.join('--' + n.replace('_', '-') for n in extra)}")
        return _script(args.script)
    args.example = args.example or "transformer"
    wrong = [n for n in given if n not in _SIZE_FLAGS[args.example]]
    if wrong:
        raise UsageError(f"{', '.join('--' + n.replace('_', '-') for n in wrong)} does not "
                         f"apply to --example {args.example}")
    return _example(args)


def _leaves(loss):
    """The leaf tensors the backward of ``loss`` accumulates into."""
    seen, stack, leaves = set(), [loss.grad_fn], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if isinstance(fn, AccumulateGrad):
            leaves.append(fn.variable)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return leaves


# ---------------------------------------------------------------- commands


def cmd_trace(args, out):
    model = load_model(args)
    g = ca.trace_backward(model.loss(), unpack=args.unpack)
    if args.format == "table":
        out(f"# backward of {model.description}: {len(g.graph.nodes)} nodes")
        out(g.graph.tabular())
    elif args.format == "graph":
        out(str(g.graph))
    elif args.format == "code":
        out(g.code.rstrip())
    elif args.format == "c":
        out(g.c_code.rstrip())
    elif args.format == "dot":
        out(g.to_dot())
    else:
        out(g.to_json())
    return 0


def _same_model(first, second):
    """Two calls of model() must build the same computation on the same tensors,
    or comparing their gradients means nothing."""
    leaves_a, leaves_b = _leaves(first), _leaves(second)
    same = len(leaves_a) == len(leaves_b) and all(a is b for a, b in zip(leaves_a, leaves_b))
    if not same or first.item() != second.item():
        raise UsageError("model() must compute the same loss from the same parameters on "
                         "every call: create parameters and data once, at module level")


def cmd_run(args, out):
    model = load_model(args)
    loss = model.loss()
    _same_model(loss, model.loss())
    leaves = _leaves(loss)
    for leaf in leaves:
        leaf.grad = None
    start = time.perf_counter()
    loss.backward()
    t_eager = time.perf_counter() - start
    expected = [None if p.grad is None else p.grad.numpy().copy() for p in leaves]
    for leaf in leaves:
        leaf.grad = None
    ca.reset_compiled_autograd()
    times = []
    for _ in range(2):  # the first call captures and compiles; the second is a cache hit
        for leaf in leaves:
            leaf.grad = None
        loss = model.loss()
        start = time.perf_counter()
        with ca.compiled_backward(backend=args.backend, unpack=args.unpack):
            loss.backward()
        times.append(time.perf_counter() - start)
    worst, rows = 0.0, 0
    for p, e in zip(leaves, expected):
        if e is None:
            continue
        rows += 1
        diff = float(np.max(np.abs(p.grad.numpy() - e))) if e.size else 0.0
        worst = max(worst, diff)
    stats = ca.compiled_autograd_stats()
    out(f"model: {model.description}")
    out(f"backend: {args.backend}, unpack: {args.unpack}")
    out(f"eager backward:    {t_eager * 1e3:9.2f} ms")
    out(f"compiled, first:   {times[0] * 1e3:9.2f} ms  (capture + compile "
        f"{stats['compile_seconds'] * 1e3:.2f} ms)")
    out(f"compiled, cached:  {times[1] * 1e3:9.2f} ms")
    out(f"gradients of {rows} tensors, max |compiled - eager| = {worst:.3g}"
        + ("  (bitwise equal)" if worst == 0.0 else ""))
    return 0


def _mb(nbytes):
    """Bytes in a readable unit (B, KiB or MiB)."""
    if nbytes >= 2 ** 20:
        return f"{nbytes / 2 ** 20:9.2f} MiB"
    if nbytes >= 2 ** 10:
        return f"{nbytes / 2 ** 10:9.2f} KiB"
    return f"{nbytes:9d} B  "


def _check_report_path(path):
    """Before any measurement: a file name with a known suffix (any case), in a
    folder where a file can really be made (a temporary one is made and removed:
    /proc passes os.access, and refuses files), that is not a directory."""
    if not path:
        raise UsageError("--report needs a file name ending in .html, .txt or .json, got ''")
    if os.path.isdir(path):
        raise UsageError(f"--report {path!r} is a directory; give a file name such as "
                         f"{os.path.join(path, 'report.html')!r}")
    if os.path.splitext(path)[1].lower() not in (".html", ".txt", ".json"):
        raise UsageError(f"--report must end in .html, .txt or .json, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot write the report {path!r}: the directory {folder!r} "
                         f"does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".compiled-autograd-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"cannot write the report {path!r}: {e.strerror or e} in "
                         f"{folder!r}") from None


def cmd_memory(args, out):
    if args.budget is not None:
        mixed = [flag for flag, on in (("--checkpoint", args.checkpoint),
                                       ("--offload", args.offload)) if on]
        if mixed:
            raise UsageError(f"--budget cannot be combined with {' or '.join(mixed)}: the "
                             f"memory plan chooses what to recompute itself")
    if args.optimizer is not None:
        mixed = [flag for flag, on in (("--budget", args.budget is not None),
                                       ("--report", args.report is not None)) if on]
        if mixed:
            raise UsageError(f"--optimizer cannot be combined with {' or '.join(mixed)}")
    if args.report is not None:
        _check_report_path(args.report)
    model = load_model(args)
    if args.optimizer is not None:
        return _memory_of_a_step(args, model, out)
    if args.budget is not None:
        return _memory_plan(args, model, out)
    rows, profiles = [], {}
    for label, unpack in (("eager autograd", None), ("compiled, progressive", "progressive"),
                          ("compiled, upfront", "upfront")):
        if unpack is not None:  # warm the cache: the profile then sees a cache hit
            warm = model.loss()
            with ca.compiled_backward(backend=args.backend, unpack=unpack):
                warm.backward()
            for leaf in _leaves(warm):
                leaf.grad = None
            del warm
        loss = model.loss()
        plan = None if unpack is None else ca.trace_backward(loss, unpack=unpack).memory_schedule()
        with ca.memory.profile() as prof:
            if unpack is None:
                loss.backward()
            else:
                with ca.compiled_backward(backend=args.backend, unpack=unpack):
                    loss.backward()
        for leaf in _leaves(loss):
            leaf.grad = None
        profiles[label] = (prof, plan)
        rows.append((label, plan, prof))
    out(f"model: {model.description}")
    out(f"backward memory (bytes allocated during the backward), backend {args.backend}")
    out(f"{'':<24}{'planned peak':>16}{'measured peak':>16}{'tracemalloc':>16}")
    for label, plan, prof in rows:
        planned = _mb(plan.peak_bytes) if plan else f"{'-':>13}"
        out(f"{label:<24}{planned:>16}{_mb(prof.peak_bytes):>16}"
            f"{_mb(prof.tracemalloc_peak_bytes):>16}")
    prof, plan = profiles["compiled, progressive"]
    eager = profiles["eager autograd"][0]
    upfront = profiles["compiled, upfront"][0]
    out(f"progressive / eager: {prof.peak_bytes / eager.peak_bytes:.2f}   "
        f"progressive / upfront: {prof.peak_bytes / upfront.peak_bytes:.2f}   "
        f"planned / measured: {plan.peak_bytes / prof.peak_bytes:.2f}")
    peak = next(s for s in plan.steps if s.node == plan.peak_node)
    out(f"planned peak at graph node #{peak.index} {plan.peak_node} ({peak.source})")
    out(f"compiled, progressive: {LARGEST_TITLE}:")
    for v in largest_live(prof.timeline, plan, k=5):
        out(f"  {v['bytes']:>12,} bytes  {v['category']:<11} {v['made_by']}")
    events = [s for s in plan.steps if s.event in ("recompute", "reload")]
    if events:
        out(f"{len(events)} recompute/reload graph nodes; first: graph node #{events[0].index} "
            f"{events[0].node} ({events[0].event}, {events[0].allocated:,} bytes planned)")
    if args.report:
        write_report(prof.timeline, args.report, title=f"Backward memory: {model.description}",
                     peak_bytes=prof.peak_bytes, planned=plan,
                     run=f"compiled, backend {args.backend}, progressive unpacking; a cache hit "
                         f"(the capture and compile ran before the profile)",
                     summary_rows=[
                         (label, f"{_mb(p.peak_bytes).strip()} measured"
                          + (f", {_mb(pl.peak_bytes).strip()} planned" if pl else ""))
                         for label, pl, p in rows])
        out(f"report written to {args.report} (the compiled, progressive run)")
    return 0


def _backward(loss, backend):
    """As ``plan_checkpoints`` runs it: "eager" is the eager engine."""
    backward_on(loss, None if backend == "eager" else backend)


def _memory_of_a_step(args, model, out):
    """``memory --optimizer``: the peak of a training step (forward, backward, update)
    with the update after the backward (``step()``) and inside it (``in_backward``)."""
    params = _leaves(model.loss())
    opt = getattr(ca.optim, args.optimizer)(params, lr=1e-3)
    peaks = {}
    for inside in (False, True):
        wrapped = ca.optim.in_backward(opt) if inside else opt
        for measured in (False, False, True):   # (the state is made, the backward compiled)
            with ca.memory.profile() if measured else nullcontext() as prof:
                wrapped.zero_grad()
                _backward(model.loss(), args.backend)
                wrapped.step()
        peaks[inside] = prof.peak_bytes
        if inside:
            wrapped.remove()
    grads = [p._data.nbytes for p in params]
    out(f"model: {model.description}")
    out(f"peak of a training step (forward + backward + {args.optimizer} update; bytes "
        f"allocated inside it, as ca.memory.profile() counts), backend {args.backend}")
    out(f"{'':<34}{'peak':>13}{'bytes':>14}")
    for label, inside in (("backward, then step()", False),
                          ("update inside the backward", True)):
        out(f"{label:<34}{_mb(peaks[inside]):>13}{peaks[inside]:>14,}")
    drop = peaks[False] - peaks[True]
    out(f"the update inside saves {drop:,} bytes ({drop / peaks[False]:.0%}); the gradients "
        f"are {sum(grads):,} bytes, the largest {max(grads):,}")
    return 0


def _memory_plan(args, model, out):
    """``memory --budget``: plan with ``ca.memory.plan_checkpoints``, then measure a
    warm forward and backward under the plan, every .grad None at the start (what
    the prediction assumes)."""
    engine = None if args.backend == "eager" else args.backend   # (the eager engine: None)
    try:
        plan = ca.memory.plan_checkpoints(model.loss, budget=args.budget, backend=engine)
    except (RuntimeError, ValueError) as exc:   # no plan fits; model() changed its forward
        if str(exc).startswith("memory plan:"):   # (plan_checkpoints runs its plan once)
            raise UsageError(f"{exc} (model() must build the same computation on "
                             f"every call)") from None
        if not str(exc).startswith("plan_checkpoints:"):
            raise
        raise UsageError(str(exc)) from None
    backward = "eager autograd" if args.backend == "eager" else f"compiled, backend {args.backend}"
    for measured in (False, True):  # the first run compiles the plan's backward
        with ca.memory.profile() if measured else nullcontext() as prof:
            try:
                with plan:
                    loss = model.loss()
            except RuntimeError as exc:   # model() made another forward than the profiled one
                if not str(exc).startswith("memory plan:"):
                    raise
                raise UsageError(f"{exc} (model() must build the same computation on "
                                 f"every call)") from None
            leaves = _leaves(loss)
            forward_events = len(prof.timeline) if measured else 0
            _backward(loss, args.backend)
            del loss
        for leaf in leaves:
            leaf.grad = None        # (so the measured run starts with every .grad None)
    predicted, peak = plan.predicted_peak_bytes, prof.peak_bytes
    out(f"model: {model.description}")
    out(f"memory plan for --budget {args.budget}, backward {backward}; peaks of forward + "
        f"backward (bytes allocated inside them, as ca.memory.profile() counts)")
    out(plan.table())
    out("")
    out(f"{'':<30}{'peak':>13}{'bytes':>16}")
    for label, nbytes in (("no plan (profiled)", plan.baseline_peak_bytes),
                          ("budget", plan.budget_bytes),
                          ("under the plan, predicted", predicted),
                          ("under the plan, measured", peak)):
        out(f"{label:<30}{_mb(nbytes):>13}{nbytes:>16,}")
    out(f"{'(tracemalloc, measured run)':<30}{_mb(prof.tracemalloc_peak_bytes):>13}"
        f"{prof.tracemalloc_peak_bytes:>16,}")
    if peak == predicted:
        out(f"predicted == measured: {peak:,} bytes, to the byte "
            f"({peak / plan.baseline_peak_bytes:.2f} of the peak without a plan)")
    else:
        diff = peak - predicted
        out(f"predicted != measured: the measured peak is {abs(diff):,} bytes "
            f"({abs(diff) / predicted:.1%}) {'above' if diff > 0 else 'below'} the prediction"
            + ("" if args.backend == "python" else
               f" (the prediction simulates the backward graph as the python backend runs "
               f"it; {backward} allocates otherwise)"))
    at_peak = [(c, b) for c, b in prof.peak_by_category.items() if b]
    out("measured at the peak: " + ", ".join(f"{c} {_mb(b).strip()}" for c, b in at_peak))
    schedule = plan.simulation.whole_schedule()
    out(f"{LARGEST_TITLE}:")
    for v in largest_live(prof.timeline, schedule, k=5, planned_start=forward_events):
        out(f"  {v['bytes']:>12,} bytes  {v['category']:<11} {v['made_by']}")
    if args.report:
        notes = []
        if args.backend == "c":
            notes.append("Backend c computes the recomputed values in its arena (one storage, "
                         "category temporary): the chart cannot show them one by one.")
        write_report(prof.timeline, args.report,
                     title=f"Forward and backward under a memory plan: {model.description}",
                     peak_bytes=peak, planned=schedule, planned_start=forward_events,
                     recomputed=plan.recomputed, notes=notes, budget=plan.budget_bytes,
                     run=f"forward under the memory plan (--budget {args.budget}), then its "
                         f"backward, {backward}; a warm run (the backward was captured and "
                         f"compiled before the profile), every .grad None at the start",
                     summary_rows=[
                         ("no plan (profiled)", f"{_mb(plan.baseline_peak_bytes).strip()}"),
                         ("budget", f"{_mb(plan.budget_bytes).strip()} "
                                    f"({plan.budget_bytes:,} bytes)"),
                         ("predicted peak", f"{_mb(predicted).strip()} ({predicted:,} bytes)"),
                         ("measured peak", f"{_mb(peak).strip()} ({peak:,} bytes)"
                          + (", equal to the prediction" if peak == predicted else "")),
                         ("recomputed by the plan",
                          f"{len(plan.recomputed_storages)} values and "
                          f"{len(plan.recomputed) - len(plan.recomputed_storages)} views of "
                          f"them, {plan.recompute_flops:,} FLOPs")])
        out(f"report written to {args.report} (the measured run under the plan)")
    return 0


def cmd_demo(args, out):
    if args.steps < 0 or args.checks < 1:
        raise UsageError("--steps must be >= 0 and --checks >= 1")
    worst = demo.run(steps=args.steps, checks=args.checks, out=out)
    return 0 if worst < 1e-5 else 1


# ---------------------------------------------------------------- parsing


def _model_args(p):
    g = p.add_argument_group("model")
    g.add_argument("--example", choices=["mlp", "transformer"],
                   help="bundled example (default transformer)")
    g.add_argument("--script", help="a Python file defining model() -> scalar loss")
    for name in ("layers", "width", "d-model", "heads", "seq", "batch", "vocab"):
        g.add_argument(f"--{name}", dest=name.replace("-", "_"), type=int)
    g.add_argument("--checkpoint", action="store_true", help="checkpoint every layer")
    g.add_argument("--offload", action="store_true", help="save activations to disk")
    p.add_argument("--unpack", choices=["progressive", "upfront"], default="progressive")


def _budget(text):
    """``--budget``: a fraction in (0, 1] (0.4, 1.0) or an integer number of bytes."""
    text = text.strip()
    if re.fullmatch(r"[+-]?\d[\d_]*", text):
        if int(text) <= 0:
            raise argparse.ArgumentTypeError(f"a budget in bytes must be positive, got {text}")
        return int(text)
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction in (0, 1] such as 0.4, or an integer number of bytes, "
            f"got {text!r}") from None
    if not 0 < value <= 1:    # (also nan)
        raise argparse.ArgumentTypeError(
            f"a fraction of the peak must be in (0, 1], got {text} (bytes: an integer)")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parser():
    top = _Parser(prog="compiled-autograd",
                  description="Trace, run and measure compiled backward passes.")
    top.add_argument("--version", action="version",
                     version=f"compiled-autograd {_version()}")
    sub = top.add_subparsers(dest="command", parser_class=_Parser)
    demo = sub.add_parser("demo", help="train the bundled MLP and check its gradients")
    demo.add_argument("--steps", type=int, default=5)
    demo.add_argument("--checks", type=int, default=8)
    trace = sub.add_parser("trace", help="print the backward graph")
    _model_args(trace)
    trace.add_argument("--format", choices=["table", "graph", "code", "c", "dot", "json"],
                       default="table")
    run = sub.add_parser("run", help="run the backward compiled; compare with eager")
    _model_args(run)
    run.add_argument("--backend", default="python", choices=["python", "eager", "c"])
    memory = sub.add_parser("memory", help="planned and measured memory of the backward")
    _model_args(memory)
    memory.add_argument("--backend", default="python", choices=["python", "eager", "c"])
    memory.add_argument("--report", help="write a report: .html, .txt or .json")
    memory.add_argument("--budget", type=_budget,
                        help="plan what to recompute so that forward + backward fits: a "
                             "fraction of the peak without a plan in (0, 1], such as 0.4, or "
                             "an integer number of bytes")
    memory.add_argument("--optimizer", choices=["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"],
                        help="the peak of a training step with this optimizer (lr 1e-3), "
                             "its update after the backward and inside it (ca.optim.in_backward)")
    return top


COMMANDS = {"demo": cmd_demo, "trace": cmd_trace, "run": cmd_run, "memory": cmd_memory}


def _version() -> str:
    try:
        return importlib.metadata.version("compiled-autograd")
    except importlib.metadata.PackageNotFoundError:     # (run from a source tree)
        return "unknown (not installed)"


def _pipe_safe(line="") -> None:
    """print, for output piped into ``head``: once the reader is gone, the rest of
    the output goes nowhere and the command goes on (a report is still written)."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())      # (Python's advice: no second error
        os.close(devnull)                          # when stdout is flushed at exit)


def main(argv=None, out=print) -> int:
    out = _pipe_safe if out is print else out
    try:
        args = parser().parse_args(argv)
        if args.command is None:
            args = parser().parse_args(["demo"] + list(argv or []))
        return COMMANDS[args.command](args, out)
    except SystemExit as exc:       # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except UsageError as exc:
        print(f"compiled-autograd: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:
        print(f"compiled-autograd: error: out of memory ({exc}); try smaller sizes",
              file=sys.stderr)
        return 2


def console() -> None:
    """The installed ``compiled-autograd`` entry point."""
    sys.exit(main(sys.argv[1:]))
