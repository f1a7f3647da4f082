"""Changing workflows and queues in place, with the `dbos` package (3.4.0) in subprocesses:
its ``set_workflow_delay``, ``update_workflow_attributes``, ``list_workflow_steps`` paging
and ``delete_queue`` on a database dbos_async created, and ours on one it created, each side
reading what the other wrote."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from typing import Any

from helpers import fetch, new_dbos

from dbos_async import DBOSClient, SetWorkflowID

PATIENCE = 60.0

_DBOS_CHANGES_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=sys.argv[1])
    try:
        client.set_workflow_delay("ours-delayed", delay_until_epoch_ms=4102444800000)
        client.update_workflow_attributes("ours-tagged", {"b": 2}, merge=True)
        client.delete_queue("ours-doomed")
        steps = client.list_workflow_steps("ours-steps", limit=2, offset=1,
                                           load_output=False)
        print("STEPS", json.dumps([[s["function_id"], s["function_name"], s["output"]]
                                   for s in steps]), flush=True)
        print("QUEUES", json.dumps(sorted(q.name for q in client.list_queues())), flush=True)
    finally:
        client.destroy()
    """
)

_DBOS_SETUP_SCRIPT = textwrap.dedent(
    """
    import sys
    import sqlalchemy as sa
    from dbos import DBOSClient, WorkflowSerializationFormat
    from dbos._migration import ensure_dbos_schema, run_dbos_migrations

    url = sys.argv[1]
    engine = sa.create_engine("postgresql+psycopg://" + url.split("://", 1)[1])
    try:
        ensure_dbos_schema(engine, "dbos")
        run_dbos_migrations(engine, "dbos", True)
    finally:
        engine.dispose()
    PORTABLE = WorkflowSerializationFormat.PORTABLE
    client = DBOSClient(system_database_url=url)
    try:
        client.register_queue("theirs-kept", global_concurrency=3)
        client.register_queue("theirs-doomed")
        client.enqueue({"workflow_name": "job", "queue_name": "theirs-parked",
                        "workflow_id": "theirs-delayed", "delay_seconds": 3600,
                        "serialization_type": PORTABLE})
        client.enqueue({"workflow_name": "job", "queue_name": "theirs-parked",
                        "workflow_id": "theirs-tagged", "attributes": {"a": 1},
                        "serialization_type": PORTABLE})
    finally:
        client.destroy()
    """
)

_DBOS_READ_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=sys.argv[1])
    try:
        for w in client.list_workflows(workflow_ids=["theirs-delayed", "theirs-tagged"]):
            print("WORKFLOW", json.dumps([w.workflow_id, w.status, w.priority,
                                          w.delay_until_epoch_ms, w.attributes]), flush=True)
        kept = client.retrieve_queue("theirs-kept")
        print("KEPT", json.dumps([kept.concurrency, kept.worker_concurrency]), flush=True)
        print("DOOMED", json.dumps(client.retrieve_queue("theirs-doomed") is None), flush=True)
    finally:
        client.destroy()
    """
)


def lines(stdout: str, tag: str) -> list[Any]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(tag + " ")]


async def run_script(script: str, url: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 0, f"{out.decode()}\n{err.decode()}"
    return out.decode()


async def test_dbos_changes_our_database(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step(name="square")
    async def square(x: int) -> int:
        return x * x

    @dbos.workflow(name="four_steps")
    async def four_steps() -> None:
        for x in range(4):
            await square(x)

    async with dbos:
        with SetWorkflowID("ours-steps"):
            await four_steps()
    async with DBOSClient(system_database_url=database_url, pool_size=2) as client:
        await client.register_queue("ours-kept")
        await client.register_queue("ours-doomed")
        await client.enqueue("ours-parked", "job", workflow_id="ours-delayed", delay=60)
        await client.enqueue("ours-parked", "job", workflow_id="ours-tagged",
                             attributes={"a": 1})
        stdout = await run_script(_DBOS_CHANGES_SCRIPT, database_url)
        [row] = await fetch(database_url, "SELECT status, delay_until_epoch_ms FROM "
                                          "dbos.workflow_status WHERE workflow_uuid = $1",
                            "ours-delayed")
        assert (row["status"], row["delay_until_epoch_ms"]) == ("DELAYED", 4102444800000)
        tagged = await client.get_workflow_status("ours-tagged")
        assert tagged is not None and tagged.attributes == {"a": 1, "b": 2}
        assert await client.get_queue_definition("ours-doomed") is None
        assert await client.get_queue_definition("ours-kept") is not None
    # Its step positions count from 1, ours from 0: the page is the stored positions 1, 2.
    assert lines(stdout, "STEPS") == [[[1, "square", None], [2, "square", None]]]
    [queues] = lines(stdout, "QUEUES")
    assert "ours-kept" in queues and "ours-doomed" not in queues


async def test_we_change_a_dbos_database(database_url: str) -> None:
    await run_script(_DBOS_SETUP_SCRIPT, database_url)
    async with DBOSClient(system_database_url=database_url, pool_size=2) as client:
        await client.set_workflow_priority("theirs-delayed", 7)
        await client.set_workflow_delay("theirs-delayed", delay_until_epoch_ms=4102444800000)
        await client.update_workflow_attributes("theirs-tagged", {"b": 2}, merge=True)
        await client.update_queue("theirs-kept", worker_concurrency=2)
        await client.delete_queue("theirs-doomed")
        assert [q.name for q in await client.list_queues()] == ["theirs-kept"]
    stdout = await run_script(_DBOS_READ_SCRIPT, database_url)
    assert sorted(lines(stdout, "WORKFLOW")) == [
        ["theirs-delayed", "DELAYED", 7, 4102444800000, None],
        ["theirs-tagged", "ENQUEUED", 0, None, {"a": 1, "b": 2}],
    ]
    assert lines(stdout, "KEPT") == [[3, 2]]
    assert lines(stdout, "DOOMED") == [True]
