"""The reads of dashboards (the console), each an observability read: bounded by the
statement timeout, in a read-only transaction, taking no lock."""

from __future__ import annotations

import asyncpg

from dbos_async._sysdb.core import DatabaseCore
from dbos_async._sysdb.records import VersionBacklog


class ObservabilityOperations(DatabaseCore):
    async def event_history(self, workflow_id: str, limit: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.event_history(workflow_id, limit),
                                          f"reading the event history of {workflow_id}")

    async def unconsumed_messages(self, workflow_id: str, limit: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.unconsumed_messages(workflow_id, limit),
                                          f"reading the messages waiting for {workflow_id}")

    async def stream_values(self, workflow_id: str, limit: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.stream_values(workflow_id, limit),
                                          f"reading the streams of {workflow_id}")

    async def queue_activity(self, since_ms: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.queue_activity(since_ms),
                                          "counting queue starts and completions")

    async def queue_arrivals(self, since_ms: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.queue_arrivals(since_ms),
                                          "counting queue arrivals")

    async def depth_samples(self, since_ms: int) -> list[asyncpg.Record]:
        """The queues' measured depths from ``since_ms`` on (none where the schema lacks
        their table: sharded, verified only, or a role that could not add it)."""
        if not self.depth_samples_table:
            return []
        return await self._observed_fetch(self.sql.depth_samples(since_ms),
                                          "reading queue depth samples")

    async def workflow_activity(self, start_ms: int, end_ms: int,
                                bucket_ms: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(
            self.sql.workflow_activity(start_ms, end_ms, bucket_ms),
            "counting finished workflows over time")

    async def oldest_waiting(self) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.oldest_waiting(),
                                          "finding each queue's oldest waiting workflow")

    async def workflow_aggregates(self, group_by: tuple[str, ...], time_column: str,
                                  start_ms: int, end_ms: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(
            self.sql.workflow_aggregates(group_by, time_column, start_ms, end_ms),
            "aggregating workflows")

    async def step_aggregates(self, start_ms: int, end_ms: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.step_aggregates(start_ms, end_ms),
                                          "aggregating steps")

    async def pending_by_executor(self, shown: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.pending_by_executor(shown),
                                          "reading what each executor runs")

    async def waiting_by_version(self, other_than: str | None) -> list[VersionBacklog]:
        rows = await self._observed_fetch(self.sql.waiting_by_version(other_than),
                                          "counting the work of each application version")
        return [VersionBacklog(r["application_version"], r["pending"], r["enqueued"])
                for r in rows]

    async def executors_seen_since(self, since_ms: int) -> list[asyncpg.Record]:
        return await self._observed_fetch(self.sql.executors_seen_since(since_ms),
                                          "listing the executors seen lately")

    async def held_advisory_keys(self) -> set[int]:
        rows = await self._observed_fetch(self.sql.held_advisory_keys(),
                                          "reading which executors are alive")
        return {row["key"] & 0xFFFF_FFFF_FFFF_FFFF for row in rows}
