"""What the console's pages show, shaped from the operator's reads: values as pretty JSON
(cut when large), the step timeline's geometry, the children tree and the queue chart."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dbos_async.errors import RecordedError
from dbos_async.executor.control import WorkflowStepInfo
from dbos_async.executor.handles import WorkflowStatus
from dbos_async.executor.observability import QueueMinute
from dbos_async.sysdb.statements.observability import MINUTE_MS

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
    finish = status.completed_at or (now_ms if status.status in ("PENDING", "ENQUEUED")
                                     else status.updated_at)
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
    slot = CHART_WIDTH / minutes
    bars = []
    for a in activity:
        index = (a.minute_epoch_ms - first) // MINUTE_MS
        if not 0 <= index < minutes:
            continue
        for offset, kind, count in ((0.0, "started", a.started),
                                    (slot / 2, "completed", a.completed)):
            if count:
                height = CHART_HEIGHT * count / peak
                bars.append((round(index * slot + offset, 2), round(height, 2),
                             round(CHART_HEIGHT - height, 2), kind,
                             f"{when(a.minute_epoch_ms)[:16]}: {count} {kind}"))
    return QueueChart(minutes, peak, bars, sum(a.started for a in activity),
                      sum(a.completed for a in activity))
