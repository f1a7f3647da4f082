"""Per-workflow ``max_recovery_attempts`` (``@dbos.workflow(max_recovery_attempts=N)``, as
the ``dbos`` package has it): a workflow recovered more often than its own limit is
dead-lettered (MAX_RECOVERY_ATTEMPTS_EXCEEDED) while others keep the executor's setting.
Each executor below exits with its workflows still running (no grace period), as a
crashed one leaves them; the next recovers them. Unsharded and sharded."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from helpers import new_dbos, wait_until

from dbos_async import (
    DBOS,
    DeadLetteredError,
    InvalidArgumentError,
    SetShardKey,
    SetWorkflowID,
)


class Stuck:
    """Two workflows that never finish: ``fragile`` (at most one recovery) and
    ``sturdy`` (the executor's setting)."""

    def __init__(self, dbos: DBOS) -> None:
        self.running: set[str] = set()
        never = asyncio.Event()

        @dbos.workflow(name="fragile", max_recovery_attempts=1)
        async def fragile() -> None:
            self.running.add("fragile")
            await never.wait()

        @dbos.workflow(name="sturdy")
        async def sturdy() -> None:
            self.running.add("sturdy")
            await never.wait()

        self.fragile, self.sturdy = fragile, sturdy


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_a_workflows_own_limit_dead_letters_it(database_url: str,
                                                     sharding: bool) -> None:
    key = "acme" if sharding else None

    async def run_once() -> dict[str, str]:
        dbos = new_dbos(database_url, shutdown_grace_period=0, sharding=sharding)
        stuck = Stuck(dbos)
        async with dbos:
            found = {name: await dbos.get_workflow_status(name, shard_key=key)
                     for name in ("fragile", "sturdy")}
            for name, status in found.items():
                if status is None:
                    with SetShardKey(key) if key else contextlib.nullcontext(), \
                            SetWorkflowID(name):
                        await dbos.start_workflow(getattr(stuck, name))
            statuses = {name: (await dbos.get_workflow_status(name, shard_key=key))
                        for name in ("fragile", "sturdy")}
            expected = {name for name, s in statuses.items()
                        if s is not None and s.status == "PENDING"}

            async def running() -> bool:
                return stuck.running >= expected

            await wait_until(running, what="the recovered workflows to run")
            return {name: s.status for name, s in statuses.items() if s is not None}

    assert await run_once() == {"fragile": "PENDING", "sturdy": "PENDING"}  # started
    assert await run_once() == {"fragile": "PENDING", "sturdy": "PENDING"}  # recovered once
    # A second recovery is past fragile's own limit; sturdy has the setting's 100.
    assert await run_once() == {"fragile": "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
                                "sturdy": "PENDING"}
    dbos = new_dbos(database_url, shutdown_grace_period=0, sharding=sharding)
    Stuck(dbos)
    async with dbos:
        handle = await dbos.retrieve_workflow("fragile", shard_key=key)
        with pytest.raises(DeadLetteredError):
            await handle.get_result()
        status = await dbos.get_workflow_status("fragile", shard_key=key)
        assert status is not None and status.recovery_attempts == 2


def test_a_bad_limit_is_refused() -> None:
    dbos = DBOS(system_database_url="postgresql://localhost/unused")
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(InvalidArgumentError, match="max_recovery_attempts"):
            dbos.workflow(max_recovery_attempts=bad)  # type: ignore[arg-type]

    async def unused() -> None: ...

    # 0: never recovered (dead-lettered at its first recovery).
    assert callable(dbos.workflow(max_recovery_attempts=0)(unused))
