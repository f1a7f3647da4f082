"""The listing filters the ``dbos`` package 3.4 has besides the basic ones: completed and
dequeued time ranges, forks and the workflows they came from, children, and the schedule
that started a workflow; on the executor, the client, the CLI, the web routes and the
console, on the unsharded and the sharded schema."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from helpers import new_dbos

from dbos_async import DBOS, DBOSClient, DBOSError, SetShardKey, SetWorkflowID
from dbos_async._web.filters import listing_filters
from dbos_async.console import console_app

CLI = str(Path(sys.executable).with_name("dbos-async"))

PATIENCE = 15.0


def keyed(sharding: bool) -> contextlib.AbstractContextManager[Any]:
    return SetShardKey("acme") if sharding else contextlib.nullcontext()


def ids(statuses: list[Any]) -> set[str]:
    return {s.workflow_id for s in statuses}


class Family:
    """A parent with a child, a queued job, a fork of the parent and a scheduled run."""

    def __init__(self, dbos: DBOS, sharding: bool = False) -> None:
        self.dbos = dbos
        self.jobs = dbos.queue("jobs")

        @dbos.workflow(name="child")
        async def child(x: int) -> int:
            return x * 2

        @dbos.workflow(name="parent")
        async def parent(x: int) -> int:
            with keyed(sharding), SetWorkflowID("kid"):
                handle = await dbos.start_workflow(child, x)
            return await handle.get_result() + 1

        @dbos.workflow(name="tick")
        async def tick(when: datetime, context: Any) -> str:
            return "ticked"

        self.child, self.parent, self.tick = child, parent, tick

    async def run(self, sharding: bool) -> None:
        dbos = self.dbos
        with keyed(sharding):
            with SetWorkflowID("dad"):
                assert await dbos.start_workflow(self.parent, 1) is not None
            with SetWorkflowID("job"):
                queued = await self.jobs.enqueue(self.child, 5)
            with SetWorkflowID("plain"):
                await (await dbos.start_workflow(self.child, 7)).get_result()
        key = "acme" if sharding else None
        assert await (await dbos.retrieve_workflow("dad", shard_key=key)).get_result() == 3
        assert await asyncio.wait_for(queued.get_result(), PATIENCE) == 10
        fork = await dbos.fork_workflow("dad", 0, new_workflow_id="dad-fork", shard_key=key)
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 3
        await dbos.create_schedule("nightly", self.tick, "0 3 * * *", shard_key=key)
        fired = await dbos.trigger_schedule("nightly")
        assert await asyncio.wait_for(fired.get_result(), PATIENCE) == "ticked"
        self.fired = fired.workflow_id


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_new_filters_select_as_documented(database_url: str, sharding: bool) -> None:
    dbos = new_dbos(database_url, sharding=sharding)
    family = Family(dbos, sharding)
    async with dbos:
        await family.run(sharding)
        everyone = {"dad", "kid", "job", "plain", "dad-fork", family.fired}
        assert ids(await dbos.list_workflows()) >= everyone
        statuses = {s.workflow_id: s for s in await dbos.list_workflows()}

        # Children, and workflows without a parent (the fork's own child is a child too).
        children = ids(await dbos.list_workflows(has_parent=True))
        assert "kid" in children and not children & {"dad", "job", "plain", "dad-fork"}
        assert ids(await dbos.list_workflows(has_parent=False)) >= {"dad", "job", "dad-fork"}
        # Forks, and the workflows they were forked from.
        assert ids(await dbos.list_workflows(is_fork=True)) == {"dad-fork"}
        assert "dad-fork" not in ids(await dbos.list_workflows(is_fork=False))
        assert ids(await dbos.list_workflows(was_forked_from=True)) == {"dad"}
        assert statuses["dad"].was_forked_from and not statuses["dad-fork"].was_forked_from
        assert "dad" not in ids(await dbos.list_workflows(was_forked_from=False))
        # The schedule that started it.
        assert ids(await dbos.list_workflows(schedule_name="nightly")) == {family.fired}
        assert ids(await dbos.list_workflows(schedule_name=["nightly", "other"])) == {
            family.fired}
        assert statuses[family.fired].schedule_name == "nightly"
        assert await dbos.list_workflows(schedule_name="other") == []

        # Completion times, inclusive at both ends.
        done = statuses["plain"].completed_at
        assert done is not None
        assert "plain" in ids(await dbos.list_workflows(completed_after=done,
                                                        completed_before=done))
        assert "plain" not in ids(await dbos.list_workflows(completed_after=done + 1))
        assert "plain" not in ids(await dbos.list_workflows(completed_before=done - 1))
        # Dequeue times: only workflows a claim took from a queue have one.
        dequeued = statuses["job"].started_at_epoch_ms
        assert dequeued is not None
        window = ids(await dbos.list_workflows(dequeued_after=dequeued,
                                               dequeued_before=dequeued))
        assert "job" in window and "plain" not in window
        assert "job" not in ids(await dbos.list_workflows(dequeued_after=dequeued + 1))
        # An ISO 8601 bound is the same instant.
        iso = datetime.fromtimestamp(dequeued / 1000).astimezone().isoformat()
        assert "job" in ids(await dbos.list_workflows(dequeued_before=iso))

        # Combined with the others (AND), and from a client the same.
        assert ids(await dbos.list_workflows(has_parent=False, is_fork=False,
                                             name="parent")) == {"dad"}
        async with DBOSClient(system_database_url=database_url, sharding=sharding) as client:
            assert ids(await client.list_workflows(is_fork=True)) == {"dad-fork"}
            assert ids(await client.list_workflows(schedule_name="nightly",
                                                   has_parent=False)) == {family.fired}


async def test_bad_filters_are_refused_by_name(database_url: str) -> None:
    dbos = new_dbos(database_url)
    async with dbos:
        with pytest.raises(DBOSError, match="has_parent must be True, False or None"):
            await dbos.list_workflows(has_parent="yes")  # type: ignore[arg-type]
        with pytest.raises(DBOSError, match="completed_after is not an ISO 8601 time"):
            await dbos.list_workflows(completed_after="yesterday")
        with pytest.raises(DBOSError, match="dequeued_before must be a datetime"):
            await dbos.list_workflows(dequeued_before=1.5)  # type: ignore[arg-type]
    with pytest.raises(DBOSError, match="'is_fork' must be true or false"):
        listing_filters([("is_fork", "maybe")])
    with pytest.raises(DBOSError, match="Unknown status 'DONE': choose from PENDING"):
        listing_filters([("status", "done")])
    assert listing_filters([("status", "error"), ("status", "Cancelled")]) == {
        "status": ["ERROR", "CANCELLED"]}
    assert listing_filters([("has_parent", "true"), ("schedule_name", "a"),
                            ("schedule_name", "b"), ("completed_after", "5")]) == {
        "has_parent": True, "schedule_name": ["a", "b"], "completed_after": 5}


async def test_cli_filters(database_url: str) -> None:
    dbos = new_dbos(database_url)
    family = Family(dbos)
    async with dbos:
        await family.run(False)

    def listed(*options: str) -> set[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DBOS_")}
        result = subprocess.run([CLI, "workflow", "list", "--json", "--url", database_url,
                                 *options], capture_output=True, text=True, timeout=60,
                                env=clean, check=False)
        assert result.returncode == 0, result.stderr
        return {row["workflow_id"] for row in json.loads(result.stdout)}

    assert listed("--is-fork") == {"dad-fork"}
    assert listed("--was-forked-from") == {"dad"}
    assert "kid" in listed("--has-parent") and "kid" not in listed("--no-has-parent")
    assert listed("--schedule", "nightly") == {family.fired}
    assert "job" in listed("--dequeued-after", "0") and "plain" not in listed(
        "--dequeued-after", "0")
    assert listed("--completed-before", "1") == set()


async def test_console_filters(database_url: str) -> None:
    dbos = new_dbos(database_url)
    family = Family(dbos)
    async with dbos:
        await family.run(False)
        transport = httpx2.ASGITransport(console_app(dbos), client=("127.0.0.1", 5000))
        async with httpx2.AsyncClient(transport=transport,
                                      base_url="http://127.0.0.1:5000") as http:
            page = await http.get("/workflows", params={"is_fork": "true"})
            assert page.status_code == 200
            assert "dad-fork" in page.text and "data-workflow-id=\"plain\"" not in page.text
            page = await http.get("/workflows", params={"schedule_name": "nightly",
                                                        "has_parent": "false"})
            assert family.fired in page.text and "data-workflow-id=\"dad\"" not in page.text
            page = await http.get("/workflows", params={"completed_before": "2000-01-01T00:00"})
            assert "No workflow matches" in page.text
            refused = await http.get("/workflows", params={"has_parent": "maybe"},
                                     headers={"accept": "application/json"})
            assert refused.status_code == 400
            assert "has_parent" in refused.json()["error"]
