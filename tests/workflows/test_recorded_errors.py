"""Errors read the same on the first run and on every replay.

A failing workflow or step is seen by its caller (or its workflow body) in the form the
system database records, with the original exception as ``__cause__``: the same classes,
``str()`` and fields whether it was raised just now, replayed by recovery in another
executor, read through a handle retrieved later, or read by a client in another process.
Builtin, dbos_async and user-defined (module-level) exception classes still catch it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import execute, new_dbos, step_rows, workflow_row
from helpers.errors_worker import describe
from helpers.user_errors import CardDeclinedError

from dbos_async import (
    DBOS,
    DBOSClient,
    NonExistentWorkflowError,
    RecordedError,
    SetWorkflowID,
    StepRetriesExceededError,
    WorkflowCancelledError,
)

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "errors_worker.py"
PATIENCE = 60.0

# What each kind of failure raises at first, and the class a caller catches it by.
ORIGINAL = {"builtin": ValueError, "library": NonExistentWorkflowError,
            "user": CardDeclinedError}


async def fail(dbos: DBOS, kind: str) -> None:
    """Fail as ``kind``: a builtin, a dbos_async error raised by the library, a user error."""
    if kind == "builtin":
        raise ValueError("bad 3")
    if kind == "library":
        await dbos.send("no-such-workflow", "hello")
    raise CardDeclinedError("4242", 1999)


async def run_worker(url: str, *args: str) -> list[Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


async def test_a_failing_workflow_reads_the_same_on_every_path(database_url: str) -> None:
    dbos = new_dbos(database_url)
    other = new_dbos(database_url, executor_id="other-executor")

    @dbos.step(name="declines")
    async def declines() -> None:
        raise CardDeclinedError("5555", 10)

    @dbos.workflow(name="fails")
    async def fails(kind: str) -> None:
        if kind == "step":  # a step's error the workflow does not catch
            await declines()
        await fail(dbos, kind)

    kinds = [*ORIGINAL, "step"]
    first: dict[str, BaseException] = {}
    later: dict[str, list[BaseException]] = {kind: [] for kind in kinds}

    async def caught(call: Any) -> BaseException:
        with pytest.raises(Exception) as raised:
            await call
        return raised.value

    async with dbos, other:
        for kind in kinds:
            with SetWorkflowID(f"direct-{kind}"):
                first[kind] = await caught(fails(kind))
            with SetWorkflowID(f"started-{kind}"):
                handle = await dbos.start_workflow(fails, kind)
            later[kind].append(await caught(handle.get_result()))
            # The same ID again: the recorded failure, without running the body.
            with SetWorkflowID(f"direct-{kind}"):
                later[kind].append(await caught(fails(kind)))
            # A handle retrieved by another executor, and by a client.
            retrieved = await other.retrieve_workflow(f"direct-{kind}")
            later[kind].append(await caught(retrieved.get_result()))
        async with DBOSClient(system_database_url=database_url,
                              result_poll_interval=0.05) as client:
            for kind in kinds:
                handle = await client.retrieve_workflow(f"direct-{kind}")
                later[kind].append(await caught(handle.get_result()))

    ids = [f"direct-{kind}" for kind in kinds]
    with_module = await run_worker(database_url, "--import-user-errors", *ids)
    without_module = await run_worker(database_url, *ids)

    for kind, replayed_here, there, bare in zip(kinds, later.values(), with_module,
                                                without_module, strict=True):
        error = first[kind]
        original = ORIGINAL.get(kind, CardDeclinedError)
        # The first run raises the recorded form, caused by the original exception...
        assert isinstance(error, RecordedError) and isinstance(error, original)
        assert type(error.__cause__) is original
        assert str(error) == str(error.__cause__) == error.message
        assert error.name == original.__name__
        # ...which every later path raises too, in this process and in another one that
        # has the application's exception class imported.
        for replayed in replayed_here:
            assert describe(replayed) == describe(error), kind
        assert there == describe(error), kind
        # Without the class, a process still reads the same name, message, code and data.
        if kind in ("user", "step"):
            assert bare["classes"][0] == "dbos_async.errors.RecordedError"
            assert bare["str"] == str(error)
            assert bare["fields"] == {k: v for k, v in describe(error)["fields"].items()
                                      if k in ("name", "message", "code", "data")}
        else:
            assert bare == describe(error)

    assert first["library"].workflow_id == "no-such-workflow"
    user = first["user"]
    assert isinstance(user, CardDeclinedError)
    assert (user.card, user.amount_cents) == ("4242", 1999)
    assert str(first["builtin"]) == "bad 3"
    row = await workflow_row(database_url, "direct-user")
    assert row is not None and row["status"] == "ERROR"
    stored = json.loads(row["stored_error"])
    assert (stored["name"], stored["message"]) == ("CardDeclinedError",
                                                   "card 4242 declined for 1999 cents")
    assert stored["data"] == {"card": "4242", "amount_cents": 1999,
                              "python_class": "helpers.user_errors:CardDeclinedError"}


async def test_a_workflow_catching_a_step_error_behaves_the_same_on_replay(
    database_url: str,
) -> None:
    """Recovery in a new executor replays each failed step from its checkpoint: the body
    catches the same error (same classes, text and fields) and returns the same value."""
    kinds = ["builtin", "library", "user", "retries", "child"]
    runs: Counter[str] = Counter()
    seen: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}

    def register(dbos: DBOS, gate: asyncio.Event | None,
                 reached: dict[str, asyncio.Event]) -> Any:
        @dbos.step(name="failing")
        async def failing(kind: str) -> None:
            runs[kind] += 1
            await fail(dbos, kind)

        @dbos.step(name="flaky", retries=2, retry_interval=0)
        async def flaky() -> None:
            runs["retries"] += 1
            raise ConnectionError(f"attempt {runs['retries']} refused")

        @dbos.workflow(name="declining_child")
        async def declining_child() -> None:
            runs["child"] += 1
            raise CardDeclinedError("7777", 5)

        @dbos.step(name="gate")
        async def wait_at_gate(kind: str) -> None:
            reached[kind].set()
            if gate is not None:
                await gate.wait()

        @dbos.workflow(name="tolerant")
        async def tolerant(kind: str) -> str:
            try:
                if kind == "retries":
                    await flaky()
                elif kind == "child":
                    await declining_child()
                else:
                    await failing(kind)
            except CardDeclinedError as error:
                seen[kind].append(describe(error))
                value = f"declined {error.amount_cents}"
            except (ValueError, NonExistentWorkflowError) as error:
                seen[kind].append(describe(error))
                value = f"{type(error).__name__}: {error}"
            except StepRetriesExceededError as error:
                seen[kind].append(describe(error))
                value = f"{error.attempts} attempts, last {error.errors[-1]}"
                assert all(isinstance(e, ConnectionError) for e in error.errors)
            await wait_at_gate(kind)
            return value

        return tolerant

    reached = {kind: asyncio.Event() for kind in kinds}
    first = new_dbos(database_url, shutdown_grace_period=0)
    tolerant = register(first, asyncio.Event(), reached)
    async with first:
        for kind in kinds:
            with SetWorkflowID(f"tolerant-{kind}"):
                await first.start_workflow(tolerant, kind)
        for event in reached.values():
            await asyncio.wait_for(event.wait(), PATIENCE)
    # Left mid-flight (PENDING, at its gate): the next executor recovers and replays it.
    reached = {kind: asyncio.Event() for kind in kinds}
    second = new_dbos(database_url)
    register(second, None, reached)
    async with second:
        results = {kind: await (await second.retrieve_workflow(f"tolerant-{kind}"))
                   .get_result() for kind in kinds}

    assert runs == {"builtin": 1, "library": 1, "user": 1, "retries": 3, "child": 1}
    for kind in kinds:
        live, replayed = seen[kind]
        assert replayed == live, kind
        assert "dbos_async.errors.RecordedError" in live["classes"]
    assert results == {
        "builtin": "ValueError: bad 3",
        "library": "NonExistentWorkflowError: Workflow 'no-such-workflow' does not exist",
        "user": "declined 1999",
        "retries": "3 attempts, last attempt 3 refused",
        "child": "declined 5",
    }
    [attempts] = seen["retries"][0]["fields"]["errors"][-1:]
    assert attempts["str"] == "attempt 3 refused"
    [step, _gate] = await step_rows(database_url, "tolerant-retries")
    assert step.error is not None and step.error["name"] == "StepRetriesExceededError"
    assert [e["message"] for e in step.error["data"]["errors"]] == [
        "attempt 1 refused", "attempt 2 refused", "attempt 3 refused"]


async def test_a_cancelled_child_fails_its_parent_but_a_cancelled_workflow_is_cancelled(
    database_url: str,
) -> None:
    """Awaiting a cancelled child is a failure of the parent, recorded (ERROR) and read the
    same later; the parent's own cancellation (here with its child's, which is what its
    wait meets first) stays a cancellation: CANCELLED, not a recorded error."""
    dbos = new_dbos(database_url)
    started = asyncio.Event()

    @dbos.workflow(name="slow_child")
    async def slow_child() -> None:
        started.set()
        await dbos.sleep(600)

    @dbos.workflow(name="waiting_parent")
    async def waiting_parent() -> None:
        child = await dbos.start_workflow(slow_child)
        await child.get_result()

    async with dbos:
        with SetWorkflowID("parent"):
            parent = await dbos.start_workflow(waiting_parent)
        await asyncio.wait_for(started.wait(), PATIENCE)
        await dbos.cancel_workflow("parent-0")
        with pytest.raises(WorkflowCancelledError) as first:
            await asyncio.wait_for(parent.get_result(), PATIENCE)
        assert (await parent.get_status()).status == "ERROR"
        with pytest.raises(WorkflowCancelledError) as later:
            await (await dbos.retrieve_workflow("parent")).get_result()

        started.clear()
        with SetWorkflowID("cancelled-parent"):
            cancelled = await dbos.start_workflow(waiting_parent)
        await asyncio.wait_for(started.wait(), PATIENCE)
        await dbos.cancel_workflow("cancelled-parent", cancel_children=True)
        with pytest.raises(WorkflowCancelledError) as own:
            await asyncio.wait_for(cancelled.get_result(), PATIENCE)
        assert (await cancelled.get_status()).status == "CANCELLED"

    assert isinstance(first.value, RecordedError)
    assert first.value.workflow_id == "parent-0"
    assert describe(later.value) == describe(first.value)
    assert not isinstance(own.value, RecordedError)
    assert own.value.workflow_id == "cancelled-parent"


_DBOS_READER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=sys.argv[1])
    try:
        for workflow_id in sys.argv[2:]:
            try:
                client.retrieve_workflow(workflow_id).get_result(polling_interval_sec=0.1)
            except Exception as error:
                print(json.dumps([type(error).__name__, error.name, str(error), error.code,
                                  error.data]), flush=True)
    finally:
        client.destroy()
    """
)


async def test_the_dbos_package_reads_our_recorded_errors(database_url: str) -> None:
    """The class path rides in ``data``: the ``dbos`` package (3.4.0) reads the error with
    its name, message and data as we wrote them."""
    dbos = new_dbos(database_url)

    @dbos.workflow(name="fails")
    async def fails(kind: str) -> None:
        await fail(dbos, kind)

    async with dbos:
        for kind in ("builtin", "user"):
            with SetWorkflowID(f"read-by-dbos-{kind}"), pytest.raises(ORIGINAL[kind]):
                await fails(kind)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DBOS_READER_SCRIPT, database_url, "read-by-dbos-builtin",
        "read-by-dbos-user", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 0, err.decode()
    assert [json.loads(line) for line in out.decode().splitlines()] == [
        ["PortableWorkflowError", "ValueError", "bad 3", None, None],
        ["PortableWorkflowError", "CardDeclinedError", "card 4242 declined for 1999 cents",
         None, {"card": "4242", "amount_cents": 1999,
                "python_class": "helpers.user_errors:CardDeclinedError"}],
    ]


async def test_a_stored_error_of_unknown_or_local_class_reads_as_a_recorded_error(
    database_url: str,
) -> None:
    """A class path naming nothing this process has imported, and a class defined inside a
    function (no importable path), read back as a plain RecordedError with the recorded
    name and message: nothing is imported on the database's word."""

    class LocalError(Exception):
        pass

    dbos = new_dbos(database_url)

    @dbos.workflow(name="fails_locally")
    async def fails_locally() -> None:
        raise LocalError("local failure")

    async with dbos:
        with SetWorkflowID("local"), pytest.raises(RecordedError) as local:
            await fails_locally()
        await _store_failure(database_url, "forged", {
            "name": "Popen", "message": "not imported",
            "data": {"python_class": "subprocess:Popen"}})
        await _store_failure(database_url, "unimported", {
            "name": "Fancy", "message": "nowhere", "code": 7,
            "data": {"python_class": "no_such_module_here:Fancy"}})
        with pytest.raises(RecordedError) as forged:
            await (await dbos.retrieve_workflow("forged")).get_result()
        with pytest.raises(RecordedError) as unimported:
            await (await dbos.retrieve_workflow("unimported")).get_result()
    assert type(local.value) is RecordedError and isinstance(local.value.__cause__, LocalError)
    assert (local.value.name, str(local.value)) == ("LocalError", "local failure")
    assert type(forged.value) is RecordedError and str(forged.value) == "not imported"
    assert type(unimported.value) is RecordedError
    assert (unimported.value.name, unimported.value.code) == ("Fancy", 7)
    assert "no_such_module_here" not in sys.modules
    # A traceback says which type was recorded and why it is not the one raised.
    assert _last_lines(unimported.value)[-2:] == [
        "dbos_async.errors.RecordedError: nowhere",
        "Recorded as 'Fancy', read back as a RecordedError: its class "
        "no_such_module_here:Fancy is not in a module this process has imported. Its .name, "
        ".message, .code and .data are the recorded ones."]
    assert "defined inside a function" in _last_lines(local.value)[-1]


async def test_a_traceback_names_the_type_the_workflow_raised(database_url: str) -> None:
    """The error a caller gets prints as the user's own type (``ValueError: ...``), on the
    first run as on a replay, not as a class of dbos_async's."""
    dbos = new_dbos(database_url)

    @dbos.workflow(name="fails")
    async def fails(kind: str) -> None:
        await fail(dbos, kind)

    async with dbos:
        for kind, last in [("builtin", "ValueError: bad 3"),
                           ("user", "helpers.user_errors.CardDeclinedError: "
                                    "card 4242 declined for 1999 cents"),
                           ("library", "dbos_async.errors.NonExistentWorkflowError: ")]:
            with SetWorkflowID(f"tb-{kind}"), pytest.raises(RecordedError) as first:
                await fails(kind)
            with SetWorkflowID(f"tb-{kind}"), pytest.raises(RecordedError) as replayed:
                await fails(kind)
            for error in (first.value, replayed.value):
                assert _last_lines(error)[-1].startswith(last), kind
                assert isinstance(error, ORIGINAL[kind])


def _last_lines(error: BaseException) -> list[str]:
    """The lines a traceback of ``error`` ends with: the exception, then its notes."""
    return [line.rstrip("\n") for line in traceback.format_exception_only(error)]


async def _store_failure(url: str, workflow_id: str, error: dict[str, Any]) -> None:
    """A failed workflow as another writer might have stored it."""
    await execute(url, """
        INSERT INTO dbos.workflow_status (workflow_uuid, status, name, error, serialization,
                                          created_at, updated_at)
        VALUES ($1, 'ERROR', 'elsewhere', $2, 'portable_json', 0, 0)""",
        workflow_id, json.dumps(error))
