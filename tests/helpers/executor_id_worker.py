"""An executor process of the executor-ID tests: every one starts from the same settings.

usage: python executor_id_worker.py URL WORKFLOW_ID [EXECUTOR_ID]

Enters DBOS (with ``EXECUTOR_ID`` if given, else none: it claims one), which recovers the
``PENDING`` workflows of its executor ID; starts workflow ``hold`` under ``WORKFLOW_ID``
(an existing one is left as it is), prints one line of JSON ``{"executor_id": ...,
"pid": ...}`` and then runs until it is killed or its stdin closes.

``hold`` records which process ran its step in ``runs(workflow_id, pid)`` (on a connection
of its own, so a step that runs twice shows twice), then waits for a message on topic
``go`` and returns the pid of the process that finished it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import asyncpg

from dbos_async import DBOS, SetWorkflowID, current_workflow_id


def build(url: str, executor_id: str | None) -> tuple[DBOS, object]:
    dbos = DBOS(system_database_url=url, executor_id=executor_id,
                application_version="executor-id-test", connection_name="executor_id_test",
                shutdown_grace_period=0, result_poll_interval=0.05,
                # These tests are about who claims which ID; failover (which would move a
                # killed worker's workflow to a live one) is tested in test_failover.py.
                failover_after=None)

    @dbos.step(name="mark")
    async def mark() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO runs (workflow_id, pid) VALUES ($1, $2)",
                               current_workflow_id(), os.getpid())
        finally:
            await conn.close()

    @dbos.workflow(name="hold")
    async def hold() -> int:
        await mark()
        await dbos.recv("go", timeout=600)
        return os.getpid()

    return dbos, hold


async def main(url: str, workflow_id: str, executor_id: str | None = None) -> None:
    dbos, hold = build(url, executor_id)
    async with dbos:
        with SetWorkflowID(workflow_id):
            await dbos.start_workflow(hold)  # type: ignore[arg-type]
        print(json.dumps({"executor_id": dbos.executor_id, "pid": os.getpid()}), flush=True)
        # Until killed, or until the test closes stdin.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
