"""The new listing filters and the fork variants with the `dbos` package (3.4.0) in
subprocesses: its ``list_workflows`` filters and ``fork_workflow`` on a database dbos_async
wrote, and ours on one its executor wrote; each side selects the same workflows."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from datetime import datetime
from typing import Any

from helpers import new_dbos

from dbos_async import DBOSClient, SetWorkflowID, StartPoint, StepNamed

PATIENCE = 60.0

# The filters both sides run, by label; the times are ISO 8601, as the dbos package takes.
FILTERS: dict[str, dict[str, Any]] = {
    "children": {"has_parent": True},
    "top": {"has_parent": False},
    "forks": {"is_fork": True},
    "not_forks": {"is_fork": False},
    "forked": {"was_forked_from": True},
    "scheduled": {"schedule_name": "nightly"},
    "dequeued": {"dequeued_after": "2000-01-01T00:00:00+00:00"},
    "completed_early": {"completed_before": "2000-01-01T00:00:00+00:00"},
    "completed": {"completed_after": "2000-01-01T00:00:00+00:00", "has_parent": False,
                  "is_fork": False},
}

_LISTINGS = """
FILTERS = json.loads(sys.argv[2])
for label, filters in FILTERS.items():
    found = sorted(w.workflow_id for w in LIST(**filters, load_input=False,
                                                load_output=False))
    print("LIST", json.dumps([label, found]), flush=True)
"""

_DBOS_READS_OURS = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=sys.argv[1])
    LIST = client.list_workflows
    try:
    """
) + textwrap.indent(_LISTINGS, "    ") + textwrap.dedent(
    """
        # Its fork of our workflow, from the position our "two" step is recorded at.
        forked = client.fork_workflow("dad", 1)
        print("FORK", json.dumps(forked.workflow_id), flush=True)
    finally:
        client.destroy()
    """
)

_DBOS_WRITES_THEIRS = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOS, SetWorkflowID

    DBOS(config={"name": "interop-f", "system_database_url": sys.argv[1],
                 "application_version": "interop-v", "executor_id": "dbos-executor"})

    @DBOS.step(name="one")
    def one(x: int) -> int:
        return x + 1

    @DBOS.step(name="two")
    def two(x: int) -> int:
        return x * 10

    @DBOS.workflow(name="child")
    def child(x: int) -> int:
        return two(one(x))

    @DBOS.workflow(name="dad")
    def dad(x: int) -> int:
        with SetWorkflowID("kid"):
            handle = DBOS.start_workflow(child, x)
        return one(handle.get_result())

    @DBOS.workflow(name="tick")
    def tick(when, context) -> str:
        return "ticked"

    DBOS.launch()
    queue = DBOS.register_queue("jobs")
    try:
        with SetWorkflowID("dad"):
            DBOS.start_workflow(dad, 1).get_result()
        with SetWorkflowID("job"):
            queue.enqueue(child, 5).get_result()
        DBOS.fork_workflow("dad", 1).get_result()
        DBOS.create_schedule(schedule_name="nightly", workflow_fn=tick, schedule="0 3 * * *")
        DBOS.trigger_schedule("nightly").get_result()
        LIST = DBOS.list_workflows
    """
) + textwrap.indent(_LISTINGS, "    ") + textwrap.dedent(
    """
    finally:
        DBOS.destroy()
    """
)


def lines(stdout: str, tag: str) -> list[Any]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(tag + " ")]


async def run_script(script: str, url: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, url, json.dumps(FILTERS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 0, f"{out.decode()}\n{err.decode()}"
    return out.decode()


async def our_listings(client: DBOSClient) -> dict[str, list[str]]:
    return {label: sorted(w.workflow_id for w in await client.list_workflows(
        **filters, load_input=False, load_output=False)) for label, filters in FILTERS.items()}


async def test_dbos_lists_and_forks_our_workflows(database_url: str) -> None:
    dbos = new_dbos(database_url)
    jobs = dbos.queue("jobs")

    @dbos.step(name="one")
    async def one(x: int) -> int:
        return x + 1

    @dbos.step(name="two")
    async def two(x: int) -> int:
        return x * 10

    @dbos.workflow(name="child")
    async def child(x: int) -> int:
        return await two(await one(x))

    @dbos.workflow(name="dad")
    async def dad(x: int) -> int:
        with SetWorkflowID("kid"):
            handle = await dbos.start_workflow(child, x)
        return await one(await handle.get_result())

    @dbos.workflow(name="tick")
    async def tick(when: datetime, context: Any) -> str:
        return "ticked"

    async with dbos:
        with SetWorkflowID("dad"):
            assert await dad(1) == 21
        with SetWorkflowID("job"):
            assert await (await jobs.enqueue(child, 5)).get_result() == 60
        ours_fork = await dbos.fork_workflow("dad", StartPoint.LAST_STEP)
        assert await asyncio.wait_for(ours_fork.get_result(), PATIENCE) == 21
        await dbos.create_schedule("nightly", tick, "0 3 * * *")
        assert await (await dbos.trigger_schedule("nightly")).get_result() == "ticked"

        async with DBOSClient(system_database_url=database_url) as client:
            ours = await our_listings(client)
        # It lists before it forks.
        stdout = await run_script(_DBOS_READS_OURS, database_url)
        assert dict(lines(stdout, "LIST")) == ours
        assert ours["forks"] == [ours_fork.workflow_id] and ours["forked"] == ["dad"]
        assert ours["children"] == ["kid"] and ours["completed_early"] == []
        assert len(ours["scheduled"]) == 1 and ours["dequeued"]

        # Its fork of ours runs here: the step at position 0 replays, "one" at 1 runs again.
        [their_fork] = lines(stdout, "FORK")
        handle = await dbos.retrieve_workflow(their_fork)
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == 21
        status = await dbos.get_workflow_status(their_fork)
        assert status is not None and status.forked_from == "dad"


async def test_we_list_and_fork_workflows_dbos_wrote(database_url: str) -> None:
    # The schema comes from us; the dbos executor finds it current.
    async with new_dbos(database_url):
        pass
    stdout = await run_script(_DBOS_WRITES_THEIRS, database_url)
    theirs = dict(lines(stdout, "LIST"))
    async with DBOSClient(system_database_url=database_url,
                          application_name="interop-f") as client:
        ours = await our_listings(client)
        assert ours == theirs
        assert ours["children"] == ["kid"] and ours["forked"] == ["dad"]
        assert len(ours["forks"]) == 1 and len(ours["scheduled"]) == 1

        # Our fork points on its recorded steps: the fork copies the checkpoints below.
        steps = await client.list_workflow_steps("kid")
        assert [s.name for s in steps] == ["one", "two"]
        by_name = await client.fork_workflow("kid", StepNamed("two"), new_workflow_id="f1")
        last = await client.fork_workflow("kid", StartPoint.LAST_STEP, new_workflow_id="f2")
        for handle in (by_name, last):
            copied = await client.list_workflow_steps(handle.workflow_id)
            assert [(s.function_id, s.name) for s in copied] == [
                (s.function_id, s.name) for s in steps[:1]]
            status = await client.get_workflow_status(handle.workflow_id)
            assert status is not None and status.forked_from == "kid"
        assert sorted(w.workflow_id for w in await client.list_workflows(
            is_fork=True, name="child")) == ["f1", "f2"]
