"""The peer: the same workload on the `dbos` package, through its async API.

`dbos` keeps a process-wide singleton and runs threads, so it runs in a child process:
``python benchmarks/bench_dbos.py --url URL ...`` prints one line ``BENCH_RESULT {json}``.
The child runs with no OTLP export, no Conductor and no DBOS Cloud settings: every ``DBOS_*``,
``DBOS__*`` and ``OTEL_*`` environment variable is removed before it starts.

Statements are counted on the client with SQLAlchemy engine events during the measured run
(``before_cursor_execute``, ``begin``, ``commit``, ``rollback``); psycopg sends each of these as
its own round trip, so their sum approximates the round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

MARKER = "BENCH_RESULT "
SCRIPT = Path(__file__).resolve()


async def run_subprocess(url: str, *, workflows: int, concurrency: int, pool_size: int,
                         warmup: int, time_limit: float = 300.0) -> dict[str, Any]:
    """Run this file as a child process and return the result it prints."""
    return await run_child(SCRIPT, [
        "--url", url, "--workflows", str(workflows), "--concurrency", str(concurrency),
        "--pool-size", str(pool_size), "--warmup", str(warmup),
    ], time_limit)


async def run_child(script: Path, argv: list[str], time_limit: float) -> dict[str, Any]:
    """Run ``script`` with ``argv`` in a child process without any ``DBOS_*``, ``DBOS__*`` or
    ``OTEL_*`` environment variable; return what it prints after :data:`MARKER`."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DBOS_", "DBOS__", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(script), *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
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

    # Imported here: the parent process never imports `dbos`.
    from common import drive

    async def one(i: int) -> None:
        handle = await DBOS.start_workflow_async(three_steps, i)
        result = await handle.get_result()
        if result != (i + 1) * 2 - 2:
            raise RuntimeError(f"workflow {i} returned {result!r}")

    async def main() -> float:
        await drive(args.warmup, args.concurrency, one)
        counts.active = True
        elapsed = await drive(args.workflows, args.concurrency, one)
        counts.active = False
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

    steps = args.workflows * 3
    round_trips = sum(counts.counts.values())
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
        **extras,
    }


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
    result = _child(parser.parse_args())
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
