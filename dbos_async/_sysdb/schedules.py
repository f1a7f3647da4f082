"""Operations on cron schedules: writing definitions, and firing a time, which starts its
workflow and records ``last_fired_at`` in one transaction."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from dbos_async._sysdb.core import DatabaseCore
from dbos_async._sysdb.statements.schedules import ACTIVE, PAUSED, ScheduleRecord, schedule_record
from dbos_async.errors import ScheduleError


class ScheduleOperations(DatabaseCore):
    async def create_schedule(self, record: ScheduleRecord) -> None:
        query = self.sql.insert_schedule(record)
        try:
            await self._execute(query, "creating a schedule")
        except asyncpg.UniqueViolationError:
            raise ScheduleError(
                f"Schedule {record.schedule_name!r} already exists") from None

    async def apply_schedules(self, records: Sequence[ScheduleRecord]) -> None:
        """Create or update every schedule given, all or none."""
        queries = [self.sql.upsert_schedule(r) for r in records]

        async def run() -> None:
            async with self.locking_transaction() as conn:
                for record, q in zip(records, queries, strict=True):
                    owner = await conn.fetchval(q.sql, *q.params)
                    self._check_owner("Schedule", record.schedule_name, owner)

        await self._retried("applying schedules", run)

    async def list_schedules(self, names: list[str] | None = None, prefix: str | None = None,
                             status: str | None = None) -> list[ScheduleRecord]:
        rows = await self._fetch(self.sql.list_schedules(names, prefix, status),
                                 "listing schedules")
        return [schedule_record(r) for r in rows]

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        row = await self._fetchrow(self.sql.get_schedule(name), "reading a schedule")
        return schedule_record(row) if row is not None else None

    async def delete_schedule(self, name: str) -> bool:
        """Delete a schedule; False if there was none of that name."""
        row = await self._fetchrow(self.sql.delete_schedule(name), "deleting a schedule")
        return row is not None

    async def set_schedule_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume a schedule; False if there is none of that name."""
        row = await self._fetchrow(self.sql.set_schedule_status(name, PAUSED if paused
                                                                else ACTIVE),
                                   "pausing or resuming a schedule")
        return row is not None
