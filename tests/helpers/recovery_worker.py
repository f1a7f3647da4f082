"""A worker process for the crash-recovery tests (run with the test's own interpreter).

usage: python recovery_worker.py URL MODE KIND WORKFLOW_ID [SHARD_KEYS]

``MODE`` is ``start``: start workflow ``KIND`` under ``WORKFLOW_ID`` and wait forever (the
test SIGKILLs the process mid-workflow); or ``recover``: enter DBOS, which recovers this
executor's PENDING workflows, wait for ``WORKFLOW_ID`` to finish and print its result as one
line of JSON. With ``SHARD_KEYS`` (comma-separated) the system database is sharded and the
workflow runs once under each key, with the same ID; ``recover`` prints ``{key: result}``.

Every step first inserts its name into ``side_effects(step text)`` in the same database (on
its own connection, outside the step's checkpoint) and then sleeps, so the test can tell how
often each step's body really ran.

``KIND`` ``load`` is many workflows at once (``WORKFLOW_ID-0`` ... ``WORKFLOW_ID-N``, spread
over the keys when sharded), stepping together, so their checkpoints are group-committed;
``recover`` prints every result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

import asyncpg

from dbos_async import DBOS, SetShardKey, SetWorkflowID

# Both processes must use the same executor ID and application version: recovery claims only
# the PENDING workflows of its own executor and version.
EXECUTOR_ID = "crash-test-executor"
APP_VERSION = "crash-test-version"
SEQUENTIAL_STEPS = 5
SEQUENTIAL_SLEEP = 0.3
FAN_WIDTH = 4
LOAD_WORKFLOWS = 200
LOAD_STEPS = 6


def build(url: str, sharding: bool = False,
          effects: asyncpg.Pool | None = None) -> tuple[DBOS, dict[str, Any]]:
    dbos = DBOS(
        system_database_url=url,
        sharding=sharding,
        executor_id=EXECUTOR_ID,
        application_version=APP_VERSION,
        connection_name=f"crash_worker_{os.getpid()}",
        shutdown_grace_period=0,
        result_poll_interval=0.05,
    )

    async def side_effect(name: str) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO side_effects (step) VALUES ($1)", name)
        finally:
            await conn.close()

    @dbos.step(name="seq_step")
    async def seq_step(i: int, prefix: str = "") -> str:
        await side_effect(f"{prefix}seq-{i}")
        await asyncio.sleep(SEQUENTIAL_SLEEP)
        return f"done-{i}"

    @dbos.workflow(name="sequential")
    async def sequential(prefix: str = "") -> list[str]:
        return [await seq_step(i, prefix) for i in range(SEQUENTIAL_STEPS)]

    @dbos.step(name="fan_step")
    async def fan_step(i: int) -> int:
        await side_effect(f"fan-{i}")
        # Staggered, and longer for later calls: the kill lands with some recorded and some
        # still in flight.
        await asyncio.sleep(0.2 + 0.4 * i)
        return i * i

    @dbos.step(name="sum_step")
    async def sum_step(values: list[int]) -> int:
        await side_effect("sum")
        return sum(values)

    @dbos.workflow(name="fanout")
    async def fanout() -> dict[str, Any]:
        squares = await asyncio.gather(*(fan_step(i) for i in range(FAN_WIDTH)))
        total = await sum_step(list(squares))
        return {"squares": list(squares), "total": total}

    @dbos.step(name="load_step")
    async def load_step(n: int, i: int) -> int:
        assert effects is not None
        await effects.execute("INSERT INTO side_effects (step) VALUES ($1)", f"load-{n}-{i}")
        await asyncio.sleep(0.05)
        return n * LOAD_STEPS + i

    @dbos.workflow(name="load")
    async def load(n: int) -> list[int]:
        return [await load_step(n, i) for i in range(LOAD_STEPS)]

    return dbos, {"sequential": sequential, "fanout": fanout, "load": load}


def load_members(workflow_id: str, shard_keys: list[str]) -> list[tuple[str, str | None, int]]:
    """The workflows of the ``load`` kind: (ID, key, n)."""
    return [(f"{workflow_id}-{n}", shard_keys[n % len(shard_keys)] if shard_keys else None, n)
            for n in range(LOAD_WORKFLOWS)]


async def run_load(dbos: DBOS, mode: str, load: Any, workflow_id: str,
                   shard_keys: list[str]) -> None:
    if mode == "start":
        for member_id, key, n in load_members(workflow_id, shard_keys):
            with SetShardKey(key) if key else contextlib.nullcontext(), \
                    SetWorkflowID(member_id):
                await dbos.start_workflow(load, n)
        print("started", flush=True)
        await asyncio.Event().wait()  # until SIGKILL
    results = {}
    for member_id, key, _ in load_members(workflow_id, shard_keys):
        handle = await dbos.retrieve_workflow(member_id, shard_key=key)
        results[member_id] = await handle.get_result()
    print(json.dumps(results), flush=True)


async def main(url: str, mode: str, kind: str, workflow_id: str, keys: str = "") -> None:
    shard_keys = [key for key in keys.split(",") if key]
    if kind == "load":
        async with asyncpg.create_pool(url, min_size=1, max_size=4) as effects:
            dbos, workflows = build(url, sharding=bool(shard_keys), effects=effects)
            async with dbos:
                await run_load(dbos, mode, workflows["load"], workflow_id, shard_keys)
        return
    dbos, workflows = build(url, sharding=bool(shard_keys))
    async with dbos:
        if mode == "start":
            if not shard_keys:
                with SetWorkflowID(workflow_id):
                    await dbos.start_workflow(workflows[kind])
            for key in shard_keys:
                with SetShardKey(key), SetWorkflowID(workflow_id):
                    await dbos.start_workflow(workflows[kind], f"{key}:")
            print("started", flush=True)
            await asyncio.Event().wait()  # until SIGKILL
        elif mode == "recover":
            if not shard_keys:
                handle = await dbos.retrieve_workflow(workflow_id)
                print(json.dumps(await handle.get_result()), flush=True)
                return
            results = {}
            for key in shard_keys:
                handle = await dbos.retrieve_workflow(workflow_id, shard_key=key)
                results[key] = await handle.get_result()
            print(json.dumps(results), flush=True)
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
