"""Where a compiled backward's time goes around the generated code, on the small
graphs of backward.py ("c" backend, 1 thread; ``--cases`` for others, the
transformer's among them): the whole ``loss.backward()``
inside ``compiled_backward``, and the medians of its parts, each timed in place
over the same backwards:

- root: the root gradient (``engine.make_root_grads``);
- key: the compiled args, walking the graph (``api._prepare``);
- lookup: the rest of ``compiled.lookup`` (the cache's dict and size checks);
- saved: the saved values' arrays read and the values released, one pass
  (``SavedVariable.arrays``; the boxed list owns the arrays from then on);
- call: the compiled function's call (codegen/c_call.c's Runner: inputs checked,
  outputs allocated, gradients handed to ``accumulate_into``, callbacks), without
  the two below:
- C function: the generated ``ca_backward`` alone (timed separately, as
  c_breakdown.py does: on the Python call path, less the time inside its
  callbacks);
- backwards: the custom Functions' backwards the C calls back (their
  ``backward_with``: the user's ``backward`` and its Tensors in and out), a
  part of the call (the custom-Function MLP; 0 elsewhere);
- rest: ``backward()``'s and ``compiled_backward``'s own Python around them.

    python benchmarks/call_breakdown.py [--reps N] [--cases a,b]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import backward  # noqa: E402  (the same cases)
import c_breakdown  # noqa: E402


def breakdown(case, reps):
    import compiled_autograd as ca
    from compiled_autograd.autograd import engine
    from compiled_autograd.autograd.function import FunctionBackward
    from compiled_autograd.autograd.node import SavedVariable
    from compiled_autograd.compiled import api, cache
    from compiled_autograd.compiled.api import backward_on
    make_loss, params = backward._ca_setup(case)
    ca.reset_compiled_autograd()
    for _ in range(3):
        loss = make_loss()
        with ca.compiled_backward(backend="c"):
            loss.backward()
        for p in params:
            p.grad = None
    parts: dict = {}
    restore = []

    def timed(owner, name, label, static=False):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                parts.setdefault(label, []).append(time.perf_counter() - start)
        setattr(owner, name, staticmethod(wrapper) if static else wrapper)
        restore.append((owner, name, staticmethod(real) if static else real))

    timed(engine, "make_root_grads", "root")
    timed(api, "_prepare", "key")
    timed(api, "lookup", "lookup+key")
    timed(SavedVariable, "arrays", "saved", static=True)
    (entry,) = [e for family in cache.families.values() for _, _, e in family.entries]
    timed(entry, "fn", "call")
    timed(FunctionBackward, "backward_with", "backwards")

    try:
        whole = backward._median_backward(make_loss, params, reps,
                                          lambda loss: backward_on(loss, "c"))
    finally:
        for owner, name, real in reversed(restore):
            setattr(owner, name, real)
    med = {k: statistics.median(v) for k, v in parts.items()}
    key = med["key"]
    n = len(parts["call"])       # (each backward's custom backwards, summed)
    per = len(parts.get("backwards", ())) // n
    backwards = statistics.median(sum(parts["backwards"][i * per:(i + 1) * per])
                                  for i in range(n)) if per else 0.0
    row = dict(whole=whole, root=med["root"], key=key, lookup=med["lookup+key"] - key,
               saved=med.get("saved", 0.0), call=med["call"] - backwards, backwards=backwards)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--cases", default="small_mlp,chain,custom_fn_python",
                        help="backward.py's cases (transformer: its reps are a tenth)")
    args = parser.parse_args()
    print(f"\"c\" backend, 1 thread; medians of {args.reps} backwards, each after a fresh "
          "forward (untimed)")
    cols = ("whole", "root", "key", "lookup", "saved", "call", "backwards", "C function",
            "rest")
    print(f"{'case':<17}" + "".join(f"{c:>12}" for c in cols))
    for case in args.cases.split(","):
        reps = max(10, args.reps // 10) if case in ("large_mlp", "transformer") else args.reps
        row = breakdown(case, reps)
        function = c_breakdown.c_function_share(case, min(reps, 100))[2]
        row["C function"] = function
        row["call"] -= function
        row["rest"] = row["whole"] - sum(row[c] for c in cols[1:-1])
        print(f"{case:<17}" + "".join(f"{row[c] * 1e6:>10.1f}us" for c in cols))


if __name__ == "__main__":
    main()
