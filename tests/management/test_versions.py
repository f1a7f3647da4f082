"""Application versions (list, latest, set latest), recovery scoped to this executor's
version, and workflow patches under replay."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from helpers import APP_VERSION, EXECUTOR_ID, execute, new_dbos, step_rows, workflow_row

from dbos_async import DBOS, DBOSError, SetWorkflowID


async def test_application_versions(database_url: str) -> None:
    first = new_dbos(database_url, application_version="v1")
    async with first:
        [only] = await first.list_application_versions()
        assert only.version_name == "v1"
        latest = await first.get_latest_application_version()
        assert latest is not None and latest.version_name == "v1"
    await asyncio.sleep(0.005)
    second = new_dbos(database_url, application_version="v2")
    async with second:
        names = [v.version_name for v in await second.list_application_versions()]
        assert names == ["v2", "v1"]  # latest first
        latest = await second.get_latest_application_version()
        assert latest is not None and latest.version_name == "v2"

        await second.set_latest_application_version("v1")
        latest = await second.get_latest_application_version()
        assert latest is not None and latest.version_name == "v1"
        assert [v.version_name for v in await second.list_application_versions()] == ["v1", "v2"]

        # An unknown name is registered as the latest.
        await second.set_latest_application_version("v3")
        versions = await second.list_application_versions()
        assert [v.version_name for v in versions] == ["v3", "v1", "v2"]
        assert versions[0].version_timestamp > versions[1].version_timestamp


async def test_recovery_only_resumes_this_version(database_url: str) -> None:
    dbos = new_dbos(database_url)
    ran: Counter[int] = Counter()

    @dbos.workflow(name="versioned")
    async def versioned(x: int) -> int:
        ran[x] += 1
        return x * 10

    inputs = '{"positionalArgs": [%d], "namedArgs": {}}'
    setup = new_dbos(database_url)
    async with setup:
        for workflow_id, version, x in (("mine", APP_VERSION, 1),
                                        ("theirs", "other-version", 2)):
            await execute(database_url, """INSERT INTO dbos.workflow_status
                    (workflow_uuid, status, name, executor_id, application_version,
                     recovery_attempts, serialization)
                    VALUES ($1, 'PENDING', 'versioned', $2, $3, 1, 'portable_json')""",
                          workflow_id, EXECUTOR_ID, version)
            await execute(database_url, "INSERT INTO dbos.workflow_input VALUES ($1, $2)",
                          workflow_id, inputs % x)
    async with dbos:
        handle = await dbos.retrieve_workflow("mine")
        assert await asyncio.wait_for(handle.get_result(), 10) == 10
        recovered = await dbos.recover_pending_workflows()
        assert recovered == []
        theirs = await workflow_row(database_url, "theirs")
        assert theirs is not None
        assert theirs["status"] == "PENDING" and theirs["recovery_attempts"] == 1
        assert ran == Counter({1: 1})


# ---- Patches ----


class Code:
    """One version of a workflow's code; ``version`` picks the patch style."""

    def __init__(self, dbos: DBOS, version: str, block_at: str | None = None) -> None:
        self.calls: Counter[str] = Counter()
        self.blocked = asyncio.Event()
        self.patched: list[bool] = []

        def step(name: str) -> Any:
            @dbos.step(name=name)
            async def run() -> str:
                self.calls[name] += 1
                if name == block_at:
                    self.blocked.set()
                    await asyncio.Event().wait()  # until the executor is shut down
                return name

            return run

        old_step, new_step, last = step("old_step"), step("new_step"), step("last")

        @dbos.workflow(name="patched")
        async def patched() -> list[str]:
            if version == "v1":
                taken = [await old_step()]
            elif version == "v2":
                is_new = await dbos.patch("fix")
                self.patched.append(is_new)
                taken = [await new_step()] if is_new else [await old_step()]
            else:  # v3: every execution from before the patch is gone
                self.patched.append(await dbos.deprecate_patch("fix"))
                taken = [await new_step()]
            taken.append(await last())
            return taken

        self.workflow = patched


async def crash_at(url: str, version: str, workflow_id: str, block_at: str) -> None:
    """Run ``version`` until the step ``block_at`` and stop there, leaving it PENDING."""
    dbos = new_dbos(url, shutdown_grace_period=0)
    code = Code(dbos, version, block_at=block_at)
    async with dbos:
        with SetWorkflowID(workflow_id):
            await dbos.start_workflow(code.workflow)
        await asyncio.wait_for(code.blocked.wait(), 10)


async def recover(url: str, version: str, workflow_id: str) -> tuple[Code, list[str]]:
    dbos = new_dbos(url)
    code = Code(dbos, version)
    async with dbos:
        result = await asyncio.wait_for((await dbos.retrieve_workflow(workflow_id))
                                        .get_result(), 10)
    return code, result


async def names(url: str, workflow_id: str) -> list[str]:
    return [s.function_name for s in await step_rows(url, workflow_id)]


async def test_new_execution_takes_the_patched_path(database_url: str) -> None:
    dbos = new_dbos(database_url)
    code = Code(dbos, "v2")
    async with dbos:
        with SetWorkflowID("new"):
            assert await code.workflow() == ["new_step", "last"]
    assert code.patched == [True]
    assert await names(database_url, "new") == ["DBOS.patch-fix", "new_step", "last"]


async def test_replay_of_an_old_execution_takes_the_old_path(database_url: str) -> None:
    # Recorded by the old code: old_step at position 0, then stopped in last.
    await crash_at(database_url, "v1", "old", block_at="last")
    assert await names(database_url, "old") == ["old_step"]
    code, result = await recover(database_url, "v2", "old")
    assert result == ["old_step", "last"]
    assert code.patched == [False]
    assert code.calls == Counter({"last": 1})  # old_step replayed from its checkpoint
    # No marker was recorded: the old path kept its positions.
    assert await names(database_url, "old") == ["old_step", "last"]


async def test_replay_of_a_patched_execution_stays_patched(database_url: str) -> None:
    await crash_at(database_url, "v2", "patched-run", block_at="last")
    assert await names(database_url, "patched-run") == ["DBOS.patch-fix", "new_step"]
    code, result = await recover(database_url, "v2", "patched-run")
    assert result == ["new_step", "last"] and code.patched == [True]
    assert code.calls == Counter({"last": 1})


async def test_replay_that_stopped_before_the_patch_takes_the_new_path(
        database_url: str) -> None:
    """An execution with nothing recorded at the patch's position is a new one there."""
    await crash_at(database_url, "v1", "early", block_at="old_step")
    assert await names(database_url, "early") == []
    code, result = await recover(database_url, "v2", "early")
    assert result == ["new_step", "last"] and code.patched == [True]
    assert await names(database_url, "early") == ["DBOS.patch-fix", "new_step", "last"]


async def test_deprecated_patch(database_url: str) -> None:
    # A patched execution replays through the deprecated patch, consuming the marker.
    await crash_at(database_url, "v2", "before-deprecation", block_at="last")
    code, result = await recover(database_url, "v3", "before-deprecation")
    assert result == ["new_step", "last"] and code.patched == [True]
    assert code.calls == Counter({"last": 1})
    # A new execution records no marker.
    dbos = new_dbos(database_url)
    code = Code(dbos, "v3")
    async with dbos:
        with SetWorkflowID("after-deprecation"):
            assert await code.workflow() == ["new_step", "last"]
    assert await names(database_url, "after-deprecation") == ["new_step", "last"]


async def test_patch_outside_a_workflow(database_url: str) -> None:
    dbos = new_dbos(database_url)
    async with dbos:
        with pytest.raises(DBOSError, match="workflow"):
            await dbos.patch("fix")
        with pytest.raises(DBOSError, match="workflow"):
            await dbos.deprecate_patch("fix")
