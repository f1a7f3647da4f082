"""Where the client's CPU goes in the three-step workflow benchmark: a cProfile of the run.

The workload is ``bench_dbos_async``'s (a workflow of three trivial steps, each started with
``start_workflow`` and awaited with ``get_result``, C in flight), on a scratch database
created for the run and dropped after it. After a warm-up, N workflows run under cProfile;
the report groups the profile's own time (tottime) by where the code lives (dbos_async,
asyncpg, asyncio, other Python code, C functions) per workflow, then lists the top entries
by own and by cumulative time, overall and within dbos_async.

    .venv/bin/python benchmarks/profile_steps.py --out benchmarks/profiles/three_step.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import sysconfig
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dbos_async import workload
from common import DEFAULT_URL, drive, drop_database, recreate_database

import dbos_async
from dbos_async import DBOS

GROUPS = ("dbos_async executor", "dbos_async sysdb", "dbos_async other", "asyncpg", "asyncio",
          "other Python", "C functions")
OURS = GROUPS[:3]
# A function of pstats: (file, line, name); C functions have the file "~".
Function = tuple[str, int, str]


def group_of(function: Function) -> str:
    path = function[0].replace(os.sep, "/")
    if path == "~":
        return "C functions"
    if "/dbos_async/_executor/" in path:
        return "dbos_async executor"
    if "/dbos_async/_sysdb/" in path:
        return "dbos_async sysdb"
    if "/dbos_async/" in path:
        return "dbos_async other"
    if "/asyncpg/" in path:
        return "asyncpg"
    if "/asyncio/" in path:
        return "asyncio"
    return "other Python"


def own_time_by_group(stats: pstats.Stats) -> tuple[dict[str, float], dict[str, float]]:
    """Own time per group, in seconds: as cProfile charges it, and with each C function's
    time charged to the group of the Python code that called it (``json.dumps`` called by
    dbos_async is dbos_async's cost; a socket send by asyncpg, asyncpg's)."""
    strict: dict[str, float] = defaultdict(float)
    charged: dict[str, float] = defaultdict(float)
    entries: dict[Function, Any] = stats.stats  # type: ignore[attr-defined]
    for function, (_, _, tottime, _, callers) in entries.items():
        group = group_of(function)
        strict[group] += tottime
        if group != "C functions" or not callers:
            charged[group] += tottime
            continue
        # Each caller entry holds that call site's share of the callee's own time.
        for caller, edge in callers.items():
            charged[group_of(caller)] += edge[2]
    return strict, charged


def report(profiler: cProfile.Profile, workflows: int, limit: int,
           what: str = "workflows of 3 steps") -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    strict, charged = own_time_by_group(stats)
    total = sum(strict.values())
    out.write(f"Profiled: {workflows} {what}; {total:.3f} s of the event loop "
              f"thread's CPU time (cProfile's overhead included), "
              f"{total / workflows * 1e6:.0f} µs per workflow\n\n")
    out.write("Own time per workflow, by group (µs; 'C charged to caller' moves each C "
              "function's time to the group that called it)\n")
    out.write(f"{'group':<20}{'own':>10}{'share':>8}{'C charged to caller':>22}\n")
    rows = [(group, strict[group], charged[group]) for group in GROUPS]
    rows.append(("dbos_async, all", sum(strict[g] for g in OURS), sum(charged[g] for g in OURS)))
    for group, own, with_c in rows:
        out.write(f"{group:<20}{own / workflows * 1e6:>10.1f}{own / total:>8.1%}"
                  f"{with_c / workflows * 1e6:>22.1f}\n")
    out.write("\n")
    sections = (
        ("All code, by own time", "tottime", ()),
        ("dbos_async, by own time", "tottime", ("/dbos_async/",)),
        ("dbos_async, by cumulative time", "cumulative", ("/dbos_async/",)),
        ("dbos_async executor, by own time", "tottime", ("/dbos_async/_executor/",)),
        ("asyncpg, by own time", "tottime", ("/asyncpg/",)),
        ("asyncio, by own time", "tottime", ("/asyncio/",)),
    )
    for title, sort, restriction in sections:
        out.write(f"==== {title} (top {limit}) ====\n")
        stats.sort_stats(sort).print_stats(*restriction, limit)
    return _without_local_paths(out.getvalue())


def _without_local_paths(text: str) -> str:
    """File names relative to where they are installed (site-packages, the standard
    library, this checkout), so the report does not depend on the machine."""
    paths = sysconfig.get_paths()
    prefixes = {paths["purelib"], paths["platlib"], paths["stdlib"],
                str(Path(__file__).resolve().parent.parent)}
    for prefix in sorted(prefixes, key=len, reverse=True):
        text = text.replace(prefix + os.sep, "")
    return text


async def profile(url: str, *, workflows: int, concurrency: int, pool_size: int,
                  warmup: int) -> cProfile.Profile:
    dbos = DBOS(system_database_url=url, pool_size=pool_size, name="profile_steps",
                application_version="bench")
    three_steps = workload(dbos)

    async def one(i: int) -> None:
        handle = await dbos.start_workflow(three_steps, i)
        result = await handle.get_result()
        if result != (i + 1) * 2 - 2:
            raise RuntimeError(f"workflow {i} returned {result!r}")

    # CPU time of this thread (the event loop's), not wall time: the server and anything
    # else running on the machine take turns on the same cores.
    profiler = cProfile.Profile(time.thread_time_ns, 1e-9)
    async with dbos:
        await drive(warmup, concurrency, one)
        profiler.enable()
        await drive(workflows, concurrency, one)
        profiler.disable()
    return profiler


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--workflows", "-n", type=int, default=2000)
    parser.add_argument("--concurrency", "-c", type=int, default=100)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=200)
    add_report_options(parser, "bench_profile_steps")
    args = parser.parse_args()
    url = await recreate_database(args.url, args.database)
    try:
        profiler = await profile(url, workflows=args.workflows, concurrency=args.concurrency,
                                 pool_size=args.pool_size, warmup=args.warmup)
    finally:
        await drop_database(args.url, args.database)
    publish(report(profiler, args.workflows, args.limit), args.out)


def add_report_options(parser: argparse.ArgumentParser, database: str) -> None:
    """The options every profiling script here takes about its report and scratch database."""
    parser.add_argument("--limit", type=int, default=30, help="entries per listing")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--database", default=database,
                        help="scratch database (dropped afterwards)")


def publish(text: str, out: Path | None) -> None:
    """Print the report, and write it to ``out`` if given."""
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


if __name__ == "__main__":
    dbos_async.run(main())
