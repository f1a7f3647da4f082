"""Queues across real executor processes (``tests/helpers/queue_worker.py``).

Flow-control limits must hold exactly when several processes dequeue from one queue at
once. Every workflow body records its interval ``[started, ended]`` (the database's clock)
with the process that ran it; the tests check the overlaps after the fact, never timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from helpers import execute, fetch, new_dbos, wait_for_steps
from helpers.queue_worker import RUNS_DDL, define_workflows

from dbos_async import DBOS, SetEnqueueOptions

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "queue_worker.py"
VERSION = "queue-test-version"



async def start_worker(url: str, spec: dict[str, Any]) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, json.dumps(spec),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            line = await proc.stdout.readline()
    except TimeoutError:
        line = b""
    if line.strip() != b"ready":
        proc.kill()
        _, err = await proc.communicate()
        raise AssertionError(f"worker did not start: {line!r} {err.decode()[-3000:]}")
    return proc


async def stop(procs: Sequence[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
    for proc in procs:
        await proc.communicate()


@contextlib.asynccontextmanager
async def workers(url: str, specs: Sequence[dict[str, Any]]
                  ) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    started = await asyncio.gather(*(start_worker(url, spec) for spec in specs),
                                   return_exceptions=True)
    procs = [p for p in started if isinstance(p, asyncio.subprocess.Process)]
    failed = [e for e in started if isinstance(e, BaseException)]
    if failed:
        await stop(procs)
        raise failed[0]
    try:
        yield procs
    finally:
        await stop(procs)


def client(url: str) -> tuple[DBOS, dict[str, Any]]:
    """An executor that enqueues but dequeues from none of the test queues."""
    dbos = new_dbos(url, application_version=VERSION, executor_id="client")
    dbos.listen()
    return dbos, define_workflows(dbos, url, extra=True)


async def runs(url: str, prefix: str) -> list[asyncpg.Record]:
    return await fetch(url, "SELECT tag, pid, executor, started, ended FROM runs "
                            "WHERE tag LIKE $1 || '%' ORDER BY started", prefix)


def max_overlap(intervals: Sequence[tuple[datetime, datetime]]) -> int:
    """Most intervals open at one instant (touching ends do not overlap)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


def intervals(rows: Sequence[asyncpg.Record]) -> list[tuple[datetime, datetime]]:
    assert all(r["ended"] is not None for r in rows)
    return [(r["started"], r["ended"]) for r in rows]


QUEUES: list[dict[str, Any]] = [
    {"name": "conc", "concurrency": 2, "polling_interval": 0.2},
    {"name": "rate", "limiter": [4, 0.5], "polling_interval": 0.2},
    {"name": "perworker", "worker_concurrency": 1, "polling_interval": 0.2},
    {"name": "hol", "partition_queue": True, "partition_concurrency": 1,
     "polling_interval": 0.2},
    {"name": "parts", "partition_queue": True, "partition_concurrency": 2, "concurrency": 3,
     "polling_interval": 0.2},
]


async def test_limits_hold_across_three_processes(database_url: str) -> None:
    url = database_url
    dbos, wfs = client(url)
    # A queue only the client declares: the workers find it in the queues table.
    dbos.queue("remote", concurrency=1, polling_interval=0.2)
    async with dbos:
        await execute(url, RUNS_DDL)
        names = [q["name"] for q in QUEUES] + ["remote"]
        specs = [{"executor_id": f"w{i}", "queues": QUEUES, "listen": names,
                  "extra": i == 2} for i in range(3)]
        async with workers(url, specs) as procs:
            queues = {n: await dbos.get_queue(n) for n in names}
            interval, gated = wfs["interval"], wfs["gated"]
            handles = []
            for i in range(12):
                handles.append(await queues["conc"].enqueue(interval, f"conc-{i}", 0.15))
                handles.append(await queues["rate"].enqueue(interval, f"rate-{i}", 0.0))
            for i in range(9):
                handles.append(await queues["perworker"].enqueue(interval, f"pw-{i}", 0.1))
            for i in range(4):
                handles.append(await queues["remote"].enqueue(interval, f"remote-{i}", 0.05))
            for p in range(3):
                for i in range(4):
                    with SetEnqueueOptions(partition_key=f"k{p}"):
                        handles.append(await queues["parts"].enqueue(
                            interval, f"parts-k{p}-{i}", 0.1))
            # Partition isolation: partition "blocked" stays busy until the others are done.
            with SetEnqueueOptions(partition_key="blocked"):
                blocker = await queues["hol"].enqueue(gated, "hol-blocked-0")
                blocked_next = await queues["hol"].enqueue(interval, "hol-blocked-1", 0.0)
            hol = []
            for p in range(3):
                for i in range(3):
                    with SetEnqueueOptions(partition_key=f"h{p}"):
                        hol.append(await queues["hol"].enqueue(
                            interval, f"hol-h{p}-{i}", 0.05))
                    # Age order is by created_at, in milliseconds: keep them apart.
                    await asyncio.sleep(0.002)
            # A workflow only worker w2 has: the others leave it for w2.
            extra = await queues["conc"].enqueue(wfs["only_extra"], "extra-0")

            async with asyncio.timeout(90):
                for handle in [*handles, *hol]:
                    await handle.get_result()
                assert await extra.get_result() == "extra-extra-0"
                assert (await blocked_next.get_status()).status == "ENQUEUED"
                await execute(url, "INSERT INTO gates VALUES ('hol-blocked-0')")
                assert await blocker.get_result() == "hol-blocked-0"
                assert await blocked_next.get_result() == "hol-blocked-1"
            for proc in procs:
                assert proc.returncode is None, "a worker died"

        conc = await runs(url, "conc-")
        assert len(conc) == 12
        assert max_overlap(intervals(conc)) <= 2

        remote = await runs(url, "remote-")
        assert len(remote) == 4 and max_overlap(intervals(remote)) == 1

        # The limiter governs starts (started_at_epoch_ms, written by the claim).
        started = sorted(r["started_at_epoch_ms"] for r in await fetch(
            url, "SELECT started_at_epoch_ms FROM dbos.workflow_status WHERE queue_name = "
                 "'rate'"))
        assert len(started) == 12
        for s in started:
            assert sum(1 for t in started if s <= t < s + 500) <= 4

        pw = await runs(url, "pw-")
        by_pid: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
        for r in pw:
            by_pid[r["pid"]].append((r["started"], r["ended"]))
        assert len(pw) == 9
        assert all(max_overlap(iv) == 1 for iv in by_pid.values())

        parts = await runs(url, "parts-")
        assert len(parts) == 12 and max_overlap(intervals(parts)) <= 3
        for p in range(3):
            assert max_overlap(intervals([r for r in parts
                                          if r["tag"].startswith(f"parts-k{p}-")])) <= 2

        hol_runs = await runs(url, "hol-h")
        for p in range(3):
            mine = [r for r in hol_runs if r["tag"].startswith(f"hol-h{p}-")]
            assert [r["tag"] for r in mine] == [f"hol-h{p}-{i}" for i in range(3)]  # FIFO
            assert max_overlap(intervals(mine)) == 1

        extra_run = await runs(url, "extra-")
        assert [r["executor"] for r in extra_run] == ["w2"]


async def test_killed_worker_is_recovered_by_a_new_process(database_url: str) -> None:
    url = database_url
    dbos, wfs = client(url)
    async with dbos:
        await execute(url, RUNS_DDL)
        spec = {"executor_id": "crashy", "queues": [{"name": "jobs", "concurrency": 1,
                                                     "polling_interval": 0.2}]}
        first = await start_worker(url, spec)
        try:
            queue = await dbos.get_queue("jobs")
            handle = await queue.enqueue(wfs["gated"], "crash-0")
            waiting = await queue.enqueue(wfs["interval"], "crash-1", 0.0)

            # Its first step is recorded (a step killed before its checkpoint may run again).
            await wait_for_steps(url, handle.workflow_id, 1, patience=60)
        finally:
            await stop([first])  # SIGKILL mid-workflow
        assert (await handle.get_status()).status == "PENDING"
        await execute(url, "INSERT INTO gates VALUES ('crash-0')")
        # Same executor ID: its recovery re-enqueues the workflow; the queue runs it once.
        async with workers(url, [spec]):
            async with asyncio.timeout(60):
                assert await handle.get_result() == "crash-0"
                assert await waiting.get_result() == "crash-1"
        status = await handle.get_status()
        assert status.status == "SUCCESS" and status.recovery_attempts == 2
        # The recorded step did not run again.
        assert len(await runs(url, "crash-0")) == 1
