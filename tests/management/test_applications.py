"""Several applications sharing one system database (``application_name``), workflow
attributes, the client's wait/dedup additions, and timeouts reaching children.

Two executors of different applications share an executor ID (the default ``local``
collides across applications). Version names are unique across the applications of a
database (as in DBOS Transact), so the two run different versions; rows of
another application under this executor's own version are written directly, to show that
only the application scope keeps them apart.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers import EXECUTOR_ID, execute, fetch, fetchval, new_dbos

from dbos_async import (
    DBOS,
    ApplicationOwnershipError,
    DBOSClient,
    QueueDeduplicatedError,
    SetWorkflowAttributes,
    SetWorkflowID,
    SetWorkflowTimeout,
    WorkflowCancelledError,
)

INTERNAL = "_dbos_internal_queue"


def app(url: str, name: str | None, version: str, **settings: Any) -> DBOS:
    """An executor of application ``name`` whose ``work`` says who ran it."""
    dbos = new_dbos(url, application_name=name, application_version=version, **settings)

    @dbos.step(name="tag")
    async def tag(x: str) -> str:
        return f"{name}:{x}"

    @dbos.workflow(name="work")
    async def work(x: str) -> str:
        return await tag(x)

    return dbos


def client(url: str, name: str | None = None) -> DBOSClient:
    return DBOSClient(system_database_url=url, application_name=name,
                      result_poll_interval=0.05)


async def migrate(url: str) -> None:
    async with new_dbos(url, application_version="bootstrap"):
        pass
    await execute(url, "DELETE FROM dbos.application_versions")


async def pending(url: str, owner: str | None, workflow_id: str, version: str) -> None:
    """A PENDING workflow ``work`` of ``owner`` on this test's executor, as a crashed
    executor leaves it."""
    async with client(url, owner) as c:
        await c.enqueue(INTERNAL, "work", workflow_id, workflow_id=workflow_id,
                        application_version=version)
    await execute(url, """UPDATE dbos.workflow_status SET status = 'PENDING',
                          queue_name = NULL, executor_id = $2 WHERE workflow_uuid = $1""",
                  workflow_id, EXECUTOR_ID)


async def statuses(url: str) -> dict[str, tuple[str, str | None]]:
    rows = await fetch(url, "SELECT workflow_uuid, status, application_name "
                            "FROM dbos.workflow_status")
    return {r["workflow_uuid"]: (r["status"], r["application_name"]) for r in rows}


async def test_recovery_takes_own_and_unclaimed_only(database_url: str) -> None:
    url = database_url
    await migrate(url)
    await pending(url, "A", "a-v1", "v1")
    await pending(url, None, "none-v1", "v1")
    await pending(url, "B", "b-v1", "v1")      # B's row under A's version
    await pending(url, "B", "b-v2", "v2")
    await pending(url, "A", "a-v2", "v2")      # A's row under B's version
    async with app(url, "A", "v1") as a:
        assert await (await a.retrieve_workflow("a-v1")).get_result() == "A:a-v1"
        assert await (await a.retrieve_workflow("none-v1")).get_result() == "A:none-v1"
        async with app(url, "B", "v2") as b:
            assert await (await b.retrieve_workflow("b-v2")).get_result() == "B:b-v2"
    found = await statuses(url)
    assert found["b-v1"] == ("PENDING", "B")
    assert found["a-v2"] == ("PENDING", "A")
    assert found["a-v1"] == ("SUCCESS", "A")
    assert found["b-v2"] == ("SUCCESS", "B")
    # Each step row carries the application that ran it.
    rows = await fetch(url, "SELECT workflow_uuid, application_name "
                            "FROM dbos.operation_outputs ORDER BY workflow_uuid")
    assert [(r["workflow_uuid"], r["application_name"]) for r in rows] == [
        ("a-v1", "A"), ("b-v2", "B"), ("none-v1", "A")]


async def test_dequeue_and_latest_version_per_application(database_url: str) -> None:
    url = database_url
    async with app(url, "A", "v1") as a:
        await asyncio.sleep(0.01)
        async with app(url, "B", "v2") as b:
            # v2 is the newest row, but not A's: A stays latest of its own versions.
            assert (await a.get_latest_application_version()).version_name == "v1"  # type: ignore[union-attr]
            assert (await b.get_latest_application_version()).version_name == "v2"  # type: ignore[union-attr]
            assert [v.version_name for v in await a.list_application_versions()] == ["v1"]
            assert [v.version_name for v in await b.list_application_versions()] == ["v2"]
            # Unversioned work: each application takes its own (being latest in its own
            # scope) and unclaimed work, never the other's.
            async with client(url, "A") as ca, client(url, "B") as cb, client(url) as cn:
                ha = await ca.enqueue(INTERNAL, "work", "x", workflow_id="qa")
                hb = await cb.enqueue(INTERNAL, "work", "y", workflow_id="qb")
                hn = await cn.enqueue(INTERNAL, "work", "z", workflow_id="qn")
                assert await asyncio.wait_for(ha.get_result(), 20) == "A:x"
                assert await asyncio.wait_for(hb.get_result(), 20) == "B:y"
                ran_by = (await asyncio.wait_for(hn.get_result(), 20)).split(":")[0]
            # The claim stamped the unclaimed workflow with the application that ran it.
            assert (await statuses(url))["qn"] == ("SUCCESS", ran_by)
            # Listing: own (and unclaimed) by default; another's on request.
            assert {s.workflow_id for s in await a.list_workflows()} == (
                {"qa"} | ({"qn"} if ran_by == "A" else set()))
            assert {s.workflow_id for s in await a.list_workflows(application_name="B")} == (
                {"qb"} | ({"qn"} if ran_by == "B" else set()))
            # A lookup by ID is an identity read, unscoped.
            [status] = await a.list_workflows(workflow_ids=["qb"])
            assert status.application_name == "B"
    async with new_dbos(url) as nameless:  # no application: everything
        assert {s.workflow_id for s in await nameless.list_workflows()} == {"qa", "qb", "qn"}


async def test_direct_starts_are_stamped(database_url: str) -> None:
    dbos = new_dbos(database_url, application_name="A")

    @dbos.step()
    async def step() -> int:
        return 1

    @dbos.workflow()
    async def child() -> int:
        return await step()

    @dbos.workflow()
    async def parent() -> int:
        return await child() + await step()

    async with dbos:
        with SetWorkflowID("direct"):
            assert await parent() == 2
    rows = await fetch(database_url, "SELECT application_name FROM dbos.workflow_status")
    assert [r["application_name"] for r in rows] == ["A", "A"]
    rows = await fetch(database_url, "SELECT application_name FROM dbos.operation_outputs")
    assert len(rows) == 3 and {r["application_name"] for r in rows} == {"A"}


async def test_names_are_owned(database_url: str) -> None:
    url = database_url
    a = app(url, "A", "v1")
    a.queue("orders", concurrency=2)
    async with a:
        b = app(url, "B", "v2")
        b.queue("orders", concurrency=3)
        with pytest.raises(ApplicationOwnershipError, match=r"Queue 'orders'.*'A'"):
            async with b:
                pass
        async with client(url, "B") as cb:
            with pytest.raises(ApplicationOwnershipError, match="'orders'"):
                await cb.register_queue("orders", concurrency=5)
            await cb.register_queue("shipping")
            assert [q.name for q in await cb.list_queues()] == ["shipping"]
        async with client(url) as cn:  # nameless: updates, owner untouched
            await cn.register_queue("orders", concurrency=4)
        # A version name another application owns cannot be registered.
        with pytest.raises(ApplicationOwnershipError, match="Application version 'v1'"):
            async with app(url, "B", "v1"):
                pass
    rows = await fetch(url, "SELECT name, concurrency, application_name FROM dbos.queues "
                            "ORDER BY name")
    assert [(r["name"], r["concurrency"], r["application_name"]) for r in rows] == [
        ("orders", 4, "A"), ("shipping", None, "B")]


async def test_unclaimed_version_is_claimed(database_url: str) -> None:
    url = database_url
    await migrate(url)
    await execute(url, "INSERT INTO dbos.application_versions (version_id, version_name) "
                       "VALUES ('old', 'v1')")
    async with app(url, "A", "v1"):
        pass
    owner = await fetchval(url, "SELECT application_name FROM dbos.application_versions "
                                "WHERE version_name = 'v1'")
    assert owner == "A"


def test_application_name_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBOS_APPLICATION_NAME", "from-env")
    assert DBOS(system_database_url="postgresql://h/db").config.application_name == "from-env"
    assert DBOSClient(system_database_url="postgresql://h/db").application_name == "from-env"


# ---- Attributes ----


async def test_attributes_filter(database_url: str) -> None:
    dbos = new_dbos(database_url)
    orders = dbos.queue("orders")

    @dbos.workflow(name="child")
    async def child() -> str:
        return "child"

    @dbos.workflow(name="parent")
    async def parent(x: str) -> str:
        return await child() + x

    async with dbos:
        with SetWorkflowAttributes({"customer": "acme", "tier": {"level": 2}}), \
                SetWorkflowID("p1"):
            assert await parent("!") == "child!"
        with SetWorkflowAttributes({"customer": "other"}):
            handle = await orders.enqueue(parent, "?")
        await handle.get_result()
        acme = await dbos.list_workflows(attributes={"customer": "acme"})
        assert [s.workflow_id for s in acme] == ["p1"]
        assert acme[0].attributes == {"customer": "acme", "tier": {"level": 2}}
        nested = await dbos.list_workflows(attributes={"tier": {"level": 2}})
        assert [s.workflow_id for s in nested] == ["p1"]
        other = await dbos.list_workflows(attributes={"customer": "other"})
        assert [s.workflow_id for s in other] == [handle.workflow_id]
        # Not inherited by children.
        [kid] = await dbos.list_workflows(parent_workflow_id="p1")
        assert kid.attributes is None
        async with client(database_url) as c:
            h = await c.enqueue("orders", "parent", "c",
                                attributes={"customer": "client"})
            assert await h.get_result() == "child" + "c"
            listed = await c.list_workflows(attributes={"customer": "client"})
            assert [s.workflow_id for s in listed] == [h.workflow_id]
    with pytest.raises(Exception, match="dict"):
        SetWorkflowAttributes(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(Exception, match="JSON"):
        SetWorkflowAttributes({"x": object()})


# ---- Client: wait_first / wait_all, deduplication policy ----


async def test_client_wait_and_dedup(database_url: str) -> None:
    dbos = new_dbos(database_url)
    dbos.queue("fast")

    @dbos.workflow(name="nap")
    async def nap(seconds: float) -> float:
        await dbos.sleep(seconds)
        return seconds

    await migrate(database_url)
    async with client(database_url) as c:
        # Nobody dequeues yet: the first stays ENQUEUED and holds the deduplication ID.
        first = await c.enqueue("fast", "nap", 0.01, deduplication_id="d")
        again = await c.enqueue("fast", "nap", 5, deduplication_id="d",
                                deduplication_policy="return_existing")
        assert again.workflow_id == first.workflow_id
        with pytest.raises(QueueDeduplicatedError, match=first.workflow_id):
            await c.enqueue("fast", "nap", 5, deduplication_id="d")
        with pytest.raises(Exception, match="deduplication_policy"):
            await c.enqueue("fast", "nap", 5, deduplication_policy="maybe")  # type: ignore[arg-type]
        slow = await c.enqueue("fast", "nap", 1)
        async with dbos:
            assert await asyncio.wait_for(c.wait_first([slow, first]), 20) is first
            assert await asyncio.wait_for(c.wait_all([first, slow]), 20) == [0.01, 1]


# ---- A timeout cancels the workflow and its children ----


async def test_timeout_cancels_children(database_url: str) -> None:
    dbos = new_dbos(database_url)
    q = dbos.queue("kids")

    @dbos.workflow()
    async def long_child(tag: str) -> str:
        await dbos.sleep(60)
        return tag

    @dbos.workflow()
    async def parent() -> str:
        queued = await q.enqueue(long_child, "queued")
        direct = await dbos.start_workflow(long_child, "direct")
        await queued.get_result()
        return await direct.get_result()

    async with dbos:
        began = time.monotonic()
        with SetWorkflowTimeout(1.0), SetWorkflowID("timed"):
            handle = await dbos.start_workflow(parent)
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(handle.get_result(), 30)
        kids = await dbos.list_workflows(parent_workflow_id="timed")
        assert len(kids) == 2
        for kid in kids:
            h = await dbos.retrieve_workflow(kid.workflow_id)
            with pytest.raises(WorkflowCancelledError):
                await asyncio.wait_for(h.get_result(), 30)
        assert time.monotonic() - began < 30
    found = await statuses(database_url)
    assert {found[k.workflow_id][0] for k in kids} | {found["timed"][0]} == {"CANCELLED"}
    assert sorted(k.workflow_id for k in kids) == ["timed-0", "timed-1"]
