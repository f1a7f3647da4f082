"""Forks and rewinds that start at a point found in the recorded steps: the last failure,
the last step, a step by name; and a rewind or fork without a start step (the whole
workflow). On the unsharded and the sharded schema, from an executor and a client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import new_dbos

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    NonExistentWorkflowError,
    SetShardKey,
    SetWorkflowID,
    StartPoint,
    StepNamed,
)

PATIENCE = 15.0
CLI = str(Path(sys.executable).with_name("dbos-async"))


class Flaky:
    """``pipeline``: steps fetch (0), charge (1), ship (2), each counted; charge fails
    while ``broken``. ``body_fails``: fetch (0) then the body raises. ``loop``: tick
    three times (0, 1, 2)."""

    def __init__(self, dbos: DBOS) -> None:
        self.runs: Counter[str] = Counter()
        self.broken = True

        @dbos.step(name="fetch")
        async def fetch(x: int) -> int:
            self.runs["fetch"] += 1
            return x + 1

        @dbos.step(name="charge")
        async def charge(x: int) -> int:
            self.runs["charge"] += 1
            if self.broken:
                raise RuntimeError("card declined")
            return x * 10

        @dbos.step(name="ship")
        async def ship(x: int) -> int:
            self.runs["ship"] += 1
            return x + 3

        @dbos.workflow(name="pipeline")
        async def pipeline(x: int) -> int:
            return await ship(await charge(await fetch(x)))

        @dbos.workflow(name="body_fails")
        async def body_fails(x: int) -> int:
            value = await fetch(x)
            if self.broken:
                raise ValueError("the body failed")
            return value

        @dbos.step(name="tick")
        async def tick(i: int) -> int:
            self.runs[f"tick{i}"] += 1
            return i

        @dbos.workflow(name="loop")
        async def loop() -> list[int]:
            return [await tick(i) for i in range(3)]

        self.pipeline, self.body_fails, self.loop = pipeline, body_fails, loop


def keyed(sharding: bool) -> contextlib.AbstractContextManager[Any]:
    return SetShardKey("acme") if sharding else contextlib.nullcontext()


async def settle(handle: Any) -> Any:
    with contextlib.suppress(Exception):
        return await asyncio.wait_for(handle.get_result(), PATIENCE)
    return None


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_fork_and_rewind_from_found_points(database_url: str, sharding: bool) -> None:
    dbos = new_dbos(database_url, sharding=sharding)
    flow = Flaky(dbos)
    key = "acme" if sharding else None
    async with dbos:
        with keyed(sharding):
            with SetWorkflowID("p"):
                await settle(await dbos.start_workflow(flow.pipeline, 1))
            with SetWorkflowID("b"):
                await settle(await dbos.start_workflow(flow.body_fails, 1))
            with SetWorkflowID("l"):
                await settle(await dbos.start_workflow(flow.loop))
        failed = await dbos.get_workflow_status("p", shard_key=key)
        assert failed is not None and failed.status == "ERROR"
        assert flow.runs == Counter(fetch=2, charge=1, tick0=1, tick1=1, tick2=1)
        flow.broken = False

        # The last failure: charge (1) runs again, fetch replays.
        fork = await dbos.fork_workflow("p", StartPoint.LAST_FAILURE, shard_key=key,
                                        new_workflow_id="p-fixed")
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 23
        assert (flow.runs["fetch"], flow.runs["charge"], flow.runs["ship"]) == (2, 2, 1)
        # A body that failed after its last checkpoint: one past it, so fetch replays.
        fork = await dbos.fork_workflow("b", StartPoint.LAST_FAILURE, shard_key=key)
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 2
        assert flow.runs["fetch"] == 2
        # The last step of a successful workflow: ship (2) alone runs again.
        fork = await dbos.fork_workflow("p-fixed", StartPoint.LAST_STEP, shard_key=key)
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 23
        assert (flow.runs["charge"], flow.runs["ship"]) == (2, 2)
        # By name, the first occurrence by default, the last with -1.
        fork = await dbos.fork_workflow("l", StepNamed("tick"), shard_key=key)
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == [0, 1, 2]
        assert [flow.runs[f"tick{i}"] for i in range(3)] == [2, 2, 2]
        fork = await dbos.fork_workflow("l", StepNamed("tick", occurrence=-1), shard_key=key)
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == [0, 1, 2]
        assert [flow.runs[f"tick{i}"] for i in range(3)] == [2, 2, 3]
        # No start step: the whole workflow, for a fork and for a rewind.
        fork = await dbos.fork_workflow("l", shard_key=key)
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == [0, 1, 2]
        assert [flow.runs[f"tick{i}"] for i in range(3)] == [3, 3, 4]
        rewound = await dbos.rewind_workflow("l", shard_key=key)
        assert await asyncio.wait_for(rewound.get_result(), PATIENCE) == [0, 1, 2]
        assert [flow.runs[f"tick{i}"] for i in range(3)] == [4, 4, 5]

        # A rewind in place from the last failure, and from a client by name.
        flow.broken = True
        with keyed(sharding), SetWorkflowID("p2"):
            await settle(await dbos.start_workflow(flow.pipeline, 2))
        flow.broken = False
        before = flow.runs["fetch"]
        rewound = await dbos.rewind_workflow("p2", StartPoint.LAST_FAILURE, shard_key=key)
        assert await asyncio.wait_for(rewound.get_result(), PATIENCE) == 33
        assert flow.runs["fetch"] == before
        async with DBOSClient(system_database_url=database_url, sharding=sharding) as client:
            await client.rewind_workflow("p2", StepNamed("ship"), shard_key=key)
            done = await client.retrieve_workflow("p2", shard_key=key)
            assert await asyncio.wait_for(done.get_result(), PATIENCE) == 33
        assert flow.runs["fetch"] == before
        steps = await dbos.list_workflow_steps("p2", shard_key=key)
        assert [s.name for s in steps] == ["fetch", "charge", "ship"]


async def test_points_that_are_not_there_are_refused(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = Flaky(dbos)
    flow.broken = False
    async with dbos:
        with SetWorkflowID("ok"):
            assert await flow.pipeline(1) == 23
        with pytest.raises(DBOSError, match="'ok' has no failure to start from"):
            await dbos.fork_workflow("ok", StartPoint.LAST_FAILURE)
        with pytest.raises(DBOSError, match="'ok' has no step named 'nope'"):
            await dbos.fork_workflow("ok", StepNamed("nope"))
        with pytest.raises(DBOSError, match="has no step named 'fetch' \\(occurrence 1\\)"):
            await dbos.rewind_workflow("ok", StepNamed("fetch", occurrence=1))
        with pytest.raises(NonExistentWorkflowError):
            await dbos.fork_workflow("missing", StepNamed("fetch"))
        with pytest.raises(NonExistentWorkflowError):
            await dbos.fork_workflow("missing", StartPoint.LAST_STEP)
        with pytest.raises(DBOSError, match="start_step must be a step position"):
            await dbos.fork_workflow("ok", "fetch")  # type: ignore[arg-type]
        with pytest.raises(DBOSError, match="occurrence must be an integer"):
            await dbos.fork_workflow("ok", StepNamed("fetch", "1"))  # type: ignore[arg-type]
        # Nothing was forked.
        assert await dbos.list_workflows(is_fork=True) == []


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DBOS_")}
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60,
                          env=clean, check=False)


async def test_cli_fork_and_rewind_points(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = Flaky(dbos)
    async with dbos:
        with SetWorkflowID("c"):
            await settle(await dbos.start_workflow(flow.pipeline, 1))
    url = ("--url", database_url)
    both = await asyncio.to_thread(run_cli, "workflow", "fork", "c", "--step", "1",
                                   "--last-step", *url)
    assert both.returncode != 0 and "at most one of --step" in both.stderr
    forked = await asyncio.to_thread(run_cli, "workflow", "fork", "c", "--last-failure", *url)
    assert forked.returncode == 0, forked.stderr
    fork_id = forked.stdout.strip()
    rewound = await asyncio.to_thread(run_cli, "workflow", "rewind", "c", "--step-name",
                                      "charge", *url)
    assert rewound.returncode == 0 and rewound.stdout == "Rewound c\n", rewound.stderr
    flow.broken = False
    async with dbos:
        for workflow_id in (fork_id, "c"):
            handle = await dbos.retrieve_workflow(workflow_id)
            assert await asyncio.wait_for(handle.get_result(), PATIENCE) == 23
        fork = await dbos.get_workflow_status(fork_id)
        assert fork is not None and fork.forked_from == "c"
    # fetch ran once for "c", and replayed in the fork and the rewind.
    assert flow.runs["fetch"] == 1
