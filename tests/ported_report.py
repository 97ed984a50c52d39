"""What became of the tests ported from PyTorch's suite: runs tests/test_ported_*.py
and prints, per PyTorch test file, how many of its tests were ported, how many pytest
items they make (each mode: the eager engine and every compiled backend), how many
pass, and every known difference (a strict xfail) with its reason and count.

    python tests/ported_report.py

Each ported test names its origin in a comment, ``# torch: test_autograd.py::...``.
"""
from __future__ import annotations

import collections
import contextlib
import glob
import io
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ORIGIN = re.compile(r"#\s*torch:\s*(\S+?\.py)::(\S+)")


def origins():
    """{(file name, test function): [(torch file, torch test)]}."""
    out = {}
    for path in sorted(glob.glob(os.path.join(HERE, "test_ported_*.py"))):
        pending = []
        with open(path) as f:
            for line in f:
                m = ORIGIN.search(line)
                if m:
                    pending.append((m.group(1), m.group(2).rstrip(",")))
                    continue
                d = re.match(r"def (test_\w+)", line)
                if d:
                    out[(os.path.basename(path), d.group(1))] = pending
                    pending = []
    return out


class _Outcomes:
    def __init__(self):
        self.items = []      # (file, function, outcome, reason)

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and not (report.when == "setup" and report.skipped):
            return
        file, _, rest = report.nodeid.partition("::")
        function = rest.split("[")[0]
        reason = getattr(report, "wasxfail", None)
        if reason is not None:
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = report.outcome
        self.items.append((os.path.basename(file), function, outcome, reason))


def main():
    collector = _Outcomes()
    files = sorted(glob.glob(os.path.join(HERE, "test_ported_*.py")))
    with contextlib.redirect_stdout(io.StringIO()):    # (pytest's progress)
        code = pytest.main(["-p", "no:cacheprovider", "-o", "addopts=", "--tb=short", "-q"]
                           + files, plugins=[collector])
    where = origins()
    by_source = collections.defaultdict(lambda: {"tests": set(), "items": 0,
                                                 "passed": 0, "xfailed": 0, "other": 0})
    reasons = collections.Counter()
    for file, function, outcome, reason in collector.items:
        for source, test in where.get((file, function)) or [("(no origin named)", function)]:
            row = by_source[source]
            row["tests"].add(test)
        source = (where.get((file, function)) or [("(no origin named)", None)])[0][0]
        row = by_source[source]
        row["items"] += 1
        if outcome == "passed":
            row["passed"] += 1
        elif outcome == "xfailed":
            row["xfailed"] += 1
            reasons[reason] += 1
        else:
            row["other"] += 1
    print()
    print(f"{'PyTorch file':<28}{'tests ported':>13}{'pytest items':>14}{'passed':>8}"
          f"{'xfailed':>9}{'other':>7}")
    for source, row in sorted(by_source.items()):
        print(f"{source:<28}{len(row['tests']):>13}{row['items']:>14}{row['passed']:>8}"
              f"{row['xfailed']:>9}{row['other']:>7}")
    print("\nknown differences (strict xfails), by reason: pytest items (tests)")
    for reason, n in reasons.most_common():
        tests = {f for _, f, o, r in collector.items if r == reason}
        print(f"{n:>4} ({len(tests)})  {reason}")
    if not reasons:
        print("   none")
    failed = [f"{file}::{function}" for file, function, outcome, _ in collector.items
              if outcome not in ("passed", "xfailed")]
    if failed:
        print("\nnot passing:", *sorted(set(failed)), sep="\n  ")
    return code


if __name__ == "__main__":
    sys.exit(main())
