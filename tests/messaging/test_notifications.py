"""The notification dispatcher: LISTEN/NOTIFY, coalescing, reconnects, polling, lifecycle."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import asyncpg
import pytest
from helpers import messaging_settings, new_dbos, unique_name, wait_no_connections, wait_until

from dbos_async import DBOS, DBOSClient, SetWorkflowID
from dbos_async._sysdb.notifications import (
    NOTIFICATIONS_CHANNEL,
    PACKED_PAYLOAD_BYTES,
    WORKFLOW_COMPLETION_CHANNEL,
    WORKFLOW_COMPLETIONS_CHANNEL,
    WORKFLOW_EVENTS_CHANNEL,
    NotificationDispatcher,
    packed,
)


def dispatcher_of(dbos: DBOS) -> NotificationDispatcher:
    dispatcher = dbos._system_database.notifications
    assert dispatcher is not None
    return dispatcher


async def test_register_then_notify_is_never_lost(database_url: str,
                                                  conn: asyncpg.Connection) -> None:
    async with new_dbos(database_url, **messaging_settings()) as dbos:
        dispatcher = dispatcher_of(dbos)
        assert dispatcher.listening
        events = [(WORKFLOW_EVENTS_CHANNEL, "wf::k")]
        assert dispatcher.wait_cap(events) == dispatcher.listening_poll_interval
        # Messages: the trigger notifies every insert, so no periodic re-read.
        assert dispatcher.wait_cap([(NOTIFICATIONS_CHANNEL, "wf::t")]) is None
        # The queue dispatchers' own waiters (DBOS's internal queue, the queue watcher).
        background = dispatcher.waiter_count()
        with dispatcher.register(WORKFLOW_EVENTS_CHANNEL, "wf::k") as waiter:
            # A notification landing before the wait (between "read" and "wait").
            await conn.execute("SELECT pg_notify('dbos_workflow_events_channel', 'wf::k')")
            async with asyncio.timeout(5):
                assert await waiter.wait(None)
            assert not await waiter.wait(0.05)  # consumed by the previous wait
        assert dispatcher.waiter_count() == background


async def test_plain_postgres_has_one_listener_connection(database_url: str,
                                                           conn: asyncpg.Connection) -> None:
    """Only a Citus cluster has other nodes to listen on."""
    name = unique_name("one_listener")
    async with new_dbos(database_url, **messaging_settings(connection_name=name)) as dbos:
        dispatcher = dispatcher_of(dbos)
        assert dispatcher.listening and dispatcher.nodes == []
        listening = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
            "AND query ILIKE 'LISTEN%'", name)
        assert [row["pid"] for row in listening] == [dispatcher.listener_pid]


async def test_notifier_coalesces_into_batches(database_url: str,
                                               conn: asyncpg.Connection) -> None:
    heard: list[str] = []
    await conn.add_listener(WORKFLOW_EVENTS_CHANNEL, lambda *a: heard.append(a[3]))
    async with new_dbos(database_url, **messaging_settings(notification_coalesce_ms=50)) as dbos:
        dispatcher = dispatcher_of(dbos)
        for i in range(100):
            dispatcher.notify(WORKFLOW_EVENTS_CHANNEL, f"wf::{i % 10}")
        async with asyncio.timeout(5):
            # The listener may hear the batch before the notifier's statement returns.
            while True:
                if len(heard) >= 10 and dispatcher.batches_sent > 0:
                    break
                await asyncio.sleep(0.01)
        assert sorted(heard) == sorted(f"wf::{i}" for i in range(10))
        assert dispatcher.batches_sent == 1 and dispatcher.notifications_sent == 10


async def test_completions_ending_together_wake_another_process_in_packed_notifications(
        database_url: str, conn: asyncpg.Connection) -> None:
    """Workflows ending together are announced a few JSON lists at a time, and the waiters
    of a client that re-reads only every minute wake for each of them; the executor's own
    wake once (its listener drops the echo of its own lists); a malformed packed payload
    (another writer's) is ignored and leaves the listener working."""
    heard: list[tuple[str, str]] = []
    for channel in (WORKFLOW_COMPLETION_CHANNEL, WORKFLOW_COMPLETIONS_CHANNEL):
        await conn.add_listener(channel, lambda *a: heard.append((a[2], a[3])))
    dbos = new_dbos(database_url, **messaging_settings())
    gate = asyncio.Event()

    @dbos.workflow()
    async def gated(i: int) -> int:
        await gate.wait()
        return i

    # Long IDs: 100 of them take several payloads.
    ids = [f"{unique_name('packed')}-{'x' * 150}-{i}" for i in range(100)]
    async with dbos, DBOSClient(database_url, listening_poll_interval=60,
                                connection_name=unique_name("packed_client")) as client:
        for i, workflow_id in enumerate(ids):
            with SetWorkflowID(workflow_id):
                await dbos.start_workflow(gated, i)
        await conn.execute(
            f"SELECT pg_notify('{WORKFLOW_COMPLETIONS_CHANNEL}', 'not a list'), "
            f"pg_notify('{WORKFLOW_COMPLETIONS_CHANNEL}', '{{\"a\": 1}}')")
        # The client's waiters, registered before the workflows end, re-read only after a
        # minute unless notified.
        dispatcher = client._peer().system_database.notifications
        assert dispatcher is not None
        waiters = [dispatcher.register(WORKFLOW_COMPLETION_CHANNEL, i) for i in ids]
        # The executor's own waiters are woken once per workflow: when it notifies, not
        # again by its listener's echo of its own packed lists.
        woken: Counter[str] = Counter()
        dispatcher_of(dbos).subscribe(WORKFLOW_COMPLETION_CHANNEL,
                                      lambda key: woken.update([key]))
        gate.set()
        async with asyncio.timeout(10):
            assert all(await asyncio.gather(*(w.wait(None) for w in waiters)))
            handles = [await client.retrieve_workflow(i) for i in ids]
            assert [await h.get_result() for h in handles] == list(range(100))
        for waiter in waiters:
            waiter.close()

        def lists() -> list[str]:  # the packed payloads heard (not the malformed two)
            return [p for c, p in heard if c == WORKFLOW_COMPLETIONS_CHANNEL
                    and p.startswith('["')]

        async def all_heard() -> bool:
            alone = {p for c, p in heard if c == WORKFLOW_COMPLETION_CHANNEL}
            return alone | {k for p in lists() for k in json.loads(p)} >= set(ids)

        await wait_until(all_heard, what="every completion announced")
        # A list sent after the executor's: its listener has heard theirs once it hears this.
        await conn.execute(f"SELECT pg_notify('{WORKFLOW_COMPLETIONS_CHANNEL}', "
                           "'[\"sentinel-1\", \"sentinel-2\"]')")

        async def sentinel_heard() -> bool:
            return woken["sentinel-1"] == 1

        await wait_until(sentinel_heard, what="the executor's listener caught up")
        assert {woken[i] for i in ids} == {1}
    payloads = lists()
    assert len(payloads) >= 3
    assert all(len(p.encode()) < PACKED_PAYLOAD_BYTES for p in payloads)


def test_packing_keeps_every_key_and_each_payload_under_the_limit() -> None:
    long_keys = [f"{i}-{'é' * 3000}" for i in range(5)]  # 6 KB each once encoded
    oversized = "k" * 9000
    notifications = [(WORKFLOW_EVENTS_CHANNEL, "wf::a"), (WORKFLOW_EVENTS_CHANNEL, "wf::b"),
                     *((WORKFLOW_COMPLETION_CHANNEL, k) for k in [*long_keys, oversized]),
                     *((WORKFLOW_COMPLETION_CHANNEL, f"short-{i}") for i in range(3))]
    sent = packed(notifications)
    # Other channels as they were; no packed payload over the limit; every key once.
    assert sent[:2] == notifications[:2]
    keys: list[str] = []
    for channel, payload in sent[2:]:
        if channel == WORKFLOW_COMPLETIONS_CHANNEL:
            assert len(payload.encode()) < PACKED_PAYLOAD_BYTES
            keys += json.loads(payload)
        else:
            assert channel == WORKFLOW_COMPLETION_CHANNEL
            keys.append(payload)
    assert sorted(keys) == sorted(k for _, k in notifications[2:])
    assert (WORKFLOW_COMPLETION_CHANNEL, oversized) in sent  # too long to share: alone
    # A lone completion keeps its own channel, as older releases listen there.
    assert packed([(WORKFLOW_COMPLETION_CHANNEL, "one")]) == [
        (WORKFLOW_COMPLETION_CHANNEL, "one")]


async def test_listener_killed_mid_wait(database_url: str, conn: asyncpg.Connection) -> None:
    dbos = new_dbos(database_url, **messaging_settings(notification_poll_interval=60))

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=60)

    async with dbos:
        dispatcher = dispatcher_of(dbos)
        with SetWorkflowID("r"):
            handle = await dbos.start_workflow(receiver)
        await asyncio.sleep(0.2)
        pid = dispatcher.listener_pid
        assert pid is not None
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        # A message from another session right away, possibly while the listener is down.
        await conn.execute("SELECT dbos.send_message('r', '\"after kill\"'::json)")
        t0 = time.monotonic()
        async with asyncio.timeout(10):  # far below the receive timeout and poll interval
            assert await handle.get_result() == "after kill"
        assert time.monotonic() - t0 < 10
        async with asyncio.timeout(10):
            while True:
                if dispatcher.listener_pid not in (None, pid):
                    break
                await asyncio.sleep(0.02)
        assert dispatcher.reconnects >= 1
        # And notifications flow again on the new connection.
        with dispatcher.register(NOTIFICATIONS_CHANNEL, "x::y") as waiter:
            await conn.execute("SELECT pg_notify('dbos_notifications_channel', 'x::y')")
            async with asyncio.timeout(5):
                assert await waiter.wait(None)


async def test_listener_killed_wakes_every_waiter(database_url: str,
                                                  conn: asyncpg.Connection) -> None:
    async with new_dbos(database_url, **messaging_settings(notification_poll_interval=60)) as dbos:
        dispatcher = dispatcher_of(dbos)
        waiters = [dispatcher.register(WORKFLOW_EVENTS_CHANNEL, f"w::{i}") for i in range(20)]
        waits = [asyncio.ensure_future(w.wait(60)) for w in waiters]
        await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_terminate_backend($1)", dispatcher.listener_pid)
        async with asyncio.timeout(10):
            await asyncio.gather(*waits)
        for w in waiters:
            w.close()


async def test_polling_mode_has_no_listener(database_url: str,
                                            conn: asyncpg.Connection) -> None:
    dbos = new_dbos(database_url,
                    **messaging_settings(listen=False, connection_name="polling_exec"))

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=10)

    async with dbos:
        dispatcher = dispatcher_of(dbos)
        assert not dispatcher.listening
        assert dispatcher.wait_cap([(NOTIFICATIONS_CHANNEL, "r::t")]) == 0.1
        listening = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'polling_exec' "
            "AND query ILIKE 'LISTEN%'")
        assert listening == 0
        with SetWorkflowID("r"):
            handle = await dbos.start_workflow(receiver)
        await asyncio.sleep(0.2)
        await conn.execute("SELECT dbos.send_message('r', '1'::json)")
        async with asyncio.timeout(5):
            assert await handle.get_result() == 1
        dispatcher.notify(WORKFLOW_EVENTS_CHANNEL, "a::b")
        assert dispatcher.notifications_sent == 0


async def test_idle_receivers_do_not_read_again(database_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """recv's channel is fed by the trigger on every insert, so while the listener is up a
    waiting receiver reads only when notified, however short ``listening_poll_interval``."""
    dbos = new_dbos(database_url, **messaging_settings(listening_poll_interval=0.1))
    reads: list[str] = []

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=60)

    async with dbos:
        consume = dbos._system_database.consume_message

        async def counted(workflow_id: str, *args: Any) -> Any:
            reads.append(workflow_id)
            return await consume(workflow_id, *args)

        monkeypatch.setattr(dbos._system_database, "consume_message", counted)
        handles = []
        for i in range(50):
            with SetWorkflowID(f"idle-{i}"):
                handles.append(await dbos.start_workflow(receiver))

        async def all_waiting() -> bool:
            return len(set(reads)) == 50

        await wait_until(all_waiting, what="every receiver's first read")
        before = len(reads)
        await asyncio.sleep(1.0)  # ten listening poll intervals
        assert len(reads) == before
        conn = await asyncpg.connect(database_url)
        try:  # a message from raw SQL: the trigger's notification wakes only its receiver
            await conn.execute("SELECT dbos.send_message('idle-7', '7'::json)")
        finally:
            await conn.close()
        async with asyncio.timeout(10):
            assert await handles[7].get_result() == 7
        assert reads[before:].count("idle-7") >= 1 and len(set(reads[before:])) == 1
        await asyncio.gather(*(dbos.send(f"idle-{i}", i) for i in range(50) if i != 7))
        async with asyncio.timeout(20):
            assert await dbos.wait_all(handles) == list(range(50))


async def test_polling_queries_are_bounded(database_url: str) -> None:
    """Without LISTEN, 60 callers polling for events read at most max_polling_queries at
    once. (recv's reads are batched instead: see test_group_commit.py.)"""
    dbos = new_dbos(database_url,
                    **messaging_settings(listen=False, pool_size=4, max_polling_queries=2))

    @dbos.workflow()
    async def publisher(value: int) -> None:
        await dbos.set_event("k", value)

    async with dbos:
        dispatcher = dispatcher_of(dbos)
        slots = dispatcher.polling()
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, 2 - slots._value)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        readers = [asyncio.ensure_future(dbos.get_event(f"p{i}", "k", timeout=30))
                   for i in range(60)]
        for i in range(60):
            with SetWorkflowID(f"p{i}"):
                await dbos.start_workflow(publisher, i)
        async with asyncio.timeout(20):
            assert await asyncio.gather(*readers) == list(range(60))
        watcher.cancel()
        assert 1 <= peak <= 2


async def test_nothing_outlives_the_executor(database_url: str, listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen, connection_name="lifecycle_exec"))

    @dbos.workflow()
    async def waiter() -> Any:
        return await dbos.recv(timeout=60)

    before = set(asyncio.all_tasks())
    async with dbos:
        await dbos.start_workflow(waiter)
        dispatcher_of(dbos).notify(WORKFLOW_EVENTS_CHANNEL, "x::y")
        await asyncio.sleep(0.1)
    assert set(asyncio.all_tasks()) - before - {asyncio.current_task()} == set()
    runtime = dbos._runtime
    assert runtime is not None and runtime.state == "closed"
    assert all(len(owner) == 0 for owner in (runtime.background, runtime.workflows,
                                             runtime.queue_tasks))
    await wait_no_connections(database_url, "lifecycle_exec", patience=5)
