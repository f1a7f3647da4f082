"""Statements of cron schedules stored in ``workflow_schedules``.

A schedule is one global row, whichever shard key its workflows run under; on a sharded
schema that key is the row's ``workflow_shard_key``. Rows belong to an application like
queues and versions: a named application lists its own and unclaimed ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dbos_async._sysdb.statements.base import Params, Query, StatementBase
from dbos_async.errors import ScheduleError

ACTIVE = "ACTIVE"
PAUSED = "PAUSED"

SCHEDULE_COLUMNS = ("schedule_id, schedule_name, workflow_name, workflow_class_name, schedule,"
                    " status, context, last_fired_at, automatic_backfill, cron_timezone,"
                    " queue_name, application_name")

# What an apply replaces on an existing row: its definition, never its runtime state.
DEFINITION_COLUMNS = ("workflow_name", "workflow_class_name", "schedule", "context",
                      "automatic_backfill", "cron_timezone", "queue_name")


@dataclass(frozen=True)
class ScheduleRecord:
    """A row of ``workflow_schedules``."""

    schedule_id: str
    schedule_name: str
    workflow_name: str
    workflow_class_name: str | None
    schedule: str
    status: str
    context: str
    last_fired_at: str | None
    automatic_backfill: bool
    cron_timezone: str | None
    queue_name: str | None
    application_name: str | None
    shard_key: str | None = None


def schedule_record(row: Any) -> ScheduleRecord:
    values = dict(row)
    shard_key = values.pop("workflow_shard_key", None)
    return ScheduleRecord(**values, shard_key=shard_key)


class ScheduleStatements(StatementBase):
    def _schedule_columns(self) -> str:
        return SCHEDULE_COLUMNS + (", workflow_shard_key" if self.sharded else "")

    def _schedule_values(self, record: ScheduleRecord) -> dict[str, Any]:
        """The columns a new row stores (its workflows' key only on a sharded schema)."""
        values: dict[str, Any] = {
            "schedule_id": record.schedule_id, "schedule_name": record.schedule_name,
            "workflow_name": record.workflow_name,
            "workflow_class_name": record.workflow_class_name, "schedule": record.schedule,
            "status": record.status, "context": record.context,
            "last_fired_at": record.last_fired_at,
            "automatic_backfill": record.automatic_backfill,
            "cron_timezone": record.cron_timezone, "queue_name": record.queue_name,
            "application_name": self.app_name,
        }
        if self.sharded:
            if record.shard_key is None:
                raise ScheduleError(f"Schedule {record.schedule_name!r} needs a shard key: this "
                                "system database is sharded (pass shard_key=...)")
            values["workflow_shard_key"] = record.shard_key
        elif record.shard_key is not None:
            raise ScheduleError("A shard key was given, but this system database is not sharded")
        return values

    def _insert_schedule_sql(self, record: ScheduleRecord, p: Params) -> str:
        values = self._schedule_values(record)
        placeholders = ", ".join(p(v, "boolean" if isinstance(v, bool) else "text")
                                 for v in values.values())
        return (f"INSERT INTO {self.table('workflow_schedules')} ({', '.join(values)})"
                f" VALUES ({placeholders})")

    def insert_schedule(self, record: ScheduleRecord) -> Query:
        """A new schedule; a taken name violates ``schedule_name``'s uniqueness."""
        p = Params()
        return Query(self._insert_schedule_sql(record, p), p.values)

    def upsert_schedule(self, record: ScheduleRecord) -> Query:
        """Create the schedule, or replace an existing one's definition, keeping its ID,
        status and ``last_fired_at`` (an unchanged re-apply changes nothing). Only an
        unclaimed row is claimed; the row's owner is read back."""
        p = Params()
        table = self.table("workflow_schedules")
        updated = [*DEFINITION_COLUMNS, *(("workflow_shard_key",) if self.sharded else ())]
        sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in updated)
        return Query(
            f"""{self._insert_schedule_sql(record, p)}
                ON CONFLICT (schedule_name) DO UPDATE SET {sets},
                  application_name = COALESCE({table}.application_name,
                                              EXCLUDED.application_name)
                RETURNING application_name""",
            p.values,
        )

    def list_schedules(self, names: list[str] | None = None,
                       prefix: str | None = None, status: str | None = None) -> Query:
        """This application's schedules and unclaimed ones, by name."""
        p = Params()
        conditions = [self.global_(None, p), self.own_scope(None, p)]
        if names is not None:
            conditions.append(f"schedule_name = ANY({p(names, 'text[]')})")
        if prefix is not None:
            conditions.append(f"starts_with(schedule_name, {p(prefix)})")
        if status is not None:
            conditions.append(f"status = {p(status)}")
        return Query(
            f"""SELECT {self._schedule_columns()} FROM {self.table('workflow_schedules')}
                WHERE {' AND '.join(conditions)} ORDER BY schedule_name""",
            p.values,
        )

    def get_schedule(self, name: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT {self._schedule_columns()} FROM {self.table('workflow_schedules')}
                WHERE {self.global_(None, p)} AND schedule_name = {p(name)}""",
            p.values,
        )

    def delete_schedule(self, name: str) -> Query:
        p = Params()
        return Query(
            f"""DELETE FROM {self.table('workflow_schedules')}
                WHERE {self.global_(None, p)} AND schedule_name = {p(name)}
                RETURNING schedule_id""",
            p.values,
        )

    def set_schedule_status(self, name: str, status: str) -> Query:
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_schedules')} SET status = {p(status)}
                WHERE {self.global_(None, p)} AND schedule_name = {p(name)}
                RETURNING schedule_id""",
            p.values,
        )

    def advance_last_fired(self, name: str, fired_at: str, fired_epoch_ms: int) -> Query:
        """Record a fired time unless a later one is recorded already (times are compared
        as instants, so executors firing out of order never move it back)."""
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_schedules')} SET last_fired_at = {p(fired_at)}
                WHERE {self.global_(None, p)} AND schedule_name = {p(name)}
                  AND (last_fired_at IS NULL OR
                       last_fired_at::timestamptz < to_timestamp({p(fired_epoch_ms, 'bigint')}
                                                                / 1000.0))""",
            p.values,
        )
