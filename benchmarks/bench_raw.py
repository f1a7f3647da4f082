"""The floor: single-row autocommit INSERTs through an asyncpg pool, one statement each.

The table has the columns and primary key of the system schema's ``operation_outputs``, so
each insert does the same index work as a step checkpoint, minus the fencing.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from common import drive, read_pool_transactions, transactions_between

TABLE = """
CREATE TABLE operation_outputs (
    workflow_uuid         text NOT NULL,
    function_id           integer NOT NULL,
    function_name         text NOT NULL DEFAULT '',
    output                text,
    error                 text,
    child_workflow_id     text,
    started_at_epoch_ms   bigint,
    completed_at_epoch_ms bigint,
    serialization         text,
    PRIMARY KEY (workflow_uuid, function_id)
)"""

INSERT = """INSERT INTO operation_outputs
    (workflow_uuid, function_id, function_name, output, started_at_epoch_ms,
     completed_at_epoch_ms, serialization)
    VALUES ($1, $2, $3, $4, $5, $6, $7)"""


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's default reset query, which costs a round trip on every release."""


async def run(url: str, *, inserts: int, concurrency: int, pool_size: int,
              warmup: int, default_reset: bool) -> dict[str, Any]:
    """Insert ``inserts`` rows with ``concurrency`` in flight; return the rate.

    ``default_reset`` keeps asyncpg's default pool reset (``SELECT pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL;`` after every release); otherwise releases send nothing.
    """
    setup = await asyncpg.connect(url)
    try:
        await setup.execute("DROP TABLE IF EXISTS operation_outputs")
        await setup.execute(TABLE)
    finally:
        await setup.close()
    pool = await asyncpg.create_pool(
        url, min_size=pool_size, max_size=pool_size,
        reset=None if default_reset else _no_reset,
    )
    prefix = str(uuid.uuid4())
    try:
        async def insert(i: int, tag: str) -> None:
            workflow, step = divmod(i, 3)
            await pool.execute(INSERT, f"{prefix}-{tag}-{workflow}", step + 1, "step",
                               '"x"', 0, 0, "portable_json")

        await drive(warmup, concurrency, lambda i: insert(i, "warm"))
        before = await read_pool_transactions(pool, resets_on_release=default_reset)
        elapsed = await drive(inserts, concurrency, lambda i: insert(i, "run"))
        after = await read_pool_transactions(pool, resets_on_release=default_reset)
        count = await pool.fetchval("SELECT count(*) FROM operation_outputs")
    finally:
        await pool.close()
    if count != warmup + inserts:
        raise RuntimeError(f"raw: expected {warmup + inserts} rows, found {count}")
    return {
        "inserts": inserts,
        "warmup": warmup,
        "seconds": elapsed,
        "inserts_per_s": inserts / elapsed,
        "server": {"transactions": transactions_between(before, after),
                   "transactions_per_insert": transactions_between(before, after) / inserts},
        "pool_size": pool_size,
        "pool_reset": "asyncpg default" if default_reset else "none",
    }
