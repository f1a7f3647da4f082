"""Queue benchmark: drain rate with 1 and 2 executor processes, and enqueue -> start latency,
for dbos_async and the `dbos` package (every executor and client in its own child process,
``queue_child.py``).

Throughput, per system and executor count, on a fresh scratch database:

1. start the executor processes (one after the other, each prints READY once it dequeues):
   queue ``bench_queue`` with the same ``worker_concurrency`` and polling interval for both
   systems, and ``one_step``, a workflow of one trivial step;
2. a separate client process enqueues N workflows through the schema's SQL function
   ``dbos.enqueue_workflow`` in one transaction (the backlog appears at one commit);
3. wait until all N are SUCCESS, stop the executors, and read the figures from
   ``workflow_status``: drain rate = N / (last completion - first start); also the delay
   from the enqueue commit to the first start, and how the workflows split between executors.

For dbos_async also a drain of ``zero_step`` workflows (no step) with one executor, one of
``IDLE_WORKFLOWS`` one-step workflows enqueued after the executor sat idle for
``IDLE_SECONDS`` (its idle poll backed off meanwhile: the delay to the first start shows
whether the backlog's commit alone wakes it), and for
every dbos_async drain the server's transactions from just before the enqueue to the end
(each executor flushes its pool's statistics on request, see ``common.TransactionReading``).
Then pgqueuer's enqueue and drain (``bench_pgqueuer.py``), when it is installed.

Latency: see ``queue_child.py`` (``latency`` role).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import asyncpg
import bench_pgqueuer
from bench_dbos import child_env
from common import (
    MARKER,
    UNFINISHED_SQL,
    TransactionReading,
    drop_database,
    read_transactions,
    recreate_database,
    transactions_between,
)

SCRIPT = Path(__file__).resolve().parent / "queue_child.py"
QUEUE = "bench_queue"
IDLE_SECONDS = 8.0
"""How long the executor sits idle before the idle run's enqueue: its idle poll, doubling
from the polling interval, has backed off to several seconds by then."""
IDLE_WORKFLOWS = 1000
WIDE_CONCURRENCY = 1000
"""The worker_concurrency of the wide drains: pgqueuer's drain caps no jobs in flight, and
at the default cap of 100 a round's claim waits for the slots of the previous one."""


class Executor:
    """One executor child process (``queue_child.py serve``)."""

    def __init__(self, system: str, url: str, executor_id: str, *, worker_concurrency: int,
                 polling_interval: float, pool_size: int) -> None:
        self.argv = [str(SCRIPT), "serve", "--system", system, "--url", url,
                     "--queue", QUEUE, "--executor-id", executor_id,
                     "--worker-concurrency", str(worker_concurrency),
                     "--polling-interval", str(polling_interval),
                     "--pool-size", str(pool_size)]
        self.process: asyncio.subprocess.Process | None = None
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)

    async def start(self, ready_within: float = 60.0) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, *self.argv, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=self.stderr, env=child_env())
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(ready_within):
                while True:
                    line = await self.process.stdout.readline()
                    if not line:
                        raise RuntimeError("executor exited before READY\n" + self.tail())
                    if line.decode().strip() == "READY":
                        return
        except TimeoutError:
            raise RuntimeError("executor not READY in time\n" + self.tail()) from None

    async def flush(self) -> int:
        """Have the executor's pool publish its statistics; return the statements it took."""
        process = self.process
        assert process is not None and process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(b"flush\n")
        await process.stdin.drain()
        line = (await asyncio.wait_for(process.stdout.readline(), 30.0)).decode().split()
        if not line or line[0] != "FLUSHED":
            raise RuntimeError(f"executor did not flush: {line}\n" + self.tail())
        return int(line[1])

    def tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-3000:]

    async def stop(self, within: float = 30.0) -> None:
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(b"stop\n")
                await process.stdin.drain()
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), within)
            except TimeoutError:
                process.kill()
                await process.wait()
        self.stderr.close()


async def run_child(argv: list[str], time_limit: float = 300.0) -> dict[str, Any]:
    """Run ``queue_child.py`` with ``argv`` and return what it prints after MARKER."""
    import json

    child = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), *argv, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=child_env())
    try:
        stdout, stderr = await asyncio.wait_for(child.communicate(), time_limit)
    except TimeoutError:
        child.kill()
        await child.wait()
        raise RuntimeError(f"queue_child.py {argv[0]} did not finish in {time_limit:.0f}s"
                           ) from None
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith(MARKER):
            result: dict[str, Any] = json.loads(line[len(MARKER):])
            return result
    raise RuntimeError(f"queue_child.py {argv[0]} exited with {child.returncode}, no result\n"
                       f"{stderr.decode(errors='replace')[-3000:]}")


async def published(conn: asyncpg.Connection, executors: list[Executor]) -> TransactionReading:
    """A transaction reading once every dbos_async executor's pool has published its
    statistics; their flushes, like the reader's, are among the reading's own."""
    flushes = sum([await executor.flush() for executor in executors])
    reading = await read_transactions([conn])
    return TransactionReading(reading.published, reading.flushes + flushes,
                              reading.trailing)


async def drain(admin_url: str, database: str, system: str, *, processes: int,
                workflows: int, worker_concurrency: int, polling_interval: float,
                pool_size: int, workflow: str = "one_step", idle_seconds: float = 0.0,
                time_limit: float = 180.0) -> dict[str, Any]:
    """One throughput run on a fresh database, the enqueue ``idle_seconds`` after the
    executors are ready; see the module docstring. For dbos_async, also the transactions
    the server ended over the drain (the enqueue's included)."""
    url = await recreate_database(admin_url, database)
    executors = [Executor(system, url, f"bench-{system}-{i}",
                          worker_concurrency=worker_concurrency,
                          polling_interval=polling_interval, pool_size=pool_size)
                 for i in range(processes)]
    try:
        for executor in executors:  # one at a time: the first one creates the schema
            await executor.start()
        counted = system == "dbos_async"
        conn = await asyncpg.connect(url)
        try:
            await asyncio.sleep(idle_seconds)
            if counted:
                before = await published(conn, executors)
            enqueue = await run_child(["enqueue", "--url", url, "--queue", QUEUE,
                                       "--count", str(workflows), "--workflow", workflow])
            deadline = time.monotonic() + time_limit
            reads = 2  # the reader's own transactions in the window: these polls, 2 reads
            while True:
                reads += 1
                if not await conn.fetchval(UNFINISHED_SQL, QUEUE):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{system}: workflows unfinished after "
                                       f"{time_limit:.0f}s\n" + executors[0].tail())
                await asyncio.sleep(0.1)
            row = await conn.fetchrow(
                """SELECT count(*) FILTER (WHERE status = 'SUCCESS') AS succeeded,
                          min(started_at_epoch_ms) AS first_start,
                          max(COALESCE(completed_at, updated_at)) AS last_end
                   FROM dbos.workflow_status WHERE queue_name = $1""", QUEUE)
            split = await conn.fetch(
                """SELECT executor_id, count(*) AS n FROM dbos.workflow_status
                   WHERE queue_name = $1 GROUP BY executor_id ORDER BY executor_id""", QUEUE)
            transactions = (transactions_between(before, await published(conn, executors))
                            - reads if counted else None)
        finally:
            await conn.close()
    finally:
        for executor in executors:
            await executor.stop()
        await drop_database(admin_url, database)
    assert row is not None
    seconds = (row["last_end"] - row["first_start"]) / 1000
    # The enqueue child read the clock right after its commit (same machine, same clock).
    pickup_ms = row["first_start"] - enqueue["committed_at_ms"]
    return {
        "system": system,
        "processes": processes,
        "workflow": workflow,
        "workflows": workflows,
        "succeeded": row["succeeded"],
        "drain_seconds": seconds,
        "workflows_per_s": workflows / seconds if seconds > 0 else float("inf"),
        "commit_to_first_start_ms": pickup_ms,
        "idle_seconds": idle_seconds,
        "per_executor": {r["executor_id"]: r["n"] for r in split},
        "enqueue": enqueue,
        "worker_concurrency": worker_concurrency,
        "polling_interval": polling_interval,
        "server": None if transactions is None else {
            "transactions": transactions,
            "transactions_per_workflow": transactions / workflows},
    }


PGQUEUER_BATCH_SIZES = [10, 100]


async def run_pgqueuer(admin_url: str, database: str, jobs: int,
                       progress: Any) -> dict[str, Any]:
    """pgqueuer's enqueue and drain (``bench_pgqueuer.py``, a child process), or why not."""
    if importlib.util.find_spec("pgqueuer") is None:
        reason = "pgqueuer is not installed (pip install pgqueuer==1.6.0; the dev extra has it)"
        progress(f"queues: pgqueuer skipped: {reason}")
        return {"skipped": reason}
    progress(f"queues: pgqueuer, enqueue and drain {jobs} jobs at batch sizes "
             f"{PGQUEUER_BATCH_SIZES} (child process)")
    url = await recreate_database(admin_url, database)
    try:
        return await bench_pgqueuer.run_subprocess(url, jobs=jobs,
                                                   batch_sizes=PGQUEUER_BATCH_SIZES)
    except RuntimeError as error:
        progress(f"pgqueuer run failed: {error}")
        return {"error": str(error)}
    finally:
        await drop_database(admin_url, database)


async def run(admin_url: str, prefix: str, *, workflows: int, dbos_workflows: int,
              worker_concurrency: int, polling_interval: float, pool_size: int,
              latency_samples: int, poll_samples: int, dbos_default_samples: int,
              skip_dbos: bool, progress: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "parameters": {"workflows": workflows, "dbos_workflows": dbos_workflows,
                       "worker_concurrency": worker_concurrency,
                       "polling_interval": polling_interval, "pool_size": pool_size},
        "throughput": {},
    }
    wide = max(worker_concurrency, WIDE_CONCURRENCY)
    runs = [("dbos_async", workflows, 1, "one_step", 0.0, worker_concurrency),
            ("dbos_async", workflows, 2, "one_step", 0.0, worker_concurrency),
            ("dbos_async", workflows, 1, "zero_step", 0.0, worker_concurrency),
            ("dbos_async", min(workflows, IDLE_WORKFLOWS), 1, "one_step", IDLE_SECONDS,
             worker_concurrency),
            ("dbos_async", workflows, 1, "one_step", 0.0, wide),
            ("dbos_async", workflows, 1, "zero_step", 0.0, wide)]
    if not skip_dbos:
        runs += [("dbos", dbos_workflows, 1, "one_step", 0.0, worker_concurrency),
                 ("dbos", dbos_workflows, 2, "one_step", 0.0, worker_concurrency)]
    for system, count, processes, workflow, idle, concurrency in runs:
        progress(f"queues: {system}, drain {count} {workflow} workflows with {processes} "
                 f"executor process(es)" + (f", enqueued after {idle:g} s idle" if idle else "")
                 + (f", worker_concurrency {concurrency}"
                    if concurrency != worker_concurrency else ""))
        key = f"{system}_{processes}" if workflow == "one_step" else f"{system}_0step_{processes}"
        if idle:
            key = f"{system}_idle_{processes}"
        if concurrency != worker_concurrency:
            key = key.replace(f"{system}_", f"{system}_wide_", 1)
        try:
            out["throughput"][key] = await drain(
                admin_url, f"{prefix}_queues_{system}", system, processes=processes,
                workflows=count, worker_concurrency=concurrency,
                polling_interval=polling_interval, pool_size=pool_size, workflow=workflow,
                idle_seconds=idle)
        except RuntimeError as error:
            progress(f"queue run {key} failed: {error}")
            out.setdefault("errors", []).append(f"{key}: {error}")
    out["pgqueuer"] = await run_pgqueuer(admin_url, f"{prefix}_queues_pgqueuer", workflows,
                                         progress)
    ratios = {}
    for processes in (1, 2):
        fast = out["throughput"].get(f"dbos_async_{processes}")
        slow = out["throughput"].get(f"dbos_{processes}")
        if fast and slow:
            ratios[str(processes)] = fast["workflows_per_s"] / slow["workflows_per_s"]
    out["ratio_dbos_async_over_dbos"] = ratios
    out["latency"] = {}
    common = ["--polling-interval", str(polling_interval), "--pool-size", str(pool_size),
              "--poll-samples", str(poll_samples)]
    for system in ["dbos_async"] + ([] if skip_dbos else ["dbos"]):
        database = f"{prefix}_queues_latency_{system}"
        url = await recreate_database(admin_url, database)
        progress(f"queues: {system}, enqueue -> start latency")
        try:
            out["latency"][system] = await run_child(
                ["latency", "--system", system, "--url", url,
                 "--samples", str(latency_samples),
                 "--default-samples", str(dbos_default_samples), "--warmup", "2", *common])
        except RuntimeError as error:
            progress(f"queue latency {system} failed: {error}")
            out.setdefault("errors", []).append(f"latency {system}: {error}")
        finally:
            await drop_database(admin_url, database)
    return out
