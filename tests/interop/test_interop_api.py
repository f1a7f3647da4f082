"""The calls both APIs have, with the `dbos` package (3.4.0) in subprocesses: its
``run_step``, ``wait_first``, ``read_stream_offset``, ``send(..., send_to_forks=True)`` and
``serialization_type`` on a database dbos_async created, and ours on one it created, each
side reading the checkpoints and values the other wrote."""

from __future__ import annotations

import textwrap

from helpers import new_dbos, wait_until

from dbos_async import DBOS, DBOSClient, SetWorkflowID, WorkflowSerializationFormat
from tests.interop.test_interop_ops import lines, run_script
from tests.workflows.test_reuse_policy import _DBOS_SCHEMA_SCRIPT

PATIENCE = 60.0


async def stepped(dbos: DBOS, workflow_id: str) -> None:
    """Wait for the workflow's first checkpoint (a fork from step 1 needs it)."""

    async def recorded() -> bool:
        return bool(await dbos.list_workflow_steps(workflow_id))

    await wait_until(recorded, what=f"the first step of {workflow_id}")

_DBOS_CALLS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOS, SetWorkflowID, StepOptions, WorkflowSerializationFormat

    PORTABLE = WorkflowSerializationFormat.PORTABLE
    DBOS(config={"name": "interop-calls", "system_database_url": sys.argv[1],
                 "executor_id": "dbos-calls"})

    def double(x):
        return 2 * x

    @DBOS.workflow(name="dbos_calls", serialization_type=PORTABLE)
    def dbos_calls() -> list:
        doubled = DBOS.run_step(StepOptions(name="double"), double, 21)
        value = DBOS.read_stream_offset("our-writer", "out", 1)
        first = DBOS.wait_first([DBOS.retrieve_workflow("our-writer")])
        return [doubled, value, first.workflow_id]

    DBOS.launch()
    try:
        with SetWorkflowID("dbos-calls"):
            print("RESULT", json.dumps(dbos_calls()), flush=True)
        DBOS.send("our-inbox", "hello", "t", send_to_forks=True,
                  serialization_type=PORTABLE)
    finally:
        DBOS.destroy()
    """
)


async def test_dbos_calls_on_our_database(database_url: str) -> None:
    dbos = new_dbos(database_url, allow_pickle=True)

    @dbos.workflow(name="our_writer")
    async def our_writer() -> None:
        for i in range(3):
            await dbos.write_stream("out", 10 + i)
        await dbos.close_stream("out")

    @dbos.workflow(name="our_inbox")
    async def our_inbox() -> str:
        await dbos.run_step(None, str, "ready")
        return str(await dbos.recv("t", timeout=PATIENCE))

    async with dbos:
        with SetWorkflowID("our-writer"):
            await our_writer()
        with SetWorkflowID("our-inbox"):
            inbox = await dbos.start_workflow(our_inbox)
        await stepped(dbos, "our-inbox")
        fork = await dbos.fork_workflow("our-inbox", 1, new_workflow_id="our-fork")
        stdout = await run_script(_DBOS_CALLS_SCRIPT, database_url)
        assert lines(stdout, "RESULT") == [[42, 11, "our-writer"]]
        steps = await dbos.list_workflow_steps("dbos-calls")
        # Its outputs are pickled (read with allow_pickle); its retrieve_workflow in a
        # workflow is a status read of its own.
        assert [(s.name, s.output) for s in steps if s.name != "DBOS.getStatus"] == [
            ("double", 42), ("DBOS.readStreamOffset", 11), ("DBOS.waitFirst", "our-writer")]
        # Its send_to_forks found our fork by our forked_from column.
        assert await inbox.get_result() == "hello"
        assert await fork.get_result() == "hello"


_DBOS_READ_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOSClient, WorkflowSerializationFormat

    client = DBOSClient(system_database_url=sys.argv[1])
    try:
        steps = client.list_workflow_steps("ours")
        print("STEPS", json.dumps([s["function_name"] for s in steps]), flush=True)
        print("OFFSET", json.dumps(client.read_stream_offset("ours", "out", 1)), flush=True)
        # A pickled event (serialization_type="native" here) reads as the set it was.
        print("EVENT", json.dumps(sorted(client.get_event("ours", "tags", 5))), flush=True)
        client.send("our-inbox", {"n", "m"}, "t", send_to_forks=True,
                    serialization_type=WorkflowSerializationFormat.NATIVE)
    finally:
        client.destroy()
    """
)


async def test_our_calls_on_a_dbos_database(database_url: str) -> None:
    await run_script(_DBOS_SCHEMA_SCRIPT, database_url)
    dbos = new_dbos(database_url, allow_pickle=True)

    @dbos.workflow(name="ours")
    async def ours() -> str:
        await dbos.run_step(None, str, "a step")
        for i in range(3):
            await dbos.write_stream("out", f"v{i}")
        await dbos.set_event("tags", {"x", "y"},
                             serialization_type=WorkflowSerializationFormat.NATIVE)
        chosen = await dbos.wait_first([await dbos.retrieve_workflow("our-inbox")])
        return chosen.workflow_id

    @dbos.workflow(name="our_inbox")
    async def our_inbox() -> list[str]:
        await dbos.run_step(None, str, "ready")
        return sorted(await dbos.recv("t", timeout=PATIENCE))

    async with dbos:
        with SetWorkflowID("our-inbox"):
            inbox = await dbos.start_workflow(our_inbox)
        await stepped(dbos, "our-inbox")
        fork = await dbos.fork_workflow("our-inbox", 1, new_workflow_id="our-fork")
        with SetWorkflowID("ours"):
            mine = await dbos.start_workflow(ours)
        assert await dbos.get_event("ours", "tags", timeout=PATIENCE) == {"x", "y"}
        stdout = await run_script(_DBOS_READ_SCRIPT, database_url)
        assert await mine.get_result() == "our-inbox"
        assert await inbox.get_result() == ["m", "n"]
        assert await fork.get_result() == ["m", "n"]
    assert lines(stdout, "STEPS") == [["str", "DBOS.writeStream", "DBOS.writeStream",
                                       "DBOS.writeStream", "DBOS.setEvent"]]
    assert lines(stdout, "OFFSET") == ["v1"]
    assert lines(stdout, "EVENT") == [["x", "y"]]
    async with DBOSClient(system_database_url=database_url, pool_size=2) as client:
        steps = await client.list_workflow_steps("ours")
        assert steps[-1].output == "our-inbox"
