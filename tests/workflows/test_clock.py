"""The test clock (dbos_async.testing.TestClock) against a real PostgreSQL: durable timers fire
when a test advances it, never before, with the values a real run would record, across
executors and across a crash."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from helpers import new_dbos, wait_until

from dbos_async import (
    DBOS,
    ConfigurationError,
    SetEnqueueOptions,
    SetWorkflowID,
    SetWorkflowTimeout,
    StreamTimeoutError,
    transaction_connection,
)
from dbos_async.errors import WorkflowCancelledError
from dbos_async.testing import TestClock

START = datetime(2026, 1, 1, 0, 30, tzinfo=UTC)
HOUR_MS = 3_600_000


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


async def steps_of(database_url: str, workflow_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetch(
            "SELECT function_name, output, started_at_epoch_ms, completed_at_epoch_ms "
            "FROM dbos.operation_outputs WHERE workflow_uuid = $1 ORDER BY function_id",
            workflow_id)
    finally:
        await conn.close()


async def test_a_thirty_day_sleep_ends_when_the_clock_gets_there(database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)

    @dbos.workflow()
    async def nap() -> str:
        await dbos.sleep(30 * 86400)
        return "awake"

    async with dbos:
        began = time.monotonic()
        with SetWorkflowID("nap"):
            handle = await dbos.start_workflow(nap)
        await clock.wait_for_timers()
        wake_up = START + timedelta(days=30)
        assert clock.next_due == wake_up
        await clock.advance(days=29, hours=23, minutes=59, seconds=59)
        assert (await handle.get_status()).status == "PENDING"
        assert clock.next_due == wake_up  # still asleep, its timer untouched
        await clock.advance(seconds=1)
        assert await handle.get_result() == "awake"
        elapsed = time.monotonic() - began
        status = await handle.get_status()
    # Recorded as a real run records it: the deadline, reached at the deadline.
    [sleep] = await steps_of(database_url, "nap")
    assert sleep["function_name"] == "DBOS.sleep"
    assert json.loads(sleep["output"]) == epoch_ms(wake_up)
    assert sleep["started_at_epoch_ms"] == epoch_ms(START)
    assert sleep["completed_at_epoch_ms"] == epoch_ms(wake_up)
    assert status.created_at == epoch_ms(START)
    assert status.updated_at == epoch_ms(wake_up)
    # From the start to the result, not one of the 30 days waited for in real time.
    assert elapsed < 1.0, f"30-day sleep: {elapsed:.3f} s of wall time"


async def test_recv_times_out_after_an_hour_and_not_before(database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)

    @dbos.workflow()
    async def wait_for_word() -> Any:
        return await dbos.recv("word", timeout=3600)

    async with dbos:
        with SetWorkflowID("answered"):
            answered = await dbos.start_workflow(wait_for_word)
        with SetWorkflowID("silent"):
            silent = await dbos.start_workflow(wait_for_word)
        await clock.wait_for_timers(2)
        await clock.advance(minutes=59, seconds=59)
        # Not timed out yet: a message sent now is received.
        await dbos.send("answered", "hello", "word")
        assert await answered.get_result() == "hello"
        assert (await silent.get_status()).status == "PENDING"
        await clock.advance(seconds=1)
        assert await silent.get_result() is None
    [recv, deadline] = await steps_of(database_url, "silent")
    assert (deadline["function_name"], recv["function_name"]) == ("DBOS.sleep", "DBOS.recv")
    assert json.loads(deadline["output"]) == epoch_ms(START) + HOUR_MS
    assert recv["completed_at_epoch_ms"] == epoch_ms(START) + HOUR_MS


async def test_get_event_times_out_on_the_clock(database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)

    @dbos.workflow()
    async def silent() -> None:
        await dbos.recv("never", timeout=None)

    @dbos.workflow()
    async def watcher() -> Any:
        return await dbos.get_event("silent", "status", timeout=600)

    async with dbos:
        with SetWorkflowID("silent"):
            await dbos.start_workflow(silent)
        handle = await dbos.start_workflow(watcher)
        await clock.wait_for_timers()
        await clock.advance(minutes=10)
        assert await handle.get_result() is None


async def test_read_stream_times_out_on_the_clock(database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)

    @dbos.workflow()
    async def writer() -> None:
        await dbos.write_stream("out", "first")
        await dbos.recv("never", timeout=None)  # the stream stays open

    @dbos.workflow()
    async def reader() -> list[Any]:
        values: list[Any] = []
        try:
            async for value in dbos.read_stream("writer", "out", timeout=3600):
                values.append(value)
        except StreamTimeoutError:
            values.append("timed out")
        return values

    async with dbos:
        with SetWorkflowID("writer"):
            await dbos.start_workflow(writer)
        with SetWorkflowID("reader"):
            handle = await dbos.start_workflow(reader)
        await clock.wait_for_timers()  # the reader waits for a second value
        assert clock.next_due == START + timedelta(hours=1)
        await clock.advance(minutes=59, seconds=59)
        assert (await handle.get_status()).status == "PENDING"
        await clock.advance(seconds=1)
        assert await handle.get_result() == ["first", "timed out"]
    [first, timeout] = await steps_of(database_url, "reader")
    assert first["function_name"] == timeout["function_name"] == "DBOS.readStream"
    assert timeout["completed_at_epoch_ms"] == epoch_ms(START) + HOUR_MS


async def test_a_cron_schedule_fires_each_time_of_an_advanced_day_once(
        database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)
    fired: list[datetime] = []

    @dbos.workflow(name="hourly")
    async def hourly(scheduled_time: datetime, context: Any) -> None:
        fired.append(scheduled_time)

    async with dbos:
        await dbos.create_schedule("hourly", hourly, "0 * * * *")
        await clock.wait_for_timers()
        assert clock.next_due == START + timedelta(minutes=30)
        await clock.advance(days=1)
        workflows = await dbos.list_workflows(name="hourly")
        for status in workflows:
            await (await dbos.retrieve_workflow(status.workflow_id)).get_result()
        await clock.wait_for_timers()  # the schedule re-arms for the next day
        assert clock.next_due == START + timedelta(days=1, minutes=30)
    expected = [START + timedelta(minutes=30 + 60 * i) for i in range(24)]
    assert sorted(fired) == expected
    assert len(workflows) == 24


async def test_a_schedule_backfills_the_hours_its_executor_was_down(
        database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock, shutdown_grace_period=0)
    fired: list[datetime] = []

    @dbos.workflow(name="hourly")
    async def hourly(scheduled_time: datetime, context: Any) -> None:
        fired.append(scheduled_time)

    async with dbos:
        await dbos.create_schedule("hourly", hourly, "0 * * * *", automatic_backfill=True)
        await clock.wait_for_timers()
        await clock.advance(hours=1)  # fires 01:00
        for status in await dbos.list_workflows(name="hourly"):
            await (await dbos.retrieve_workflow(status.workflow_id)).get_result()
    await clock.advance(hours=3)  # down at 02:00, 03:00 and 04:00
    async with dbos:
        await clock.wait_for_timers()  # entered, backfilled, waiting for 05:00
        for status in await dbos.list_workflows(name="hourly"):
            await (await dbos.retrieve_workflow(status.workflow_id)).get_result()
        assert clock.next_due == START + timedelta(hours=4, minutes=30)
    assert sorted(fired) == [START + timedelta(minutes=30 + 60 * i) for i in range(4)]


async def test_a_rate_limit_of_one_an_hour_admits_the_next_job_after_an_hour(
        database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("hourly-jobs", limiter=(1, 3600), polling_interval=0.1)

    @dbos.workflow()
    async def job(n: int) -> int:
        return n

    async with dbos:
        first = await queue.enqueue(job, 1)
        second = await queue.enqueue(job, 2)
        assert await first.get_result() == 1
        await clock.wait_for_timers()  # the claim loop waits out the period
        assert clock.next_due == START + timedelta(hours=1)
        assert (await second.get_status()).status == "ENQUEUED"
        await clock.advance(minutes=59)
        assert (await second.get_status()).status == "ENQUEUED"
        await clock.advance(minutes=1)
        assert await second.get_result() == 2
        assert (await second.get_status()).created_at == epoch_ms(START)


async def test_a_workflow_timeout_cancels_when_the_clock_passes_it(database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)

    @dbos.workflow()
    async def stuck() -> None:
        await dbos.recv("never", timeout=None)

    async with dbos:
        with SetWorkflowTimeout(7200):
            handle = await dbos.start_workflow(stuck)
        await clock.wait_for_timers()
        assert clock.next_due == START + timedelta(hours=2)
        await clock.advance(hours=1)
        assert (await handle.get_status()).status == "PENDING"
        await clock.advance(hours=1)
        with pytest.raises(WorkflowCancelledError):
            await handle.get_result()
        status = await handle.get_status()
    assert status.status == "CANCELLED"
    assert status.deadline_epoch_ms == epoch_ms(START) + 2 * HOUR_MS


async def test_deadlines_on_the_clock(database_url: str) -> None:
    """An enqueued workflow's timeout counts from when a claim starts it (its delay's end,
    on the clock), and a child it starts inherits its deadline: both are cancelled when the
    clock passes it, and not before."""
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("later", polling_interval=0.1)

    @dbos.workflow()
    async def stuck() -> None:
        await dbos.recv("never", timeout=None)

    @dbos.workflow()
    async def parent() -> None:
        with SetWorkflowID("child"):
            child = await dbos.start_workflow(stuck)
        await child.get_result()

    async with dbos:
        with SetEnqueueOptions(delay=86400), SetWorkflowTimeout(3600), \
                SetWorkflowID("parent"):
            queued = await queue.enqueue(parent)
        await clock.wait_for_timers()
        await clock.advance(days=1)  # claimed and started now
        deadline = epoch_ms(START + timedelta(days=1, hours=1))

        async def child_started() -> bool:
            return await dbos.get_workflow_status("child") is not None

        await wait_until(child_started, what="the child to start")
        child = await dbos.retrieve_workflow("child")
        assert (await queued.get_status()).deadline_epoch_ms == deadline
        assert (await child.get_status()).deadline_epoch_ms == deadline
        await clock.advance(minutes=59, seconds=59)
        assert (await queued.get_status()).status == "PENDING"
        assert (await child.get_status()).status == "PENDING"
        await clock.advance(seconds=1)
        for handle in (queued, child):
            with pytest.raises(WorkflowCancelledError):
                await handle.get_result()
            assert (await handle.get_status()).status == "CANCELLED"


async def test_step_retry_backoff_waits_on_the_clock(database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)
    attempts: list[datetime] = []

    @dbos.step(retries=3, retry_interval=60, backoff_rate=2, max_retry_interval=600)
    async def flaky() -> str:
        attempts.append(clock.now())
        if len(attempts) < 4:
            raise RuntimeError("not yet")
        return "done"

    @dbos.workflow()
    async def retrying() -> str:
        return await flaky()

    async with dbos:
        handle = await dbos.start_workflow(retrying)
        await clock.wait_for_timers()
        await clock.advance(minutes=7)  # 1 + 2 + 4 minutes of backoff
        assert await handle.get_result() == "done"
    assert attempts == [START, START + timedelta(minutes=1), START + timedelta(minutes=3),
                        START + timedelta(minutes=7)]


async def test_queue_delays_and_set_workflow_delay_fall_due_on_the_clock(
        database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("later", polling_interval=0.1)

    @dbos.workflow()
    async def job(n: int) -> int:
        return n

    async with dbos:
        with SetEnqueueOptions(delay=86400):
            tomorrow = await queue.enqueue(job, 1)
        with SetEnqueueOptions(delay=60):
            moved = await queue.enqueue(job, 2)
        await dbos.set_workflow_delay(moved.workflow_id, delay_seconds=2 * 86400)
        await clock.wait_for_timers()
        await clock.advance(hours=23)
        assert (await tomorrow.get_status()).status == "DELAYED"
        await clock.advance(hours=1)
        assert await tomorrow.get_result() == 1
        assert (await moved.get_status()).status == "DELAYED"
        await clock.advance(days=1)
        assert await moved.get_result() == 2
        status = await moved.get_status()
    assert status.started_at_epoch_ms == epoch_ms(START) + 48 * HOUR_MS


async def test_debounce_windows_close_on_the_clock(database_url: str) -> None:
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("bounce", polling_interval=0.1)
    ran: list[str] = []

    @dbos.workflow()
    async def echo(text: str) -> str:
        ran.append(text)
        return text

    async with dbos:
        debouncer = queue.debouncer(echo, period=60, max_delay=300)
        # A call every 50 s keeps pushing the start back, but never past max_delay.
        burst = [await debouncer.debounce("user", "a")]
        for n in range(5):
            await clock.advance(seconds=50)
            burst.append(await debouncer.debounce("user", f"b{n}"))
        assert {h.workflow_id for h in burst} == {burst[0].workflow_id}
        await clock.advance(seconds=49)
        assert (await burst[0].get_status()).status == "DELAYED"
        await clock.advance(seconds=1)
        assert await burst[0].get_result() == "b4"  # the latest arguments
        status = await burst[0].get_status()
        assert status.started_at_epoch_ms == epoch_ms(START) + 300_000
        # A lone call runs once its quiet period has passed.
        lone = await debouncer.debounce("user", "c")
        assert lone.workflow_id != burst[0].workflow_id
        await clock.advance(seconds=60)
        assert await lone.get_result() == "c"
        assert (await lone.get_status()).started_at_epoch_ms == epoch_ms(START) + 360_000
    assert ran == ["b4", "c"]


async def test_a_recovered_sleep_ends_at_its_recorded_time(database_url: str) -> None:
    """A DBOS closed mid-sleep (as a crash leaves it) and entered again resumes on the
    test clock, and wakes at the time recorded before the crash."""
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock, shutdown_grace_period=0)
    runs: list[str] = []

    @dbos.workflow()
    async def nap() -> str:
        runs.append("started")
        await dbos.sleep(86400)
        return "awake"

    async with dbos:
        with SetWorkflowID("nap"):
            await dbos.start_workflow(nap)
        await clock.wait_for_timers()
    await clock.advance(hours=20)  # the executor is down meanwhile
    async with dbos:
        handle = await dbos.retrieve_workflow("nap")
        await clock.wait_for_timers()
        assert clock.next_due == START + timedelta(days=1)
        assert (await handle.get_status()).status == "PENDING"
        await clock.advance(hours=4)
        assert await handle.get_result() == "awake"
    assert runs == ["started", "started"]
    [sleep] = await steps_of(database_url, "nap")
    assert json.loads(sleep["output"]) == epoch_ms(START + timedelta(days=1))


async def test_several_executors_share_one_clock(database_url: str) -> None:
    clock = TestClock(START)
    sender, receiver = (new_dbos(database_url, clock=clock, executor_id=name)
                        for name in ("sender", "receiver"))

    def register(dbos: DBOS) -> Any:
        @dbos.workflow(name="late_reply")
        async def late_reply(to: str) -> None:
            await dbos.sleep(3600)
            await dbos.send(to, "hi", "reply")

        @dbos.workflow(name="wait_reply")
        async def wait_reply() -> Any:
            return await dbos.recv("reply", timeout=7200)

        return late_reply, wait_reply

    late_reply, _ = register(sender)
    _, wait_reply = register(receiver)
    async with sender, receiver:
        with SetWorkflowID("waiting"):
            waiting = await receiver.start_workflow(wait_reply)
        replying = await sender.start_workflow(late_reply, "waiting")
        await clock.wait_for_timers(2)
        await clock.advance(hours=1)
        await replying.get_result()
        assert await waiting.get_result() == "hi"
        with SetWorkflowID("unanswered"):
            unanswered = await receiver.start_workflow(wait_reply)
        await clock.wait_for_timers()
        await clock.advance_to_next()
        assert clock.now() == START + timedelta(hours=3)
        assert await unanswered.get_result() is None


async def test_maintenance_ages_count_on_the_clock(
        database_url: str, create_database: Callable[[], Awaitable[str]]) -> None:
    """Retention ages workflows, and a data source's transaction records, on the clock:
    the records carry the clock's time, not the server's."""
    app_url = await create_database()
    clock = TestClock(START)
    dbos = new_dbos(database_url, clock=clock, retention_hours=24, maintenance_interval=3600)
    dbos.data_source("app", app_url)

    @dbos.transaction(data_source="app")
    async def one() -> int:
        return int(await transaction_connection().fetchval("SELECT 1"))

    @dbos.workflow()
    async def quick() -> int:
        return await one()

    async def records() -> list[int]:
        conn = await asyncpg.connect(app_url)
        try:
            return [r["created_at"] for r in await conn.fetch(
                "SELECT created_at FROM dbos.datasource_outputs")]
        finally:
            await conn.close()

    async with dbos:
        with SetWorkflowID("old"):
            await quick()
        assert await records() == [epoch_ms(START)]
        await clock.wait_for_timers()  # the jobs ran at start, and wait for the next round
        await clock.advance(hours=24)
        assert [w.workflow_id for w in await dbos.list_workflows()] == ["old"]
        assert await records() == [epoch_ms(START)]
        await clock.advance(hours=1)  # the next run of the job: "old" is 25 hours old
        assert await dbos.list_workflows() == []
        assert await records() == []


async def test_time_only_moves_forward() -> None:
    clock = TestClock(START)
    with pytest.raises(ValueError, match="only moves forward"):
        await clock.advance(hours=-1)
    assert clock.now() == START
    assert await clock.advance_to_next() is None  # no timer: it stays
    assert clock.now() == START


def test_a_clock_setting_that_is_no_clock_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="a clock needs the methods now_ms"):
        DBOS(name="app", clock=object())
    assert DBOS(name="app").config.clock is None  # the wall clock
