"""What a drained job costs in CPU, client and server: dbos_async's queue drain of zero-step and
one-step workflows against pgqueuer's drain at batch size 100, on one server.

    python benchmarks/drain_cpu.py --url postgresql://postgres@127.0.0.1:5432/postgres

A drain's rate depends on the machine's load; the CPU each job costs, the client's and the
server's, much less, and it is what bounds a drain on a machine whose cores the client and
the server share. Each round runs on a fresh scratch database:

- dbos_async: an executor in this process (one queue, ``worker_concurrency`` 100, polling
  interval 0.1 s, the workflows of ``queue_child.py``); N workflows enqueued through the
  SQL function ``dbos.enqueue_workflow`` in one transaction onto a queue nobody drains
  (the enqueue's own cost), then N onto the drained queue, measured from before that
  enqueue until all N are SUCCESS; the enqueue's cost is taken off.
- the schema floor: N workflows enqueued the same way, then drained by raw SQL in batches of
  100, a claim and an outcome statement each (``FLOOR_CLAIM_SQL``, ``FLOOR_OUTCOME_SQL``),
  claims and outcomes overlapping on two connections: the least the `dbos`-compatible
  schema has the server do per workflow, whatever the client.
- pgqueuer: N trivial jobs enqueued in one call, then drained by a ``QueueManager`` in
  drain mode at batch size 100 (as ``bench_pgqueuer.py``), measured over the drain.

Client CPU: this process's (``getrusage``); server CPU: the server's whole process tree
(``server_cpu.py``; only for a server on this machine, and it counts whatever else that
server does meanwhile). Figures per job, µs, each round printed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncpg
import server_cpu
from common import DEFAULT_URL, UNFINISHED_SQL, drop_database, recreate_database, table
from queue_child import ENQUEUE_SQL, WORKFLOW, ZERO_STEP, dbos_async_workflows

import dbos_async
from dbos_async import DBOS

DATABASE = "bench_drain_cpu"
QUEUE = "drained"
UNDRAINED = "undrained"
PGQUEUER_BATCH = 100


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Window:
    """The client's and the server's CPU seconds over a stretch of time."""

    def __init__(self, postmaster: int | None) -> None:
        self._postmaster = postmaster

    def __enter__(self) -> Window:
        self._client = _client_cpu()
        self._server = (server_cpu.read_trees([self._postmaster])[self._postmaster]
                        if self._postmaster is not None else None)
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.client = _client_cpu() - self._client
        self.server: float | None = None
        if self._postmaster is not None and self._server is not None:
            after = server_cpu.read_trees([self._postmaster])[self._postmaster]
            self.server = server_cpu.seconds_between(self._server, after)


async def _enqueue(conn: asyncpg.Connection, workflow: str, queue: str, jobs: int) -> None:
    rows = [(workflow, queue, json.dumps(i)) for i in range(jobs)]
    async with conn.transaction():
        await conn.executemany(ENQUEUE_SQL, rows)


async def dbos_async_round(url: str, workflow: str, jobs: int) -> dict[str, Any]:
    dbos = DBOS(system_database_url=url, name="drain_cpu", application_version="bench")
    dbos.queue(QUEUE, worker_concurrency=100, polling_interval=0.1)
    dbos_async_workflows(dbos, {})
    async with dbos:
        conn = await asyncpg.connect(url)
        try:
            postmaster = await server_cpu.local_postmaster(conn)
            with Window(postmaster) as enqueue:
                await _enqueue(conn, workflow, UNDRAINED, jobs)
            with Window(postmaster) as drain:
                await _enqueue(conn, workflow, QUEUE, jobs)
                # Polled: no handle waits on workflows the SQL enqueued.
                while True:
                    if not await conn.fetchval(UNFINISHED_SQL, QUEUE):
                        break
                    await asyncio.sleep(0.02)
        finally:
            await conn.close()
    server = (None if drain.server is None or enqueue.server is None
              else drain.server - enqueue.server)
    return _figures(jobs, drain.wall, drain.client - enqueue.client, server)


# The schema floor: the least a drain on the `dbos`-compatible schema must have the server do
# per workflow, sent by a client that does nothing else. A claim flips a batch to PENDING
# and reads its inputs; an outcome flips it to SUCCESS and stores its output. One statement
# each per batch of FLOOR_BATCH, autocommitted; claims and outcomes on two connections, one
# batch apart, so that they overlap as an executor's do (their locks and pages contend).
FLOOR_BATCH = 100
FLOOR_CLAIM_SQL = """
    UPDATE dbos.workflow_status ws
    SET status = 'PENDING', executor_id = 'floor', started_at_epoch_ms = $2,
        updated_at = $2, recovery_attempts = recovery_attempts + 1
    WHERE ws.workflow_uuid = ANY(ARRAY(
        -- SKIP LOCKED, as a claimer among others must.
        SELECT workflow_uuid FROM dbos.workflow_status
        WHERE queue_name = $1 AND status = 'ENQUEUED'
        ORDER BY priority, created_at LIMIT $3 FOR UPDATE SKIP LOCKED))
    RETURNING ws.workflow_uuid,
              (SELECT wi.inputs FROM dbos.workflow_input wi
               WHERE wi.workflow_uuid = ws.workflow_uuid) AS inputs"""
FLOOR_OUTCOME_SQL = """
    WITH finished AS (
        UPDATE dbos.workflow_status ws
        SET status = 'SUCCESS', updated_at = $3, completed_at = $3
        FROM unnest($1::text[]) AS v(workflow_uuid)
        WHERE ws.workflow_uuid = v.workflow_uuid
        RETURNING ws.workflow_uuid)
    INSERT INTO dbos.workflow_output (workflow_uuid, output)
    SELECT finished.workflow_uuid, o.output
    FROM finished JOIN unnest($1::text[], $2::text[]) AS o(workflow_uuid, output)
      ON o.workflow_uuid = finished.workflow_uuid"""


async def floor_round(url: str, jobs: int) -> dict[str, Any]:
    await dbos_async.migrate(url)
    claims, outcomes = await asyncpg.connect(url), await asyncpg.connect(url)
    claimed: asyncio.Queue[list[asyncpg.Record]] = asyncio.Queue(maxsize=1)

    async def claim() -> None:
        done = 0
        while done < jobs:
            rows = await claims.fetch(FLOOR_CLAIM_SQL, QUEUE, int(time.time() * 1000),
                                      FLOOR_BATCH)
            done += len(rows)
            await claimed.put(rows)
        await claimed.put([])

    async def record() -> None:
        while rows := await claimed.get():
            await outcomes.execute(FLOOR_OUTCOME_SQL, [row["workflow_uuid"] for row in rows],
                                   [row["inputs"] for row in rows], int(time.time() * 1000))

    try:
        await _enqueue(claims, ZERO_STEP, QUEUE, jobs)
        with Window(await server_cpu.local_postmaster(claims)) as drain:
            await asyncio.gather(claim(), record())
    finally:
        await claims.close()
        await outcomes.close()
    return _figures(jobs, drain.wall, drain.client, drain.server)


async def pgqueuer_round(url: str, jobs: int) -> dict[str, Any]:
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    reader = await asyncpg.connect(url)
    worker = await asyncpg.connect(url)
    try:
        await Queries(AsyncpgDriver(reader)).install()
        await Queries(AsyncpgDriver(reader)).enqueue(
            ["trivial"] * jobs, [str(i).encode() for i in range(jobs)], [0] * jobs)
        manager = QueueManager(Queries(AsyncpgDriver(worker)))

        @manager.entrypoint("trivial")
        async def trivial(job: Job) -> None:
            pass

        with Window(await server_cpu.local_postmaster(reader)) as drain:
            await manager.run(batch_size=PGQUEUER_BATCH, mode=QueueExecutionMode.drain)
    finally:
        await worker.close()
        await reader.close()
    return _figures(jobs, drain.wall, drain.client, drain.server)


def _figures(jobs: int, wall: float, client: float, server: float | None) -> dict[str, Any]:
    return {"jobs_per_s": jobs / wall, "client_us": client / jobs * 1e6,
            "server_us": None if server is None else server / jobs * 1e6}


async def _fresh(base_url: str, measure: Callable[[str], Awaitable[dict[str, Any]]]
                 ) -> dict[str, Any]:
    url = await recreate_database(base_url, DATABASE)
    try:
        return await measure(url)
    finally:
        await drop_database(base_url, DATABASE)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--jobs", "-n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    systems: list[tuple[str, Callable[[str], Awaitable[dict[str, Any]]]]] = [
        ("dbos_async, zero-step", lambda url: dbos_async_round(url, ZERO_STEP, args.jobs)),
        ("dbos_async, one-step", lambda url: dbos_async_round(url, WORKFLOW, args.jobs)),
        (f"dbos schema floor, raw SQL b{FLOOR_BATCH}", lambda url: floor_round(url, args.jobs)),
        (f"pgqueuer, batch size {PGQUEUER_BATCH}", lambda url: pgqueuer_round(url, args.jobs)),
    ]
    rows: list[tuple[str, ...]] = [("system", "round", "jobs/s", "client µs/job",
                                    "server µs/job", "both µs/job")]
    for number in range(1, args.rounds + 1):  # interleaved: the machine's load falls on all
        for name, measure in systems:
            r = await _fresh(args.url, measure)
            server = r["server_us"]
            rows.append((name, str(number), f"{r['jobs_per_s']:,.0f}",
                         f"{r['client_us']:.0f}",
                         "n/a" if server is None else f"{server:.0f}",
                         "n/a" if server is None else f"{r['client_us'] + server:.0f}"))
    print(f"CPU per drained job, {args.jobs:,} jobs a drain, each on a fresh database "
          "(server: the whole server's process tree)")
    print("\n".join(table(rows, "<>>>>>")))


if __name__ == "__main__":
    dbos_async.run(main())
