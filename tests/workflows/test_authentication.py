"""Authentication: the identity set with SetAuthentication is recorded on the workflows
started in its block (the columns the `dbos` package writes), inherited by their children
and enqueued workflows, kept across recovery, and checked against required roles before
anything is written."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from helpers import count_workflows, fetch, new_dbos

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    NotAuthorizedError,
    SetAuthentication,
    SetShardKey,
    SetWorkflowID,
    current_authentication,
    current_shard_key,
)

PATIENCE = 30.0


def identity() -> list[Any]:
    auth = current_authentication()
    return [auth.user, list(auth.roles) if auth.roles is not None else None, auth.assumed_role]


async def recorded_identities(url: str) -> dict[str, list[Any]]:
    rows = await fetch(url, """SELECT workflow_uuid, authenticated_user, authenticated_roles,
                                      assumed_role FROM dbos.workflow_status""")
    return {r["workflow_uuid"]: [r["authenticated_user"],
                                 json.loads(r["authenticated_roles"])
                                 if r["authenticated_roles"] else None,
                                 r["assumed_role"]] for r in rows}


def register_family(dbos: DBOS) -> Any:
    queue = dbos.queue("auth-jobs")

    @dbos.step()
    async def seen_by_step() -> list[Any]:
        return identity()

    @dbos.workflow(name="child")
    async def child() -> list[Any]:
        return identity()

    @dbos.workflow(name="parent", required_roles=["user", "admin"])
    async def parent() -> dict[str, Any]:
        key = current_shard_key()  # children under the parent's key, when sharded
        with SetShardKey(key) if key is not None else contextlib.nullcontext():
            started = await dbos.start_workflow(child)
            enqueued = await queue.enqueue(child)
        return {"body": identity(), "step": await seen_by_step(),
                "child": await started.get_result(), "enqueued": await enqueued.get_result(),
                "ids": [started.workflow_id, enqueued.workflow_id]}

    return parent


@pytest.mark.parametrize("sharding", [False, True])
async def test_identity_is_recorded_and_inherited(database_url: str, sharding: bool) -> None:
    dbos = new_dbos(database_url, sharding=sharding)
    parent = register_family(dbos)
    async with dbos:
        with SetAuthentication("alice", ["admin", "user"]), SetWorkflowID("p"):
            if sharding:
                with SetShardKey("tenant-a"):
                    result = await parent()
            else:
                result = await parent()
        # The first required role the user holds is the one assumed, as in the dbos package.
        alice = ["alice", ["admin", "user"], "user"]
        assert result["body"] == result["step"] == result["child"] == result["enqueued"] \
            == alice
        status = await dbos.get_workflow_status("p", shard_key="tenant-a") if sharding \
            else await dbos.get_workflow_status("p")
        assert status is not None
        assert (status.authenticated_user, status.authenticated_roles, status.assumed_role) \
            == ("alice", ["admin", "user"], "user")
        recorded = await recorded_identities(database_url)
        assert recorded == {"p": alice, **{child_id: alice for child_id in result["ids"]}}
        assert [w.workflow_id for w in await dbos.list_workflows(authenticated_user="alice")]
        # Outside any block there is no identity.
        assert identity() == [None, None, None]


async def test_missing_roles_are_refused_before_anything_is_written(database_url: str) -> None:
    dbos = new_dbos(database_url)
    queue = dbos.queue("admin-jobs")

    @dbos.workflow(name="admin_only", required_roles=["admin"])
    async def admin_only() -> str:
        return "done"

    async with dbos:
        with pytest.raises(NotAuthorizedError, match="without authentication"):
            await admin_only()
        with SetAuthentication("bob", ["user"]):
            with pytest.raises(NotAuthorizedError) as refused:
                await dbos.start_workflow(admin_only)
            assert "'admin_only' requires one of the roles ['admin']" in str(refused.value)
            assert "user 'bob' with roles ['user']" in str(refused.value)
            with pytest.raises(NotAuthorizedError):
                await queue.enqueue(admin_only)
        debouncer = queue.debouncer(admin_only, period=60)
        with pytest.raises(NotAuthorizedError):
            await debouncer.debounce("k")
        assert await count_workflows(database_url) == 0
        with SetAuthentication("carol", ["admin"]):
            assert await admin_only() == "done"
            await debouncer.debounce("k")
        with SetAuthentication("bob", ["user"]), pytest.raises(NotAuthorizedError):
            await debouncer.debounce("k")  # may not join (and change) carol's burst


async def test_a_refused_child_fails_its_parent_the_same_on_replay(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.workflow(name="needs_admin", required_roles=["admin"])
    async def needs_admin() -> str:
        return "never"

    @dbos.workflow(name="caller")
    async def caller() -> str:
        try:
            await needs_admin()
        except NotAuthorizedError as error:
            return f"refused: {error.function_name}"
        return "ran"

    async with dbos:
        with SetAuthentication("bob", ["user"]), SetWorkflowID("caller-1"):
            assert await caller() == "refused: needs_admin"
        assert await count_workflows(database_url) == 1


async def test_steps_with_required_roles(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step(required_roles=["auditor", "admin"])
    async def audit() -> list[Any]:
        return identity()

    @dbos.workflow(name="audited")
    async def audited() -> Any:
        try:
            return await audit()
        except NotAuthorizedError as error:
            return str(error)

    async with dbos:
        with SetAuthentication("alice", ["admin"]), SetWorkflowID("ok"):
            # The step runs as the required role the user holds; the workflow assumes none.
            assert await audited() == ["alice", ["admin"], "admin"]
        with SetAuthentication("bob", ["user"]), SetWorkflowID("refused"):
            assert "Step" in await audited()
        steps = await dbos.list_workflow_steps("refused")
        assert steps == []  # refused at the call: no checkpoint taken
        # Called outside a workflow, the step is checked against the block's identity.
        with pytest.raises(NotAuthorizedError):
            await audit()
        with SetAuthentication("dave", ["auditor"]):
            assert await audit() == ["dave", ["auditor"], "auditor"]


async def test_recovered_workflow_runs_as_recorded(database_url: str) -> None:
    first = new_dbos(database_url, shutdown_grace_period=0.2)

    def register(dbos: DBOS) -> Any:
        @dbos.workflow(name="waits", required_roles=["user"])
        async def waits() -> list[Any]:
            await dbos.recv("go", timeout=PATIENCE)
            return identity()
        return waits

    waits = register(first)
    async with first:
        with SetAuthentication("alice", ["user"]), SetWorkflowID("w"):
            await first.start_workflow(waits)
    # Left PENDING by the exit; a new instance of the same executor recovers it.
    second = new_dbos(database_url)
    register(second)
    async with second:
        await second.send("w", "go", topic="go")
        handle = await second.retrieve_workflow("w")
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) \
            == ["alice", ["user"], "user"]


async def test_client_enqueues_are_checked_where_they_run(database_url: str) -> None:
    dbos = new_dbos(database_url)
    dbos.queue("checked")

    @dbos.workflow(name="guarded", required_roles=["admin"])
    async def guarded() -> list[Any]:
        return identity()

    async with dbos, DBOSClient(system_database_url=database_url) as client:
        allowed = await client.enqueue("checked", "guarded", authenticated_user="alice",
                                       authenticated_roles=["admin"])
        assert await asyncio.wait_for(allowed.get_result(), PATIENCE) \
            == ["alice", ["admin"], "admin"]
        refused = await client.enqueue("checked", "guarded", authenticated_user="eve")
        with pytest.raises(NotAuthorizedError, match="'guarded' requires"):
            await asyncio.wait_for(refused.get_result(), PATIENCE)
        status = await dbos.get_workflow_status(refused.workflow_id)
        assert status is not None and status.status == "ERROR"
        with pytest.raises(DBOSError, match="list of role names"):
            await client.enqueue("checked", "guarded", authenticated_roles="admin")


async def test_a_refused_queued_workflow_frees_its_worker_slot(database_url: str) -> None:
    # Without notifications: the refused workflow's completion is announced here only
    # before its claim loop counts it, so nothing else frees its slot.
    dbos = new_dbos(database_url, use_listen_notify=False)
    dbos.queue("one-at-a-time", worker_concurrency=1, polling_interval=0.1)

    @dbos.workflow(name="guarded", required_roles=["admin"])
    async def guarded() -> list[Any]:
        return identity()

    async with dbos, DBOSClient(system_database_url=database_url) as client:
        refused = await client.enqueue("one-at-a-time", "guarded", authenticated_user="eve")
        with pytest.raises(NotAuthorizedError):
            await asyncio.wait_for(refused.get_result(), PATIENCE)
        # The only slot was the refused workflow's: the next one runs only if it was freed.
        allowed = await client.enqueue("one-at-a-time", "guarded", authenticated_user="alice",
                                       authenticated_roles=["admin"])
        assert await asyncio.wait_for(allowed.get_result(), PATIENCE) \
            == ["alice", ["admin"], "admin"]


def test_bad_identities_and_requirements_are_refused() -> None:
    with pytest.raises(DBOSError, match="list of role names"):
        SetAuthentication("alice", "admin")  # type: ignore[arg-type]
    with pytest.raises(DBOSError, match="non-empty string"):
        SetAuthentication("", ["admin"])
    with pytest.raises(DBOSError, match="not one of the roles"):
        SetAuthentication("alice", ["user"], assumed_role="admin")
    with pytest.raises(DBOSError, match="non-empty strings"):
        SetAuthentication("alice", ["user", ""])
    dbos = DBOS(system_database_url="postgresql://localhost/unused")
    with pytest.raises(DBOSError, match="required_roles must be a list"):
        @dbos.workflow(required_roles="admin")  # type: ignore[arg-type]
        async def wrong() -> None: ...
