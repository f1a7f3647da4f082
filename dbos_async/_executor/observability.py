"""What dashboards read besides listings: event history, messages not yet received,
stream values, per-minute queue activity, each queue's oldest waiting workflow, the
executors with what each runs, and the aggregates of metrics (workflows and steps counted
over a time range with their duration percentiles, queue depths). The operator's methods
of the same names return these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from dbos_async._executor.management.control import TimeBound, epoch_ms
from dbos_async._executor.peer import Peer
from dbos_async._sysdb.statements import STREAM_CLOSED_SERIALIZED
from dbos_async._sysdb.statements.observability import MINUTE_MS, TIME_COLUMNS, WORKFLOW_GROUPS
from dbos_async.errors import InvalidArgumentError


@dataclass(frozen=True)
class EventChange:
    """One value an event was set to, by the step (``function_id``) that set it."""

    function_id: int
    key: str
    value: Any


@dataclass(frozen=True)
class PendingMessage:
    """A message sent to a workflow that it has not received yet."""

    message_id: str
    topic: str | None
    value: Any
    created_at: int


@dataclass(frozen=True)
class StreamValue:
    """One value of a workflow's stream ``key``, at ``offset``; or, with ``closed``, the
    mark that the stream was closed there (its ``value`` None)."""

    key: str
    offset: int
    value: Any
    closed: bool = False


@dataclass(frozen=True)
class QueueMinute:
    """How many of a queue's workflows started and finished in the minute beginning at
    ``minute_epoch_ms``."""

    queue_name: str
    minute_epoch_ms: int
    started: int = 0
    completed: int = 0


@dataclass(frozen=True)
class WaitingWorkflow:
    """A queue's oldest workflow still waiting to start."""

    queue_name: str
    workflow_id: str
    name: str
    status: str
    created_at: int
    shard_key: str | None = None


async def event_history(peer: Peer, workflow_id: str, limit: int) -> list[EventChange]:
    rows = await peer.system_database.event_history(workflow_id, limit)
    return [EventChange(r["function_id"], r["key"],
                        peer.formats.decode(r["value"], r["serialization"],
                                            f"event {r['key']!r}"))
            for r in rows]


async def unconsumed_messages(peer: Peer, workflow_id: str,
                              limit: int) -> list[PendingMessage]:
    rows = await peer.system_database.unconsumed_messages(workflow_id, limit)
    return [PendingMessage(r["message_uuid"], r["topic"],
                           peer.formats.decode(r["message"], r["serialization"], "a message"),
                           r["created_at_epoch_ms"])
            for r in rows]


async def stream_values(peer: Peer, workflow_id: str, limit: int) -> list[StreamValue]:
    rows = await peer.system_database.stream_values(workflow_id, limit)
    return [StreamValue(r["key"], r["stream_offset"], None, closed=True)
            if r["value"] == STREAM_CLOSED_SERIALIZED
            else StreamValue(r["key"], r["stream_offset"],
                             peer.formats.decode(r["value"], r["serialization"],
                                                 f"stream {r['key']!r}"))
            for r in rows]


async def queue_activity(peer: Peer, minutes: int) -> list[QueueMinute]:
    """Per queue, the minutes of the last ``minutes`` in which any workflow started or
    finished, oldest first."""
    since = (peer.system_database.clock.now_ms() // MINUTE_MS - minutes + 1) * MINUTE_MS
    counts: dict[tuple[str, int], dict[str, int]] = {}
    for r in await peer.system_database.queue_activity(since):
        counts.setdefault((r["queue_name"], r["minute"] * MINUTE_MS), {})[r["kind"]] = (
            r["workflows"])
    return [QueueMinute(queue, minute, c.get("started", 0), c.get("completed", 0))
            for (queue, minute), c in sorted(counts.items())]


async def oldest_waiting(peer: Peer) -> dict[str, WaitingWorkflow]:
    rows = await peer.system_database.oldest_waiting()
    return {r["queue_name"]: WaitingWorkflow(
        r["queue_name"], r["workflow_uuid"], r["name"], r["status"], r["created_at"],
        r.get("shard_key")) for r in rows}


@dataclass(frozen=True)
class RunningWorkflow:
    """A PENDING workflow an executor owns."""

    workflow_id: str
    name: str
    shard_key: str | None = None


@dataclass(frozen=True)
class ExecutorActivity:
    """An executor of the system database: whether its process is alive (it holds its
    executor-ID lock, which PostgreSQL frees when the process's session ends) and the
    PENDING workflows it owns (``pending`` of them, the oldest in ``running``)."""

    executor_id: str
    application_name: str | None
    alive: bool
    pending: int
    running: list[RunningWorkflow]


async def executors(peer: Peer, recent_minutes: int, shown: int) -> list[ExecutorActivity]:
    """The executors owning PENDING workflows or having started one in the last
    ``recent_minutes``; alive ones first, then by ID."""
    sysdb = peer.system_database
    since = sysdb.clock.now_ms() - recent_minutes * MINUTE_MS
    pending = {(r["application_name"], r["executor_id"]): r
               for r in await sysdb.pending_by_executor(shown)}
    seen = {(r["application_name"], r["executor_id"])
            for r in await sysdb.executors_seen_since(since)}
    held = await sysdb.held_advisory_keys()
    found = []
    for app, executor_id in set(pending) | seen:
        if executor_id is None:
            continue
        row = pending.get((app, executor_id))
        running = ([RunningWorkflow(*entry) for entry in zip(
            row["workflow_ids"], row["names"], row["shard_keys"], strict=True)]
            if row is not None else [])
        key = sysdb.sql.executor_lock_key(executor_id, app) & 0xFFFF_FFFF_FFFF_FFFF
        found.append(ExecutorActivity(executor_id, app, key in held,
                                      row["pending"] if row is not None else 0, running))
    return sorted(found, key=lambda e: (not e.alive, e.executor_id, e.application_name or ""))


# ---- Aggregates: what metrics dashboards and alerts read from the database ----


@dataclass(frozen=True)
class Durations:
    """The distribution of durations (milliseconds) of the finished ones among ``count``
    rows: None where none has finished."""

    count: int
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class WorkflowAggregate(Durations):
    """The workflows of one group: the columns grouped by hold the group's values (None
    for a NULL column), the others are None."""

    status: str | None = None
    name: str | None = None
    queue_name: str | None = None
    application_version: str | None = None
    executor_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class StepAggregate(Durations):
    """The steps of one name and outcome (``SUCCESS`` or ``ERROR``)."""

    name: str
    outcome: str


@dataclass(frozen=True)
class QueueMetrics:
    """A queue's backlog now: its workflows by status and its oldest one waiting to start
    (``oldest_waiting_ms``: how long it has waited, by the system database's clock)."""

    queue_name: str
    delayed: int
    enqueued: int
    pending: int
    oldest_waiting_id: str | None
    oldest_waiting_ms: int | None


@dataclass(frozen=True)
class MetricData:
    """One number of :meth:`get_metrics`: ``workflow_count`` or ``step_count`` of the
    workflow or step named ``metric_name``."""

    metric_type: str
    metric_name: str
    value: int


DEFAULT_RANGE_MS = 60 * MINUTE_MS
"""The time range of an aggregate given no start: the last hour."""


def _range(peer: Peer, start_time: TimeBound | None,
           end_time: TimeBound | None) -> tuple[int, int]:
    """[start, end) in epoch milliseconds; the end defaults to now and the start to an
    hour before the end."""
    end = epoch_ms(end_time, "end_time")
    end = peer.system_database.clock.now_ms() if end is None else end
    start = epoch_ms(start_time, "start_time")
    start = end - DEFAULT_RANGE_MS if start is None else start
    if start >= end:
        raise InvalidArgumentError("start_time", f"{start} ms is not before the end, {end} ms")
    return start, end


def _durations(row: asyncpg.Record, count_column: str) -> dict[str, Any]:
    percentiles = row["percentiles"] or [None, None, None]
    return {"count": row[count_column], "mean_ms": row["mean_ms"], "p50_ms": percentiles[0],
            "p95_ms": percentiles[1], "p99_ms": percentiles[2]}


def check_group_by(group_by: str | Sequence[str]) -> tuple[str, ...]:
    """The workflow columns to group by, each one of :data:`WORKFLOW_GROUPS`."""
    names = (group_by,) if isinstance(group_by, str) else tuple(group_by)
    for name in names:
        if name not in WORKFLOW_GROUPS:
            raise InvalidArgumentError(
                "group_by", f"{name!r} is not one of {', '.join(WORKFLOW_GROUPS)}")
    return names


async def workflow_aggregates(peer: Peer, group_by: str | Sequence[str],
                              start_time: TimeBound | None, end_time: TimeBound | None,
                              time_column: str) -> list[WorkflowAggregate]:
    groups = check_group_by(group_by)
    if time_column not in TIME_COLUMNS:
        raise InvalidArgumentError("time_column",
                                   f"{time_column!r} is not one of {', '.join(TIME_COLUMNS)}")
    start, end = _range(peer, start_time, end_time)
    rows = await peer.system_database.workflow_aggregates(groups, time_column, start, end)
    return [WorkflowAggregate(**_durations(r, "workflows"),
                              **{g: r[g] for g in WORKFLOW_GROUPS})
            for r in rows if r["workflows"]]


async def step_aggregates(peer: Peer, start_time: TimeBound | None,
                          end_time: TimeBound | None) -> list[StepAggregate]:
    start, end = _range(peer, start_time, end_time)
    rows = await peer.system_database.step_aggregates(start, end)
    return [StepAggregate(**_durations(r, "steps"), name=r["name"], outcome=r["outcome"])
            for r in rows]


async def queue_metrics(peer: Peer) -> list[QueueMetrics]:
    sysdb = peer.system_database
    depths = await sysdb.queue_depths()
    oldest = await oldest_waiting(peer)
    now = sysdb.clock.now_ms()
    found = []
    for queue in sorted(set(depths) | set(oldest)):
        counts = depths.get(queue, {})
        waiting = oldest.get(queue)
        found.append(QueueMetrics(
            queue, counts.get("DELAYED", 0), counts.get("ENQUEUED", 0), counts.get("PENDING", 0),
            waiting.workflow_id if waiting else None,
            max(0, now - waiting.created_at) if waiting else None))
    return found


async def metrics(peer: Peer, start_time: TimeBound,
                  end_time: TimeBound) -> list[MetricData]:
    """How many workflows (by name) were created and how many steps (by name) completed
    in the range."""
    workflows = await workflow_aggregates(peer, ("name",), start_time, end_time, "created")
    steps: dict[str, int] = {}
    for step in await step_aggregates(peer, start_time, end_time):
        steps[step.name] = steps.get(step.name, 0) + step.count
    return ([MetricData("workflow_count", w.name or "", w.count) for w in workflows]
            + [MetricData("step_count", name, count) for name, count in steps.items()])


@dataclass(frozen=True)
class WorkflowActivity:
    """How many workflows named ``name`` finished in the interval beginning at
    ``start_epoch_ms``: in all (cancelled ones included), succeeded, and failed (ERROR or
    out of recovery attempts)."""

    name: str
    start_epoch_ms: int
    finished: int
    succeeded: int
    failed: int


@dataclass(frozen=True)
class QueueDepth:
    """How many of a queue's workflows waited to start (ENQUEUED or DELAYED) at the end
    of the minute beginning at ``minute_epoch_ms`` (now, for the current minute);
    ``measured``: counted (an executor's sample of that minute, or the count now) rather
    than worked back."""

    queue_name: str
    minute_epoch_ms: int
    waiting: int
    measured: bool = False


async def workflow_activity(peer: Peer, start_time: TimeBound | None,
                            end_time: TimeBound | None,
                            bucket_seconds: int) -> list[WorkflowActivity]:
    if (not isinstance(bucket_seconds, int) or isinstance(bucket_seconds, bool)
            or bucket_seconds < 1):
        raise InvalidArgumentError("bucket_seconds",
                                   f"must be a positive integer, not {bucket_seconds!r}")
    start, end = _range(peer, start_time, end_time)
    bucket_ms = bucket_seconds * 1000
    rows = await peer.system_database.workflow_activity(start, end, bucket_ms)
    return [WorkflowActivity(r["name"], r["bucket"] * bucket_ms, r["finished"],
                             r["succeeded"], r["failed"]) for r in rows]


async def queue_depth_history(peer: Peer, minutes: int) -> list[QueueDepth]:
    """Each queue's waiting workflows at the end of each of the last ``minutes`` minutes,
    oldest first. The current minute's is the count now; a minute an executor sampled
    (``dbos_async/_executor/queues/depth_samples.py``) is its sample; any other is worked
    back from the next measured minute: less the arrivals (enqueues) after it, plus the
    starts after it (a waiting workflow cancelled or deleted since that measure is not
    counted back)."""
    sysdb = peer.system_database
    now = sysdb.clock.now_ms()
    last = now // MINUTE_MS
    first = last - minutes + 1
    waiting_now = {queue: counts.get("ENQUEUED", 0) + counts.get("DELAYED", 0)
                   for queue, counts in (await sysdb.queue_depths()).items()}
    changes: dict[tuple[str, int], int] = {}  # arrivals minus starts, per queue and minute
    for r in await sysdb.queue_arrivals(first * MINUTE_MS):
        key = (r["queue_name"], r["minute"])
        changes[key] = changes.get(key, 0) + r["workflows"]
    for r in await sysdb.queue_activity(first * MINUTE_MS):
        if r["kind"] == "started":
            key = (r["queue_name"], r["minute"])
            changes[key] = changes.get(key, 0) - r["workflows"]
    samples = {(r["queue_name"], r["minute"]): r["waiting"]
               for r in await sysdb.depth_samples(first * MINUTE_MS)}
    found: list[QueueDepth] = []
    for queue in sorted(set(waiting_now) | {q for q, _ in changes} | {q for q, _ in samples}):
        waiting = waiting_now.get(queue, 0)
        series = [QueueDepth(queue, last * MINUTE_MS, waiting, True)]
        for minute in range(last - 1, first - 1, -1):
            waiting -= changes.get((queue, minute + 1), 0)
            sample = samples.get((queue, minute))
            if sample is None:
                series.append(QueueDepth(queue, minute * MINUTE_MS, max(0, waiting)))
            else:
                waiting = sample
                series.append(QueueDepth(queue, minute * MINUTE_MS, sample, True))
        found += reversed(series)
    return found
