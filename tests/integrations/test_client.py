"""The async client: enqueue, send, events, streams, handles, listing and control from a
process that runs no workflow; the transactional outbox; and a client in another process."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections import Counter

import asyncpg
import pytest
from helpers import fetch, new_dbos, unique_name, wait_until, workflow_row

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    MigrationError,
    NonExistentWorkflowError,
    QueueDeduplicatedError,
    SetWorkflowID,
    WorkflowCancelledError,
)

PATIENCE = 15.0


def client_for(url: str) -> DBOSClient:
    return DBOSClient(system_database_url=url, application_name=unique_name("client"),
                      result_poll_interval=0.2, pool_size=2)


class App:
    """An executor with a queue and a few workflows the client drives by name."""

    def __init__(self, url: str) -> None:
        self.dbos: DBOS = new_dbos(url)
        dbos = self.dbos
        self.queue = dbos.queue("jobs")
        self.runs: Counter[str] = Counter()
        self.gate = asyncio.Event()

        @dbos.step(name="double")
        async def double(x: int) -> int:
            self.runs["double"] += 1
            return 2 * x

        @dbos.step(name="held")
        async def held() -> None:
            self.runs["held"] += 1
            await self.gate.wait()

        @dbos.workflow(name="work")
        async def work(x: int, label: str = "") -> str:
            doubled = await double(x)
            await dbos.set_event("doubled", doubled)
            await dbos.write_stream("out", doubled)
            await dbos.close_stream("out")
            return f"{label}{doubled}"

        @dbos.workflow(name="inbox")
        async def inbox() -> str:
            got = await dbos.recv("mail", timeout=30)
            return f"got {got}"

        @dbos.workflow(name="slow")
        async def slow() -> int:
            await double(1)
            await held()
            return 7

        self.slow = slow


async def test_client_enqueue_results_status_steps(database_url: str) -> None:
    app = App(database_url)
    async with app.dbos, client_for(database_url) as client:
        handle = await client.enqueue("jobs", "work", 21, label="n=", workflow_id="c1")
        assert handle.workflow_id == "c1"
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "n=42"
        assert await client.get_event("c1", "doubled", timeout=1) == 42
        assert [v async for v in client.read_stream("c1", "out")] == [42]
        status = await client.get_workflow_status("c1")
        assert status is not None
        assert (status.status, status.name, status.queue_name) == ("SUCCESS", "work", "jobs")
        steps = await client.list_workflow_steps("c1")
        assert steps[0].name == "double" and steps[0].output == 42
        [listed] = await client.list_workflows(name="work")
        assert listed.input is not None and listed.input.args == (21,)
        assert listed.input.kwargs == {"label": "n="} and listed.output == "n=42"
        # The same ID again returns the same workflow.
        again = await client.enqueue("jobs", "work", 99, workflow_id="c1")
        assert await again.get_result() == "n=42" and app.runs["double"] == 1
        with pytest.raises(NonExistentWorkflowError):
            await client.retrieve_workflow("missing")
        with pytest.raises(NonExistentWorkflowError):
            await client.list_workflow_steps("missing")
        # Retrieved handles work the same way.
        assert await (await client.retrieve_workflow("c1")).get_result() == "n=42"


async def test_client_send_and_queue_options(database_url: str) -> None:
    app = App(database_url)
    async with app.dbos, client_for(database_url) as client:
        handle = await client.enqueue("jobs", "inbox", workflow_id="in1")
        await client.send("in1", {"a": 1}, topic="mail", idempotency_key="k")
        await client.send("in1", {"a": 2}, topic="mail", idempotency_key="k")
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "got {'a': 1}"
        with pytest.raises(NonExistentWorkflowError):
            await client.send("nobody", 1)
        # Deduplication, delay and priority, as the queue options mean them.
        app.gate.clear()
        first = await client.enqueue("jobs", "slow", deduplication_id="d", priority=3)
        with pytest.raises(QueueDeduplicatedError):
            await client.enqueue("jobs", "slow", deduplication_id="d")
        delayed = await client.enqueue("jobs", "work", 1, delay=0.3)
        row = await workflow_row(database_url, delayed.workflow_id)
        assert row["status"] in ("DELAYED", "ENQUEUED", "PENDING", "SUCCESS")
        assert row["delay_until_epoch_ms"] is not None
        assert await asyncio.wait_for(delayed.get_result(), PATIENCE) == "2"
        app.gate.set()
        assert await asyncio.wait_for(first.get_result(), PATIENCE) == 7
        assert (await workflow_row(database_url, first.workflow_id))["priority"] == 3


async def test_client_control_queues_and_versions(database_url: str) -> None:
    app = App(database_url)
    async with app.dbos, client_for(database_url) as client:
        app.gate.clear()
        handle = await client.enqueue("jobs", "slow", workflow_id="s1")
        async def held() -> bool:
            return app.runs["held"] > 0

        await wait_until(held, what="the step to start")
        [queued] = await client.list_queued_workflows(queue_name="jobs")
        assert queued.workflow_id == "s1" and queued.status == "PENDING"
        assert await client.cancel_workflows(["s1"]) == ["s1"]
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(handle.get_result(), PATIENCE)
        app.gate.set()
        resumed = await client.resume_workflow("s1")
        assert await asyncio.wait_for(resumed.get_result(), PATIENCE) == 7
        assert app.runs == Counter(double=1, held=2)
        fork = await client.fork_workflow("s1", 1, new_workflow_id="s1-fork")
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 7
        assert app.runs == Counter(double=1, held=3)
        await client.delete_workflow("s1-fork")
        assert await client.get_workflow_status("s1-fork") is None

        await client.register_queue("from-client", concurrency=2, limiter=(5, 1.0))
        stored = {q.name: q for q in await client.list_queues()}
        assert stored["from-client"].concurrency == 2
        assert (await app.dbos.get_queue("from-client")).concurrency == 2

        versions = [v.version_name for v in await client.list_application_versions()]
        assert "test-version-1" in versions
        await client.set_latest_application_version("v-next")
        latest = await client.get_latest_application_version()
        assert latest is not None and latest.version_name == "v-next"


@pytest.mark.parametrize("commit", [True, False])
async def test_outbox_enqueue_and_send_join_the_callers_transaction(
        database_url: str, commit: bool) -> None:
    app = App(database_url)
    async with app.dbos, client_for(database_url) as client:
        receiver = await client.enqueue("jobs", "inbox", workflow_id="rx")
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
            tx = conn.transaction()
            await tx.start()
            await conn.execute("INSERT INTO orders VALUES ('o1')")
            handle = await client.enqueue("jobs", "work", 5, workflow_id="ob1",
                                          connection=conn)
            await client.send("rx", "order o1", topic="mail", connection=conn)
            # A duplicate inside the transaction fails in its savepoint, not the caller's.
            await client.enqueue("jobs", "slow", deduplication_id="dd", connection=conn)
            with pytest.raises(QueueDeduplicatedError):
                await client.enqueue("jobs", "slow", deduplication_id="dd", connection=conn)
            await conn.execute("INSERT INTO orders VALUES ('o2')")
            # Nothing is visible outside the transaction yet.
            assert await workflow_row(database_url, "ob1") is None
            await asyncio.sleep(0.3)
            assert app.runs["double"] == 0
            if commit:
                await tx.commit()
            else:
                await tx.rollback()
        finally:
            await conn.close()
        if commit:
            assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "10"
            assert await asyncio.wait_for(receiver.get_result(), PATIENCE) == "got order o1"
            orders = await fetch(database_url, "SELECT id FROM orders ORDER BY id")
            assert [r["id"] for r in orders] == ["o1", "o2"]
        else:
            assert await workflow_row(database_url, "ob1") is None
            assert await fetch(database_url, "SELECT * FROM dbos.notifications") == []
            await client.cancel_workflow("rx")


async def test_client_never_migrates(database_url: str) -> None:
    with pytest.raises(MigrationError):
        async with client_for(database_url):
            pass
    tables = await fetch(database_url, """SELECT 1 FROM information_schema.tables
                                          WHERE table_schema = 'dbos'""")
    assert tables == []


_CLIENT_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from dbos_async import DBOSClient

    async def main() -> None:
        async with DBOSClient(system_database_url=sys.argv[1]) as client:
            handle = await client.enqueue("jobs", "work", 4, label="sub:",
                                          workflow_id="from-subprocess")
            print("RESULT", await asyncio.wait_for(handle.get_result(), 30), flush=True)
            print("EVENT", await client.get_event("from-subprocess", "doubled"), flush=True)
            rx = await client.enqueue("jobs", "inbox", workflow_id="rx-sub")
            await client.send("rx-sub", "hello", topic="mail")
            print("RECV", await rx.get_result(), flush=True)
            steps = await client.list_workflow_steps("from-subprocess")
            print("STEPS", ",".join(s.name for s in steps), flush=True)
            await client.cancel_workflow("victim")
            print("CANCELLED", (await client.get_workflow_status("victim")).status,
                  flush=True)

    asyncio.run(main())
    """
)


async def test_client_in_another_process(database_url: str) -> None:
    app = App(database_url)
    async with app.dbos:
        app.gate.clear()
        with SetWorkflowID("victim"):
            victim = await app.dbos.start_workflow(app.slow)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CLIENT_SCRIPT, database_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        stdout = out.decode()
        assert proc.returncode == 0, f"{stdout}\n{err.decode()}"
        assert "RESULT sub:8" in stdout
        assert "EVENT 8" in stdout
        assert "RECV got hello" in stdout
        assert "STEPS double," in stdout
        assert "CANCELLED CANCELLED" in stdout
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(victim.get_result(), PATIENCE)
        app.gate.set()


async def test_enqueue_takes_application_version_and_its_old_name(database_url: str) -> None:
    app = App(database_url)
    async with app.dbos, client_for(database_url) as client:
        await client.enqueue("jobs", "work", 1, workflow_id="named",
                             application_version="v-named")
        with pytest.warns(DeprecationWarning, match="application_version"):
            await client.enqueue("jobs", "work", 2, workflow_id="old-name",
                                 app_version="v-old")
        with pytest.warns(DeprecationWarning), pytest.raises(DBOSError, match="not both"):
            await client.enqueue("jobs", "work", 3, workflow_id="both",
                                 application_version="a", app_version="b")
    versions = {row["workflow_uuid"]: row["application_version"] for row in await fetch(
        database_url, "SELECT workflow_uuid, application_version FROM dbos.workflow_status")}
    assert versions == {"named": "v-named", "old-name": "v-old"}
