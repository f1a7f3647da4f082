"""An executor process for the queue tests (run with the test's own interpreter).

usage: python queue_worker.py URL SPEC_JSON

``SPEC_JSON``: ``{"executor_id": str, "queues": [{"name": ..., <Queue kwargs>}],
"listen": [names] or null, "extra": bool}``. The worker declares the queues, registers the
workflows of :func:`define_workflows` (with ``extra``, also ``only_extra``), enters DBOS,
prints ``ready`` and serves until killed.

Each workflow records what it did in tables of the same database (created by the test):
``runs(tag, pid, executor, started, ended)`` with the database's clock, so the test can
check overlaps across processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import asyncpg

from dbos_async import DBOS

RUNS_DDL = """
CREATE TABLE IF NOT EXISTS runs (
  id bigserial PRIMARY KEY, tag text NOT NULL, pid int NOT NULL, executor text NOT NULL,
  started timestamptz NOT NULL DEFAULT clock_timestamp(), ended timestamptz);
CREATE TABLE IF NOT EXISTS gates (tag text PRIMARY KEY);
"""


def define_workflows(dbos: DBOS, url: str, extra: bool = False) -> dict[str, Any]:
    """The queue tests' workflows, registered under fixed names (same in every process)."""
    executor = dbos.config.executor_id

    @dbos.step(name="record_interval")
    async def record_interval(tag: str, hold: float) -> None:
        conn = await asyncpg.connect(url)
        try:
            run_id = await conn.fetchval(
                "INSERT INTO runs (tag, pid, executor) VALUES ($1, $2, $3) RETURNING id",
                tag, os.getpid(), executor)
            await asyncio.sleep(hold)
            await conn.execute("UPDATE runs SET ended = clock_timestamp() WHERE id = $1", run_id)
        finally:
            await conn.close()

    @dbos.workflow(name="interval")
    async def interval(tag: str, hold: float) -> str:
        await record_interval(tag, hold)
        return tag

    @dbos.step(name="wait_gate")
    async def wait_gate(tag: str) -> None:
        conn = await asyncpg.connect(url)
        try:
            # Polls the database (another process opens the gate): no local event to await.
            while not await conn.fetchval(  # noqa: ASYNC110
                    "SELECT count(*) FROM gates WHERE tag = $1", tag):
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    @dbos.workflow(name="gated")
    async def gated(tag: str) -> str:
        """Records a run, then waits until the test inserts ``tag`` into ``gates``."""
        await record_interval(tag, 0.0)
        await wait_gate(tag)
        return tag

    workflows: dict[str, Any] = {"interval": interval, "gated": gated}
    if extra:
        @dbos.workflow(name="only_extra")
        async def only_extra(tag: str) -> str:
            await record_interval(tag, 0.0)
            return f"extra-{tag}"

        workflows["only_extra"] = only_extra
    return workflows


async def main(url: str, spec_text: str) -> None:
    spec = json.loads(spec_text)
    dbos = DBOS(
        system_database_url=url,
        executor_id=spec["executor_id"],
        application_version="queue-test-version",
        connection_name=f"queue_worker_{os.getpid()}",
        shutdown_grace_period=0,
        result_poll_interval=0.05,
        pool_size=4,
    )
    for queue in spec.get("queues", []):
        dbos.queue(**queue)
    if spec.get("listen") is not None:
        dbos.listen(*spec["listen"])
    define_workflows(dbos, url, extra=bool(spec.get("extra")))
    async with dbos:
        print("ready", flush=True)
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
