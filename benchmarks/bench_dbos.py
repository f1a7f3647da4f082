"""The peer: the same workload on the `dbos` package, through its async API.

`dbos` keeps a process-wide singleton and runs threads, so it runs in a child process:
``python benchmarks/bench_dbos.py --url URL ...`` prints one line ``BENCH_RESULT {json}``.
The child runs with no OTLP export, no Conductor and no DBOS Cloud settings: every ``DBOS_*``,
``DBOS__*`` and ``OTEL_*`` environment variable is removed before it starts.

Statements are counted on the client with SQLAlchemy engine events during the measured run
(``before_cursor_execute``, ``begin``, ``commit``, ``rollback``); psycopg sends each of these as
its own round trip, so their sum approximates the round trips. Transactions are read on the
server as for dbos_async (``common.TransactionReading``), after every idle connection of the
package's system-database pool has published its statistics; a connection that one of its
background threads holds at that moment publishes later, so the figure is within a few.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import MARKER

SCRIPT = Path(__file__).resolve()


async def run_subprocess(url: str, *, workflows: int, concurrency: int, pool_size: int,
                         warmup: int, burst: bool = False,
                         time_limit: float = 300.0) -> dict[str, Any]:
    """Run this file as a child process and return the result it prints."""
    return await run_child(SCRIPT, [
        "--url", url, "--workflows", str(workflows), "--concurrency", str(concurrency),
        "--pool-size", str(pool_size), "--warmup", str(warmup),
        *(["--burst"] if burst else []),
    ], time_limit)


def child_env() -> dict[str, str]:
    """This process's environment less every ``DBOS_*``, ``DBOS__*`` and ``OTEL_*`` variable
    (no Cloud, Conductor or OTLP settings reach a child), except ``DBOS_UVLOOP``, which only
    dbos_async reads and which picks the children's event loop as it picks this one's."""
    env = {key: value for key, value in os.environ.items()
           if key == "DBOS_UVLOOP" or not key.startswith(("DBOS_", "DBOS__", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def run_child(script: Path, argv: list[str], time_limit: float) -> dict[str, Any]:
    """Run ``script`` with ``argv`` in a child process with :func:`child_env`; return what it
    prints after :data:`MARKER`."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(script), *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env(),
    )
    try:
        stdout, stderr = await asyncio.wait_for(child.communicate(), time_limit)
    except TimeoutError:
        child.kill()
        await child.wait()
        raise RuntimeError(
            f"{script.name} did not finish within {time_limit:.0f}s") from None
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith(MARKER):
            result: dict[str, Any] = json.loads(line[len(MARKER):])
            return result
    raise RuntimeError(
        f"{script.name} exited with {child.returncode} and no result\n"
        f"--- stdout ---\n{stdout.decode(errors='replace')[-3000:]}\n"
        f"--- stderr ---\n{stderr.decode(errors='replace')[-3000:]}"
    )


def new_dbos(name: str, url: str, pool_size: int, **settings: Any) -> Any:
    """The `dbos` package's DBOS instance as every benchmark child configures it: its logs
    at WARNING, no OTLP export, application version "bench"."""
    import logging

    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    return DBOS(config={
        "name": name,
        "system_database_url": url,
        "sys_db_pool_size": pool_size,
        "enable_otlp": False,
        "log_level": "WARNING",
        "application_version": "bench",
        **settings,
    })


class _Counts:
    def __init__(self) -> None:
        self.active = False
        self.counts: Counter[str] = Counter()

    def hook(self, kind: str) -> Any:
        def count(*_: Any, **__: Any) -> None:
            if self.active:
                self.counts[kind] += 1
        return count


def _child(args: argparse.Namespace) -> dict[str, Any]:
    from dbos import DBOS
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts = _Counts()
    event.listen(Engine, "before_cursor_execute", counts.hook("statement"))
    for kind in ("begin", "commit", "rollback"):
        event.listen(Engine, kind, counts.hook(kind))

    instance = new_dbos("bench_dbos", args.url, args.pool_size)

    @DBOS.step()
    async def add_one(x: int) -> int:
        return x + 1

    @DBOS.step()
    async def double(x: int) -> int:
        return x * 2

    @DBOS.step()
    async def subtract_two(x: int) -> int:
        return x - 2

    @DBOS.workflow()
    async def three_steps(x: int) -> int:
        return await subtract_two(await double(await add_one(x)))

    from common import drive

    async def check(i: int, handle: Any) -> None:
        result = await handle.get_result()
        if result != (i + 1) * 2 - 2:
            raise RuntimeError(f"workflow {i} returned {result!r}")

    async def one(i: int) -> None:
        await check(i, await DBOS.start_workflow_async(three_steps, i))

    async def measured(count: int) -> float:
        if not args.burst:
            return await drive(count, args.concurrency, one)
        began = time.perf_counter()
        handles = await asyncio.gather(
            *(DBOS.start_workflow_async(three_steps, i) for i in range(count)))
        await asyncio.gather(*(check(i, h) for i, h in enumerate(handles)))
        return time.perf_counter() - began

    readings: list[Any] = []

    async def main() -> float:
        await measured(args.warmup)
        readings.append(await asyncio.to_thread(_read_transactions, instance))
        counts.active = True
        elapsed = await measured(args.workflows)
        counts.active = False
        readings.append(await asyncio.to_thread(_read_transactions, instance))
        return elapsed

    DBOS.launch()
    try:
        # Checked, not assumed: no Conductor connection and no OTLP export in this process.
        from dbos._tracer import dbos_tracer

        extras = {
            "conductor": instance.conductor_websocket is not None,
            "otlp": not dbos_tracer.disable_otlp,
        }
        elapsed = asyncio.run(main())
    finally:
        DBOS.destroy()
    import dbos as dbos_package
    from common import transactions_between

    steps = args.workflows * 3
    round_trips = sum(counts.counts.values())
    transactions = transactions_between(*readings)
    return {
        "dbos_version": getattr(dbos_package, "__version__", None) or _version("dbos"),
        "workflows": args.workflows,
        "warmup": args.warmup,
        "steps": steps,
        "seconds": elapsed,
        "workflows_per_s": args.workflows / elapsed,
        "steps_per_s": steps / elapsed,
        "pool_size": args.pool_size,
        "client_counts": dict(counts.counts),
        "round_trips_per_workflow": round_trips / args.workflows,
        "burst": args.burst,
        "concurrency": args.workflows if args.burst else args.concurrency,
        "server": {"transactions": transactions,
                   "transactions_per_workflow": transactions / args.workflows},
        **extras,
    }


def _read_transactions(instance: Any) -> Any:
    """``common.read_transactions`` for the package's SQLAlchemy pool (psycopg, in a
    thread): flush each idle pooled connection, then read on the first."""
    from common import FLUSH_SQL, TRANSACTIONS_SQL, TransactionReading

    engine = instance._sys_db.engine
    conns = [engine.raw_connection() for _ in range(max(1, engine.pool.checkedin()))]
    try:
        for conn in conns:
            with conn.cursor() as cursor:
                cursor.execute(FLUSH_SQL)
            conn.commit()
        with conns[0].cursor() as cursor:
            cursor.execute(TRANSACTIONS_SQL)
            published = cursor.fetchone()[0]
        conns[0].commit()
    finally:
        for conn in conns:
            conn.close()  # back to the pool; its rollback sends nothing outside a transaction
    return TransactionReading(int(published), len(conns), 1)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--workflows", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--pool-size", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--burst", action="store_true",
                        help="start all workflows at once, then gather their results")
    result = _child(parser.parse_args())
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
