"""The workflow ID reuse policy (``SetWorkflowID(..., workflow_id_reuse_policy=...)`` and
``DBOSClient.enqueue(..., workflow_id_reuse_policy=...)``, as the ``dbos`` package has
them): by default a start whose ID is in use returns that workflow; under ``"reject"`` it
raises :class:`WorkflowIDInUseError`, except for a retry of the start that created the row.
On the unsharded and the sharded schema, and against the ``dbos`` package both ways."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import fetchval, new_dbos

from dbos_async import (
    DBOSClient,
    DBOSError,
    InvalidArgumentError,
    SetShardKey,
    SetWorkflowID,
    WorkflowIDInUseError,
    migrate,
)
from dbos_async._executor.start import Placement, StartPlan, plan_start, read_call
from dbos_async._sysdb.statements import Payload

PATIENCE = 60.0


@pytest.fixture(params=["unsharded", "sharded",
                        pytest.param("citus", marks=pytest.mark.citus)])
def schema(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(URL of a fresh database, whether its system schema is sharded)."""
    if request.param == "citus":
        return request.getfixturevalue("citus_url"), True
    return request.getfixturevalue("plain_database_url"), request.param == "sharded"


class App:
    def __init__(self, url: str, sharded: bool) -> None:
        self.sharded = sharded
        self.dbos = dbos = new_dbos(url, sharding=sharded)
        self.queue = dbos.queue("jobs")
        self.runs: list[int] = []

        @dbos.workflow(name="double")
        async def double(x: int) -> int:
            self.runs.append(x)
            return 2 * x

        @dbos.workflow(name="parent")
        async def parent(child_id: str, x: int) -> str:
            try:
                with self.key(), SetWorkflowID(child_id, workflow_id_reuse_policy="reject"):
                    handle = await dbos.start_workflow(double, x)
            except DBOSError as refused:
                return f"refused: {refused}"
            return f"started: {await handle.get_result()}"

        self.double, self.parent = double, parent

    def key(self) -> contextlib.AbstractContextManager[Any]:
        return SetShardKey("acme") if self.sharded else contextlib.nullcontext()


@contextlib.contextmanager
def named(workflow_id: str, reject: bool, key: contextlib.AbstractContextManager[Any]
          ) -> Iterator[None]:
    policy = "reject" if reject else None
    with key, SetWorkflowID(workflow_id, workflow_id_reuse_policy=policy):
        yield


async def test_by_default_an_id_in_use_returns_that_workflow(
        schema: tuple[str, bool]) -> None:
    url, sharded = schema
    app = App(url, sharded)
    async with app.dbos as dbos:
        with named("w", False, app.key()):
            assert await app.double(1) == 2
        with named("w", False, app.key()):
            assert await app.double(5) == 2  # the recorded result, other arguments or not
        with named("w", False, app.key()):
            assert await (await app.queue.enqueue(app.double, 7)).get_result() == 2
        with named("w", False, app.key()):
            assert await (await dbos.start_workflow(app.double, 9)).get_result() == 2
    assert app.runs == [1]


async def test_reject_refuses_an_id_in_use_and_writes_nothing(
        schema: tuple[str, bool]) -> None:
    url, sharded = schema
    app = App(url, sharded)
    async with app.dbos as dbos:
        with named("w", True, app.key()):
            assert await app.double(1) == 2  # a new ID starts as usual
        starts = [lambda: app.double(5),
                  lambda: dbos.start_workflow(app.double, 5),
                  lambda: app.queue.enqueue(app.double, 5)]
        for start in starts:
            with named("w", True, app.key()), pytest.raises(WorkflowIDInUseError) as refused:
                await start()
            assert (refused.value.workflow_id, refused.value.workflow_status,
                    refused.value.workflow_name) == ("w", "SUCCESS", "double")
            assert str(refused.value) == ("Workflow ID 'w' is already in use by workflow "
                                          "'double' with status SUCCESS")
        # The policy goes with the ID it was given with: the next start is not refused.
        with named("w2", True, app.key()):
            assert await app.double(2) == 4
            assert await (await dbos.start_workflow(app.double, 3)).get_result() == 6
        status = await dbos.get_workflow_status("w", shard_key="acme" if sharded else None)
        assert status is not None and status.status == "SUCCESS"
    assert app.runs[:2] == [1, 2]
    assert await fetchval(url, "SELECT count(*) FROM dbos.workflow_status") == 3


async def test_a_child_refused_is_the_parents_checkpoint(schema: tuple[str, bool]) -> None:
    """From a workflow body the refusal is recorded as the start's step (no child), so a
    replay of the parent (here a fork past that step) raises it again."""
    url, sharded = schema
    app = App(url, sharded)
    key = "acme" if sharded else None
    async with app.dbos as dbos:
        with named("taken", False, app.key()):
            await app.double(1)
        with named("p", False, app.key()):
            refused = await app.parent("taken", 10)
        assert refused.startswith("refused: ") and "'taken' is already in use" in refused
        [step] = await dbos.list_workflow_steps("p", shard_key=key)
        assert step.child_workflow_id is None and step.error is not None
        fork = await dbos.fork_workflow("p", 1, shard_key=key, new_workflow_id="p-replayed")
        assert await fork.get_result() == refused
        with named("q", False, app.key()):
            assert await app.parent("fresh", 10) == "started: 20"
    assert app.runs == [1, 10]


async def test_a_retry_of_the_creating_start_is_not_refused(schema: tuple[str, bool]) -> None:
    """The start that created the row (its creator token) finds it again, as a retry whose
    first reply was lost does; another start of the same plan is refused."""
    url, sharded = schema
    app = App(url, sharded)
    key = "acme" if sharded else None
    async with app.dbos as dbos:
        sysdb = dbos._system_database
        call = read_call(workflow_id="r", as_child=False, shard_key=key,
                         reuse_policy="reject")

        def plan() -> StartPlan:
            return plan_start(call, name="double", inputs=Payload('{"positionalArgs": [4]}'),
                              executor_id="retrying", application_version=None,
                              now_ms=sysdb.clock.now_ms(), placement=Placement("jobs"))

        once = plan()  # Planned once, written twice: what a retried insert does.
        first = await sysdb.start_workflow(once.row, once.creator_xid, reject=True)
        again = await sysdb.start_workflow(once.row, once.creator_xid, reject=True)
        assert first.created and again.created
        other = plan()
        with pytest.raises(WorkflowIDInUseError):
            await sysdb.start_workflow(other.row, other.creator_xid, reject=True)
        handle = await dbos.retrieve_workflow("r", shard_key=key)
        assert await handle.get_result() == 8


async def test_the_client_enqueue_takes_the_policy(schema: tuple[str, bool]) -> None:
    url, sharded = schema
    key: dict[str, Any] = {"shard_key": "acme"} if sharded else {}
    await migrate(url, sharding=sharded)
    async with DBOSClient(system_database_url=url, sharding=sharded) as client:
        first = await client.enqueue("jobs", "double", 1, workflow_id="c", **key)
        again = await client.enqueue("jobs", "double", 2, workflow_id="c", **key)
        assert again.workflow_id == first.workflow_id == "c"
        with pytest.raises(WorkflowIDInUseError, match="'c' is already in use by workflow "
                           "'double' with status ENQUEUED"):
            await client.enqueue("jobs", "double", 3, workflow_id="c",
                                 workflow_id_reuse_policy="reject", **key)
        await client.enqueue("jobs", "double", 3, workflow_id="c2",
                             workflow_id_reuse_policy="reject", **key)
        with pytest.raises(InvalidArgumentError, match="workflow_id_reuse_policy"):
            await client.enqueue("jobs", "double", 3, workflow_id="c3",
                                 workflow_id_reuse_policy="never", **key)  # type: ignore[arg-type]
        assert await client.get_workflow_status("c3", **key) is None


def test_bad_policies_are_refused_at_the_block() -> None:
    with pytest.raises(InvalidArgumentError, match="workflow_id_reuse_policy: must be one of "
                       "'return-existing', 'reject'"):
        SetWorkflowID("w", workflow_id_reuse_policy="overwrite")  # type: ignore[arg-type]
    assert SetWorkflowID("w", workflow_id_reuse_policy="return-existing")


async def test_a_debounce_refuses_the_reject_policy(database_url: str) -> None:
    app = App(database_url, False)
    async with app.dbos:
        debouncer = app.queue.debouncer(app.double, period=60)
        with SetWorkflowID("d", workflow_id_reuse_policy="reject"), \
                pytest.raises(DBOSError, match="Cannot debounce a workflow with "
                              "workflow_id_reuse_policy 'reject'"):
            await debouncer.debounce("k", 1)


# ---- Against the dbos package (in subprocesses: its DBOS is a process singleton) ----

_DBOS_ENQUEUES_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dbos import DBOSClient, WorkflowSerializationFormat

    client = DBOSClient(system_database_url=sys.argv[1])
    try:
        for workflow_id in sys.argv[2:]:
            try:
                client.enqueue({"workflow_name": "double", "queue_name": "jobs",
                                "workflow_id": workflow_id, "workflow_id_reuse_policy": "reject",
                                "serialization_type": WorkflowSerializationFormat.PORTABLE}, 1)
                print("OUTCOME", json.dumps([workflow_id, "enqueued"]), flush=True)
            except Exception as error:
                print("OUTCOME", json.dumps([workflow_id, type(error).__name__,
                                             getattr(error, "workflow_status", None),
                                             getattr(error, "workflow_name", None)]),
                      flush=True)
    finally:
        client.destroy()
    """
)

_DBOS_SCHEMA_SCRIPT = textwrap.dedent(
    """
    import sys
    import sqlalchemy as sa
    from dbos._migration import ensure_dbos_schema, run_dbos_migrations

    engine = sa.create_engine("postgresql+psycopg://" + sys.argv[1].split("://", 1)[1])
    try:
        ensure_dbos_schema(engine, "dbos")
        run_dbos_migrations(engine, "dbos", True)
    finally:
        engine.dispose()
    """
)


async def run_script(script: str, *args: str) -> list[Any]:
    """Run ``script`` with ``args``; the JSON of its OUTCOME lines."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 0, f"{out.decode()}\n{err.decode()}"
    return [json.loads(line.split(" ", 1)[1]) for line in out.decode().splitlines()
            if line.startswith("OUTCOME ")]


async def test_the_dbos_client_rejects_on_our_database(database_url: str) -> None:
    app = App(database_url, False)
    async with app.dbos as dbos:
        with named("ours", False, app.key()):
            assert await app.double(1) == 2
        outcomes = await run_script(_DBOS_ENQUEUES_SCRIPT, database_url, "ours", "fresh")
        assert outcomes == [["ours", "DBOSWorkflowIDInUseError", "SUCCESS", "double"],
                            ["fresh", "enqueued"]]
        # Its enqueue under the policy runs here.
        assert await (await dbos.retrieve_workflow("fresh")).get_result() == 2


async def test_we_reject_on_a_dbos_database(database_url: str) -> None:
    await run_script(_DBOS_SCHEMA_SCRIPT, database_url)
    assert await run_script(_DBOS_ENQUEUES_SCRIPT, database_url, "theirs") == [
        ["theirs", "enqueued"]]
    async with DBOSClient(system_database_url=database_url) as client:
        with pytest.raises(WorkflowIDInUseError) as refused:
            await client.enqueue("jobs", "double", 2, workflow_id="theirs",
                                 workflow_id_reuse_policy="reject")
        assert (refused.value.workflow_status, refused.value.workflow_name) == (
            "ENQUEUED", "double")
        await client.enqueue("jobs", "double", 3, workflow_id="mine",
                             workflow_id_reuse_policy="reject")
    # And its client refuses the ID our client took.
    assert await run_script(_DBOS_ENQUEUES_SCRIPT, database_url, "mine") == [
        ["mine", "DBOSWorkflowIDInUseError", "ENQUEUED", "double"]]
