"""An executor process of the failover tests (run with the test's own interpreter).

usage: python failover_worker.py URL EXECUTOR_ID PREFIX DIRECT QUEUED STEP_SECONDS

Enters DBOS (``EXECUTOR_ID`` ``-`` claims ``local``, ``local-2``, ...; failover every
0.5 s scan), starts ``DIRECT`` workflows ``<PREFIX>-<i>`` and enqueues ``QUEUED`` ones
``<PREFIX>-q<i>``, prints one line of JSON ``{"executor_id": ..., "pid": ...}``, then one
line ``{"finished": ID}`` for each of its workflows as its handle returns, and runs until it
is killed or its stdin closes.

Every step of ``steps`` first inserts ``(workflow_id, step, pid)`` into ``side_effects`` (on a
connection of its own, outside the step's checkpoint, so a body that runs twice shows twice)
and then sleeps ``STEP_SECONDS``: a kill lands mid-step, after its side effect and before its
checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import asyncpg

from dbos_async import DBOS, Queue, SetWorkflowID, current_workflow_id

APP_VERSION = "failover-test"
STEPS = 4
FAILOVER_AFTER = 1.0


def build(url: str, executor_id: str | None, step_seconds: float,
          **settings: Any) -> tuple[DBOS, Any, Queue]:
    dbos = DBOS(system_database_url=url, executor_id=executor_id,
                application_version=APP_VERSION, connection_name=f"failover_{os.getpid()}",
                shutdown_grace_period=0, result_poll_interval=0.05,
                **{"failover_after": FAILOVER_AFTER, **settings})
    queue = dbos.register_queue(Queue("failover_queue", polling_interval=0.2))

    @dbos.step(name="fo_step")
    async def fo_step(i: int) -> str:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO side_effects (workflow_id, step, pid) "
                               "VALUES ($1, $2, $3)", current_workflow_id(), i, os.getpid())
        finally:
            await conn.close()
        await asyncio.sleep(step_seconds)
        return f"step-{i}"

    @dbos.workflow(name="fo_steps")
    async def fo_steps() -> list[str]:
        return [await fo_step(i) for i in range(STEPS)]

    return dbos, fo_steps, queue


async def main(url: str, executor_id: str, prefix: str, direct: str, queued: str,
               step_seconds: str) -> None:
    dbos, fo_steps, queue = build(url, None if executor_id == "-" else executor_id,
                                  float(step_seconds))
    async with dbos:
        handles = []
        for i in range(int(direct)):
            with SetWorkflowID(f"{prefix}-{i}"):
                handles.append(await dbos.start_workflow(fo_steps))
        for i in range(int(queued)):
            with SetWorkflowID(f"{prefix}-q{i}"):
                handles.append(await queue.enqueue(fo_steps))
        print(json.dumps({"executor_id": dbos.executor_id, "pid": os.getpid()}), flush=True)

        async def report(handle: Any) -> None:
            await handle.get_result()
            print(json.dumps({"finished": handle.workflow_id}), flush=True)

        reports = [asyncio.ensure_future(report(h)) for h in handles]
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for task in reports:
            task.cancel()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
