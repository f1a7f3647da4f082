"""What dashboards read besides listings: event history, messages not yet received,
stream values, per-minute queue activity, each queue's oldest waiting workflow, and the
executors with what each runs. The operator's methods of the same names return these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dbos_async.executor.peer import Peer
from dbos_async.sysdb.statements import STREAM_CLOSED_SERIALIZED
from dbos_async.sysdb.statements.observability import MINUTE_MS


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
