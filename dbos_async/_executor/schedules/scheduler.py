"""The scheduler: one task per executor firing every active schedule of its application.

It keeps the next time of each schedule in a heap and sleeps until the earliest (or until
the next re-read of the definitions, or until a dbos_async writer announces a change), so
between re-reads it sends no statement. Firing is
:func:`~dbos_async._executor.schedules.definition.fire`:
several executors firing one time insert one workflow under one ID, so each time runs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dbos_async._executor.runtime import Runtime
from dbos_async._executor.schedules import definition
from dbos_async._sysdb.clock import epoch_ms, now_utc
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async._sysdb.statements.schedules import ACTIVE, ScheduleRecord
from dbos_async.errors import ScheduleError

logger = logging.getLogger("dbos_async")

BACKFILL_LIMIT = 1000
"""The most missed times an automatic backfill fires per schedule (the latest ones)."""

BACKFILL_WINDOW = timedelta(days=7)
"""How far back an automatic backfill looks."""


@dataclass(order=True)
class _Due:
    time: datetime
    name: str
    generation: int


def _definition(record: ScheduleRecord) -> tuple[Any, ...]:
    """What, changed, makes the scheduler recompute a schedule's times."""
    return (record.workflow_name, record.workflow_class_name, record.schedule,
            record.context, record.cron_timezone, record.queue_name, record.shard_key)


class Scheduler:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._changed = asyncio.Event()
        self._records: dict[str, ScheduleRecord] = {}
        self._generation: dict[str, int] = {}
        self._heap: list[_Due] = []
        self._backfilled: set[str] = set()
        self._unreadable: dict[str, ScheduleRecord] = {}

    def start(self) -> None:
        notifications = self._runtime.system_database.notifications
        if notifications is not None:
            notifications.subscribe(ENQUEUE_CHANNEL, self._on_notification)
        self._runtime.background.supervise(self._run, "scheduler")

    def _on_notification(self, key: str) -> None:
        if key == definition.SCHEDULES_CHANGED_KEY:
            self._changed.set()

    async def _run(self) -> None:
        interval = self._runtime.config.schedule_reread_interval
        clock = self._runtime.system_database.clock
        while True:
            self._changed.clear()
            try:
                await self._reread()
            except Exception:
                logger.exception("Reading the schedules failed; retrying")
            # Re-reads look for other writers' changes: real time. Fire times are durable
            # time: on the clock.
            loop = asyncio.get_running_loop()
            reread_at = loop.time() + interval
            while not self._changed.is_set() and loop.time() < reread_at:
                if self._heap and self._heap[0].time <= now_utc(clock):
                    await self._fire_due()
                    continue
                due = epoch_ms(self._heap[0].time) if self._heap else None
                with contextlib.suppress(TimeoutError):
                    async with clock.wait_until(due, max(0.0, reread_at - loop.time())):
                        await self._changed.wait()

    async def _reread(self) -> None:
        records = {r.schedule_name: r for r in
                   await self._runtime.system_database.list_schedules(status=ACTIVE)}
        now = now_utc(self._runtime.system_database.clock)
        for name, record in records.items():
            old = self._records.get(name)
            if old is not None and _definition(old) == _definition(record):
                self._records[name] = record
                continue
            try:
                next_time = next(definition.times_after(record, now))
            except ScheduleError:
                # Stored by another writer with a cron expression or time zone this
                # library cannot read: skipped (logged once per definition), others fire.
                if self._unreadable.get(name) != record:
                    logger.error("Schedule %s cannot be fired: cron %r, time zone %r",
                                 name, record.schedule, record.cron_timezone)
                self._unreadable[name] = record
                self._forget(name)
                continue
            if name not in self._backfilled:
                await self._backfill(record, now)
                self._backfilled.add(name)  # once done: a failed backfill is retried
            self._records[name] = record
            self._push(name, next_time)
        for name in set(self._records) - set(records):
            self._forget(name)

    def _forget(self, name: str) -> None:
        """Stop firing ``name`` (its entries left in the heap are superseded)."""
        self._records.pop(name, None)
        self._generation[name] = self._generation.get(name, 0) + 1

    async def _backfill(self, record: ScheduleRecord, now: datetime) -> None:
        """Fire the times missed since the schedule last fired, bounded (see
        :data:`BACKFILL_LIMIT` and :data:`BACKFILL_WINDOW`)."""
        if not record.automatic_backfill or record.last_fired_at is None:
            return
        since = max(datetime.fromisoformat(record.last_fired_at), now - BACKFILL_WINDOW)
        missed = definition.times_between(record, since, now)[-BACKFILL_LIMIT:]
        for time in missed:
            await definition.fire(self._runtime, self._runtime.executor_id, record, time)

    def _push(self, name: str, time: datetime) -> None:
        generation = self._generation.get(name, 0) + 1
        self._generation[name] = generation
        heapq.heappush(self._heap, _Due(time, name, generation))

    async def _fire_due(self) -> None:
        due = heapq.heappop(self._heap)
        if self._generation.get(due.name) != due.generation:
            return  # Superseded: the schedule changed, was paused or deleted.
        record = self._records[due.name]
        try:
            await definition.fire(self._runtime, self._runtime.executor_id, record, due.time)
        except Exception:
            logger.exception("Firing schedule %s at %s failed", due.name, due.time)
        self._push(due.name, next(definition.times_after(record, due.time)))
