"""Cron schedules: their public shape, validation, the fired times, and firing one.

A fired time has one workflow ID, ``sched-{schedule name}-{time in ISO 8601, in the
schedule's time zone}`` (the ``dbos`` package's scheme), so every executor firing the same
time addresses the same workflow and only the first insert starts it. The workflow receives
``(scheduled_time, context)``.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dbos_async._executor.peer import Peer
from dbos_async._executor.queues.enqueue import announcement_key
from dbos_async._executor.serialization import dumps, to_json_value
from dbos_async._executor.start import CallContext, Placement, plan_start
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async._sysdb.shard_keys import validate_shard_key
from dbos_async._sysdb.statements import INTERNAL_QUEUE_NAME, Payload
from dbos_async._sysdb.statements.schedules import ACTIVE, ScheduleRecord
from dbos_async._validation import check_identifier, check_lookup, reported_as
from dbos_async.errors import ScheduleError

TRIGGER_TAG = "trigger"

SCHEDULES_CHANGED_KEY = "dbos_async:schedules"
"""ENQUEUE_CHANNEL payload announcing a changed schedule (wakes every scheduler)."""


@dataclass(frozen=True)
class WorkflowSchedule:
    """A stored schedule, as listed and returned."""

    schedule_id: str
    schedule_name: str
    workflow_name: str
    workflow_class_name: str | None
    schedule: str
    status: str
    context: Any
    last_fired_at: datetime | None
    automatic_backfill: bool
    cron_timezone: str | None
    queue_name: str | None
    application_name: str | None
    shard_key: str | None = None

    @property
    def paused(self) -> bool:
        return self.status != ACTIVE

    def next_fire_times(self, count: int = 1) -> list[datetime]:
        """The next ``count`` times this schedule fires from now (whether paused or not),
        in its time zone."""
        times = cron_times_after(self.schedule, self.cron_timezone, datetime.now(UTC))
        return [next(times) for _ in range(count)]


def public_schedule(record: ScheduleRecord) -> WorkflowSchedule:
    return WorkflowSchedule(
        schedule_id=record.schedule_id, schedule_name=record.schedule_name,
        workflow_name=record.workflow_name, workflow_class_name=record.workflow_class_name,
        schedule=record.schedule, status=record.status, context=_context(record),
        last_fired_at=(datetime.fromisoformat(record.last_fired_at)
                       if record.last_fired_at else None),
        automatic_backfill=record.automatic_backfill, cron_timezone=record.cron_timezone,
        queue_name=record.queue_name, application_name=record.application_name,
        shard_key=record.shard_key)


def _context(record: ScheduleRecord) -> Any:
    """The schedule's context; one another library stored in a format this one does not
    read comes back as its stored text rather than failing the listing."""
    try:
        return json.loads(record.context)
    except ValueError:
        return record.context


def zone_of(name: str | None) -> tzinfo:
    """The time zone a schedule's cron expression is read in (UTC when none is named)."""
    if name is None:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"Unknown time zone {name!r} (use an IANA name such as "
                            "'America/New_York')") from None


def check_cron(cron: str) -> None:
    """Raise unless ``cron`` has 5 fields, or 6 with seconds first."""
    from croniter import croniter  # imported where needed: it slows importing dbos_async

    if not isinstance(cron, str) or not croniter.is_valid(cron, second_at_beginning=True):
        raise ScheduleError(f"Invalid cron expression {cron!r}: give 5 fields (minute hour "
                            "day month weekday) or 6 with seconds first")


def times_after(record: ScheduleRecord, after: datetime) -> Iterator[datetime]:
    """The schedule's times strictly after ``after``, in its time zone, in order (a stored
    definition this library cannot read raises :class:`ScheduleError`)."""
    return cron_times_after(record.schedule, record.cron_timezone, after)


def cron_times_after(cron: str, timezone_name: str | None,
                     after: datetime) -> Iterator[datetime]:
    """The times of ``cron`` in ``timezone_name`` (None: UTC) strictly after ``after``."""
    from croniter import croniter

    check_cron(cron)
    it = croniter(cron, after.astimezone(zone_of(timezone_name)), second_at_beginning=True)
    while True:
        yield it.get_next(datetime)


def times_between(record: ScheduleRecord, start: datetime, end: datetime) -> list[datetime]:
    """The schedule's times in the open window (``start``, ``end``)."""
    found: list[datetime] = []
    for time in times_after(record, aware(start)):
        if time >= aware(end):
            return found
        found.append(time)
    return found


def aware(moment: datetime) -> datetime:
    """A naive datetime read as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def fired_workflow_id(schedule_name: str, time: datetime) -> str:
    return f"sched-{schedule_name}-{time.isoformat()}"


def new_record(name: str, workflow_name: str, class_name: str | None, cron: str,
               context: Any, timezone_name: str | None, queue: str | None,
               automatic_backfill: bool, shard_key: str | None) -> ScheduleRecord:
    """A validated new schedule row (raises :class:`ScheduleError` before anything is
    stored)."""
    with reported_as(ScheduleError):
        check_identifier(name, "schedule name")
        check_identifier(workflow_name, "schedule's workflow name")
        check_identifier(class_name, "schedule's workflow class name", optional=True)
        check_lookup(queue, "schedule's queue name")
        validate_shard_key(shard_key)
    check_cron(cron)
    zone_of(timezone_name)
    return ScheduleRecord(
        schedule_id=str(uuid.uuid4()), schedule_name=name, workflow_name=workflow_name,
        workflow_class_name=class_name, schedule=cron, status=ACTIVE,
        context=dumps(to_json_value(context, "the schedule's context"),
                      f"the context of schedule {name}"),
        last_fired_at=None, automatic_backfill=automatic_backfill,
        cron_timezone=timezone_name, queue_name=queue, application_name=None,
        shard_key=shard_key)


async def fire(peer: Peer, executor_id: str, record: ScheduleRecord, time: datetime,
               triggered: bool = False) -> str:
    """Enqueue the schedule's workflow for ``time`` under its deterministic ID and record
    the time as fired, in one transaction. Returns the ID. A ``triggered`` run (fired by
    hand, off the cron times) has an ID of its own and leaves ``last_fired_at`` alone, so
    it never hides a missed time from a backfill."""
    name = record.schedule_name
    workflow_id = fired_workflow_id(f"{name}-{TRIGGER_TAG}" if triggered else name, time)
    inputs = dumps({"positionalArgs": [time.isoformat(), _context(record)], "namedArgs": {}},
                   f"the inputs of {record.workflow_name}")
    # Portable JSON whatever the firing peer writes: schedules are shared with every SDK.
    plan = plan_start(CallContext(workflow_id=workflow_id, shard_key=record.shard_key),
                      name=record.workflow_name, inputs=Payload(inputs), executor_id=executor_id,
                      application_version=None, now_ms=peer.system_database.clock.now_ms(),
                      placement=Placement(record.queue_name or INTERNAL_QUEUE_NAME),
                      class_name=record.workflow_class_name)
    # The schedule recorded on the row (for list_workflows(schedule_name=...)), as DBOS does.
    row = dataclasses.replace(plan.row, schedule_name=name)
    await peer.system_database.fire_schedule(
        None if triggered else name, time.isoformat(), int(time.timestamp() * 1000), row,
        plan.creator_xid, announce=(ENQUEUE_CHANNEL, announcement_key(plan.row)))
    return workflow_id


async def stored(peer: Peer, name: str) -> ScheduleRecord:
    check_lookup(name, "schedule name")
    record = await peer.system_database.get_schedule(name)
    if record is None:
        raise ScheduleError(f"Schedule {name!r} does not exist")
    return record
