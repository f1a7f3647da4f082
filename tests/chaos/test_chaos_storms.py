"""Connection-kill storms: every backend of the test database is terminated every 100 ms
(``pg_terminate_backend``, all but the killer's own) while one family of operations runs
without pause: checkpoints, messages, events, streams, queue claims, cancel/resume/fork/
delete, listings, client calls.

Every call must either succeed (with the right result) or raise a dbos_async error (a
``DBOSError``, documented in the README's error table); a raw driver error (``asyncpg.*``,
``OSError``, ...) reaching the caller is a failure. After the storm nothing may be stuck:
every workflow reaches a terminal state with its executor alive (none is left ``PENDING``),
and no background task of the executor died.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from faults import App, Calls, connection_storm, failed_tasks, register, unfinished_workflows
from helpers import new_dbos, wait_until

from dbos_async import DBOS, DBOSClient

pytestmark = pytest.mark.chaos

STORM_SECONDS_PER_SCALE = 2.0
PARALLEL_ROUNDS = 3
QUEUE = "chaos_storm_queue"
WAIT = 30.0  # recv and get_event timeouts: far longer than any storm needs


class Family:
    """One round of a family's calls; rounds run back to back, ``PARALLEL_ROUNDS`` at once."""

    def __init__(self, dbos: DBOS, app: App, client: DBOSClient, calls: Calls,
                 before: str) -> None:
        self.dbos, self.app, self.client, self.calls = dbos, app, client, calls
        self.before = before  # a finished workflow started before the storm
        self.wrong: list[str] = []

    def expect(self, what: str, got: Any, want: Any) -> None:
        if got != want:
            self.wrong.append(f"{what}: got {got!r}, expected {want!r}")

    async def result(self, what: str, handle: Any, want: Any) -> None:
        """The workflow's result, checked unless the call raised a documented error."""
        if handle is None:
            return
        got = await self.calls(f"{what}.get_result", handle.get_result())
        if got is not None:
            self.expect(what, got, want)

    async def checkpoints(self, tag: str) -> None:
        handle = await self.calls("start_workflow", self.dbos.start_workflow(self.app.steps, 5))
        await self.result("steps", handle, 10)

    async def messages(self, tag: str) -> None:
        handle = await self.calls("start_workflow",
                                  self.dbos.start_workflow(self.app.receiver, 3, WAIT))
        if handle is None:
            return
        errors = len(self.calls.documented) + len(self.calls.raw)
        for i in range(3):
            await self.calls("send", self.dbos.send(handle.workflow_id, i, topic="chaos",
                                                    idempotency_key=f"{tag}-{i}"))
        await self.calls("send", self.dbos.send(self.before, "x", topic="unused"))
        if len(self.calls.documented) + len(self.calls.raw) == errors:  # all delivered
            await self.result("receiver", handle, [0, 1, 2])

    async def events(self, tag: str) -> None:
        handle = await self.calls("start_workflow", self.dbos.start_workflow(self.app.publisher, 3))
        if handle is None:
            return
        got = await self.calls("get_event", self.dbos.get_event(handle.workflow_id, "key-2", WAIT))
        self.expect("get_event", got, 2)
        await self.result("publisher", handle, 3)
        events = await self.calls("get_all_events", self.dbos.get_all_events(handle.workflow_id))
        if events is not None:
            self.expect("get_all_events", events, {"key-0": 0, "key-1": 1, "key-2": 2})

    async def streams(self, tag: str) -> None:
        handle = await self.calls("start_workflow", self.dbos.start_workflow(self.app.streamer, 5))
        if handle is None:
            return

        async def read_all() -> list[Any]:
            return [v async for v in self.dbos.read_stream(handle.workflow_id, "values")]

        values = await self.calls("read_stream", read_all())
        if values is not None:
            self.expect("read_stream", values, [0, 1, 2, 3, 4])
        await self.result("streamer", handle, 5)

    async def queues(self, tag: str) -> None:
        queue = await self.calls("get_queue", self.dbos.get_queue(QUEUE))
        if queue is None:
            return
        handles = [await self.calls("enqueue", queue.enqueue(self.app.steps, 4)) for _ in range(3)]
        for handle in handles:
            await self.result("queued steps", handle, 6)

    async def operations(self, tag: str) -> None:
        blocked = await self.calls("start_workflow",
                                   self.dbos.start_workflow(self.app.blocker, WAIT))
        if blocked is not None:
            await self.calls("cancel_workflow", self.dbos.cancel_workflow(blocked.workflow_id))
            resumed = await self.calls("resume_workflow",
                                       self.dbos.resume_workflow(blocked.workflow_id))
            await self.calls("send", self.dbos.send(blocked.workflow_id, "go", topic="unblock",
                                                    idempotency_key=f"{tag}-go"))
            await self.result("resumed", resumed, "go")
        done = await self.calls("start_workflow", self.dbos.start_workflow(self.app.steps, 3))
        await self.result("steps", done, 3)
        if done is None:
            return
        fork = await self.calls("fork_workflow", self.dbos.fork_workflow(done.workflow_id, 1))
        await self.result("fork", fork, 3)
        await self.calls("delete_workflow", self.dbos.delete_workflow(done.workflow_id))

    async def listings(self, tag: str) -> None:
        await self.calls("list_workflows", self.dbos.list_workflows(limit=20))
        await self.calls("list_queued_workflows", self.dbos.list_queued_workflows())
        steps = await self.calls("list_workflow_steps",
                                 self.dbos.list_workflow_steps(self.before))
        if steps is not None:
            self.expect("list_workflow_steps", len(steps), 4)  # 2 set_event, 2 steps
        status = await self.calls("get_workflow_status",
                                  self.dbos.get_workflow_status(self.before))
        if status is not None:
            self.expect("get_workflow_status", status.status, "SUCCESS")
        await self.calls("queue_depths", self.dbos.queue_depths())

    async def client_calls(self, tag: str) -> None:
        queued = await self.calls("client.enqueue", self.client.enqueue(QUEUE, "chaos_steps", 3))
        await self.result("client-enqueued steps", queued, 3)
        receiver = await self.calls("start_workflow",
                                    self.dbos.start_workflow(self.app.receiver, 1, WAIT))
        if receiver is not None:
            errors = len(self.calls.documented) + len(self.calls.raw)
            await self.calls("client.send", self.client.send(
                receiver.workflow_id, "m", topic="chaos", idempotency_key=f"{tag}-m"))
            if len(self.calls.documented) + len(self.calls.raw) == errors:  # delivered
                await self.result("receiver", receiver, ["m"])
        got = await self.calls("client.get_event", self.client.get_event(self.before, "key-1",
                                                                           WAIT))
        self.expect("client.get_event", got, 1)
        await self.calls("client.list_workflows", self.client.list_workflows(limit=10))
        await self.calls("client.list_queued_workflows", self.client.list_queued_workflows())
        await self.calls("client.list_workflow_steps",
                         self.client.list_workflow_steps(self.before))
        handle = await self.calls("client.retrieve_workflow",
                                  self.client.retrieve_workflow(self.before))
        await self.result("client-retrieved", handle, 2)


ROUNDS: dict[str, Callable[[Family], Callable[[str], Awaitable[None]]]] = {
    "checkpoints": lambda f: f.checkpoints,
    "messages": lambda f: f.messages,
    "events": lambda f: f.events,
    "streams": lambda f: f.streams,
    "queue-claims": lambda f: f.queues,
    "listings": lambda f: f.listings,
    "client-calls": lambda f: f.client_calls,
    "cancel-resume-fork-delete": lambda f: f.operations,
}

@pytest.mark.parametrize("family", list(ROUNDS))
async def test_storm_during(family: str, database_url: str, scale: int,
                            chaos_figures: Counter[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dbos_async")
    dbos = new_dbos(database_url, pool_size=6)
    app = register(dbos)
    dbos.queue(QUEUE, concurrency=4, polling_interval=0.2)
    calls = Calls(chaos_figures)
    async with dbos, DBOSClient(database_url) as client:
        before = await dbos.start_workflow(app.publisher, 2)
        assert await before.get_result() == 2
        family_calls = Family(dbos, app, client, calls, before.workflow_id)
        run_round = ROUNDS[family](family_calls)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STORM_SECONDS_PER_SCALE * scale

        async def rounds(worker: int) -> None:
            n = 0
            while loop.time() < deadline and not calls.raw:
                await run_round(f"{family}-{worker}-{n}")
                n += 1

        async with connection_storm(database_url, chaos_figures):
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(rounds(w) for w in range(PARALLEL_ROUNDS))), deadline + 120)
            except TimeoutError:
                raise AssertionError(f"calls of {family} still waiting 120 s after the storm "
                                     "ended") from None

        async def settled() -> bool:
            return not await unfinished_workflows(database_url)

        await wait_until(settled, patience=60, what="every workflow to reach a terminal state")
    assert calls.raw == [], "\n".join(calls.raw)
    assert family_calls.wrong == [], "\n".join(family_calls.wrong)
    assert failed_tasks(caplog) == []
    assert chaos_figures["calls_under_faults"] > 0 and chaos_figures["storm_kills"] > 0


ENTERING_ATTEMPTS_PER_SCALE = 10


async def test_storm_while_entering_and_leaving(database_url: str, scale: int,
                                                chaos_figures: Counter[str]) -> None:
    async with new_dbos(database_url):
        pass  # the schema exists: what follows is the entry of an executor, not a migration
    calls = Calls(chaos_figures)

    async def enter_and_leave() -> None:
        dbos = new_dbos(database_url)
        app = register(dbos)
        async with dbos:
            assert await (await dbos.start_workflow(app.steps, 2)).get_result() == 1
        async with DBOSClient(database_url) as client:
            await client.list_workflows(limit=1)

    async with connection_storm(database_url, chaos_figures):
        for attempt in range(ENTERING_ATTEMPTS_PER_SCALE * scale):
            await calls(f"entering ({attempt})", enter_and_leave())
            if calls.raw:
                break  # one is enough to fail
    assert calls.raw == [], "\n".join(calls.raw)


NOTIFIER_STORM_SECONDS = 10.0


async def test_notifier_survives_a_storm(database_url: str, scale: int,
                                         chaos_figures: Counter[str],
                                         caplog: pytest.LogCaptureFixture) -> None:
    """Sends and events under a storm, until the notifier dies or the time is up (the
    other storm tests leave the notifier out of their check of dead tasks: see
    :func:`faults.failed_tasks`)."""
    caplog.set_level(logging.WARNING, logger="dbos_async")
    dbos = new_dbos(database_url, pool_size=6)
    app = register(dbos)
    calls = Calls(chaos_figures)
    async with dbos, DBOSClient(database_url) as client:
        before = await dbos.start_workflow(app.publisher, 2)
        assert await before.get_result() == 2
        family = Family(dbos, app, client, calls, before.workflow_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NOTIFIER_STORM_SECONDS * scale

        async def rounds(worker: int) -> None:
            n = 0
            while loop.time() < deadline and not failed_tasks(caplog):
                await (family.messages if n % 2 else family.events)(f"notifier-{worker}-{n}")
                n += 1

        async with connection_storm(database_url, chaos_figures):
            await asyncio.gather(*(rounds(w) for w in range(PARALLEL_ROUNDS)))

        async def all_running() -> bool:
            return not dbos.health().down

        await wait_until(all_running, what="every background task running after the storm")
        # Notifications still leave the process: a message sent now wakes its receiver.
        await family.messages("notifier-after")
    assert failed_tasks(caplog) == []
