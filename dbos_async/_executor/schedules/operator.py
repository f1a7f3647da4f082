"""The schedule operations an executor and a client share (mixed into
:class:`~dbos_async._executor.operator.Operator`): create, list, get, delete, pause,
resume, apply, trigger and backfill, over rows of ``workflow_schedules``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dbos_async._executor.handles import WorkflowHandle, workflow_handle
from dbos_async._executor.peer import Peer
from dbos_async._executor.queues.declaration import Queue
from dbos_async._executor.registry import WorkflowInfo
from dbos_async._executor.schedules import definition
from dbos_async._executor.schedules.definition import WorkflowSchedule, public_schedule
from dbos_async._sysdb.clock import now_utc
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async._sysdb.statements.schedules import ScheduleRecord
from dbos_async._validation import check_lookup
from dbos_async.errors import ScheduleError

if TYPE_CHECKING:
    from dbos_async._executor.context import WorkflowContext

ScheduledWorkflow = str | Callable[..., Any]
"""A workflow a schedule runs: its registered name, or (on an executor) the workflow."""


def check_scheduled_signature(info: WorkflowInfo) -> None:
    """Raise unless the workflow takes ``(scheduled_time, context)`` positionally."""
    positional = [p for p in info.signature.parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in info.signature.parameters
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if info.is_method or len(positional) < 2 or len(required) > 2:
        raise ScheduleError(f"Workflow {info.name!r} cannot be scheduled: a scheduled "
                            "workflow is a function taking (scheduled_time, context)")


@dataclass(frozen=True)
class ScheduleDefinition:
    """One schedule of :meth:`ScheduleOperator.apply_schedules`."""

    name: str
    workflow: ScheduledWorkflow
    cron: str
    context: Any = None
    timezone: str | None = None
    queue: str | Queue | None = None
    automatic_backfill: bool = False
    shard_key: str | None = None


class ScheduleOperator:
    """Schedule operations; the hooks say what runs them and how a workflow is named."""

    def _peer(self, during_shutdown: bool = False) -> Peer:
        raise NotImplementedError

    def _firing_executor_id(self) -> str:
        """The executor ID a workflow fired by hand is recorded with."""
        raise NotImplementedError

    def _scheduled_workflow(self, workflow: ScheduledWorkflow) -> tuple[str, str | None]:
        """The (name, class name) a schedule stores for ``workflow``; raises
        :class:`ScheduleError` for one that cannot be scheduled."""
        if isinstance(workflow, str) and workflow:
            return workflow, None
        raise ScheduleError("Name the scheduled workflow by its registered name")

    def _contexts(self) -> tuple[WorkflowContext | None, WorkflowContext | None]:
        return None, None

    def _writing(self, what: str) -> Peer:
        """The peer a schedule write runs on. A workflow body may not write: the write is
        not a checkpoint, so a replay would repeat it; a step may."""
        body, _ = self._contexts()
        if body is not None:
            raise ScheduleError(f"{what} is not checkpointed: call it from a step, not from "
                                "a workflow body")
        return self._peer()

    def _schedules_changed(self) -> None:
        """Announce a committed write to schedules: the schedulers of this process and of
        every other one listening re-read them at once."""
        self._peer().system_database.notify(ENQUEUE_CHANNEL,
                                            definition.SCHEDULES_CHANGED_KEY)

    async def _check_queues(self, records: Sequence[ScheduleRecord]) -> None:
        """Raise unless every queue the schedules name is stored (declared)."""
        named = sorted({r.queue_name for r in records if r.queue_name is not None})
        if not named:
            return
        stored = {q.name for q in await self._peer().system_database.list_queues(named)}
        missing = [name for name in named if name not in stored]
        if missing:
            raise ScheduleError(f"Queue {missing[0]!r} is not declared: declare it "
                                "(dbos.queue(...) or DBOSClient.register_queue(...)) "
                                "before scheduling workflows on it")

    def _record(self, d: ScheduleDefinition) -> ScheduleRecord:
        name, class_name = self._scheduled_workflow(d.workflow)
        queue = d.queue.name if isinstance(d.queue, Queue) else d.queue
        return definition.new_record(d.name, name, class_name, d.cron, d.context, d.timezone,
                                    queue, d.automatic_backfill, d.shard_key)

    async def create_schedule(self, name: str, workflow: ScheduledWorkflow, cron: str,
                              context: Any = None, timezone: str | None = None,
                              queue: str | Queue | None = None,
                              automatic_backfill: bool = False,
                              shard_key: str | None = None) -> WorkflowSchedule:
        """Store a new schedule running ``workflow(scheduled_time, context)`` at each time
        of ``cron`` (5 fields, or 6 with seconds first) read in ``timezone`` (an IANA name;
        UTC by default), enqueued on ``queue`` (the internal queue by default).
        ``automatic_backfill``: times missed while no executor ran fire at the next start.
        Raises :class:`ScheduleError` (nothing stored) for a bad definition or a taken name."""
        record = self._record(ScheduleDefinition(name, workflow, cron, context, timezone,
                                                 queue, automatic_backfill, shard_key))
        await self._check_queues([record])
        sysdb = self._writing("create_schedule").system_database
        await sysdb.create_schedule(record)
        self._schedules_changed()
        return public_schedule(await definition.stored(self._peer(), name))

    async def apply_schedules(self, definitions: Sequence[ScheduleDefinition]
                              ) -> list[WorkflowSchedule]:
        """Create the schedules given, or update their definitions (keeping their status
        and last fired time), all in one transaction; schedules not given are left as
        they are. Every definition is validated before anything is written."""
        records = [self._record(d) for d in definitions]
        names = [r.schedule_name for r in records]
        if len(set(names)) != len(names):
            raise ScheduleError("apply_schedules was given one schedule name twice")
        await self._check_queues(records)
        sysdb = self._writing("apply_schedules").system_database
        await sysdb.apply_schedules(records)
        self._schedules_changed()
        return [public_schedule(r) for r in await sysdb.list_schedules(names=names)]

    async def list_schedules(self, *, status: str | None = None,
                             name_prefix: str | None = None) -> list[WorkflowSchedule]:
        """This application's schedules (and unclaimed ones), by name; ``status`` is
        ``"ACTIVE"`` or ``"PAUSED"``."""
        check_lookup(name_prefix, "name_prefix")
        check_lookup(status, "status")
        records = await self._peer().system_database.list_schedules(prefix=name_prefix,
                                                                    status=status)
        return [public_schedule(r) for r in records]

    async def get_schedule(self, name: str) -> WorkflowSchedule | None:
        check_lookup(name, "schedule name")
        record = await self._peer().system_database.get_schedule(name)
        return public_schedule(record) if record is not None else None

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule (its fired workflows stay); unknown names raise."""
        check_lookup(name, "schedule name")
        if not await self._writing("delete_schedule").system_database.delete_schedule(name):
            raise ScheduleError(f"Schedule {name!r} does not exist")
        self._schedules_changed()

    async def pause_schedule(self, name: str) -> None:
        """Stop firing a schedule until it is resumed (times in between are not fired,
        unless a backfill fires them)."""
        await self._set_paused(name, True)

    async def resume_schedule(self, name: str) -> None:
        await self._set_paused(name, False)

    async def _set_paused(self, name: str, paused: bool) -> None:
        check_lookup(name, "schedule name")
        sysdb = self._writing("pause_schedule" if paused else "resume_schedule").system_database
        if not await sysdb.set_schedule_paused(name, paused):
            raise ScheduleError(f"Schedule {name!r} does not exist")
        self._schedules_changed()

    async def trigger_schedule(self, name: str) -> WorkflowHandle[Any]:
        """Fire a schedule now, off its cron times (a paused one too)."""
        peer = self._writing("trigger_schedule")
        record = await definition.stored(peer, name)
        workflow_id = await definition.fire(peer, self._firing_executor_id(), record,
                                           now_utc(peer.system_database.clock),
                                           triggered=True)
        return workflow_handle(peer, workflow_id, shard_key=record.shard_key)

    async def backfill_schedule(self, name: str, start: datetime,
                                end: datetime) -> list[WorkflowHandle[Any]]:
        """Fire every time of the schedule strictly between ``start`` and ``end`` (naive
        datetimes are UTC). Each time has its deterministic workflow ID, so times fired
        already, by the scheduler or an earlier backfill, are not run again."""
        peer = self._writing("backfill_schedule")
        record = await definition.stored(peer, name)
        handles: list[WorkflowHandle[Any]] = []
        for time in definition.times_between(record, start, end):
            workflow_id = await definition.fire(peer, self._firing_executor_id(), record, time)
            handles.append(workflow_handle(peer, workflow_id, shard_key=record.shard_key))
        return handles
