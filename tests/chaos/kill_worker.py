"""A worker process for the kill -9 cycles (run with the test's own interpreter).

usage: python kill_worker.py URL CYCLE DIRECT QUEUED STEPS STEP_SECONDS [KEYS]

Entering DBOS recovers the PENDING workflows earlier (killed) workers of the same executor ID
left behind. Then it starts ``DIRECT`` workflows itself and enqueues ``QUEUED`` more, each of
``STEPS`` steps, prints ``ready`` once every start is acknowledged, and runs until it is
killed. With ``DIRECT`` and ``QUEUED`` both 0 it is the last worker: it waits until no
workflow is left unfinished, prints ``drained`` and exits normally. With ``KEYS`` (above 0)
the system database is sharded and workflow ``i`` of a cycle lives under key
``tenant-<i % KEYS>``.

Every step first inserts ``(workflow_id, step_id, cycle)`` into ``chaos_side_effects`` on its
own connection (outside the step's checkpoint), then sleeps ``STEP_SECONDS``: the test can
tell which process ran each step body, and the sleep makes kills land mid-step.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import asyncpg

from dbos_async import DBOS, SetShardKey, SetWorkflowID, current_step_id, current_workflow_id

EXECUTOR_ID = "chaos-kill-executor"
APP_VERSION = "chaos-kill-version"
QUEUE = "chaos_kill_queue"


def connection_name(cycle: int) -> str:
    """The ``application_name`` of cycle ``cycle``'s connections: the test waits for them to
    be gone before reading what the killed process left."""
    return f"chaos_kill_{cycle}"


def under_key(index: int, keys: int) -> contextlib.AbstractContextManager[object]:
    """The shard key of a cycle's workflow ``index``: none on an unsharded database (``keys``
    0)."""
    return SetShardKey(f"tenant-{index % keys}") if keys else contextlib.nullcontext()


def build(url: str, cycle: int, step_seconds: float, keys: int) -> tuple[DBOS, object]:
    dbos = DBOS(
        system_database_url=url,
        sharding=keys > 0,
        executor_id=EXECUTOR_ID,
        application_version=APP_VERSION,
        connection_name=connection_name(cycle),
        shutdown_grace_period=0,
        result_poll_interval=0.05,
    )
    dbos.queue(QUEUE, worker_concurrency=8, polling_interval=0.2)

    @dbos.step(name="chaos_step")
    async def chaos_step(index: int) -> int:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "INSERT INTO chaos_side_effects (workflow_id, step_id, cycle) VALUES ($1, $2, $3)",
                current_workflow_id(), current_step_id(), cycle)
        finally:
            await conn.close()
        await asyncio.sleep(step_seconds)
        return index * index

    @dbos.workflow(name="chaos_chain")
    async def chaos_chain(steps: int) -> int:
        return sum([await chaos_step(i) for i in range(steps)])

    return dbos, chaos_chain


async def main(url: str, cycle: int, direct: int, queued: int, steps: int,
               step_seconds: float, keys: int) -> None:
    dbos, chain = build(url, cycle, step_seconds, keys)
    async with dbos:
        queue = await dbos.get_queue(QUEUE)
        for i in range(direct):
            with under_key(i, keys), SetWorkflowID(f"direct-{cycle}-{i}"):
                await dbos.start_workflow(chain, steps)  # type: ignore[arg-type]
        for i in range(queued):
            with under_key(i, keys), SetWorkflowID(f"queued-{cycle}-{i}"):
                await queue.enqueue(chain, steps)  # type: ignore[arg-type]
        if direct or queued:
            print("ready", flush=True)
            await asyncio.Event().wait()  # until SIGKILL
        # Nothing starts any more: waiting once for every workflow there is drains them all.
        for status in await dbos.list_workflows(load_input=False, load_output=False):
            handle = await dbos.retrieve_workflow(status.workflow_id,
                                                  shard_key=status.shard_key)
            await handle.get_result()
        print("drained", flush=True)


if __name__ == "__main__":
    url_arg, cycle_arg, direct_arg, queued_arg, steps_arg, seconds_arg = sys.argv[1:7]
    keys_arg = sys.argv[7] if len(sys.argv) > 7 else "0"
    asyncio.run(main(url_arg, int(cycle_arg), int(direct_arg), int(queued_arg), int(steps_arg),
                     float(seconds_arg), int(keys_arg)))
