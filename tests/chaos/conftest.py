"""The fault-injection suite: its size, its figures, and their summary.

``DBOS_CHAOS_SCALE`` (a positive integer, default 1) multiplies every test's amount of faults
(kill cycles, storm durations, restarts): ``make test`` runs the short version (1),
``make chaos`` the full one. Each test counts what it saw in the ``chaos_figures`` fixture;
the end of the run prints the totals of every test (under pytest-xdist too: the figures
travel with the test reports).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

SCALE_ENV = "DBOS_CHAOS_SCALE"
FIGURES_KEY = "chaos_figures"

# What the summary prints, in this order: (figure, label).
FIGURES = (
    ("cycles", "kill cycles run"),
    ("kills_mid_workflow", "kills that landed mid-workflow"),
    ("steps_in_flight_at_kill", "steps in flight at a kill (may run again)"),
    ("workflows_checked", "workflows checked after faults"),
    ("workflows_lost", "workflows lost"),
    ("steps_rerun_after_checkpoint", "steps re-run after their checkpoint"),
    ("storm_kills", "connections terminated by storms"),
    ("calls_under_faults", "calls made under faults"),
    ("documented_errors", "calls that raised a documented dbos_async error"),
    ("raw_driver_errors", "raw driver errors seen by callers"),
    ("restarts", "server restarts"),
    ("primary_failovers", "primary failovers (kill -9, standby promoted)"),
)


def chaos_scale() -> int:
    raw = os.environ.get(SCALE_ENV, "1").strip() or "1"
    try:
        scale = int(raw)
    except ValueError:
        raise pytest.UsageError(f"{SCALE_ENV} must be a positive integer, not {raw!r}") from None
    if scale < 1:
        raise pytest.UsageError(f"{SCALE_ENV} must be a positive integer, not {raw!r}")
    return scale


@pytest.fixture(scope="session")
def scale() -> int:
    """How many times the short version's amount of faults this run injects."""
    return chaos_scale()


@pytest.fixture
def chaos_figures(request: pytest.FixtureRequest) -> Counter[str]:
    """The test's figures. The counter is attached to the test's user properties at set-up,
    so the report of its call carries their final values (as a dict, which xdist workers can
    send: see :func:`pytest_runtest_makereport`)."""
    figures: Counter[str] = Counter()
    request.node.user_properties.append((FIGURES_KEY, figures))
    return figures


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    report.user_properties = [(key, dict(value) if key == FIGURES_KEY else value)
                              for key, value in report.user_properties]
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The totals of the tests expected to pass, then the raw errors of those marked as
    expected failures (known bugs, each named in its marker)."""
    totals: Counter[str] = Counter()
    known: Counter[str] = Counter()
    seen = False
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == FIGURES_KEY:
                    seen = True
                    (known if hasattr(report, "wasxfail") else totals).update(dict(value))
    if not seen:
        return
    terminalreporter.section(f"chaos figures ({SCALE_ENV}={chaos_scale()})")
    for figure, label in FIGURES:
        terminalreporter.line(f"{label:<56} {totals[figure]}")
    if known:
        terminalreporter.line(f"{'raw driver errors in expected failures (known bugs)':<56} "
                              f"{known['raw_driver_errors']}")
