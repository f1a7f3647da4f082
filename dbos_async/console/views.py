"""What the console's pages show, shaped from the operator's reads: values as pretty JSON
(cut when large), the step timeline's geometry, the children tree, the queue chart and the
metrics page's charts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dbos_async._executor.handles import WorkflowStatus
from dbos_async._executor.management.control import WorkflowStepInfo
from dbos_async._executor.observability import (
    QueueDepth,
    QueueMinute,
    WorkflowActivity,
    WorkflowAggregate,
)
from dbos_async._sysdb.statements.observability import MINUTE_MS
from dbos_async.errors import RecordedError
from dbos_async.statuses import WorkflowStatusString

SHOWN_CHARS = 2000
"""How much of a value a page shows before cutting it (a link shows it all)."""


def pretty(value: Any) -> str:
    """A value as indented JSON (anything JSON cannot hold as its ``repr``)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class Shown:
    """A value's text on a page: its start, and whether the rest was cut."""

    text: str
    cut: bool
    total_chars: int


def shown(text: str) -> Shown:
    return Shown(text[:SHOWN_CHARS], len(text) > SHOWN_CHARS, len(text))


def error_text(error: BaseException | None) -> str | None:
    if error is None:
        return None
    name = error.name if isinstance(error, RecordedError) else type(error).__name__
    return f"{name}: {error}"


def when(epoch_ms: int | None) -> str:
    """An instant as UTC, to the millisecond."""
    if epoch_ms is None:
        return ""
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{epoch_ms % 1000:03d}"


def duration(start_ms: int | None, end_ms: int | None) -> str:
    if start_ms is None or end_ms is None:
        return ""
    ms = end_ms - start_ms
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


@dataclass(frozen=True)
class StepBar:
    """One step of the timeline: where its bar starts and how wide it is (percent of the
    workflow's span), and what marks it."""

    step: WorkflowStepInfo
    left: float
    width: float
    error: str | None
    retries_exhausted: bool
    running: bool


def timeline(status: WorkflowStatus, steps: list[WorkflowStepInfo], now_ms: int) -> list[StepBar]:
    """The steps as bars on one time axis: from the workflow's creation to its completion
    (or now, or the last step's end, whichever is latest)."""
    starts = [s.started_at_epoch_ms for s in steps if s.started_at_epoch_ms is not None]
    ends = [s.completed_at_epoch_ms for s in steps if s.completed_at_epoch_ms is not None]
    origin = min([status.created_at, *starts])
    waiting = status.status in (WorkflowStatusString.PENDING, WorkflowStatusString.ENQUEUED)
    finish = status.completed_at or (now_ms if waiting else status.updated_at)
    end = max([finish, *ends, origin + 1])
    span = end - origin
    bars = []
    for step in steps:
        start = step.started_at_epoch_ms if step.started_at_epoch_ms is not None else origin
        stop = step.completed_at_epoch_ms
        running = stop is None
        stop = end if stop is None else stop
        left = 100 * (start - origin) / span
        width = max(100 * (stop - start) / span, 0.4)
        error = step.error
        bars.append(StepBar(step, round(left, 2), round(min(width, 100 - left), 2),
                            error_text(error),
                            isinstance(error, RecordedError)
                            and error.name == "StepRetriesExceededError",
                            running and error is None))
    return bars


@dataclass
class ChildNode:
    """A child workflow in the tree, with its own children."""

    status: WorkflowStatus
    children: list[ChildNode] = field(default_factory=list)


@dataclass(frozen=True)
class QueueChart:
    """One queue's starts and completions per minute over the chart's window, as SVG
    bar geometry: a pair of bars per minute."""

    minutes: int
    peak: int
    bars: list[tuple[float, float, float, str, str]]
    total_started: int
    total_completed: int


CHART_WIDTH = 600
CHART_HEIGHT = 80


def queue_chart(activity: list[QueueMinute], now_ms: int, minutes: int) -> QueueChart:
    """The bars of one queue's chart: x, height, y, kind and a tooltip per bar."""
    first = (now_ms // MINUTE_MS - minutes + 1) * MINUTE_MS
    peak = max([1, *(a.started for a in activity), *(a.completed for a in activity)])
    bars = _paired_bars([((a.minute_epoch_ms - first) // MINUTE_MS, a.minute_epoch_ms,
                          (("started", a.started), ("completed", a.completed)))
                         for a in activity], minutes, peak)
    return QueueChart(minutes, peak, bars, sum(a.started for a in activity),
                      sum(a.completed for a in activity))


Bar = tuple[float, float, float, str, str]
"""x, height, y, kind (its CSS class) and tooltip of a chart's bar."""


def _paired_bars(slots: list[tuple[int, int, tuple[tuple[str, int], tuple[str, int]]]],
                 count: int, peak: int) -> list[Bar]:
    """A pair of bars (side by side) in each of ``count`` slots: (slot index, the slot's
    start in epoch ms, ((kind, value), (kind, value))) each; slots outside are dropped."""
    width = CHART_WIDTH / count
    bars = []
    for index, start_ms, pair in slots:
        if not 0 <= index < count:
            continue
        for offset, (kind, value) in zip((0.0, width / 2), pair, strict=True):
            if value:
                height = CHART_HEIGHT * value / peak
                bars.append((round(index * width + offset, 2), round(height, 2),
                             round(CHART_HEIGHT - height, 2), kind,
                             f"{when(start_ms)[:16]}: {value} {kind}"))
    return bars


# ---- The metrics page: throughput and failures, latency, queue depth ----


@dataclass(frozen=True)
class Window:
    """A metrics page's time window: ``slots`` intervals of ``bucket_seconds``."""

    name: str
    slots: int
    bucket_seconds: int

    @property
    def minutes(self) -> int:
        return self.slots * self.bucket_seconds // 60


WINDOWS = {"hour": Window("hour", 60, 60), "day": Window("day", 96, 900)}


@dataclass(frozen=True)
class ActivityChart:
    """One workflow name's finished workflows per interval: succeeded and failed bars."""

    name: str
    peak: int
    bars: list[Bar]
    succeeded: int
    failed: int


def activity_charts(activity: list[WorkflowActivity], now_ms: int,
                    window: Window) -> list[ActivityChart]:
    """A chart per workflow name, over the window ending with the current interval."""
    bucket_ms = window.bucket_seconds * 1000
    first = (now_ms // bucket_ms - window.slots + 1) * bucket_ms
    charts = []
    for name in sorted({a.name for a in activity}):
        mine = [a for a in activity if a.name == name]
        peak = max([1, *(a.succeeded for a in mine), *(a.failed for a in mine)])
        bars = _paired_bars([((a.start_epoch_ms - first) // bucket_ms, a.start_epoch_ms,
                              (("succeeded", a.succeeded), ("failed", a.failed)))
                             for a in mine], window.slots, peak)
        charts.append(ActivityChart(name, peak, bars, sum(a.succeeded for a in mine),
                                    sum(a.failed for a in mine)))
    return charts


@dataclass(frozen=True)
class LatencyRow:
    """One workflow name's run-time percentiles as bars: (label, width, text) each."""

    name: str
    count: int
    bars: list[tuple[str, float, str]]


LATENCY_BAR_WIDTH = 400


def latency_rows(aggregates: list[WorkflowAggregate]) -> list[LatencyRow]:
    """p50, p95 and p99 bars per name, on one scale (the longest p99 fills the width)."""
    timed = [a for a in aggregates if a.p99_ms is not None]
    longest = max([1.0, *(a.p99_ms or 0.0 for a in timed)])
    return [LatencyRow(a.name or "", a.count, [
        (label, round(LATENCY_BAR_WIDTH * (value or 0.0) / longest, 2), _ms(value or 0.0))
        for label, value in (("p50", a.p50_ms), ("p95", a.p95_ms), ("p99", a.p99_ms))])
        for a in timed]


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


@dataclass(frozen=True)
class DepthChart:
    """One queue's waiting workflows over time: the whole series as an SVG polyline, and
    its measured minutes (sampled by the executors, and the count now) as a path drawn
    over it."""

    queue_name: str
    peak: int
    points: str
    measured_path: str
    measured: int
    now: int


def depth_charts(history: list[QueueDepth]) -> list[DepthChart]:
    """One chart per queue of ``history`` (by queue, then time)."""
    charts = []
    for queue in sorted({h.queue_name for h in history}):
        mine = [h for h in history if h.queue_name == queue]
        peak = max([1, *(h.waiting for h in mine)])
        step = CHART_WIDTH / max(1, len(mine) - 1)
        xy = [f"{round(i * step, 2)},{round(CHART_HEIGHT - CHART_HEIGHT * h.waiting / peak, 2)}"
              for i, h in enumerate(mine)]
        path = []  # a run of measured minutes is one stroke, ending in a dot
        for i, h in enumerate(mine):
            if h.measured:
                path.append(("L" if i and mine[i - 1].measured else "M") + xy[i])
                if not (i + 1 < len(mine) and mine[i + 1].measured):
                    path.append("l0.01,0")
        charts.append(DepthChart(queue, peak, " ".join(xy), " ".join(path),
                                 sum(h.measured for h in mine), mine[-1].waiting))
    return charts
