"""An executor process of the primary-failover tests (run with the test's own interpreter).

usage: python standby_worker.py URL EFFECTS WORKFLOWS STEPS STEP_SECONDS

Enters DBOS on ``URL`` (a multi-host URL: the failover happens under it), starts
``WORKFLOWS`` workflows of ``STEPS`` steps (half directly, ``direct-<i>``, half through a
queue, ``queued-<i>``), prints ``ready``, waits for all of them and prints ``done``. Then each
line ``more N`` on its stdin starts ``N`` more (``more-<k>``), and prints ``done`` once they
finished; it exits when its stdin closes.

Every step body first appends ``<workflow_id> <step_id> <pid>`` to the file ``EFFECTS``
(outside the database, so the primary's death cannot lose it), then sleeps
``STEP_SECONDS``: the file counts how many times each step body ran. The last step's body
then waits for ``SIGUSR1``, so a test can fail the primary over before any workflow
finishes, however slowly the machine runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from dbos_async import DBOS, SetWorkflowID, current_step_id, current_workflow_id

EXECUTOR_ID = "standby-failover-executor"
APP_VERSION = "standby-failover-version"
CONNECTION_NAME = "standby_failover_worker"
QUEUE = "standby_failover_queue"
# Generous: a checkpoint write waits out the failover (kill, promotion, reconnection).
RETRY_TIMEOUT = 60.0


def build(url: str, effects: Path, step_seconds: float, promoted: asyncio.Event,
          **settings: Any) -> tuple[DBOS, Any]:
    dbos = DBOS(**{
        "system_database_url": url, "executor_id": EXECUTOR_ID,
        "application_version": APP_VERSION, "connection_name": CONNECTION_NAME,
        "db_retry_timeout": RETRY_TIMEOUT, "shutdown_grace_period": 0,
        "result_poll_interval": 0.05, **settings})
    dbos.queue(QUEUE, worker_concurrency=16, polling_interval=0.1)

    @dbos.step(name="standby_step")
    async def standby_step(index: int, last: bool) -> int:
        with effects.open("a") as file:
            file.write(f"{current_workflow_id()} {current_step_id()} {os.getpid()}\n")
        await asyncio.sleep(step_seconds)
        if last:
            await promoted.wait()
        return index

    @dbos.workflow(name="standby_chain")
    async def standby_chain(steps: int) -> int:
        return sum([await standby_step(i, i == steps - 1) for i in range(steps)])

    return dbos, standby_chain


async def main(url: str, effects: str, workflows: int, steps: int, step_seconds: float) -> None:
    promoted = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, promoted.set)
    dbos, chain = build(url, Path(effects), step_seconds, promoted)
    async with dbos:
        queue = await dbos.get_queue(QUEUE)
        handles = []
        for i in range(workflows):
            with SetWorkflowID(f"direct-{i}" if i % 2 else f"queued-{i}"):
                handles.append(await (dbos.start_workflow(chain, steps) if i % 2
                                      else queue.enqueue(chain, steps)))
        print("ready", flush=True)
        for handle in handles:
            await handle.get_result()
        print("done", flush=True)
        loop, started = asyncio.get_running_loop(), 0
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            more = []
            for _ in range(int(line.split()[1])):
                with SetWorkflowID(f"more-{started}"):
                    more.append(await dbos.start_workflow(chain, steps))
                started += 1
            for handle in more:
                await handle.get_result()
            print("done", flush=True)


if __name__ == "__main__":
    url_arg, effects_arg, workflows_arg, steps_arg, seconds_arg = sys.argv[1:6]
    asyncio.run(main(url_arg, effects_arg, int(workflows_arg), int(steps_arg),
                     float(seconds_arg)))
