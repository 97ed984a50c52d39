"""Data-parallel steps over MPI, side by side: the 8 x 1024 MLP (batch 256 over all
ranks, float32, 1 BLAS thread per rank), its backward compiled ("c"), on 1 and 2
ranks:

- ``after``: no DDP; once ``backward()`` has returned, every gradient is copied
  into one flat buffer, all-reduced (one ``Iallreduce``), and copied back;
- ``per_grad``: the same, one all-reduce per gradient (16 of them);
- ``ddp_1mb`` / ``ddp_25mb``: DistributedDataParallel, whose buckets' all-reduces
  start inside the compiled backward (``bucket_<i>_allreduce`` nodes), right after
  each bucket's last gradient; the wait is the ``wait_buckets`` node.

Columns (medians over the steps after the warm-up): ``step`` (forward, backward,
communication), ``left`` (the time left waiting for communication once the
backward's compute is done: the wait and the copy back into ``.grad``, i.e.
``after``'s whole communication, DDP's hand-over), ``in hooks`` (the time
inside DDP's hooks during the backward: copying gradients into buckets, starting
all-reduces, letting MPI progress them), ``comm alone`` (one all-reduce
of all 33.6 MB of gradients, nothing else running); then what DDP's check of the
ranks' layouts before each backward's first all-reduce costs alone.

    python benchmarks/distributed.py [--steps N]

It starts ``mpiexec -n 1`` and ``mpiexec -n 2`` on itself (``--rank-job``) and
prints one table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODES = ("after", "per_grad", "ddp_1mb", "ddp_25mb")
LAYERS, WIDTH, BATCH = 8, 1024, 256


def rank_job(steps):
    import compiled_autograd as ca
    import compiled_autograd.distributed as dist
    from compiled_autograd.distributed.world import all_gather_array, all_reduce_array
    from compiled_autograd.nn.parallel import DistributedDataParallel
    from compiled_autograd.nn.parallel.reducer import Reducer

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(0)
    x_all = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    x = ca.tensor(x_all[share])

    left = []
    hand_over = Reducer._hand_over

    def timed_hand_over(self, st):            # DDP's time left: its hand-over
        t0 = time.perf_counter()
        hand_over(self, st)
        left.append(time.perf_counter() - t0)
    Reducer._hand_over = timed_hand_over
    in_hooks = [0.0]
    ready = Reducer.ready

    def timed_ready(self, i):                 # DDP's hooks: copy, start, poke MPI
        t0 = time.perf_counter()
        ready(self, i)
        in_hooks[0] += time.perf_counter() - t0
    Reducer.ready = timed_ready

    def build():
        ca.manual_seed(0)
        mods = []
        for _ in range(LAYERS):
            mods += [ca.nn.Linear(WIDTH, WIDTH), ca.nn.ReLU()]
        return ca.nn.Sequential(*mods)

    results = {}
    for mode in MODES:
        model = build()
        net = model
        if mode.startswith("ddp"):
            net = DistributedDataParallel(model, bucket_cap_mb=1 if mode == "ddp_1mb" else 25)
        params = list(model.parameters())
        flat = np.zeros(sum(p._data.size for p in params), np.float32)
        left.clear()
        step_times, hook_times = [], []
        for _ in range(steps + 2):
            in_hooks[0] = 0.0
            dist.barrier()
            t0 = time.perf_counter()
            model.zero_grad()
            loss = (net(x) ** 2).mean()
            with ca.compiled_backward(backend="c"):
                loss.backward()
            if mode == "after":
                t1 = time.perf_counter()
                off = 0
                for p in params:
                    n = p._data.size
                    flat[off:off + n] = p.grad._data.reshape(-1)
                    off += n
                flat /= world
                all_reduce_array(flat).wait()
                off = 0
                for p in params:
                    n = p._data.size
                    p.grad._data[...] = flat[off:off + n].reshape(p.shape)
                    off += n
                left.append(time.perf_counter() - t1)
            elif mode == "per_grad":
                t1 = time.perf_counter()
                works = []
                for p in params:
                    p.grad._data /= world
                    works.append(all_reduce_array(p.grad._data.reshape(-1)))
                for w in works:
                    w.wait()
                left.append(time.perf_counter() - t1)
            step_times.append(time.perf_counter() - t0)
            hook_times.append(in_hooks[0])
        results[mode] = {"step": statistics.median(step_times[2:]),
                         "left": statistics.median(left[2:]),
                         "hooks": statistics.median(hook_times[2:])}
    comm = []
    for _ in range(steps + 2):
        dist.barrier()
        t0 = time.perf_counter()
        all_reduce_array(flat).wait()
        comm.append(time.perf_counter() - t0)
    results["comm"] = statistics.median(comm[2:])
    check = []                                # DDP's check before each backward's first
    row = np.zeros(3 + 2 * LAYERS, np.int64)  # all-reduce: an all-gather of this many ints
    for _ in range(50):
        dist.barrier()
        t0 = time.perf_counter()
        all_gather_array(row)
        check.append(time.perf_counter() - t0)
    results["check"] = statistics.median(check)
    if rank == 0:
        print("RESULT " + json.dumps({"world": world, "results": results}), flush=True)
    dist.destroy_process_group()


def launch(ranks, steps):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run([str(mpiexec), "--oversubscribe", "-n", str(ranks), sys.executable,
                          __file__, "--rank-job", "--steps", str(steps)],
                         capture_output=True, text=True, env=env, timeout=1200)
    if out.returncode:
        raise SystemExit(out.stdout + out.stderr)
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rank-job", action="store_true")
    args = ap.parse_args()
    if args.rank_job:
        rank_job(args.steps)
        return
    runs = [launch(n, args.steps) for n in (1, 2)]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, numpy {np.__version__}; {LAYERS} x {WIDTH} MLP, batch "
          f"{BATCH} over the ranks, float32, backend c, 1 BLAS thread per rank; medians of "
          f"{args.steps} steps (ms)")
    print(f"{'ranks':>5}  {'mode':<9} {'step':>8} {'left':>8} {'in hooks':>9} "
          f"{'comm alone':>11}")
    for run in runs:
        r = run["results"]
        for mode in MODES:
            print(f"{run['world']:>5}  {mode:<9} {r[mode]['step'] * 1e3:8.1f} "
                  f"{r[mode]['left'] * 1e3:8.1f} {r[mode]['hooks'] * 1e3:9.1f} "
                  f"{r['comm'] * 1e3:11.1f}")
    two = runs[1]["results"]
    print(f"2 ranks: DDP's check before each backward's first all-reduce (an all-gather of "
          f"{3 + 2 * LAYERS} int64): {two['check'] * 1e6:.0f} us (median of 50)")
    print(f"2 ranks: DDP 1 MB buckets leave {two['ddp_1mb']['left'] / two['after']['left']:.2f}"
          f" of the time one all-reduce after the backward leaves")


if __name__ == "__main__":
    main()
