"""Schedules across executor processes: an executor killed (SIGKILL) and restarted fires
the times it missed exactly when the schedule has ``automatic_backfill``; two processes
firing one schedule run each time once."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import fetch, fetchval, wait_until

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "schedule_worker.py"
DOWNTIME = 3.0  # the scenario: how long no executor runs (not a synchronisation)

Start = Callable[[str, bool], Coroutine[Any, Any, asyncio.subprocess.Process]]


@pytest.fixture
async def start_worker(database_url: str) -> AsyncIterator[Start]:
    started: list[asyncio.subprocess.Process] = []

    async def start(name: str, backfill: bool) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), database_url, name, "1" if backfill else "0",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert json.loads(line)["pid"] == proc.pid
        return proc

    yield start
    for proc in started:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def fired_times(url: str, name: str) -> list[datetime]:
    rows = await fetch(url, "SELECT workflow_uuid FROM dbos.workflow_status"
                       " WHERE workflow_uuid LIKE $1", f"sched-{name}-%")
    return sorted(datetime.fromisoformat(r["workflow_uuid"].removeprefix(f"sched-{name}-"))
                  for r in rows)


async def fired_after(url: str, name: str, moment: datetime) -> bool:
    return any(t > moment for t in await fired_times(url, name))


@pytest.mark.parametrize("backfill", [True, False])
async def test_killed_executor_backfills_missed_times(database_url: str, start_worker: Start,
                                                      backfill: bool) -> None:
    name = "killed"
    first = await start_worker(name, backfill)
    began = datetime.now(UTC)
    await wait_until(lambda: fired_after(database_url, name, began + timedelta(seconds=1)),
                     what="two firings")
    first.kill()
    await first.wait()
    killed_at = datetime.now(UTC)
    await asyncio.sleep(DOWNTIME)
    restarted_at = datetime.now(UTC)
    await start_worker(name, backfill)
    await wait_until(lambda: fired_after(database_url, name,
                                         restarted_at + timedelta(seconds=1)),
                     what="firings after the restart")
    times = await fired_times(database_url, name)
    assert len(times) == len(set(times))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    missed = [t for t in times if killed_at + timedelta(seconds=1) < t < restarted_at]
    if backfill:
        # Every second from the first firing on fired once, the downtime's too.
        assert all(gap == timedelta(seconds=1) for gap in gaps), gaps
        assert len(missed) >= int(DOWNTIME) - 1
    else:
        assert missed == []
        assert max(gaps) >= timedelta(seconds=int(DOWNTIME))


async def test_two_processes_fire_each_time_once(database_url: str,
                                                 start_worker: Start) -> None:
    name = "shared"
    await start_worker(name, False)
    await start_worker(name, False)
    began = datetime.now(UTC)
    await wait_until(lambda: fired_after(database_url, name, began + timedelta(seconds=3)),
                     what="firings while both run")
    times = await fired_times(database_url, name)
    assert len(times) == len(set(times))
    # Both fire every second; one row per second, none skipped.
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(times))
    rows = await fetchval(database_url, "SELECT count(*) FROM dbos.workflow_status"
                          " WHERE workflow_uuid LIKE $1", f"sched-{name}-%")
    assert rows == len(times)
