"""Cron schedules stored in the system database: the API on an executor and a client,
validation (nothing stored on bad input), and firing: each time once, under its
deterministic workflow ID, across executors."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers import execute, fetch, fetchval, new_dbos, wait_until

from dbos_async import DBOS, DBOSClient, ScheduleDefinition, ScheduleError

EVERY_SECOND = "* * * * * *"


def scheduled_workflows(dbos: DBOS, runs: list[tuple[datetime, Any]]) -> dict[str, Any]:
    @dbos.workflow(name="tick")
    async def tick(scheduled_time: datetime, context: Any) -> None:
        runs.append((scheduled_time, context))

    @dbos.workflow(name="wrong")
    async def wrong(x: int) -> None:
        del x

    return {"tick": tick, "wrong": wrong}


async def schedule_rows(url: str, name: str) -> list[Any]:
    return await fetch(url, "SELECT workflow_uuid, status, inputs FROM dbos.workflow_status"
                       " WHERE workflow_uuid LIKE $1 ORDER BY workflow_uuid", f"sched-{name}-%")


async def stored_count(url: str) -> int:
    return int(await fetchval(url, "SELECT count(*) FROM dbos.workflow_schedules"))


async def test_create_list_get_pause_resume_delete(database_url: str) -> None:
    dbos = new_dbos(database_url)
    wfs = scheduled_workflows(dbos, [])
    reports = dbos.queue("reports")
    async with dbos:
        created = await dbos.create_schedule("nightly", wfs["tick"], "0 3 * * *",
                                             context={"region": "eu"},
                                             timezone="Europe/Paris")
        assert created.schedule_name == "nightly" and created.workflow_name == "tick"
        assert created.context == {"region": "eu"} and created.cron_timezone == "Europe/Paris"
        assert created.status == "ACTIVE" and created.last_fired_at is None
        await dbos.create_schedule("hourly", "tick", "0 * * * *", queue=reports)
        names = [s.schedule_name for s in await dbos.list_schedules()]
        assert names == ["hourly", "nightly"]
        with pytest.raises(ScheduleError, match="already exists"):
            await dbos.create_schedule("hourly", "tick", "0 * * * *")

        await dbos.pause_schedule("nightly")
        got = await dbos.get_schedule("nightly")
        assert got is not None and got.paused
        assert [s.schedule_name for s in await dbos.list_schedules(status="PAUSED")] == [
            "nightly"]
        await dbos.resume_schedule("nightly")
        got = await dbos.get_schedule("nightly")
        assert got is not None and not got.paused

        await dbos.delete_schedule("nightly")
        assert await dbos.get_schedule("nightly") is None
        for operation in (dbos.delete_schedule, dbos.pause_schedule, dbos.resume_schedule,
                          dbos.trigger_schedule):
            with pytest.raises(ScheduleError, match="does not exist"):
                await operation("nightly")
        [hourly] = await dbos.list_schedules(name_prefix="ho")
        assert hourly.schedule_name == "hourly" and hourly.queue_name == "reports"


async def test_bad_definitions_store_nothing(database_url: str) -> None:
    dbos = new_dbos(database_url)
    wfs = scheduled_workflows(dbos, [])

    async def not_a_workflow(scheduled_time: datetime, context: Any) -> None:
        del scheduled_time, context

    async with dbos:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"workflow": "tick", "cron": "every day"}, "Invalid cron expression"),
            ({"workflow": "tick", "cron": "61 * * * *"}, "Invalid cron expression"),
            ({"workflow": "tick", "cron": "* * * * *", "timezone": "Mars/Base"},
             "Unknown time zone"),
            ({"workflow": "nope", "cron": "* * * * *"}, "No workflow named 'nope'"),
            ({"workflow": wfs["wrong"], "cron": "* * * * *"}, "cannot be scheduled"),
            ({"workflow": not_a_workflow, "cron": "* * * * *"}, "is not a workflow"),
            ({"workflow": "tick", "cron": "* * * * *", "context": object()},
             "context"),
            ({"workflow": "tick", "cron": "* * * * *", "queue": "undeclared"},
             "Queue 'undeclared' is not declared"),
        ]
        for kwargs, message in cases:
            with pytest.raises(ScheduleError if "context" not in kwargs else Exception,
                               match=message):
                await dbos.create_schedule("bad", **kwargs)
        with pytest.raises(ScheduleError, match="Invalid cron"):
            await dbos.apply_schedules([ScheduleDefinition("a", "tick", "* * * * *"),
                                        ScheduleDefinition("b", "tick", "nonsense")])
    assert await stored_count(database_url) == 0


async def test_every_second_fires_each_time_once_with_its_id(database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    dbos = new_dbos(database_url)
    scheduled_workflows(dbos, runs)
    async with dbos:
        await dbos.create_schedule("sec", "tick", EVERY_SECOND, context=[1, "two"])
        await wait_until(lambda: _has_rows(database_url, "sec", 3), what="three firings")
        await wait_until(lambda: _true(len(runs) >= 3), what="three runs")
        got = await dbos.get_schedule("sec")
    rows = await schedule_rows(database_url, "sec")
    times = [datetime.fromisoformat(r["workflow_uuid"]
                                    .removeprefix("sched-sec-")) for r in rows]
    # One workflow per second, consecutive, each ID naming its time.
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(times))
    assert all(t.microsecond == 0 and t.tzinfo is not None for t in times)
    scheduled = sorted(t for t, _ in runs)
    assert scheduled == times[:len(scheduled)]
    assert all(context == [1, "two"] for _, context in runs)
    assert got is not None and got.last_fired_at is not None
    assert got.last_fired_at >= times[2]


async def _has_rows(url: str, name: str, count: int) -> bool:
    return len(await schedule_rows(url, name)) >= count


async def _true(value: bool) -> bool:
    return value


async def test_two_executors_fire_each_time_once(database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    first = new_dbos(database_url, executor_id="one")
    second = new_dbos(database_url, executor_id="two")
    for dbos in (first, second):
        scheduled_workflows(dbos, runs)
    async with first:
        await first.create_schedule("shared", "tick", EVERY_SECOND)
        async with second:
            # The first was woken by its write, the second read it at entry: both fire
            # every time.
            await wait_until(lambda: _has_rows(database_url, "shared", 4), what="firings")
            await wait_until(lambda: _true(len(runs) >= 4), what="runs")
    rows = await schedule_rows(database_url, "shared")
    ids = [r["workflow_uuid"] for r in rows]
    assert len(ids) == len(set(ids))
    scheduled = [t for t, _ in runs]
    assert len(scheduled) == len(set(scheduled))  # no time ran twice
    assert len(rows) == len(set(r["workflow_uuid"].split("-", 2)[2] for r in rows))


async def test_trigger_and_backfill(database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    dbos = new_dbos(database_url)
    scheduled_workflows(dbos, runs)
    async with dbos:
        await dbos.create_schedule("daily", "tick", "0 12 * * *", context="ctx")
        handle = await dbos.trigger_schedule("daily")
        assert handle.workflow_id.startswith("sched-daily-trigger-")
        await handle.get_result()
        start = datetime(2026, 1, 1, tzinfo=UTC)
        end = datetime(2026, 1, 4, 13, tzinfo=UTC)
        handles = await dbos.backfill_schedule("daily", start, end)
        assert [h.workflow_id for h in handles] == [
            f"sched-daily-2026-01-0{d}T12:00:00+00:00" for d in (1, 2, 3, 4)]
        for h in handles:
            await h.get_result()
        again = await dbos.backfill_schedule("daily", start, end)
        assert [h.workflow_id for h in again] == [h.workflow_id for h in handles]
        got = await dbos.get_schedule("daily")
    assert len(await schedule_rows(database_url, "daily")) == 5  # idempotent
    assert len(runs) == 5
    assert got is not None and got.last_fired_at == datetime(2026, 1, 4, 12,
                                                              tzinfo=UTC)


async def test_apply_creates_and_updates_atomically(database_url: str) -> None:
    dbos = new_dbos(database_url)
    scheduled_workflows(dbos, [])
    async with dbos:
        await dbos.create_schedule("keep", "tick", "0 1 * * *")
        await dbos.create_schedule("change", "tick", "0 2 * * *")
        await dbos.pause_schedule("change")
        before = await dbos.get_schedule("change")
        applied = await dbos.apply_schedules([
            ScheduleDefinition("change", "tick", "0 4 * * *", context=7),
            ScheduleDefinition("new", "tick", "*/5 * * * *"),
        ])
        assert [s.schedule_name for s in applied] == ["change", "new"]
        changed = await dbos.get_schedule("change")
        assert before is not None and changed is not None
        assert changed.schedule == "0 4 * * *" and changed.context == 7
        # The definition changed; the identity and the runtime state did not.
        assert changed.schedule_id == before.schedule_id and changed.paused
        names = [s.schedule_name for s in await dbos.list_schedules()]
        assert names == ["change", "keep", "new"]  # not listed: left as it was


async def test_client_operates_schedules_an_executor_fires(database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    # No periodic re-read during the test: the client's NOTIFY wakes the scheduler.
    dbos = new_dbos(database_url, schedule_reread_interval=3600.0)
    scheduled_workflows(dbos, runs)
    async with dbos, DBOSClient(database_url) as client:
        created = await client.create_schedule("from-client", "tick", EVERY_SECOND,
                                               context={"by": "client"})
        assert created.workflow_name == "tick"
        await wait_until(lambda: _true(len(runs) >= 1), what="a run")
        await client.pause_schedule("from-client")
        listed = await client.list_schedules()
        assert [s.schedule_name for s in listed] == ["from-client"] and listed[0].paused
        handle = await client.trigger_schedule("from-client")
        assert await handle.get_result() is None
        await client.delete_schedule("from-client")
        with pytest.raises(ScheduleError, match="Invalid cron"):
            await client.create_schedule("x", "tick", "bad")
    assert runs[0][1] == {"by": "client"}


async def test_static_schedule_decorator(database_url: str) -> None:
    runs: list[datetime] = []
    dbos = new_dbos(database_url)

    @dbos.scheduled(EVERY_SECOND)
    @dbos.workflow()
    async def every_second(scheduled_time: datetime, context: Any) -> None:
        assert context is None
        runs.append(scheduled_time)

    async with dbos:
        await wait_until(lambda: _true(len(runs) >= 2), what="two runs")
        [stored] = await dbos.list_schedules()
    assert stored.schedule_name == stored.workflow_name == every_second.__qualname__
    with pytest.raises(ScheduleError, match="cannot be scheduled"):
        @dbos.scheduled(EVERY_SECOND)
        @dbos.workflow()
        async def unschedulable(x: int) -> None:
            del x


async def test_pause_stops_firing(database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    dbos = new_dbos(database_url)
    scheduled_workflows(dbos, runs)
    async with dbos:
        await dbos.create_schedule("p", "tick", EVERY_SECOND)
        await wait_until(lambda: _has_rows(database_url, "p", 1), what="a firing")
        await dbos.pause_schedule("p")
        paused_at = datetime.now(UTC)
        # Another schedule's firings mark the seconds passing after the pause.
        await dbos.create_schedule("probe", "tick", EVERY_SECOND)
        await wait_until(lambda: _fired_after(database_url, "probe",
                                              paused_at + timedelta(seconds=2)),
                         what="the probe to fire two seconds after the pause")
    assert not await _fired_after(database_url, "p", paused_at + timedelta(seconds=1))


async def _fired_after(url: str, name: str, moment: datetime) -> bool:
    times = [datetime.fromisoformat(r["workflow_uuid"].removeprefix(f"sched-{name}-"))
             for r in await schedule_rows(url, name)]
    return any(t > moment for t in times)


async def test_daylight_saving_transitions(database_url: str) -> None:
    """A 02:30 schedule in New York fires once on each transition day: at 03:00 EDT when
    02:30 does not exist (spring forward), at the one 02:30 EST when 01:00-02:00 repeats
    (fall back); an hourly :30 schedule fires the repeated 01:30 twice, once per offset."""
    dbos = new_dbos(database_url)
    scheduled_workflows(dbos, [])
    async with dbos:
        await dbos.create_schedule("daily-0230", "tick", "30 2 * * *",
                                   timezone="America/New_York")
        await dbos.create_schedule("hourly-30", "tick", "30 * * * *",
                                   timezone="America/New_York")
        await dbos.pause_schedule("daily-0230")
        await dbos.pause_schedule("hourly-30")

        async def ids(name: str, start: datetime, end: datetime) -> list[str]:
            return [h.workflow_id.removeprefix(f"sched-{name}-")
                    for h in await dbos.backfill_schedule(name, start, end)]

        spring = await ids("daily-0230", datetime(2026, 3, 7, 12), datetime(2026, 3, 9, 12))
        assert spring == ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]
        fall = await ids("daily-0230", datetime(2026, 10, 31, 12), datetime(2026, 11, 2, 12))
        assert fall == ["2026-11-01T02:30:00-05:00", "2026-11-02T02:30:00-05:00"]
        repeated = await ids("hourly-30", datetime(2026, 11, 1, 5), datetime(2026, 11, 1, 7))
        assert repeated == ["2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00"]


async def test_sharded_schedule_runs_under_its_key(plain_database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    dbos = new_dbos(plain_database_url, sharding=True)
    scheduled_workflows(dbos, runs)
    async with dbos:
        with pytest.raises(ScheduleError, match="needs a shard key"):
            await dbos.create_schedule("keyless", "tick", EVERY_SECOND)
        created = await dbos.create_schedule("keyed", "tick", EVERY_SECOND,
                                             shard_key="acme")
        assert created.shard_key == "acme"
        await wait_until(lambda: _true(len(runs) >= 1), what="a run")
        handle = await dbos.trigger_schedule("keyed")
        assert handle.shard_key == "acme"
        await handle.get_result()
        [moved] = await dbos.apply_schedules([
            ScheduleDefinition("keyed", "tick", "0 0 1 1 *", shard_key="globex")])
        assert moved.shard_key == "globex"
        [handle] = await dbos.backfill_schedule("keyed", datetime(2020, 12, 31),
                                                datetime(2021, 1, 2))
        assert handle.shard_key == "globex"
        await handle.get_result()
    keys = {r["shard_key"] for r in await fetch(
        plain_database_url, "SELECT shard_key FROM dbos.workflow_status"
        " WHERE workflow_uuid LIKE 'sched-keyed-%'")}
    assert keys == {"acme", "globex"}
    assert await stored_count(plain_database_url) == 1


async def test_idle_scheduler_sends_no_statement_between_rereads(database_url: str) -> None:
    """100 schedules due in about half an hour: once the scheduler has read them, it
    sleeps on its heap and sends nothing about schedules until the next re-read."""
    dbos = new_dbos(database_url, schedule_reread_interval=3600.0)
    scheduled_workflows(dbos, [])
    minute = (datetime.now(UTC).minute + 30) % 60
    texts: list[str] = []

    def logged(record: Any) -> None:
        texts.append(record.query)

    async with dbos:
        pool = dbos._system_database.pool
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        for conn in held:
            conn.add_query_logger(logged)
        for conn in held:
            await pool.release(conn)

        def schedule_reads() -> int:
            return sum("workflow_schedules" in t and "ORDER BY schedule_name" in t
                       for t in texts)

        before = schedule_reads()
        async with DBOSClient(database_url) as client:
            await client.apply_schedules([
                ScheduleDefinition(f"s{n:03}", "tick", f"{minute} * * * *")
                for n in range(100)])
            # The client's one NOTIFY woke the scheduler: it re-reads once.
            await wait_until(lambda: _true(schedule_reads() >= before + 1),
                             what="the re-read")
        texts.clear()
        await asyncio.sleep(2.0)  # the idle period measured (not a synchronisation)
        about_schedules = [t for t in texts if "workflow_schedules" in t or "sched-" in t]
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        for conn in held:
            conn.remove_query_logger(logged)
        for conn in held:
            await pool.release(conn)
    assert about_schedules == []
    assert len(await dbos_schedules(database_url)) == 100


async def dbos_schedules(url: str) -> list[Any]:
    return await fetch(url, "SELECT schedule_name FROM dbos.workflow_schedules")


async def test_an_unreadable_stored_schedule_does_not_stop_the_others(
        database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    setup = new_dbos(database_url)
    async with setup:  # migrates
        pass
    # Rows another writer stored, with a cron expression and a time zone this one rejects.
    for name, cron, zone in (("bad-cron", "not a cron", None),
                             ("bad-zone", "* * * * * *", "Mars/Base")):
        await execute(database_url, """INSERT INTO dbos.workflow_schedules
                (schedule_id, schedule_name, workflow_name, schedule, context, cron_timezone)
                VALUES ($1, $1, 'tick', $2, 'null', $3)""", name, cron, zone)
    dbos = new_dbos(database_url)
    scheduled_workflows(dbos, runs)
    async with dbos:
        await dbos.create_schedule("good", "tick", EVERY_SECOND)
        await wait_until(lambda: _has_rows(database_url, "good", 2), what="two firings")
        listed = {s.schedule_name for s in await dbos.list_schedules()}
        with pytest.raises(ScheduleError, match="Invalid cron expression 'not a cron'"):
            await dbos.backfill_schedule("bad-cron", datetime(2026, 1, 1), datetime(2026, 1, 2))
    assert listed == {"bad-cron", "bad-zone", "good"}
    assert await schedule_rows(database_url, "bad-zone") == []


async def test_a_client_that_leaves_at_once_still_wakes_the_scheduler(
        database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    dbos = new_dbos(database_url, schedule_reread_interval=3600.0)
    scheduled_workflows(dbos, runs)
    async with dbos:
        async with DBOSClient(database_url) as client:
            await client.create_schedule("brief", "tick", EVERY_SECOND)
        # The client's NOTIFY went out as it closed: no periodic re-read is due for an hour.
        await wait_until(lambda: _true(len(runs) >= 1), what="a run")


async def test_schedule_writes_from_a_workflow_body_are_refused(database_url: str) -> None:
    dbos = new_dbos(database_url)
    scheduled_workflows(dbos, [])

    @dbos.step()
    async def create_in_step() -> str:
        created = await dbos.create_schedule("from-step", "tick", "0 * * * *")
        return created.schedule_name

    @dbos.workflow()
    async def creates() -> str:
        with pytest.raises(ScheduleError, match="call it from a step"):
            await dbos.create_schedule("from-body", "tick", "0 * * * *")
        with pytest.raises(ScheduleError, match="call it from a step"):
            await dbos.pause_schedule("from-step")
        listed = [s.schedule_name for s in await dbos.list_schedules()]  # reads are fine
        return ",".join([*listed, await create_in_step()])

    async with dbos:
        assert await creates() == "from-step"
        assert [s.schedule_name for s in await dbos.list_schedules()] == ["from-step"]
