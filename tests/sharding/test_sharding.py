"""Sharding on plain PostgreSQL: workflows under shard keys, isolated per key.

Workflow IDs are unique per key: the same ID under two keys is two workflows, with their own
checkpoints, messages, events and streams, and a call addressing one never touches the
other. Everything a workflow does routes by its own key; callers outside name the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import (
    execute,
    fetch,
    listen_for_completions,
    new_dbos,
    pool_statements,
    take_executor_id_away,
    unique_name,
    wait_until,
)

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    NondeterminismError,
    NonExistentWorkflowError,
    QueueDeduplicatedError,
    SetEnqueueOptions,
    SetShardKey,
    SetWorkflowID,
    WorkflowCancelledError,
    current_shard_key,
    current_workflow_id,
)
from dbos_async._database_url import parse_database_url
from dbos_async._sysdb.core import MIN_KEYS_PER_ROUND_TRIP
from dbos_async._sysdb.statements.sharded import CLAIM_LOCK_CLASS
from dbos_async.testing import TestClock

PATIENCE = 15.0


@pytest.fixture(params=["postgres", pytest.param("citus", marks=pytest.mark.citus)])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh database for a sharded system schema: on the test PostgreSQL server, and on
    the Citus cluster of ``DBOS_TEST_CITUS_URL`` (skipped when it is not set)."""
    fixture = "citus_url" if request.param == "citus" else "plain_database_url"
    url: str = request.getfixturevalue(fixture)
    return url


def sharded(url: str, **settings: Any) -> DBOS:
    return new_dbos(url, sharding=True, **settings)


class Tenants:
    """A sharded executor with one workflow that exercises every primitive."""

    def __init__(self, url: str, **settings: Any) -> None:
        self.dbos = dbos = sharded(url, **settings)
        self.runs: Counter[tuple[str, str]] = Counter()
        self.queue = dbos.queue("tenant-jobs")

        @dbos.step(name="note")
        async def note(tenant: str, text: str) -> str:
            self.runs[(tenant, text)] += 1
            return f"{tenant}:{text}"

        @dbos.workflow(name="work")
        async def work(tenant: str) -> str:
            first = await note(tenant, "first")
            await dbos.set_event("progress", first)
            await dbos.write_stream("out", first)
            await dbos.close_stream("out")
            reply = await dbos.recv("go", timeout=PATIENCE)
            return f"{first}|{reply}"

        @dbos.workflow(name="child")
        async def child(tenant: str) -> str:
            return await note(tenant, "child")

        @dbos.workflow(name="parent")
        async def parent(tenant: str, child_key: str) -> list[str]:
            same = await dbos.start_workflow(child, tenant)
            with SetShardKey(child_key):
                other = await dbos.start_workflow(child, tenant)
            return [same.workflow_id, await same.get_result(),
                    other.workflow_id, await other.get_result()]

        self.work, self.child, self.parent = work, child, parent


async def test_the_same_id_under_two_keys_is_two_workflows(database_url: str) -> None:
    app = Tenants(database_url)
    async with app.dbos as dbos:
        handles = {}
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("same-id"):
                handles[key] = await dbos.start_workflow(app.work, key)
            assert handles[key].shard_key == key
        for key in ("acme", "globex"):
            assert await dbos.get_event("same-id", "progress", timeout=PATIENCE,
                                        shard_key=key) == f"{key}:first"
            assert [v async for v in dbos.read_stream("same-id", "out", shard_key=key)] \
                == [f"{key}:first"]
        # A message to one key's workflow wakes that one only.
        await dbos.send("same-id", "go-acme", "go", shard_key="acme")
        assert await handles["acme"].get_result() == "acme:first|go-acme"
        status = await dbos.get_workflow_status("same-id", shard_key="globex")
        assert status is not None and status.status == "PENDING"
        assert status.shard_key == "globex"
        # Cancelling one leaves the other finished.
        await dbos.cancel_workflow("same-id", shard_key="globex")
        with pytest.raises(WorkflowCancelledError):
            await handles["globex"].get_result()
        done = await dbos.get_workflow_status("same-id", shard_key="acme")
        assert done is not None and done.status == "SUCCESS"
        listed = await dbos.list_workflows(shard_key="acme")
        assert [(w.workflow_id, w.shard_key) for w in listed] == [("same-id", "acme")]
        assert await dbos.list_workflows(shard_key=[]) == []
        assert {w.shard_key for w in await dbos.list_workflows()} == {"acme", "globex"}
        steps = await dbos.list_workflow_steps("same-id", shard_key="globex")
        assert [s.name for s in steps][:1] == ["note"]
    assert app.runs == Counter({("acme", "first"): 1, ("globex", "first"): 1})
    rows = await fetch(database_url, "SELECT shard_key, count(*) AS n FROM dbos.operation_outputs"
                                     " WHERE workflow_uuid = 'same-id' GROUP BY shard_key")
    assert {r["shard_key"]: r["n"] for r in rows}.keys() == {"acme", "globex"}


async def test_a_workflow_without_a_key_is_refused_before_anything_is_written(
        database_url: str) -> None:
    app = Tenants(database_url)
    async with app.dbos as dbos:
        with SetWorkflowID("keyless"), pytest.raises(DBOSError, match=r"'keyless'.*shard key"):
            await dbos.start_workflow(app.work, "nobody")
        with pytest.raises(DBOSError, match="shard key"):
            await dbos.get_workflow_status("keyless")
        with pytest.raises(DBOSError, match="non-empty string"):
            SetShardKey("")
        with pytest.raises(DBOSError, match="non-empty string"):
            await dbos.get_workflow_status("keyless", shard_key="")
    assert await fetch(database_url, "SELECT 1 FROM dbos.workflow_status") == []


async def test_an_unkeyed_child_is_refused(database_url: str) -> None:
    """A workflow never inherits its caller's key: a child started with none fails."""
    app = Tenants(database_url)
    async with app.dbos as dbos:
        with SetShardKey("acme"), SetWorkflowID("p"):
            handle = await dbos.start_workflow(app.parent, "acme", "globex")
        with pytest.raises(DBOSError, match="'p-0' needs a shard key"):
            await handle.get_result()


async def test_children_keyed_explicitly(database_url: str) -> None:
    app = Tenants(database_url)

    @app.dbos.workflow(name="keyed-parent")
    async def keyed_parent() -> list[str]:
        with SetShardKey("acme"):
            same = await app.dbos.start_workflow(app.child, "acme")
        with SetShardKey("globex"):
            other = await app.dbos.start_workflow(app.child, "globex")
        return [same.workflow_id, await same.get_result(),
                other.workflow_id, await other.get_result()]

    async with app.dbos as dbos:
        with SetShardKey("acme"), SetWorkflowID("kp"):
            result = await keyed_parent()
        # A child under the parent's key gets the plain child ID; under another key the
        # parent's key prefixes it (the parent's ID is unique only within its key).
        assert result == ["kp-0", "acme:child", "4:acme:kp-1", "globex:child"]
        children = await dbos.list_workflows(parent_shard_key="acme")
        assert sorted((w.workflow_id, w.shard_key, w.parent_workflow_id)
                      for w in children) == [("4:acme:kp-1", "globex", "kp"),
                                             ("kp-0", "acme", "kp")]
        steps = await dbos.list_workflow_steps("kp", shard_key="acme")
        assert [(s.child_workflow_id, s.child_shard_key) for s in steps] == [
            ("kp-0", "acme"), ("4:acme:kp-1", "globex")]
        # Cancel with children follows the children to their keys.
        with SetShardKey("acme"), SetWorkflowID("kp-again"):
            handle = await dbos.start_workflow(keyed_parent)
        await handle.get_result()
        cancelled = await dbos.cancel_workflows(["kp-again"], cancel_children=True,
                                                shard_key="acme")
        assert cancelled == []  # all finished: nothing changed, nothing refused
        await dbos.delete_workflow("kp", delete_children=True, shard_key="acme")
        remaining = {(w.workflow_id, w.shard_key) for w in await dbos.list_workflows()}
        assert remaining == {("kp-again", "acme"), ("kp-again-0", "acme"),
                             ("4:acme:kp-again-1", "globex")}


async def test_recovery_resumes_each_workflow_under_its_key(database_url: str) -> None:
    gate = asyncio.Event()
    reached: dict[str, asyncio.Event] = {k: asyncio.Event() for k in ("acme", "globex")}
    runs: Counter[str] = Counter()

    def register(dbos: DBOS) -> Any:
        @dbos.step(name="before")
        async def before(key: str) -> None:
            runs[key] += 1

        @dbos.workflow(name="held")
        async def held(key: str) -> str:
            await before(key)
            reached[key].set()
            await gate.wait()
            return key

        return held

    first = sharded(database_url, shutdown_grace_period=0)
    held = register(first)
    async with first:
        for key in reached:
            with SetShardKey(key), SetWorkflowID("held-1"):
                await first.start_workflow(held, key)
        for event in reached.values():
            await event.wait()
    gate.set()
    second = sharded(database_url)
    register(second)
    async with second:
        for key in reached:
            handle = await second.retrieve_workflow("held-1", shard_key=key)
            assert await handle.get_result() == key
    assert runs == Counter({"acme": 1, "globex": 1})  # the steps did not run again


async def test_queues_and_deduplication_per_key(database_url: str) -> None:
    app = Tenants(database_url)
    async with app.dbos:
        handles = []
        for key in ("acme", "globex"):
            with SetShardKey(key), SetEnqueueOptions(deduplication_id="once"):
                handles.append(await app.queue.enqueue(app.child, key))
        # Deduplication holds per key: a second enqueue under acme is refused only there.
        with SetShardKey("acme"), SetEnqueueOptions(deduplication_id="once"), \
                pytest.raises(QueueDeduplicatedError):
            await app.queue.enqueue(app.child, "acme")
        assert [await h.get_result() for h in handles] == ["acme:child", "globex:child"]


async def test_one_claimer_at_a_time_per_key(database_url: str) -> None:
    """A claim of a queue's key runs only while no other claimer holds that key's gate (the
    advisory lock of its transaction): a claimer that finds it held claims nothing there
    and goes on to the queue's other keys; once the gate is free the key's work is taken."""
    dbos = new_dbos(database_url, sharding=True)
    queue = dbos.queue("gated", polling_interval=0.05)

    @dbos.workflow(name="job")
    async def job(key: str) -> str:
        return key

    async with dbos:
        sysdb = dbos._system_database
        gate = sysdb.sql.claim_gate_name("gated", None, "held")
        # On Citus the key's claims run on the node holding it, and so does its gate.
        node = await sysdb.node_of("held")
        other = await asyncpg.connect(
            database_url if node is None
            else parse_database_url(database_url).with_server(node))  # type: ignore[arg-type]
        try:
            transaction = other.transaction()
            await transaction.start()
            # Another claimer of the key "held", in the middle of its claim.
            assert await other.fetchval(
                "SELECT pg_try_advisory_xact_lock($1, hashtext($2))", CLAIM_LOCK_CLASS, gate)
            with SetShardKey("held"):
                held = await queue.enqueue(job, "held")
            with SetShardKey("free"):
                free = await queue.enqueue(job, "free")
            # The round that claimed "free" read both keys (both were enqueued before it)
            # and left the held one.
            assert await asyncio.wait_for(free.get_result(), PATIENCE) == "free"
            status = await held.get_status()
            assert status is not None and status.status == "ENQUEUED"
            await transaction.rollback()
            assert await asyncio.wait_for(held.get_result(), PATIENCE) == "held"
        finally:
            await other.close()


async def test_a_finished_workflow_is_announced_under_its_key(database_url: str) -> None:
    """Another process waiting on a keyed workflow hears its completion under the key, for
    workflows run directly and from a queue, whose IDs repeat across keys."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    try:
        await listen_for_completions(listener, heard.put_nowait)
        app = Tenants(database_url)
        async with app.dbos as dbos:
            for key in ("acme", "globex"):
                with SetShardKey(key), SetWorkflowID("direct"):
                    await (await dbos.start_workflow(app.child, key)).get_result()
                with SetShardKey(key), SetWorkflowID("queued"):
                    await (await app.queue.enqueue(app.child, key)).get_result()
            expected = {f"{len(key)}:{key}:{workflow_id}" for key in ("acme", "globex")
                        for workflow_id in ("direct", "queued")}
            payloads: set[str] = set()
            while not expected <= payloads:
                payloads.add(await asyncio.wait_for(heard.get(), PATIENCE))
        assert not any(p in {"direct", "queued"} for p in payloads), payloads
    finally:
        await listener.close()


async def test_queue_limits_and_partitions_per_key(database_url: str) -> None:
    """``concurrency`` and ``limiter`` hold per key (each claim counts within its key);
    ``worker_concurrency`` holds across every key of the executor."""
    dbos = sharded(database_url)
    limited = dbos.queue("limited", concurrency=1, limiter=(100, 1.0), polling_interval=0.1)
    parted = dbos.queue("parted", partition_queue=True, partition_concurrency=1,
                        polling_interval=0.1)
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    release = asyncio.Event()

    @dbos.workflow(name="occupy")
    async def occupy(key: str) -> str:
        running[key] += 1
        peak[key] = max(peak[key], running[key])
        await release.wait()
        running[key] -= 1
        return key

    async with dbos:
        handles = []
        for key in ("acme", "globex"):
            for _ in range(3):
                with SetShardKey(key):
                    handles.append(await limited.enqueue(occupy, key))
                with SetShardKey(key), SetEnqueueOptions(partition_key="p"):
                    handles.append(await parted.enqueue(occupy, key))

        async def both_started() -> bool:
            return running["acme"] >= 2 and running["globex"] >= 2

        await wait_until(both_started, what="one workflow of each queue under each key")
        release.set()
        assert sorted(await asyncio.gather(*(h.get_result() for h in handles))) \
            == ["acme"] * 6 + ["globex"] * 6
    # One per queue at a time within a key (concurrency 1, partition concurrency 1).
    assert peak == Counter({"acme": 2, "globex": 2})


async def test_client_addresses_workflows_by_key(database_url: str) -> None:
    app = Tenants(database_url)
    async with app.dbos as dbos, DBOSClient(system_database_url=database_url, sharding=True,
                                            application_name=unique_name("client")) as client:
        with SetShardKey("acme"), SetWorkflowID("via-client"):
            await dbos.start_workflow(app.work, "acme")
        assert await client.get_event("via-client", "progress", timeout=PATIENCE,
                                      shard_key="acme") == "acme:first"
        await client.send("via-client", "from-client", "go", shard_key="acme")
        handle = await client.retrieve_workflow("via-client", shard_key="acme")
        assert await handle.get_result() == "acme:first|from-client"
        queued = await client.enqueue("tenant-jobs", "child", "globex", shard_key="globex",
                                      workflow_id="client-child")
        assert queued.shard_key == "globex"
        assert await queued.get_result() == "globex:child"
        with pytest.raises(DBOSError, match="shard key"):
            await client.enqueue("tenant-jobs", "child", "x", workflow_id="unkeyed")


async def test_resume_fork_rewind_and_sleep_under_keys(database_url: str) -> None:
    dbos = sharded(database_url)
    runs: Counter[tuple[str, int]] = Counter()
    gate = asyncio.Event()
    waiting: Counter[str] = Counter()

    @dbos.step(name="count")
    async def count(key: str, n: int) -> int:
        runs[(key, n)] += 1
        return n

    @dbos.workflow(name="three")
    async def three(key: str) -> list[int]:
        first = await count(key, 1)
        await dbos.sleep(0.01)
        waiting[key] += 1
        await gate.wait()
        return [first, await count(key, 2)]

    async def both_waiting() -> bool:
        return waiting["acme"] >= 1 and waiting["globex"] >= 1

    async with dbos:
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("w"):
                await dbos.start_workflow(three, key)
        # Both recorded their first step and sleep: the cancel stops acme at its gate.
        await wait_until(both_waiting, what="both workflows at their gate")
        await dbos.cancel_workflow("w", shard_key="acme")
        gate.set()
        globex = await dbos.retrieve_workflow("w", shard_key="globex")
        assert await globex.get_result() == [1, 2]
        # Resume continues the cancelled one from its checkpoints, under its key.
        resumed = await dbos.resume_workflow("w", shard_key="acme")
        assert resumed.shard_key == "acme"
        assert await resumed.get_result() == [1, 2]
        # A fork lives under its original's key; steps below the cut are copied.
        fork = await dbos.fork_workflow("w", 2, shard_key="globex", new_workflow_id="w-fork")
        assert fork.shard_key == "globex"
        assert await fork.get_result() == [1, 2]
        # Rewind re-runs the steps from the cut, in place.
        rewound = await dbos.rewind_workflow("w", 2, shard_key="acme")
        assert await rewound.get_result() == [1, 2]
    assert runs == Counter({("acme", 1): 1, ("globex", 1): 1, ("acme", 2): 2,
                            ("globex", 2): 2})


async def test_a_fork_refuses_to_replace_a_child_id_recorded_under_two_keys(
        database_url: str) -> None:
    """A replacement names a child by ID alone: a fork whose copied steps record that ID
    under two keys is refused, naming the child, and nothing is written; an ID recorded
    under one key is replaced."""
    app = Tenants(database_url)
    dbos = app.dbos

    @dbos.workflow(name="twins")
    async def twins() -> list[str]:
        results = []
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("twin"):
                results.append(await (await dbos.start_workflow(app.child, key)).get_result())
        with SetShardKey("acme"), SetWorkflowID("single"):
            results.append(await (await dbos.start_workflow(app.child, "acme")).get_result())
        return results

    async with dbos:
        with SetShardKey("acme"), SetWorkflowID("twins"):
            assert await twins() == ["acme:child", "globex:child", "acme:child"]
        with SetShardKey("acme"), SetWorkflowID("replacement"):
            await (await dbos.start_workflow(app.child, "acme")).get_result()
        with pytest.raises(DBOSError, match=r"^Can't replace child workflow twin: the forked "
                           r"steps refer to children with that ID under more than one shard "
                           r"key$"):
            await dbos.fork_workflow("twins", 3, shard_key="acme", new_workflow_id="refused",
                                     replacement_children={"twin": "replacement"})
        assert await dbos.get_workflow_status("refused", shard_key="acme") is None
        # Below the second start the ID names one child only.
        fork = await dbos.fork_workflow("twins", 1, shard_key="acme", new_workflow_id="one",
                                        replacement_children={"twin": "replacement"})
        assert await fork.get_result() == ["acme:child", "globex:child", "acme:child"]
        steps = await dbos.list_workflow_steps("one", shard_key="acme")
        assert [(s.child_workflow_id, s.child_shard_key) for s in steps][:1] == [
            ("replacement", "acme")]
        fork = await dbos.fork_workflow("twins", 3, shard_key="acme", new_workflow_id="other",
                                        replacement_children={"single": "replacement"})
        assert await fork.get_result() == ["acme:child", "globex:child", "acme:child"]
        steps = await dbos.list_workflow_steps("other", shard_key="acme")
        assert [s.child_workflow_id for s in steps] == ["twin", "twin", "replacement"]


async def test_maintenance_jobs_span_every_key(database_url: str) -> None:
    dbos = sharded(database_url)

    @dbos.workflow(name="quick")
    async def quick() -> int:
        return 1

    @dbos.workflow(name="stuck")
    async def stuck() -> None:
        await dbos.sleep(3600)  # interruptible: the cancel stops it at once

    async with dbos:
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID(f"quick-{key}"):
                await quick()
            with SetShardKey(key), SetWorkflowID(f"stuck-{key}"):
                await dbos.start_workflow(stuck)
        far_future = 2**62
        cancelled = await dbos.global_timeout(far_future)
        assert sorted(cancelled or []) == ["stuck-acme", "stuck-globex"]
        for key in ("acme", "globex"):
            with pytest.raises(WorkflowCancelledError):
                await (await dbos.retrieve_workflow(f"stuck-{key}", shard_key=key)).get_result()
        assert await dbos.garbage_collect(far_future) == 4
        assert await dbos.list_workflows() == []


WORKER = Path(__file__).resolve().parents[1] / "helpers" / "recovery_worker.py"


async def test_sigkilled_workflows_recover_under_their_keys(database_url: str) -> None:
    """A worker process running one workflow ID under three keys is SIGKILLed mid-way; a
    new process recovers each under its key, and every checkpointed step ran once."""
    url, keys = database_url, ["acme", "globex", "initech"]
    await execute(url, "CREATE TABLE side_effects (step text NOT NULL)")
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, "start", "sequential", "crash", ",".join(keys),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async def two_steps_each() -> bool:
            if worker.returncode is not None:
                raise AssertionError((await worker.communicate())[1].decode())
            try:
                rows = await fetch(url, "SELECT shard_key, count(*) AS n FROM "
                                        "dbos.operation_outputs WHERE workflow_uuid = 'crash'"
                                        " GROUP BY shard_key")
            except asyncpg.UndefinedTableError:
                return False  # the worker has not created the system schema yet
            return len(rows) == 3 and all(r["n"] >= 2 for r in rows)

        await wait_until(two_steps_each, patience=60, what="two steps under each key")
    finally:
        worker.kill()
        await worker.communicate()
    recorded = {r["shard_key"]: r["n"] for r in await fetch(
        url, "SELECT shard_key, count(*) AS n FROM dbos.operation_outputs GROUP BY shard_key")}
    recover = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, "recover", "sequential", "crash", ",".join(keys),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(recover.communicate(), 120)
    assert recover.returncode == 0, err.decode()
    results = json.loads(out.decode().strip().splitlines()[-1])
    assert results == {key: [f"done-{i}" for i in range(5)] for key in keys}
    counts = Counter(r["step"] for r in await fetch(url, "SELECT step FROM side_effects"))
    for key in keys:
        for i in range(5):
            # The step in flight at the kill may have run twice; the recorded ones once.
            expected = (1, 1) if i < recorded[key] else (1, 2)
            assert expected[0] <= counts[f"{key}:seq-{i}"] <= expected[1], (key, i, counts)


async def test_a_workflow_messages_a_workflow_under_another_key(database_url: str) -> None:
    app = Tenants(database_url)

    @app.dbos.workflow(name="courier")
    async def courier(target: str, key: str) -> str:
        await app.dbos.send(target, "from-courier", "go", shard_key=key)
        return await app.dbos.get_event(target, "progress", timeout=PATIENCE, shard_key=key)

    async with app.dbos as dbos:
        with SetShardKey("globex"), SetWorkflowID("receiver"):
            receiver = await dbos.start_workflow(app.work, "globex")
        with SetShardKey("acme"), SetWorkflowID("courier"):
            assert await courier("receiver", "globex") == "globex:first"
        assert await receiver.get_result() == "globex:first|from-courier"
        steps = await dbos.list_workflow_steps("courier", shard_key="acme")
        assert [s.name for s in steps][:1] == ["DBOS.send"]

        # A workflow messaging its namesake under another key: each side's rows stay under
        # its own key (the sender's checkpoints under acme, the message under globex).
        with SetShardKey("globex"), SetWorkflowID("twin"):
            twin = await dbos.start_workflow(app.work, "globex")
        with SetShardKey("acme"), SetWorkflowID("twin"):
            assert await courier("twin", "globex") == "globex:first"
        assert await twin.get_result() == "globex:first|from-courier"
        sender = await dbos.list_workflow_steps("twin", shard_key="acme")
        assert [s.name for s in sender][:2] == ["DBOS.send", "DBOS.getEvent"]
        receiver_steps = await dbos.list_workflow_steps("twin", shard_key="globex")
        assert "DBOS.send" not in [s.name for s in receiver_steps]
        status = await dbos.get_workflow_status("twin", shard_key="acme")
        assert status is not None and status.status == "SUCCESS"


async def test_sends_from_outside_go_together_per_key_and_a_missing_one_fails_alone(
        database_url: str) -> None:
    """Sends from outside a workflow made together, to workflows of one ID under two keys
    and to an ID that exists under neither: every message lands under its own key, and
    only the send to the missing workflow fails."""
    dbos = sharded(database_url)

    @dbos.workflow(name="receiver")
    async def receiver() -> Any:
        return await dbos.recv(timeout=PATIENCE)

    keys = ["acme", "globex"]
    async with dbos:
        handles = {}
        for key in keys:
            with SetShardKey(key), SetWorkflowID("inbox"):
                handles[key] = await dbos.start_workflow(receiver)
        sent = await asyncio.gather(*(dbos.send("inbox", key, shard_key=key) for key in keys),
                                    dbos.send("nobody", 1, shard_key="acme"),
                                    return_exceptions=True)
        assert sent[:2] == [None, None]
        assert isinstance(sent[2], NonExistentWorkflowError) and "nobody" in str(sent[2])
        for key in keys:
            assert await asyncio.wait_for(handles[key].get_result(), PATIENCE) == key
    stored = await fetch(database_url, "SELECT shard_key, destination_uuid, message "
                                       "FROM dbos.notifications ORDER BY shard_key")
    assert [(r["shard_key"], r["destination_uuid"]) for r in stored] == [
        ("acme", "inbox"), ("globex", "inbox")]


async def test_recovery_tells_same_id_workflows_of_two_keys_apart(database_url: str) -> None:
    """An execution of ("x", acme) running here does not hide the crashed ("x", globex) from
    recovery: what runs here is excluded by ID and key."""
    release = asyncio.Event()
    started: Counter[str] = Counter()

    def register(dbos: DBOS) -> Any:
        @dbos.workflow(name="blocked")
        async def blocked(key: str) -> str:
            started[key] += 1
            await release.wait()
            return key

        return blocked

    runner = sharded(database_url)
    blocked = register(runner)
    # Another executor ID, so entering it does not recover what the runner runs.
    crashed = sharded(database_url, shutdown_grace_period=0, executor_id="crashed")
    blocked_there = register(crashed)
    async with runner:
        with SetShardKey("acme"), SetWorkflowID("x"):
            mine = await runner.start_workflow(blocked, "acme")
        async with crashed:
            with SetShardKey("globex"), SetWorkflowID("x"):
                await crashed.start_workflow(blocked_there, "globex")
        # Left PENDING under globex, as if by an earlier life of the runner's executor.
        await execute(database_url, "UPDATE dbos.workflow_status SET executor_id = $1 "
                      "WHERE shard_key = 'globex'", runner.config.executor_id)
        recovered = await runner.recover_pending_workflows()
        assert [(h.workflow_id, h.shard_key) for h in recovered] == [("x", "globex")]
        release.set()
        assert [await mine.get_result(), await recovered[0].get_result()] == ["acme", "globex"]


async def test_debounce_per_key(database_url: str) -> None:
    """A burst under one key collapses into one run with its latest arguments; the same
    debounce key under another key is another burst."""
    clock = TestClock()  # the window closes when the test says, not under a slow machine
    app = Tenants(database_url, clock=clock)
    debouncer = app.queue.debouncer(app.child, period=30)
    async with app.dbos:
        handles = {}
        for key in ("acme", "globex"):
            with SetShardKey(key):
                first = await debouncer.debounce("burst", f"{key}-1")
                handles[key] = await debouncer.debounce("burst", f"{key}-2")
            assert first.workflow_id == handles[key].workflow_id
            assert handles[key].shard_key == key
        await clock.advance(seconds=30)
        assert {key: await h.get_result() for key, h in handles.items()} == {
            "acme": "acme-2:child", "globex": "globex-2:child"}
    assert app.runs == Counter({("acme-2", "child"): 1, ("globex-2", "child"): 1})


def register_race(dbos: DBOS, label: str, gate: asyncio.Event | None,
                  reached: asyncio.Event | None, runs: Counter[tuple[str, int]]) -> Any:
    """A 4-step workflow; step 1 signals ``reached`` and waits on ``gate`` (if given)."""

    @dbos.step(name="race_step")
    async def race_step(i: int) -> str:
        runs[label, i] += 1
        if i == 1:
            if reached is not None:
                reached.set()
            if gate is not None:
                await gate.wait()
        return f"{label}-{i}"

    @dbos.workflow(name="race_wf")
    async def race_wf() -> list[str]:
        return [await race_step(i) for i in range(4)]

    return race_wf


async def test_a_stale_execution_under_a_key_is_fenced(database_url: str) -> None:
    """A recovered elsewhere, ("f", acme)'s first execution stops at its next checkpoint and
    writes nothing; ("f", globex), alive on another executor, is untouched."""
    url, runs = database_url, Counter[tuple[str, int]]()
    gate_a, reached_a, gate_c, reached_c = (asyncio.Event() for _ in range(4))
    # Only B watches for dead executors: who takes ("f", acme) over is certain.
    a = sharded(url, failover_after=None)
    race_a = register_race(a, "A", gate_a, reached_a, runs)
    c = sharded(url, executor_id="other", failover_after=None)
    race_c = register_race(c, "C", gate_c, reached_c, runs)
    async with a, c:
        with SetShardKey("acme"), SetWorkflowID("f"):
            handle_a = await a.start_workflow(race_a)
        with SetShardKey("globex"), SetWorkflowID("f"):
            handle_c = await c.start_workflow(race_c)
        await reached_a.wait()
        await reached_c.wait()
        # A looks dead to the others (as across a partition): B takes over only
        # ("f", acme), the PENDING workflow of A's executor; C is alive, so not C's.
        await take_executor_id_away(url, a)
        b = sharded(url, executor_id="taker", failover_after=0.2)
        register_race(b, "B", None, None, runs)
        async with b:
            result_b = await (await b.retrieve_workflow("f", shard_key="acme")).get_result()
        assert result_b == ["A-0", "B-1", "B-2", "B-3"]
        gate_a.set()
        assert await handle_a.get_result() == result_b  # refused, it reports B's outcome
        assert runs["A", 1] == 1 and runs["A", 2] == runs["A", 3] == 0
        acme = await a.list_workflow_steps("f", shard_key="acme")
        assert [s.output for s in acme] == result_b
        globex = await a.get_workflow_status("f", shard_key="globex")
        assert globex is not None and globex.status == "PENDING"
        assert globex.executor_id == "other" and globex.recovery_attempts == 1
        assert [s.output for s in await a.list_workflow_steps("f", shard_key="globex")] \
            == ["C-0"]
        gate_c.set()
        assert await handle_c.get_result() == ["C-0", "C-1", "C-2", "C-3"]
    assert runs["B", 0] == runs["C", 0] - 1 == 0


BATCH_LAYOUTS = {
    # Several rows per key (each key's statement in the array form), the refused ones under
    # acme beside healthy ones, and the same IDs under the other keys.
    "rows per key": ([(key, w) for key in ("acme", "globex", "initech")
                      for w in ("healthy", "cancelled", "fenced", "nondeterministic")],
                     ("acme", "cancelled"), ("acme", "fenced"), ("acme", "nondeterministic")),
    # One row per key (each in the single-row form), one ID under every key.
    "one row per key": ([(key, "w") for key in ("acme", "globex", "initech", "umbrella")],
                        ("acme", "w"), ("globex", "w"), ("initech", "w")),
    # Enough keys that the statements go as two transactions at once, the refused rows in
    # both halves.
    "keys over two round trips": ([(f"key-{n:02}", "w") for n in range(24)],
                                  ("key-00", "w"), ("key-13", "w"), ("key-23", "w")),
}


@pytest.mark.parametrize("layout", list(BATCH_LAYOUTS))
async def test_a_batch_across_keys_judges_each_row(database_url: str, layout: str) -> None:
    """Checkpoints of workflows under many keys queued behind one in flight go together
    (on plain PostgreSQL one statement per key, all in one round trip), and each row gets
    its own verdict: a cancelled, a fenced-out and a nondeterministic workflow fail alone,
    while the workflows with the same IDs under other keys commit."""
    url = database_url
    dbos = sharded(url)
    release_lead, release_rest, everyone_in = asyncio.Event(), asyncio.Event(), asyncio.Event()
    others, cancelled, fenced, nondeterministic = BATCH_LAYOUTS[layout]
    arrived: set[tuple[str, str]] = set()

    @dbos.step(name="held", cancellable=False)
    async def held(key: str, workflow_id: str) -> str:
        arrived.add((key, workflow_id))
        if arrived >= {("lead", "lead"), *others}:
            everyone_in.set()
        await (release_lead if key == "lead" else release_rest).wait()
        return f"{key}/{workflow_id}"

    @dbos.step(name="after")
    async def after(value: str) -> str:
        return value + "!"

    @dbos.workflow(name="work")
    async def work(key: str, workflow_id: str) -> str:
        return await after(await held(key, workflow_id))

    async with dbos:
        handles = {}
        for key, workflow_id in [("lead", "lead"), *others]:
            with SetShardKey(key), SetWorkflowID(workflow_id):
                handles[key, workflow_id] = await dbos.start_workflow(work, key, workflow_id)
        await asyncio.wait_for(everyone_in.wait(), PATIENCE)
        # Three rows an outside writer changes while their steps run.
        await execute(url, "UPDATE dbos.workflow_status SET status = 'CANCELLED' "
                           "WHERE shard_key = $1 AND workflow_uuid = $2", *cancelled)
        await execute(url, "UPDATE dbos.workflow_status SET owner_xid = 'elsewhere' "
                           "WHERE shard_key = $1 AND workflow_uuid = $2", *fenced)
        await execute(url, "INSERT INTO dbos.operation_outputs (shard_key, workflow_uuid, "
                           "function_id, function_name, output) "
                           "VALUES ($1, $2, 0, 'another_step', 'null')", *nondeterministic)
        async with pool_statements(dbos) as logged:
            # The lead's checkpoint goes alone and waits for its row; meanwhile the others
            # finish and queue behind it.
            async with _lead_held(url, lambda: release_lead.set()):
                release_rest.set()
            results = {ref: await asyncio.wait_for(h.get_result(), PATIENCE)
                       for ref, h in handles.items()
                       if ref not in (cancelled, fenced, nondeterministic)}
            with pytest.raises(WorkflowCancelledError):
                await asyncio.wait_for(handles[cancelled].get_result(), PATIENCE)
            with pytest.raises(NondeterminismError):
                await asyncio.wait_for(handles[nondeterministic].get_result(), PATIENCE)
        assert results == {(k, w): f"{k}/{w}!" for k, w in results}
        assert len(results) == 1 + len(others) - 3
        for key, workflow_id in results:
            steps = await dbos.list_workflow_steps(workflow_id, shard_key=key)
            assert [s.name for s in steps] == ["held", "after"]
        for key, workflow_id in (cancelled, fenced):
            assert await dbos.list_workflow_steps(workflow_id, shard_key=key) == []
        status = await dbos.get_workflow_status(fenced[1], shard_key=fenced[0])
        assert status is not None and status.status == "PENDING"
        steps = await dbos.list_workflow_steps(nondeterministic[1],
                                               shard_key=nondeterministic[0])
        assert [s.name for s in steps] == ["another_step"]
    if not await _on_citus(url):
        # The queued first checkpoints went as one round trip (two at once for many keys):
        # one statement per key (its arguments one list per key), each naming one key; the
        # lead's next step, quick to follow, may have joined.
        keys = {key for key, _ in others}
        rounds = [args for sql, args in logged if "operation_outputs" in sql
                  and args and all(isinstance(a, (list, tuple)) for a in args)]
        assert rounds, "no checkpoints of several keys went in one round trip"
        first = rounds[:2 if len(keys) >= 2 * MIN_KEYS_PER_ROUND_TRIP else 1]
        named = [{key for key in [*keys, "lead"] if key in params}
                 for statements in first for params in statements]
        assert all(len(k) == 1 for k in named), named
        assert set().union(*named) - {"lead"} == keys
        assert len(named) in (len(keys), len(keys) + 1)


async def test_a_refused_statement_fails_only_its_own_key(plain_database_url: str) -> None:
    """The statements of a batch over many keys go as two transactions at once; when the
    database refuses one, its statements run again key by key, so the refused key's
    workflow alone fails and every other commits, in both halves."""
    url = plain_database_url
    dbos = sharded(url)
    keys = [f"key-{n:02}" for n in range(2 * MIN_KEYS_PER_ROUND_TRIP)]
    release_lead, release_rest, everyone_in = asyncio.Event(), asyncio.Event(), asyncio.Event()
    arrived: set[str] = set()

    @dbos.step(name="held", cancellable=False)
    async def held(key: str) -> str:
        arrived.add(key)
        if arrived >= {"lead", *keys}:
            everyone_in.set()
        await (release_lead if key == "lead" else release_rest).wait()
        return key

    @dbos.workflow(name="work")
    async def work(key: str) -> str:
        return await held(key) + "!"

    async with dbos:
        # A real refusal by the server (not a lost connection) of key-03's checkpoint.
        await execute(url, """
            CREATE FUNCTION refuse_key_03() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.shard_key = 'key-03' AND NEW.function_name = 'held' THEN
                RAISE EXCEPTION 'refused for %', NEW.shard_key;
              END IF;
              RETURN NEW;
            END $$""")
        await execute(url, "CREATE TRIGGER refuse_key_03 BEFORE INSERT ON "
                           "dbos.operation_outputs FOR EACH ROW EXECUTE FUNCTION refuse_key_03()")
        handles = {}
        for key in ["lead", *keys]:
            with SetShardKey(key), SetWorkflowID("lead" if key == "lead" else "w"):
                handles[key] = await dbos.start_workflow(work, key)
        await asyncio.wait_for(everyone_in.wait(), PATIENCE)
        async with pool_statements(dbos) as logged:
            # The lead's checkpoint waits for its row; meanwhile the others queue behind it.
            async with _lead_held(url, lambda: release_lead.set()):
                release_rest.set()
            outcomes = await asyncio.gather(
                *(asyncio.wait_for(h.get_result(), PATIENCE) for h in handles.values()),
                return_exceptions=True)
        results = dict(zip(handles, outcomes, strict=True))
        refused = results.pop("key-03")
        assert isinstance(refused, DBOSError) and "refused for key-03" in str(refused)
        assert results == {key: key + "!" for key in results}
        for key in keys:
            steps = await dbos.list_workflow_steps("w", shard_key=key)
            assert [s.name for s in steps] == ([] if key == "key-03" else ["held"])
    # Two transactions at once, then key-03's half again key by key. Statements are
    # logged as they complete: the refused half's key-by-key rounds may finish before the
    # other half does, so the order within these rounds is not fixed.
    rounds = [args for sql, args in logged if "operation_outputs" in sql
              and args and all(isinstance(a, (list, tuple)) for a in args)]
    sizes = [len(statements) for statements in rounds]
    first = sorted(sizes[:2 + MIN_KEYS_PER_ROUND_TRIP])
    assert first[:MIN_KEYS_PER_ROUND_TRIP] == [1] * MIN_KEYS_PER_ROUND_TRIP, sizes
    halves = first[MIN_KEYS_PER_ROUND_TRIP:]
    assert halves in ([MIN_KEYS_PER_ROUND_TRIP] * 2,
                      [MIN_KEYS_PER_ROUND_TRIP, MIN_KEYS_PER_ROUND_TRIP + 1]), sizes


async def test_starts_across_keys_go_together(database_url: str) -> None:
    """Starts of one ID under several keys, queued behind a start in flight, go together
    (on plain PostgreSQL in one round trip) and start one workflow per key, each once; a
    second start of one of them in the same batch gets that workflow."""
    url = database_url
    dbos = sharded(url)
    runs: Counter[tuple[str, str]] = Counter()

    @dbos.workflow(name="work")
    async def work(key: str) -> str:
        runs[current_shard_key() or "", current_workflow_id() or ""] += 1
        return key + "!"

    async def start(key: str, workflow_id: str) -> Any:
        with SetShardKey(key), SetWorkflowID(workflow_id):
            return await dbos.start_workflow(work, key)

    keys = ["acme", "globex", "initech"]
    async with dbos:
        await (await start("lead", "lead")).get_result()
        leads: list[asyncio.Task[Any]] = []
        async with pool_statements(dbos) as logged:
            # The lead's second start waits for its row; the others queue behind it.
            async with _lead_held(url, lambda: leads.append(
                    asyncio.create_task(start("lead", "lead")))):
                rest = [asyncio.create_task(start(key, "same")) for key in [*keys, "acme"]]
            await leads[0]
            handles = await asyncio.gather(*rest)
            results = [await asyncio.wait_for(h.get_result(), PATIENCE) for h in handles]
    assert results == [key + "!" for key in [*keys, "acme"]]
    assert runs == Counter({("lead", "lead"): 1, **{(key, "same"): 1 for key in keys}})
    assert [h.shard_key for h in handles] == [*keys, "acme"]
    if not await _on_citus(url):
        # One statement per key, in one round trip (its arguments one list per key, each
        # naming its key); the repeated start of ("same", acme) went alone after it.
        rounds = [args for sql, args in logged if "workflow_input" in sql
                  and args and all(isinstance(a, (list, tuple)) for a in args)]
        assert len(rounds) == 1, rounds
        assert sorted(key for params in rounds[0] for key in keys if key in params) == keys


@contextlib.asynccontextmanager
async def _lead_held(url: str, write: Callable[[], None]) -> AsyncIterator[None]:
    """Lock the status row of ("lead", lead), then ``write`` to it: the block runs once that
    write waits for the lock, which goes when the block ends."""
    blocker = await asyncpg.connect(url)
    try:
        async with blocker.transaction():
            await blocker.execute("SELECT 1 FROM dbos.workflow_status WHERE shard_key = "
                                  "'lead' AND workflow_uuid = 'lead' FOR UPDATE")
            write()
            await wait_until(lambda: _lock_waiters(url), what="a write waiting for the lead")
            yield
    finally:
        await blocker.close()


async def _lock_waiters(url: str) -> bool:
    """Whether a statement waits for a row lock (on Citus, on the worker holding the row)."""
    if await _on_citus(url):
        rows = await fetch(url, "SELECT count(*) AS n FROM citus_lock_waits")
    else:
        rows = await fetch(url, "SELECT count(*) AS n FROM pg_stat_activity WHERE "
                                "wait_event_type = 'Lock' AND datname = current_database()")
    return int(rows[0]["n"]) >= 1


async def _on_citus(url: str) -> bool:
    rows = await fetch(url, "SELECT count(*) AS n FROM pg_extension WHERE extname = 'citus'")
    return int(rows[0]["n"]) > 0


async def test_a_stale_execution_cannot_send_or_set_events(database_url: str) -> None:
    """Recovered elsewhere after its step, a workflow's first execution is refused at its
    next ``set_event`` or ``send``: neither the event nor the message is written."""
    url = database_url
    between = asyncio.Event()
    waiting: Counter[str] = Counter()

    def register(dbos: DBOS, label: str, hold: bool) -> Any:
        @dbos.step(name="prepare")
        async def prepare() -> str:
            return label

        @dbos.workflow(name="announcer")
        async def announcer(what: str) -> str:
            await prepare()
            if hold:
                waiting[what] += 1
                await between.wait()
            if what == "event":
                await dbos.set_event("announced", label)
            else:
                await dbos.send("inbox", label, "news", shard_key="globex")
            return label

        @dbos.workflow(name="inbox")
        async def inbox() -> Any:
            return await dbos.recv("news", timeout=PATIENCE)

        return announcer, inbox

    a = sharded(url, failover_after=None)
    announcer, _ = register(a, "A", hold=True)
    c = sharded(url, executor_id="other", failover_after=None)
    _, inbox = register(c, "C", hold=False)
    async with a, c:
        with SetShardKey("globex"), SetWorkflowID("inbox"):
            receiver = await c.start_workflow(inbox)
        stale = {}
        for what in ("event", "send"):
            with SetShardKey("acme"), SetWorkflowID(what):
                stale[what] = await a.start_workflow(announcer, what)

        async def both_held() -> bool:
            return waiting["event"] == waiting["send"] == 1

        await wait_until(both_held, what="both executions past their step")
        await take_executor_id_away(url, a)
        b = sharded(url, executor_id="taker", failover_after=0.2)
        register(b, "B", hold=False)
        async with b:
            for what in ("event", "send"):
                handle = await b.retrieve_workflow(what, shard_key="acme")
                assert await handle.get_result() == "B"
        between.set()
        for what in ("event", "send"):
            assert await stale[what].get_result() == "B"  # refused: it reports B's outcome
        assert await receiver.get_result() == "B"
        assert await a.get_all_events("event", shard_key="acme") == {"announced": "B"}
    events = await fetch(url, "SELECT 1 FROM dbos.workflow_events_history")
    assert len(events) == 1
    for what, name in (("event", "DBOS.setEvent"), ("send", "DBOS.send")):
        steps = await fetch(url, "SELECT function_name FROM dbos.operation_outputs WHERE "
                                 "workflow_uuid = $1 AND shard_key = 'acme' "
                                 "ORDER BY function_id", what)
        assert [r["function_name"] for r in steps] == ["prepare", name]
    consumed = await fetch(url, "SELECT 1 FROM dbos.operation_outputs WHERE workflow_uuid ="
                                " 'inbox' AND function_name = 'DBOS.recv'")
    assert len(consumed) == 1
    assert len(await fetch(url, "SELECT 1 FROM dbos.notifications")) == 1  # B's alone


async def test_queue_priority_delay_and_worker_concurrency_across_keys(
        database_url: str) -> None:
    """Priorities order each key's queue; ``worker_concurrency`` 1 runs one workflow at a
    time over every key; a delayed workflow starts no sooner than its delay."""
    producer = sharded(database_url)
    producer.listen()  # dispatches none of the queues: everything waits for the consumer
    consumer = sharded(database_url)
    log: list[tuple[str, str]] = []
    running: list[str] = []
    peak = 0

    def register(dbos: DBOS) -> Any:
        @dbos.workflow(name="echo")
        async def echo(key: str, text: str) -> str:
            nonlocal peak
            log.append((key, text))
            if text == "late":  # on the other queue, which has no worker_concurrency
                return text
            running.append(text)
            peak = max(peak, len(running))
            await asyncio.sleep(0)
            running.remove(text)
            return text

        return echo

    echo = register(producer)
    register(consumer)
    queue = producer.queue("prio", worker_concurrency=1, polling_interval=0.1)
    consumer.queue("prio", worker_concurrency=1, polling_interval=0.1)
    delayed = producer.queue("later", polling_interval=0.1)
    consumer.queue("later", polling_interval=0.1)
    async with producer:
        for key in ("acme", "globex"):
            for text, priority in [("c", 5), ("a", 1), ("b", 2), ("z", 0)]:
                with SetShardKey(key), SetEnqueueOptions(priority=priority):
                    await queue.enqueue(echo, key, text)
        with SetShardKey("globex"), SetEnqueueOptions(delay=0.3):
            late = await delayed.enqueue(echo, "globex", "late")
    async with consumer:
        assert await (await consumer.retrieve_workflow(late.workflow_id,
                                                       shard_key="globex")).get_result() \
            == "late"

        async def all_ran() -> bool:
            return len(log) == 9

        await wait_until(all_ran, what="every queued workflow")
    for key in ("acme", "globex"):
        assert [t for k, t in log if k == key and t != "late"] == ["z", "a", "b", "c"]
    assert peak == 1
    row = (await fetch(database_url, "SELECT delay_until_epoch_ms, started_at_epoch_ms FROM "
                                     "dbos.workflow_status WHERE shard_key = 'globex' AND "
                                     "workflow_uuid = $1", late.workflow_id))[0]
    assert row["started_at_epoch_ms"] >= row["delay_until_epoch_ms"]


async def test_listing_filters_under_keys(database_url: str) -> None:
    app = Tenants(database_url)

    @app.dbos.workflow(name="fails")
    async def fails() -> None:
        raise ValueError("no")

    @app.dbos.workflow(name="keyed-parent")
    async def parent() -> None:
        for key in ("acme", "globex"):
            with SetShardKey(key):
                await app.child(key)

    async with app.dbos as dbos:
        with SetShardKey("acme"), SetWorkflowID("c-acme"):
            await app.child("acme")
        first = await dbos.get_workflow_status("c-acme", shard_key="acme")
        assert first is not None

        async def clock_moved_on() -> bool:
            return time.time() * 1000 > first.created_at + 1

        await wait_until(clock_moved_on, what="a later millisecond")  # so the bounds split
        with SetShardKey("globex"), SetWorkflowID("f-globex"), pytest.raises(ValueError):
            await fails()
        with SetShardKey("initech"):
            queued = await app.queue.enqueue(app.child, "initech")
        await queued.get_result()
        with SetShardKey("acme"), SetWorkflowID("p"):
            await parent()

        async def ids(**filters: Any) -> set[tuple[str, str | None]]:
            return {(w.workflow_id, w.shard_key) for w in await dbos.list_workflows(**filters)}

        assert await ids(status="ERROR") == {("f-globex", "globex")}
        assert await ids(name="fails", shard_key="acme") == set()
        assert await ids(name="child", shard_key=["acme", "initech"]) == {
            ("c-acme", "acme"), ("p-0", "acme"), (queued.workflow_id, "initech")}
        assert await ids(name="child", shard_key="globex") == {("4:acme:p-1", "globex")}
        assert await ids(queue_name="tenant-jobs") == {(queued.workflow_id, "initech")}
        assert await ids(end_time=first.created_at) == {("c-acme", "acme")}
        assert ("c-acme", "acme") not in await ids(start_time=first.created_at + 1)
        assert len(await ids(start_time=first.created_at + 1)) == 5
        assert await ids(parent_shard_key="acme", shard_key="globex") == {
            ("4:acme:p-1", "globex")}
        assert await ids(parent_workflow_id="p", shard_key="acme") == {("p-0", "acme")}
        steps = await dbos.list_workflow_steps("p", shard_key="acme")
        assert [s.child_shard_key for s in steps if s.child_workflow_id] == ["acme", "globex"]


async def test_client_cancels_resumes_and_reads_under_keys(database_url: str) -> None:
    app = Tenants(database_url)
    async with app.dbos as dbos, DBOSClient(system_database_url=database_url, sharding=True,
                                            application_name=unique_name("client")) as client:
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("same"):
                await dbos.start_workflow(app.work, key)
            assert await client.get_event("same", "progress", timeout=PATIENCE,
                                          shard_key=key) == f"{key}:first"
        await client.cancel_workflow("same", shard_key="acme")
        cancelled = await client.get_workflow_status("same", shard_key="acme")
        untouched = await client.get_workflow_status("same", shard_key="globex")
        assert cancelled is not None and cancelled.status == "CANCELLED"
        assert untouched is not None and untouched.status == "PENDING"
        resumed = await client.resume_workflow("same", shard_key="acme")
        assert resumed.shard_key == "acme"
        await client.send("same", "resumed", "go", shard_key="acme")
        assert await resumed.get_result() == "acme:first|resumed"
        assert await client.get_all_events("same", shard_key="acme") == {
            "progress": "acme:first"}
        assert [v async for v in client.read_stream("same", "out", shard_key="globex")] \
            == ["globex:first"]
        await client.send("same", "last", "go", shard_key="globex")
        handle = await client.retrieve_workflow("same", shard_key="globex")
        assert await handle.get_result() == "globex:first|last"
        with pytest.raises(DBOSError, match=r"'same'.*shard key"):
            await client.cancel_workflow("same")
    assert app.runs == Counter({("acme", "first"): 1, ("globex", "first"): 1})


async def test_a_fork_copies_events_and_streams_below_its_cut(database_url: str) -> None:
    dbos = sharded(database_url)
    runs: Counter[tuple[str, int]] = Counter()

    @dbos.step(name="mark")
    async def mark(key: str, n: int) -> str:
        runs[(key, n)] += 1
        return f"{key}-{n}"

    @dbos.workflow(name="history")
    async def history(key: str) -> str:
        for n in range(3):
            value = await mark(key, n)
            await dbos.set_event("latest", value)
            await dbos.write_stream("marks", value)
        await dbos.close_stream("marks")
        return value

    async with dbos:
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("h"):
                assert await history(key) == f"{key}-2"
        steps = [s.name for s in await dbos.list_workflow_steps("h", shard_key="acme")]
        cut = steps.index("mark", steps.index("mark", 1) + 1)  # the third mark re-runs
        fork = await dbos.fork_workflow("h", cut, shard_key="acme", new_workflow_id="h-fork")
        assert fork.shard_key == "acme"
        assert await fork.get_result() == "acme-2"
        assert [v async for v in dbos.read_stream("h-fork", "marks", shard_key="acme")] \
            == ["acme-0", "acme-1", "acme-2"]
        assert await dbos.get_all_events("h-fork", shard_key="acme") == {"latest": "acme-2"}
        assert await dbos.list_workflows(workflow_ids=["h-fork"], shard_key="globex") == []
        assert [v async for v in dbos.read_stream("h", "marks", shard_key="globex")] \
            == ["globex-0", "globex-1", "globex-2"]
    assert runs == Counter({("acme", 0): 1, ("acme", 1): 1, ("acme", 2): 2,
                            ("globex", 0): 1, ("globex", 1): 1, ("globex", 2): 1})
    history_rows = await fetch(database_url, "SELECT value FROM dbos.workflow_events_history "
                                             "WHERE workflow_uuid = 'h-fork' AND shard_key = "
                                             "'acme' ORDER BY function_id")
    assert len(history_rows) == 3


async def test_bad_keys_are_refused(database_url: str) -> None:
    for bad in (None, 7, ""):
        with pytest.raises(DBOSError, match="Invalid shard key"):
            SetShardKey(bad)  # type: ignore[arg-type]
    app = Tenants(database_url)
    async with app.dbos as dbos:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(DBOSError, match="non-empty string"):
                await dbos.send("w", 1, shard_key=3)  # type: ignore[arg-type]
            gc.collect()
        assert [str(w.message) for w in caught] == []  # the refused send left nothing unrun
        with pytest.raises(DBOSError, match=r"'nobody'.*shard key"):
            await dbos.send("nobody", 1)
    assert await fetch(database_url, "SELECT 1 FROM dbos.notifications") == []


async def test_a_key_given_to_an_unsharded_database_is_refused(
        plain_database_url: str) -> None:
    dbos = new_dbos(plain_database_url)

    @dbos.workflow(name="plain")
    async def plain() -> int:
        return 1

    async with dbos:
        with SetShardKey("acme"), pytest.raises(DBOSError, match="not sharded"):
            await dbos.start_workflow(plain)
        with pytest.raises(DBOSError, match="not sharded"):
            await dbos.get_workflow_status("w", shard_key="acme")
    assert await fetch(plain_database_url, "SELECT 1 FROM dbos.workflow_status") == []


async def test_the_rate_limiter_holds_per_key(database_url: str) -> None:
    """A limiter of one start per hour lets one workflow of each key start; the others
    stay queued while later rounds still start a third key's."""
    app = Tenants(database_url)
    limited = app.dbos.queue("hourly", limiter=(1, 3600.0), polling_interval=0.05)
    async with app.dbos as dbos:
        for key in ("acme", "globex"):
            for _ in range(2):
                with SetShardKey(key):
                    await limited.enqueue(app.child, key)

        async def one_of_each_done() -> bool:
            done = await dbos.list_workflows(status="SUCCESS")
            return sorted(w.shard_key or "" for w in done) == ["acme", "globex"]

        await wait_until(one_of_each_done, what="one workflow of each key")
        # A later claim round (the keys are read again) visits every key with queued work.
        with SetShardKey("initech"):
            later = await limited.enqueue(app.child, "initech")
        assert await later.get_result() == "initech:child"
        queued = await dbos.list_workflows(status="ENQUEUED")
        assert sorted(w.shard_key or "" for w in queued) == ["acme", "globex"]
    assert app.runs == Counter({("acme", "child"): 1, ("globex", "child"): 1,
                                ("initech", "child"): 1})


async def test_deduplication_returns_the_existing_workflow_of_its_key(database_url: str) -> None:
    dbos = sharded(database_url)
    queue = dbos.queue("dedup-keys")
    release = asyncio.Event()

    @dbos.workflow(name="held")
    async def held(tag: str) -> str:
        await release.wait()
        return tag

    async with dbos:
        with SetShardKey("acme"), SetEnqueueOptions(deduplication_id="order-1"):
            first = await queue.enqueue(held, "first")
            with SetEnqueueOptions(deduplication_policy="return_existing"):
                again = await queue.enqueue(held, "again")
        with SetShardKey("globex"), SetEnqueueOptions(deduplication_id="order-1",
                                                       deduplication_policy="return_existing"):
            other = await queue.enqueue(held, "other")
        assert again.workflow_id == first.workflow_id and again.shard_key == "acme"
        assert other.workflow_id != first.workflow_id and other.shard_key == "globex"
        release.set()
        assert [await h.get_result() for h in (first, again, other)] == ["first", "first",
                                                                         "other"]


async def test_rewind_rolls_back_one_keys_events_streams_and_messages(database_url: str) -> None:
    dbos = sharded(database_url)

    @dbos.workflow(name="eventful")
    async def eventful(tag: str) -> Any:
        await dbos.set_event("k", f"{tag}-1")        # 0
        await dbos.set_event("k", f"{tag}-2")        # 1
        await dbos.write_stream("s", f"{tag}-late")  # 2
        got = await dbos.recv("t", timeout=30)       # 3 (and 4, its timer)
        return got

    async with dbos:
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("ev"):
                handle = await dbos.start_workflow(eventful, key)
            await dbos.send("ev", f"{key}-msg", "t", shard_key=key)
            assert await handle.get_result() == f"{key}-msg"
        # Rewind acme's onto a queue nobody serves, to see the rolled-back state.
        await dbos.rewind_workflow("ev", 1, queue="nobody-serves-this", shard_key="acme")
        assert await dbos.get_all_events("ev", shard_key="acme") == {"k": "acme-1"}
        assert await dbos.get_all_events("ev", shard_key="globex") == {"k": "globex-2"}
        streamed = [v async for v in dbos.read_stream("ev", "s", shard_key="globex")]
        assert streamed == ["globex-late"]
        consumed = await fetch(database_url,
                               "SELECT shard_key, message FROM dbos.notifications "
                               "WHERE destination_uuid = 'ev' ORDER BY shard_key")
        assert [(r["shard_key"], json.loads(r["message"])) for r in consumed] == [
            ("globex", "globex-msg")]
        steps = await dbos.list_workflow_steps("ev", shard_key="acme")
        assert [s.function_id for s in steps] == [0]
        assert len(await dbos.list_workflow_steps("ev", shard_key="globex")) >= 4


async def test_step_retries_under_a_key_checkpoint_once(database_url: str) -> None:
    dbos = sharded(database_url)
    attempts: Counter[str] = Counter()

    @dbos.step(name="flaky", retries=3, retry_interval=0.01)
    async def flaky(tag: str) -> str:
        attempts[tag] += 1
        if attempts[tag] < 3:
            raise ConnectionError(f"{tag} attempt {attempts[tag]}")
        return f"{tag}:{attempts[tag]}"

    @dbos.workflow(name="retrying")
    async def retrying(tag: str) -> str:
        return await flaky(tag)

    async with dbos:
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("r"):
                assert await retrying(key) == f"{key}:3"
        # A second call under the same ID returns the recorded result: no fourth attempt.
        with SetShardKey("acme"), SetWorkflowID("r"):
            assert await retrying("acme") == "acme:3"
        assert attempts == Counter({"acme": 3, "globex": 3})
        for key in ("acme", "globex"):
            steps = await dbos.list_workflow_steps("r", shard_key=key)
            assert [(s.name, s.output) for s in steps] == [("flaky", f"{key}:3")]


async def test_recv_topics_and_timeouts_under_keys(database_url: str) -> None:
    dbos = sharded(database_url)

    @dbos.workflow(name="inbox")
    async def inbox() -> list[Any]:
        first = await dbos.recv("b", timeout=30)
        second = await dbos.recv("a", timeout=30)
        missing = await dbos.recv("never", timeout=0.05)
        return [first, second, missing]

    async with dbos:
        handles = {}
        for key in ("acme", "globex"):
            with SetShardKey(key), SetWorkflowID("box"):
                handles[key] = await dbos.start_workflow(inbox)
        # Each topic is its own queue: "a" arrives first but is taken second.
        for key in ("globex", "acme"):
            await dbos.send("box", f"{key}-a", "a", shard_key=key)
            await dbos.send("box", f"{key}-b", "b", shard_key=key)
        for key, handle in handles.items():
            assert await handle.get_result() == [f"{key}-b", f"{key}-a", None]
        for key in handles:
            steps = await dbos.list_workflow_steps("box", shard_key=key)
            assert [s.name for s in steps].count("DBOS.recv") == 3
