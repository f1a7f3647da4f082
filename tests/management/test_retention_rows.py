"""Retention by a row threshold: ``garbage_collect(rows_threshold=N)`` (and the
``retention_rows_threshold`` setting) keeps the N newest workflows of the application and
deletes older terminal ones with their rows, never in-flight ones; with an age cutoff too,
a workflow past either bound goes. On the unsharded and the sharded schema."""

from __future__ import annotations

import time

import pytest
from helpers import execute, fetch, new_dbos, wait_until

from dbos_async import DBOSError

MINUTE_MS = 60_000


async def seed(url: str, sharding: bool, now: int) -> None:
    """w0 (oldest) ... w9 (newest), a minute apart; w1 is PENDING, w8 finished long ago
    by its completion (created recently, completed at the start: a seeded oddity that
    only the age bound catches), the others SUCCESS; each with an input and a step."""
    key_column, key_value = ("shard_key, ", "'acme', ") if sharding else ("", "")
    for i in range(10):
        created = now - (10 - i) * MINUTE_MS
        status = "PENDING" if i == 1 else "SUCCESS"
        completed = None if i == 1 else (now - 60 * MINUTE_MS if i == 8 else created + 1)
        await execute(url, f"""INSERT INTO dbos.workflow_status
                                ({key_column}workflow_uuid, status, name, created_at,
                                 updated_at, completed_at)
                              VALUES ({key_value}$1, $2, 'seeded', $3, $3, $4)""",
                      f"w{i}", status, created, completed)
        await execute(url, f"""INSERT INTO dbos.operation_outputs
                                ({key_column}workflow_uuid, function_id, function_name, output)
                              VALUES ({key_value}$1, 0, 'step', '1')""", f"w{i}")


async def remaining(url: str, table: str = "workflow_status") -> set[str]:
    return {r["workflow_uuid"] for r in await fetch(
        url, f"SELECT workflow_uuid FROM dbos.{table}")}


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_rows_threshold_keeps_the_newest(database_url: str, sharding: bool) -> None:
    now = int(time.time() * 1000)
    dbos = new_dbos(database_url, sharding=sharding)
    async with dbos:
        await seed(database_url, sharding, now)
        # More rows kept than there are: nothing goes.
        assert await dbos.garbage_collect(rows_threshold=50) == 0
        # The 4 newest (w6..w9) stay; of the older ones, the PENDING w1 stays too.
        assert await dbos.garbage_collect(rows_threshold=4) == 5
        assert await remaining(database_url) == {"w1", "w6", "w7", "w8", "w9"}
        assert await remaining(database_url, "operation_outputs") == {
            "w1", "w6", "w7", "w8", "w9"}
        # Both bounds: a workflow past either goes (w8 finished an hour ago).
        assert await dbos.garbage_collect(now - 30 * MINUTE_MS, rows_threshold=4) == 1
        assert await remaining(database_url) == {"w1", "w6", "w7", "w9"}
        # Small batches delete the same.
        assert await dbos.garbage_collect(rows_threshold=2, batch_size=1) == 1
        assert await remaining(database_url) == {"w1", "w7", "w9"}


async def test_retention_rows_threshold_setting(database_url: str) -> None:
    now = int(time.time() * 1000)
    dbos = new_dbos(database_url, retention_rows_threshold=3, maintenance_interval=0.2)
    async with dbos:
        await seed(database_url, False, now)

        async def kept_three() -> bool:
            return await remaining(database_url) == {"w1", "w7", "w8", "w9"}

        await wait_until(kept_three, what="the retention job by rows")


async def test_bad_bounds_are_refused(database_url: str) -> None:
    dbos = new_dbos(database_url)
    async with dbos:
        with pytest.raises(DBOSError, match="needs cutoff_epoch_ms, rows_threshold or both"):
            await dbos.garbage_collect()
        with pytest.raises(DBOSError, match="rows_threshold must be an integer >= 1"):
            await dbos.garbage_collect(rows_threshold=0)
        with pytest.raises(DBOSError, match="cutoff_epoch_ms must be an integer >= 0"):
            await dbos.garbage_collect("yesterday")  # type: ignore[arg-type]
