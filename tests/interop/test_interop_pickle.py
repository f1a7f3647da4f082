"""Python pickle written by the `dbos` package (its default serializer, `py_pickle`), read
by dbos_async only with allow_pickle=True; never by default, with an error naming the
setting. With it, an executor also runs a workflow the package enqueued pickled and writes
its result back in pickle, for the package's client to read. The package's authentication
columns read back as ours."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import pytest
from helpers import new_dbos

from dbos_async import DBOSClient, RecordedError, SerializationError
from tests.interop.test_interop import lines, script_output, script_running

PATIENCE = 60.0

_DBOS_PICKLING_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOS, DBOSClient, DBOSContextSetAuth, SetWorkflowID

    DBOS(config={"name": "pickles", "system_database_url": sys.argv[1],
                 "application_version": "pickle-v", "executor_id": "dbos-pickler"})

    @DBOS.step(name="pickled_step")
    def pickled_step(x):
        return 2 * x

    @DBOS.workflow(name="pickled_work")
    @DBOS.required_roles(["admin"])
    def pickled_work(x):
        DBOS.set_event("e", {"k": x, "pair": (x, x)})
        DBOS.write_stream("s", x)
        DBOS.close_stream("s")
        return {"doubled": pickled_step(x), "pair": (1, 2)}

    @DBOS.workflow(name="pickled_fail")
    def pickled_fail():
        raise ValueError("bad pickle")

    DBOS.launch()
    try:
        with DBOSContextSetAuth("alice", ["user", "admin"]), SetWorkflowID("pickled"):
            pickled_work(21)
        with SetWorkflowID("pickled-fail"):
            try:
                pickled_fail()
            except ValueError:
                pass
        DBOS.send("inbox-refusing", {"m": 1}, topic="t")
        DBOS.send("inbox-trusting", {"m": 2}, topic="t")
        client = DBOSClient(system_database_url=sys.argv[1])
        handle = client.enqueue({"workflow_name": "our_target", "queue_name": "pickle-q",
                                 "workflow_id": "from-dbos-pickled"}, 5)
        print("ENQUEUED", flush=True)
        print("THEIR_READ", json.dumps(handle.get_result(polling_interval_sec=0.1)),
              flush=True)
        client.destroy()
    finally:
        DBOS.destroy()
    """
)


def executor(url: str, executor_id: str, queues: list[str], **settings: Any) -> Any:
    # A version of its own, registered last, is the latest: it claims unversioned workflows.
    dbos = new_dbos(url, executor_id=executor_id, application_version=f"{executor_id}-v",
                    **settings)
    for queue in queues:
        dbos.queue(queue)

    @dbos.workflow(name="inbox")
    async def inbox() -> Any:
        return await dbos.recv("t", timeout=PATIENCE)

    @dbos.workflow(name="our_target")
    async def our_target(x: int) -> dict[str, Any]:
        return {"got": x, "pair": (x, 1)}

    return dbos


async def test_pickled_values_are_read_only_with_allow_pickle(database_url: str) -> None:
    async with new_dbos(database_url):
        pass  # our schema, current for the package
    async with DBOSClient(system_database_url=database_url) as plain:
        await plain.enqueue("refusing-q", "inbox", workflow_id="inbox-refusing")
        await plain.enqueue("trusting-q", "inbox", workflow_id="inbox-trusting")
    async with script_running(_DBOS_PICKLING_SCRIPT, database_url, b"ENQUEUED") as proc:
        # By default nothing pickled is read: each read names the setting.
        async with DBOSClient(system_database_url=database_url) as plain:
            handle = await plain.retrieve_workflow("pickled")
            with pytest.raises(SerializationError, match=r"py_pickle.*allow_pickle=True"):
                await handle.get_result()
            with pytest.raises(SerializationError, match="allow_pickle=True"):
                await plain.get_event("pickled", "e", timeout=0)
            with pytest.raises(SerializationError, match="allow_pickle=True"):
                [v async for v in plain.read_stream("pickled", "s")]
            with pytest.raises(SerializationError, match="allow_pickle=True"):
                await (await plain.retrieve_workflow("pickled-fail")).get_result()
            [status] = await plain.list_workflows(workflow_ids=["pickled"], load_input=True)
            assert (status.serialization, status.input, status.output) == (
                "py_pickle", None, None)
            # Its identity columns are ours: the role its required_roles chose is assumed.
            assert (status.authenticated_user, status.authenticated_roles,
                    status.assumed_role) == ("alice", ["user", "admin"], "admin")
            assert [s.output for s in await plain.list_workflow_steps("pickled")
                    if s.name == "pickled_step"] == [None]
        refusing = executor(database_url, "refusing", ["refusing-q"])
        async with refusing:
            inbox = await refusing.retrieve_workflow("inbox-refusing")
            with pytest.raises(SerializationError, match="allow_pickle=True") as refused:
                await asyncio.wait_for(inbox.get_result(), PATIENCE)
            assert isinstance(refused.value, RecordedError)

        # With the opt-in, every pickled value reads back as the package stored it.
        trusting = executor(database_url, "trusting", ["trusting-q", "pickle-q"],
                            allow_pickle=True)
        async with trusting, DBOSClient(system_database_url=database_url,
                                        allow_pickle=True) as client:
            assert await (await client.retrieve_workflow("pickled")).get_result() == {
                "doubled": 42, "pair": (1, 2)}
            assert await client.get_event("pickled", "e", timeout=0) == {
                "k": 21, "pair": (21, 21)}
            assert [v async for v in client.read_stream("pickled", "s")] == [21]
            [status] = await client.list_workflows(workflow_ids=["pickled"], load_input=True)
            assert status.input is not None and status.input.args == (21,)
            assert [s.output for s in await client.list_workflow_steps("pickled")
                    if s.name == "pickled_step"] == [42]
            with pytest.raises(ValueError, match="bad pickle") as failed:
                await (await client.retrieve_workflow("pickled-fail")).get_result()
            assert isinstance(failed.value, RecordedError)
            inbox = await trusting.retrieve_workflow("inbox-trusting")
            assert await asyncio.wait_for(inbox.get_result(), PATIENCE) == {"m": 2}
            # The workflow it enqueued pickled ran here; its result went back in pickle.
            ours = await trusting.retrieve_workflow("from-dbos-pickled")
            assert await asyncio.wait_for(ours.get_result(), PATIENCE) == {
                "got": 5, "pair": (5, 1)}
            stdout = await script_output(proc)
    assert lines(stdout, "THEIR_READ") == [{"got": 5, "pair": [5, 1]}]
