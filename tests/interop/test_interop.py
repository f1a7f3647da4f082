"""Interoperability with the `dbos` package (3.4.0), run in subprocesses (its DBOS is a
process singleton with threads):

(a) its DBOSClient enqueues with portable serialization, a dbos_async executor runs it, and
    its client reads the result, status and steps;
(b) our DBOSClient enqueues with portable serialization, a `dbos` executor runs it, and our
    client reads the result;
(c) its send/get_event and ours reach each other's workflows;
(d) a workflow listed by one is listed by the other with the same status, name, queue and
    timestamps;
(e) its send_bulk reaches our workflows and ours reaches its, exactly once per idempotency
    key on either side;
(f) its patching mode and ours are one application version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

from helpers import new_dbos

from dbos_async import DBOSClient, SendMessage, SetWorkflowID, WorkflowStatus

PATIENCE = 60.0

_DBOS_CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOSClient, WorkflowSerializationFormat

    PORTABLE = WorkflowSerializationFormat.PORTABLE
    client = DBOSClient(system_database_url=sys.argv[1])
    try:
        handle = client.enqueue({"workflow_name": "interop_work", "queue_name": "interop",
                                 "workflow_id": "from-dbos", "serialization_type": PORTABLE},
                                20, label="x")
        print("RESULT", json.dumps(handle.get_result(polling_interval_sec=0.1)), flush=True)
        status = handle.get_status()
        print("STATUS", json.dumps([status.status, status.name, status.queue_name]),
              flush=True)
        steps = client.list_workflow_steps("from-dbos")
        print("STEPS", json.dumps([[s["function_id"], s["function_name"], s["output"]]
                                   for s in steps]), flush=True)
        client.send("our-chat", "ping!", topic="ping", serialization_type=PORTABLE)
        print("EVENT", json.dumps(client.get_event("our-chat", "pong", 30)), flush=True)
        for w in client.list_workflows(workflow_ids=["from-dbos", "our-chat"]):
            print("LIST", json.dumps([w.workflow_id, w.status, w.name, w.queue_name,
                                      w.created_at, w.updated_at]), flush=True)
    finally:
        client.destroy()
    """
)

_DBOS_EXECUTOR_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOS, SetWorkflowID, WorkflowSerializationFormat

    PORTABLE = WorkflowSerializationFormat.PORTABLE
    DBOS(config={"name": "interop-b", "system_database_url": sys.argv[1],
                 "application_version": "interop-v", "executor_id": "dbos-executor"})

    @DBOS.step(name="dbos_step")
    def dbos_step(x: int) -> int:
        return 3 * x

    @DBOS.workflow(name="dbos_work", serialization_type=PORTABLE)
    def dbos_work(x: int, label: str = "") -> dict:
        return {"label": label, "value": dbos_step(x)}

    @DBOS.workflow(name="dbos_chat", serialization_type=PORTABLE)
    def dbos_chat() -> str:
        message = DBOS.recv("ping", 30)
        DBOS.set_event("pong", "pong:" + str(message))
        return message

    DBOS.launch()
    DBOS.register_queue("interop-b")
    try:
        with SetWorkflowID("dbos-chat"):
            chat = DBOS.start_workflow(dbos_chat)
        print("READY", flush=True)
        print("RESULT", json.dumps(DBOS.retrieve_workflow("to-dbos").get_result()), flush=True)
        print("CHAT", json.dumps(chat.get_result()), flush=True)
        for w in DBOS.list_workflows(workflow_ids=["to-dbos", "dbos-chat"]):
            print("LIST", json.dumps([w.workflow_id, w.status, w.name, w.queue_name,
                                      w.created_at, w.updated_at]), flush=True)
    finally:
        DBOS.destroy()
    """
)


def lines(stdout: str, tag: str) -> list[Any]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(tag + " ")]


@contextlib.asynccontextmanager
async def script_running(script: str, database_url: str,
                         tag: bytes) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run ``script`` on the database in a subprocess; the block starts once it printed a
    line starting with ``tag`` (its readiness; another line first fails with its output).
    A block that fails kills it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, database_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready = await asyncio.wait_for(proc.stdout.readline(), PATIENCE)
        if not ready.startswith(tag):
            _, err = await proc.communicate()
            raise AssertionError(f"{ready!r}\n{err.decode()}")
        yield proc
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise


async def script_output(proc: asyncio.subprocess.Process) -> str:
    """What the script printed after its readiness line, once it exited successfully."""
    rest, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    stdout = rest.decode()
    assert proc.returncode == 0, f"{stdout}\n{err.decode()}"
    return stdout


def listed(statuses: list[WorkflowStatus]) -> dict[str, list[Any]]:
    return {s.workflow_id: [s.workflow_id, s.status, s.name, s.queue_name, s.created_at,
                            s.updated_at] for s in statuses}


async def test_dbos_client_with_our_executor(database_url: str) -> None:
    dbos = new_dbos(database_url)
    dbos.queue("interop")

    @dbos.step(name="interop_step")
    async def interop_step(x: int) -> int:
        return 2 * x

    @dbos.workflow(name="interop_work")
    async def interop_work(x: int, label: str = "") -> dict[str, Any]:
        return {"label": label, "value": await interop_step(x)}

    @dbos.workflow(name="our_chat")
    async def our_chat() -> str:
        message = await dbos.recv("ping", timeout=30)
        await dbos.set_event("pong", f"pong:{message}")
        return str(message)

    async with dbos:
        with SetWorkflowID("our-chat"):
            chat = await dbos.start_workflow(our_chat)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _DBOS_CLIENT_SCRIPT, database_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
        stdout = out.decode()
        assert proc.returncode == 0, f"{stdout}\n{err.decode()}"
        # (a) its client read our executor's result, status and steps.
        assert lines(stdout, "RESULT") == [{"label": "x", "value": 40}]
        assert lines(stdout, "STATUS") == [["SUCCESS", "interop_work", "interop"]]
        [steps] = lines(stdout, "STEPS")
        assert [name for _, name, _ in steps] == ["interop_step"] and steps[0][2] == 40
        # (c) its send reached our workflow; its get_event read our event.
        assert lines(stdout, "EVENT") == ["pong:ping!"]
        assert await chat.get_result() == "ping!"
        # (d) the same listing on both sides.
        ours = listed(await dbos.list_workflows(workflow_ids=["from-dbos", "our-chat"]))
        theirs = {row[0]: row for row in lines(stdout, "LIST")}
        assert set(theirs) == {"from-dbos", "our-chat"}
        for workflow_id, row in theirs.items():
            # Their listing ran before our-chat finished; compare what it saw then.
            if workflow_id == "our-chat" and row[1] != "SUCCESS":
                continue
            assert ours[workflow_id] == row


async def test_our_client_with_dbos_executor(database_url: str) -> None:
    # The schema comes from us; the dbos executor finds it current and does not migrate.
    async with new_dbos(database_url):
        pass
    # The client acts for the dbos executor's application (its config name), whose
    # dequeue takes only its own and unclaimed workflows.
    client = DBOSClient(system_database_url=database_url,
                        application_name="interop-b", result_poll_interval=0.2)
    async with client:
        handle = await client.enqueue("interop-b", "dbos_work", 7, label="y",
                                      workflow_id="to-dbos", application_version="interop-v")
        async with script_running(_DBOS_EXECUTOR_SCRIPT, database_url, b"READY") as proc:
            # (c) our send reaches its workflow, and we read its event.
            await client.send("dbos-chat", "hi", topic="ping")
            assert await client.get_event("dbos-chat", "pong", timeout=30) == "pong:hi"
            # (b) its executor ran what our client enqueued.
            result = await asyncio.wait_for(handle.get_result(), PATIENCE)
            assert result == {"label": "y", "value": 21}
            stdout = await script_output(proc)
        assert lines(stdout, "CHAT") == ["hi"]
        steps = await client.list_workflow_steps("to-dbos")
        # dbos records a step's output with its default serializer (py_pickle), which we
        # do not read: the step is listed, its output left None.
        assert [(s.function_id, s.name, s.output) for s in steps] == [(1, "dbos_step", None)]
        # (d) the same listing on both sides.
        ours = listed(await client.list_workflows(workflow_ids=["to-dbos", "dbos-chat"]))
        theirs = {row[0]: row for row in lines(stdout, "LIST")}
        assert theirs == ours
        status = await client.get_workflow_status("to-dbos")
        assert status is not None
        assert (status.status, status.name, status.queue_name) == (
            "SUCCESS", "dbos_work", "interop-b")


_DBOS_BULK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOS, SendMessage, SetWorkflowID, WorkflowSerializationFormat

    PORTABLE = WorkflowSerializationFormat.PORTABLE
    DBOS(config={"name": "interop-bulk", "system_database_url": sys.argv[1],
                 "executor_id": "dbos-bulk"})

    @DBOS.workflow(name="dbos_inbox", serialization_type=PORTABLE)
    def dbos_inbox() -> list:
        return [DBOS.recv("bulk", 30), DBOS.recv("bulk", 30)]

    DBOS.launch()
    try:
        with SetWorkflowID("dbos-inbox"):
            inbox = DBOS.start_workflow(dbos_inbox)
        batch = [SendMessage("our-inbox", "a", "bulk", "k1"),
                 SendMessage("our-inbox", {"b": 2}, "bulk", "k2")]
        DBOS.send_bulk(batch, serialization_type=PORTABLE)
        DBOS.send_bulk(batch, serialization_type=PORTABLE)
        print("READY", flush=True)
        print("RESULT", json.dumps(inbox.get_result()), flush=True)
    finally:
        DBOS.destroy()
    """
)


async def test_send_bulk_both_ways(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.workflow(name="our_inbox")
    async def our_inbox() -> list[Any]:
        return [await dbos.recv("bulk", timeout=30), await dbos.recv("bulk", timeout=30)]

    async with dbos:
        with SetWorkflowID("our-inbox"):
            inbox = await dbos.start_workflow(our_inbox)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _DBOS_BULK_SCRIPT, database_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stdout is not None
            ready = await asyncio.wait_for(proc.stdout.readline(), PATIENCE)
            if not ready.startswith(b"READY"):
                _, err = await proc.communicate()
                raise AssertionError(f"{ready!r}\n{err.decode()}")
            # (e) its send_bulk reached our workflow, each message once.
            assert sorted(await inbox.get_result(), key=str) == ["a", {"b": 2}]
            batch = [SendMessage("dbos-inbox", "x", "bulk", "k1"),
                     SendMessage("dbos-inbox", [3], "bulk", "k2")]
            await dbos.send_bulk(batch)
            await dbos.send_bulk(batch)
            rest, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        stdout = rest.decode()
        assert proc.returncode == 0, f"{stdout}\n{err.decode()}"
        [received] = lines(stdout, "RESULT")
        assert sorted(received, key=str) == [[3], "x"]
        # The same message IDs on both sides: <key>::<destination>.
        rows = await dbos._system_database.pool.fetch(
            "SELECT destination_uuid, message_uuid FROM dbos.notifications "
            "ORDER BY message_uuid")
        assert [(r["destination_uuid"], r["message_uuid"]) for r in rows] == [
            ("dbos-inbox", "k1::dbos-inbox"), ("our-inbox", "k1::our-inbox"),
            ("dbos-inbox", "k2::dbos-inbox"), ("our-inbox", "k2::our-inbox")]


_DBOS_PATCHING_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOS, WorkflowSerializationFormat

    PORTABLE = WorkflowSerializationFormat.PORTABLE
    DBOS(config={"name": "interop-p", "system_database_url": sys.argv[1],
                 "enable_patching": True, "executor_id": "dbos-patching"})

    @DBOS.workflow(name="patched_work", serialization_type=PORTABLE)
    def patched_work(x: int) -> int:
        return x + 1 if DBOS.patch("plus-one") else x

    DBOS.launch()
    DBOS.register_queue("interop-p")
    try:
        print("READY", flush=True)
        print("RESULT", json.dumps(DBOS.retrieve_workflow("to-patched").get_result()),
              flush=True)
    finally:
        DBOS.destroy()
    """
)


async def test_patching_mode_is_the_same_version_as_the_dbos_packages(
        database_url: str) -> None:
    """(f) Its enable_patching and ours run as one version: work our client enqueues for
    our patching-mode version is run by its patching-mode executor, whose patch marker is
    the checkpoint ours records."""
    ours = new_dbos(database_url, application_version=None, enable_patching=True)
    async with ours:
        version = ours.application_version
    assert version == "PATCHING_ENABLED"
    client = DBOSClient(system_database_url=database_url, application_name="interop-p",
                        result_poll_interval=0.2)
    async with client:
        handle = await client.enqueue("interop-p", "patched_work", 1,
                                      workflow_id="to-patched", application_version=version)
        async with script_running(_DBOS_PATCHING_SCRIPT, database_url, b"READY") as proc:
            assert await asyncio.wait_for(handle.get_result(), PATIENCE) == 2
            stdout = await script_output(proc)
        assert lines(stdout, "RESULT") == [2]
        names = [v.version_name for v in await client.list_application_versions()]
        assert names == ["PATCHING_ENABLED"]
        steps = await client.list_workflow_steps("to-patched")
        assert [s.name for s in steps] == ["DBOS.patch-plus-one"]
