"""benchmarks/alone.py, how step.py and backward.py run each library in a process of
its own: a runner's child makes its step from a factory named "module:function",
runs the blocks asked for and reports each step's value and page faults;
``rounds`` makes the runners take turns,
dropping the first step of each block, the machine's pace taking its turn too."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ALONE = Path(__file__).resolve().parents[1] / "benchmarks" / "alone.py"

FACTORY = '''
import os

def make(tag):
    """A step that counts itself and says which process ran it, and with what
    environment."""
    count = [0]

    def step():
        count[0] += 1
        return [tag, os.getpid(), count[0], os.environ.get("ALONE_TEST", "")]
    return step, {"tag": tag, "pid": os.getpid()}
'''


@pytest.fixture
def alone(tmp_path, monkeypatch):
    (tmp_path / "alone_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    spec = importlib.util.spec_from_file_location("alone_under_test", ALONE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_runner_alone_runs_its_steps_in_its_own_process(alone):
    runner = alone.Alone("alone_factory:make", "a", env={"ALONE_TEST": "yes"})
    try:
        assert runner.info["tag"] == "a" and runner.info["pid"] != os.getpid()
        got = runner(3)
        assert [value[2] for value, _ in got] == [1, 2, 3]
        assert all(value[1] == runner.info["pid"] and value[3] == "yes" for value, _ in got)
        assert all(isinstance(faults, int) and faults >= 0 for _, faults in got)
        assert [value[2] for value, _ in runner(2)] == [4, 5]        # the same runner goes on
    finally:
        runner.close()
    assert runner.proc.returncode == 0


def test_rounds_take_turns_by_blocks_and_drop_each_blocks_first_step(alone):
    runners = {"x": alone.Alone("alone_factory:make", "x"),
               "y": alone.Alone("alone_factory:make", "y")}
    try:
        got = alone.rounds(runners, 8)      # blocks of 4 (+1 dropped) after 5 warm-ups
    finally:
        for runner in runners.values():
            runner.close()
    for name in ("x", "y"):
        counts = [value[2] for value, _ in got[name]]
        # warm-up 1-5; block 1 runs 6-10 and keeps 7-10; block 2 runs 11-15, keeps 12-15
        assert counts == [7, 8, 9, 10, 12, 13, 14, 15]
    pace = got[alone.PACE]                  # the machine's pace, after each runner's turn
    assert len(pace) == 2 * 2 * alone.PACE_STEPS
    assert all(seconds > 0 and faults >= 0 for seconds, faults in pace)
    assert set(got) == {"x", "y", alone.PACE}


def test_the_pace_runs_at_one_blas_thread_whatever_the_callers(alone, monkeypatch):
    made, real = [], alone.Alone

    def spy(factory, *args, **kwargs):
        made.append((factory, kwargs.get("env")))
        return real(factory, *args, **kwargs)
    monkeypatch.setattr(alone, "Alone", spy)
    runner = real("alone_factory:make", "x")
    try:
        got = alone.rounds({"x": runner}, 4)
    finally:
        runner.close()
    assert made == [(alone.PACE_RUNNER, alone.PACE_ENV)]
    assert alone.PACE_ENV["OPENBLAS_NUM_THREADS"] == "1"
    assert len(got[alone.PACE]) == alone.PACE_STEPS


def test_the_pace_summary_shows_a_slow_spell_as_its_slowest_round(alone):
    # two runners: 2 * PACE_STEPS pace readings a round; 5 rounds, the second slow
    per_round = 2 * alone.PACE_STEPS
    pace = [(1.0 if i // per_round != 1 else 1.5, 0) for i in range(5 * per_round)]
    summary = alone.pace_summary({"x": [], "y": [], alone.PACE: pace})
    assert summary == {"median": 1.0, "slowest tenth": 1.5, "slowest round": 1.5}
    quiet = alone.pace_summary({"x": [], "y": [], alone.PACE: [
        (1.0 + 0.01 * (i % per_round), 0) for i in range(5 * per_round)]})
    assert quiet["slowest round"] == pytest.approx(1.0, abs=0.01)
    assert quiet["slowest tenth"] < 1.1
    assert alone.pace_line(summary).endswith("slowest tenth 1.50x, slowest round 1.50x")


def test_a_child_that_fails_ends_the_benchmark_with_its_code(alone):
    with pytest.raises(SystemExit, match="step server failed"):
        alone.Alone("alone_factory:no_such_function", "z")


def test_a_runner_of_another_checkout_runs_its_own_alone_py(alone, tmp_path):
    """against.py's baseline: another interpreter and another checkout's
    benchmarks folder, whose alone.py serves the steps and finds its own modules."""
    other = tmp_path / "other_checkout" / "benchmarks"
    other.mkdir(parents=True)
    (other / "alone.py").write_text(ALONE.read_text())
    (other / "other_factory.py").write_text(FACTORY.replace('"tag": tag', '"tag": tag + "@other"'))
    runner = alone.Alone("other_factory:make", "b", python=sys.executable, folder=str(other))
    try:
        assert runner.info["tag"] == "b@other" and runner.info["pid"] != os.getpid()
        assert [value[2] for value, _ in runner(2)] == [1, 2]
    finally:
        runner.close()
    assert runner.proc.returncode == 0
