"""The group-commit batches that write workflows' outcomes and steps find each status row by
primary key, whatever the statistics say: at 120,000 rows of which 5,000 PENDING, with
statistics taken when few were PENDING and with fresh ones, in the plan PostgreSQL makes
for the prepared statement with its values (custom) and without (generic), on the
unsharded and the sharded schema. Never a read of every PENDING row (through the partial
index on them) hashed with the batch: its cost grows with the PENDING workflows."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from dbos_async import DBOSClient, migrate
from dbos_async._sysdb.shard_keys import shard_key_scope
from dbos_async._sysdb.statements import Checkpoint, FinalOutcome, Query, Statements

ROWS, PENDING = 120_000, 5_000
KEY = "tenant"
BATCHES = (25, 256)  # a busy group commit's batch, and its largest

FILL = """
INSERT INTO dbos.workflow_status (workflow_uuid, status, name, owner_xid, created_at,
                                  application_name{key})
SELECT 'wf-' || i, CASE WHEN i <= $2 THEN 'PENDING' ELSE 'SUCCESS' END, 'work',
       'owner-' || i, i, 'plans-app'{key_value}
FROM generate_series(1, $1::int) AS i
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
    """The batch statements of ``size`` PENDING workflows, as the group commit builds them:
    under the batch's key scope, and (sharded) with each row's own key, as on Citus."""
    ids = [f"wf-{i}" for i in range(1, size + 1)]
    outcomes = [FinalOutcome(w, "SUCCESS", f"owner-{w[3:]}", '"done"', None) for w in ids]
    steps = [Checkpoint(w, 1, "step", f"owner-{w[3:]}", '"out"', None, 1, 2) for w in ids]
    with shard_key_scope(KEY if sharding else None):
        statements = {"record_outcomes": sql.record_outcomes(outcomes, 3),
                      "record_steps": sql.record_steps(steps)}
    if sharding:
        keys = [KEY] * size
        statements["record_outcomes, own keys"] = sql.record_outcomes(outcomes, 3, keys)
        statements["record_steps, own keys"] = sql.record_steps(steps, keys)
    return statements


async def prepared_plans(conn: asyncpg.Connection, query: Query) -> dict[str, str]:
    """The custom and the generic plan of ``query`` as a prepared statement."""
    await conn.execute(f"PREPARE batch AS {query.sql}")
    args = ", ".join(literal(v) for v in query.params)
    plans = {}
    try:
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            plans[mode] = "\n".join(row[0] for row in await conn.fetch(
                f"EXPLAIN EXECUTE batch({args})"))
    finally:
        await conn.execute("DEALLOCATE batch")
        await conn.execute("RESET plan_cache_mode")
    return plans


def assert_by_primary_key(plans: dict[str, str]) -> None:
    for name, plan in plans.items():
        shown = f"{name}:\n{plan}"
        assert "Index Scan using workflow_status_pkey on workflow_status ws" in plan, shown
        assert "idx_workflow_status_pending" not in plan, shown
        assert "Seq Scan on workflow_status" not in plan, shown
        hashed = [line for line in plan.splitlines() if "Hash Cond" in line and "ws." in line]
        assert not hashed, shown


async def test_batches_find_their_rows_by_primary_key(database_url: str,
                                                      sharding: bool) -> None:
    await migrate(database_url, sharding=sharding)
    key, key_value = (", shard_key", f", '{KEY}'") if sharding else ("", "")
    async with DBOSClient(system_database_url=database_url, sharding=sharding,
                          application_name="plans-app") as client:
        sql = client._peer().system_database.sql
        conn = await asyncpg.connect(database_url)
        try:
            # Statistics of a quiet moment (10 PENDING), then a busy one's 5,000.
            await conn.execute(FILL.format(key=key, key_value=key_value), ROWS, 10)
            await conn.execute("VACUUM ANALYZE dbos.workflow_status")
            await conn.execute(
                "UPDATE dbos.workflow_status SET status = 'PENDING' "
                "WHERE workflow_uuid = ANY($1::text[])",
                [f"wf-{i}" for i in range(1, PENDING + 1)])
            plans: dict[str, str] = {}
            for statistics in ("stale", "fresh"):
                if statistics == "fresh":
                    await conn.execute("ANALYZE dbos.workflow_status")
                for size in BATCHES:
                    for name, query in batch_statements(sql, size, sharding).items():
                        for mode, plan in (await prepared_plans(conn, query)).items():
                            plans[f"{name} of {size}, {statistics}, {mode}"] = plan
        finally:
            await conn.close()
    assert len(plans) == 2 * len(BATCHES) * (4 if sharding else 2) * 2
    assert_by_primary_key(plans)
