"""An executor process of the transaction tests (run with the test's own interpreter).

usage: python transaction_worker.py SYSTEM_URL APP_URL ON CYCLE COUNT [EXECUTOR_ID]

``ON`` is ``system`` or ``application``: where the transactions run. Entering DBOS recovers
what earlier (killed) workers of the same executor ID left. With ``COUNT`` above 0 it
starts workflows ``w<cycle>-<i>`` (``i`` below ``COUNT``), prints ``ready`` and runs until it
is killed; with ``COUNT`` 0 it waits for every workflow to finish, prints ``drained`` and
exits. With ``COUNT`` -1 (the zombie) it starts the one workflow ``zombie``, whose
transaction prints ``inside`` after its SQL and waits for a line on stdin before committing.

Each workflow runs ``STEPS`` transactions; each inserts ``(workflow_id, step_id, pid)`` into
``effects`` and adds one to ``counter``, in the transaction.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from dbos_async import (
    DBOS,
    SetWorkflowID,
    current_step_id,
    current_workflow_id,
    transaction_connection,
)

STEPS = 3
TRANSACTION_SECONDS = 0.03
PAUSING = False
"""Whether this process is the zombie, whose transaction pauses before its commit."""
APP_VERSION = "transactions-test"
TABLES = ("CREATE TABLE IF NOT EXISTS effects (workflow_id text, step_id int, pid int);"
          "CREATE TABLE IF NOT EXISTS counter (n int);"
          "INSERT INTO counter SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM counter)")


def connection_name(cycle: int) -> str:
    return f"txn_worker_{cycle}"


def build(system_url: str, app_url: str, on: str, cycle: int, executor_id: str,
          **settings: Any) -> tuple[DBOS, Any]:
    dbos = DBOS(system_database_url=system_url, executor_id=executor_id,
                application_version=APP_VERSION, connection_name=connection_name(cycle),
                shutdown_grace_period=0, result_poll_interval=0.05, **settings)
    source = None if on == "system" else "shop"
    if source is not None:
        dbos.data_source("shop", app_url)

    @dbos.transaction(data_source=source, name="effect", isolation="READ COMMITTED")
    async def effect() -> int:
        conn = transaction_connection()
        await conn.execute("INSERT INTO effects VALUES ($1, $2, $3)", current_workflow_id(),
                           current_step_id(), os.getpid())
        n = await conn.fetchval("UPDATE counter SET n = n + 1 RETURNING n")
        await asyncio.sleep(TRANSACTION_SECONDS)  # kills land inside transactions too
        global PAUSING
        if PAUSING and current_workflow_id() == "zombie":
            PAUSING = False  # once: a retry after the pause runs straight through
            print("inside", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        return int(n)

    @dbos.workflow(name="effects")
    async def effects() -> int:
        return sum([await effect() for _ in range(STEPS)])

    return dbos, effects


async def main(system_url: str, app_url: str, on: str, cycle: int, count: int,
               executor_id: str) -> None:
    global PAUSING
    PAUSING = count == -1
    # The zombie's transactions end 2 s after it stops (so the taker need not wait long).
    settings = {"idle_transaction_timeout": 2.0} if PAUSING else {}
    dbos, effects = build(system_url, app_url, on, cycle, executor_id, **settings)
    async with dbos:
        if count == -1:
            with SetWorkflowID("zombie"):
                handle = await dbos.start_workflow(effects)
            try:
                print(f"result {await handle.get_result()}", flush=True)
            except Exception as error:
                print(f"error {type(error).__name__}", flush=True)
            return
        for i in range(count):
            with SetWorkflowID(f"w{cycle}-{i}"):
                await dbos.start_workflow(effects)
        if count:
            print("ready", flush=True)
            await asyncio.Event().wait()  # until SIGKILL
        for status in await dbos.list_workflows(load_input=False, load_output=False):
            await (await dbos.retrieve_workflow(status.workflow_id)).get_result()
        print("drained", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], int(args[3]), int(args[4]),
                     args[5] if len(args) > 5 else "txn-executor"))
