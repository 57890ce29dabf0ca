"""What the suite costs, printed at the end of every run (docs/testing.md): seconds per directory (unit,
integration, e2e, ui) and per marker (slow, sglang, ui, none), summed over setup, call and teardown of each test,
and the session's wall time against the budget; and the CPU seconds each test file used (the test process's own
plus those of the processes it started and reaped: SGLang servers, torchrun, flow processes, servers torn down
with the file's fixtures), the first thing to cut when the cores are busy (docs/testing.md).

The budget speaks: above PYTEST_BUDGET_WARN_S (default 30 min) the run warns, above PYTEST_BUDGET_FAIL_S (default
45 min) it fails with a message, so a slowdown is seen the day it is merged. Under pytest-xdist the workers send
their reports to the controller, which alone prints the tables and applies the budget.
"""

from __future__ import annotations

import os
import resource
import time
from collections import defaultdict

import pytest

MARKERS = ("sglang", "ui", "slow")  # a test's marker class: the first of these it carries, else "none"
WARN_S = float(os.environ.get("PYTEST_BUDGET_WARN_S", str(30 * 60)))
FAIL_S = float(os.environ.get("PYTEST_BUDGET_FAIL_S", str(45 * 60)))

_start = time.monotonic()
_by_dir: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # directory -> [tests, seconds]
_by_marker: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_cpu_by_file: dict[str, float] = defaultdict(float)
CPU_ROWS = 20


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def directory_of(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def marker_of(keywords: object) -> str:
    return next((m for m in MARKERS if m in keywords), "none")  # type: ignore[operator]


def cpu_seconds() -> float:
    """User + system CPU of this process and of its reaped children (each counted once it has been waited for)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    # Wraps setup, call and teardown, so module and session fixtures torn down after the item count for its file.
    before = cpu_seconds()
    yield
    _cpu_by_file[item.nodeid.split("::")[0]] += cpu_seconds() - before


def pytest_sessionstart(session: pytest.Session) -> None:
    global _start
    _start = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    d, m = _by_dir[directory_of(report.nodeid)], _by_marker[marker_of(report.keywords)]
    d[1] += report.duration
    m[1] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        d[0] += 1
        m[0] += 1


def _table(title: str, rows: dict[str, list[float]]) -> list[str]:
    lines = [f"{title:<20} {'tests':>6} {'seconds':>9} {'minutes':>8}"]
    for name, (n, s) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{name:<20} {int(n):>6} {s:>9.1f} {s / 60:>8.1f}")
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if _is_worker(config) or not _by_dir:
        return
    wall = time.monotonic() - _start
    tr = terminalreporter
    tr.section("time per directory and marker (setup + call + teardown, summed over tests)")
    for line in [*_table("directory", _by_dir), "", *_table("marker", _by_marker)]:
        tr.write_line(line)
    if _cpu_by_file:
        total = sum(_cpu_by_file.values())
        tr.write_line(f"\nCPU seconds per file (this process and the children it reaped), {total / 60:.1f} CPU-min "
                      f"in all; the {CPU_ROWS} largest:")  # fmt: skip
        for path, cpu in sorted(_cpu_by_file.items(), key=lambda kv: -kv[1])[:CPU_ROWS]:
            tr.write_line(f"{cpu:>9.1f}  {path}")
    workers = getattr(config.option, "numprocesses", None) or 1
    tr.write_line(f"\nwall time {wall:.0f} s ({wall / 60:.1f} min) with {workers} worker(s); "
                  f"budget: warn above {WARN_S / 60:.0f} min, fail above {FAIL_S / 60:.0f} min")  # fmt: skip
    if wall > FAIL_S:
        tr.write_line(f"TEST BUDGET EXCEEDED: {wall / 60:.1f} min > {FAIL_S / 60:.0f} min. Find the new cost in the "
                      "tables above and --durations below (docs/testing.md says how to pay for a server once)",
                      red=True)  # fmt: skip
    elif wall > WARN_S:
        tr.write_line(f"test budget warning: {wall / 60:.1f} min > {WARN_S / 60:.0f} min", yellow=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _is_worker(session.config) and time.monotonic() - _start > FAIL_S and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
