"""The batch statements that write workflows' outcomes and steps, and the flip of a queue's
claimed workflows, find each status row by primary key, whatever the statistics say: at
120,000 rows of which 5,000 PENDING and 5,000 ENQUEUED, with statistics taken when few
were and with fresh ones, in the plan PostgreSQL makes for the prepared statement with its
values (custom) and without (generic), on the unsharded and the sharded schema. Never a
read of every row of a status (through a partial index on it) hashed with or filtered
against the batch: its cost grows with the PENDING and ENQUEUED workflows.

A small table too: at 20,000 rows, 3,000 of them PENDING and ENQUEUED while the statistics
count none (taken before a large enqueue was claimed), a scan of the table may look cheaper
than 256 lookups, but each row it finds is never matched against every row of the batch
(a nested loop over the batch: 0.3-0.4 s for one outcome batch of 256)."""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import pytest

from dbos_async import DBOSClient, migrate
from dbos_async._sysdb.shard_keys import shard_key_scope
from dbos_async._sysdb.statements import Checkpoint, FinalOutcome, Query, Statements

ROWS, BUSY = 120_000, 5_000  # BUSY PENDING workflows, then BUSY ENQUEUED
KEY = "tenant"
BATCHES = (25, 256)  # a busy group commit's batch, and its largest

FILL = """
INSERT INTO dbos.workflow_status (workflow_uuid, status, name, owner_xid, queue_name,
                                  created_at, application_name{key})
SELECT 'wf-' || i, 'SUCCESS', 'work', 'owner-' || i, 'jobs', i, 'plans-app'{key_value}
FROM generate_series(1, $1::int) AS i
"""
# The first ``$1`` workflows PENDING, the next ``$1`` ENQUEUED.
BUSY_STATUSES = """
UPDATE dbos.workflow_status
SET status = CASE WHEN created_at <= $1 THEN 'PENDING' ELSE 'ENQUEUED' END
WHERE created_at <= 2 * $1
"""


@pytest.fixture(params=[False, True], ids=["unsharded", "sharded"])
def sharding(request: pytest.FixtureRequest) -> bool:
    value: bool = request.param
    return value


def literal(value: Any) -> str:
    """``value`` as an SQL literal of unknown type, which EXECUTE casts to its parameter's."""
    if value is None:
        return "NULL"
    if isinstance(value, list):
        value = "{" + ",".join("NULL" if v is None else '"' + str(v).replace(
            "\\", "\\\\").replace('"', '\\"') + '"' for v in value) + "}"
    return "'" + str(value).replace("'", "''") + "'"


def batch_statements(sql: Statements, size: int, sharding: bool) -> dict[str, Query]:
    """The batch statements of ``size`` PENDING (or ENQUEUED) workflows, as they are built:
    under the batch's key scope, and (sharded) with each row's own key, as on Citus."""
    ids = [f"wf-{i}" for i in range(1, size + 1)]
    outcomes = [FinalOutcome(w, "SUCCESS", f"owner-{w[3:]}", '"done"', None) for w in ids]
    steps = [Checkpoint(w, 1, "step", f"owner-{w[3:]}", '"out"', None, 1, 2) for w in ids]
    claimed = [f"wf-{BUSY + i}" for i in range(1, size + 1)]
    with shard_key_scope(KEY if sharding else None):
        statements = {"record_outcomes": sql.record_outcomes(outcomes, 3),
                      "record_steps": sql.record_steps(steps),
                      "flip_claimed": sql.flip_claimed(claimed, "jobs", "executor", None,
                                                       False, 3)}
    if sharding:
        keys = [KEY] * size
        statements["record_outcomes, own keys"] = sql.record_outcomes(outcomes, 3, keys)
        statements["record_steps, own keys"] = sql.record_steps(steps, keys)
    return statements


async def prepared_plans(conn: asyncpg.Connection, query: Query,
                         form: str = "TEXT") -> dict[str, str]:
    """The custom and the generic plan of ``query`` as a prepared statement, in ``form``."""
    await conn.execute(f"PREPARE batch AS {query.sql}")
    args = ", ".join(literal(v) for v in query.params)
    plans = {}
    try:
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            plans[mode] = "\n".join(row[0] for row in await conn.fetch(
                f"EXPLAIN (FORMAT {form}) EXECUTE batch({args})"))
    finally:
        await conn.execute("DEALLOCATE batch")
        await conn.execute("RESET plan_cache_mode")
    return plans


STATUS_INDEX = re.compile(r"Index (?:Only )?Scan (?:using|on) (\S*workflow_status\S*)")


def assert_by_primary_key(plans: dict[str, str]) -> None:
    for name, plan in plans.items():
        shown = f"{name}:\n{plan}"
        # Status rows are read through the primary key only: no partial (or other) index,
        # no scan of the table.
        assert set(STATUS_INDEX.findall(plan)) == {"workflow_status_pkey"}, shown
        assert "Seq Scan on workflow_status" not in plan, shown


def rescans_the_batch(node: dict[str, Any]) -> bool:
    """Whether the plan ``node`` (EXPLAIN's JSON form) holds a nested loop that reads
    status rows and, for each, every row of the batch (its CTE, or its unnest)."""
    children = node.get("Plans", [])
    if node["Node Type"] == "Nested Loop":
        outer, inner = children[0], children[1]
        if reads_status_rows(outer) and inner["Node Type"] in ("CTE Scan", "Function Scan"):
            return True
    return any(rescans_the_batch(child) for child in children)


def reads_status_rows(node: dict[str, Any]) -> bool:
    return (node.get("Relation Name") == "workflow_status"
            or any(reads_status_rows(child) for child in node.get("Plans", [])))


async def busy_plans(database_url: str, sharding: bool, rows: int, busy: int,
                     quiet: int, form: str = "TEXT") -> dict[str, str]:
    """The plans (in ``form``) of the batch statements at ``rows`` workflows, ``busy`` of
    them PENDING and ``busy`` ENQUEUED, with statistics taken when ``quiet`` were (stale),
    then fresh."""
    await migrate(database_url, sharding=sharding)
    key, key_value = (", shard_key", f", '{KEY}'") if sharding else ("", "")
    async with DBOSClient(system_database_url=database_url, sharding=sharding,
                          application_name="plans-app") as client:
        sql = client._peer().system_database.sql
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(FILL.format(key=key, key_value=key_value), rows)
            await conn.execute(BUSY_STATUSES, quiet)
            await conn.execute("VACUUM ANALYZE dbos.workflow_status")
            await conn.execute("UPDATE dbos.workflow_status SET status = 'SUCCESS'")
            await conn.execute(BUSY_STATUSES, busy)
            plans: dict[str, str] = {}
            for statistics in ("stale", "fresh"):
                if statistics == "fresh":
                    await conn.execute("ANALYZE dbos.workflow_status")
                for size in BATCHES:
                    for name, query in batch_statements(sql, size, sharding).items():
                        for mode, plan in (await prepared_plans(conn, query, form)).items():
                            plans[f"{name} of {size}, {statistics}, {mode}"] = plan
        finally:
            await conn.close()
    assert len(plans) == 2 * len(BATCHES) * (5 if sharding else 3) * 2
    return plans


async def test_batches_find_their_rows_by_primary_key(database_url: str,
                                                      sharding: bool) -> None:
    # Statistics of a quiet moment (10 PENDING, 10 ENQUEUED), then a busy one.
    assert_by_primary_key(await busy_plans(database_url, sharding, ROWS, BUSY, quiet=10))


async def test_batches_of_a_small_table_never_read_the_whole_batch_per_status_row(
        database_url: str, sharding: bool) -> None:
    # Statistics taken with none PENDING or ENQUEUED.
    plans = await busy_plans(database_url, sharding, 20_000, 3_000, quiet=0, form="JSON")
    for name, plan in plans.items():
        assert not rescans_the_batch(json.loads(plan)[0]["Plan"]), f"{name}:\n{plan}"
