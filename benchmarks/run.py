"""Side-by-side benchmark: dbos_async vs the `dbos` package vs raw asyncpg inserts.

    python benchmarks/run.py [--url URL] [--workflows N] [--concurrency C] [--json PATH]

One run, one PostgreSQL server, three scratch databases (dropped and recreated each run):

1. dbos_async: N workflows of three trivial steps, at most C started-and-awaited at a time,
   after a warm-up; every statement of the measured run is counted (see bench_dbos_async.py).
2. the `dbos` package, same workload through its async API, in a child process
   (bench_dbos.py), on N/4 workflows by default: rates are compared, not totals.
3. raw asyncpg: 3N single-row autocommit INSERTs into a copy of operation_outputs, C in flight
   over a pool of the same size; once with no pool reset (the floor) and once with asyncpg's
   default reset query on release (what a pool gives unless told otherwise).

Then, unless --burst 0, B (3,000) three-step workflows started at once and their results
gathered: dbos_async in a child process on uvloop and on asyncio's loop, and the `dbos`
package with B/10; the burst rate against the one-write-per-commit ceiling (raw inserts/s / 5)
and against the `dbos` package. Every throughput figure comes with the server's commits per
workflow (pg_stat_database, see common.TransactionReading) and the statements per step.

Then, unless --skip-queues (--queues-only runs only this part), queues (bench_queues.py,
queue_child.py): the drain rate of a backlog enqueued by a separate client process through
the SQL function dbos.enqueue_workflow, with 1 and 2 executor processes (and a 0-step
workflow with 1), with commits per workflow, and the enqueue -> start latency, beside the
`dbos` package's figures and pgqueuer's enqueue and drain (bench_pgqueuer.py).

Then, unless --skip-waiters (--waiters-only runs only this part), many workflows waiting at
once in one process (bench_waiters.py, a child process per system): start time, memory and
threads while they wait, statements sent while idle, and the time to wake them all.

Then, unless --skip-transactions, transactional steps (bench_transactions.py): single-row
INSERTs run bare, in @dbos.transaction() steps on the system database and on an application
database, with throughput and every statement counted per transaction.

Then, unless --skip-metrics (--metrics-only runs only this part), the cost of the
executor's metrics: the throughput workload with metrics off, exported through
OpenTelemetry's SDK and through the Prometheus endpoint, in child processes
(bench_metrics.py), the CPU and wall time per workflow of each.

Then, unless --skip-latency (--latency-only runs only this part), the latency of single
operations, one at a time: send -> recv wake-up, set_event -> get_event, write_stream ->
read_stream and start_workflow -> get_result, median and p99, for dbos_async
(bench_latency_dbos_async.py) and for the `dbos` package in a child process
(bench_latency_dbos.py), on two more scratch databases; see latency.py.

The report ends with every targeted ratio of the run in one table. It runs on the event
loop dbos_async.run picks (uvloop when installed, unless DBOS_UVLOOP=0). See
benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_dbos
import bench_dbos_async
import bench_latency_dbos
import bench_latency_dbos_async
import bench_metrics
import bench_queues
import bench_raw
import bench_transactions
import bench_waiters
import latency
from common import DEFAULT_URL, drop_database, recreate_database, server_facts, table

import dbos_async
from dbos_async import ConfigurationError
from dbos_async import _eventloop as eventloop

WORKFLOW_RATIO_TARGET = 5.0
WORKFLOW_RATIO_DESIGN = 10.0
RAW_FRACTION_TARGET = 0.70
EXPECTED_PER_WORKFLOW = 5.0
EXPECTED_PER_STEP = 1.0
# Statement counts within 5% of the expectation pass: amortized extras (a batched
# notification statement, say) are reported but do not fail the line.
COUNT_TOLERANCE = 1.05
LATENCY_MEDIAN_TARGET_MS = 10.0
QUEUE_RATIO_TARGET = 5.0
QUEUE_LATENCY_TARGET_MS = 5.0
# The burst of 3-step workflows against one write per commit: the raw autocommit insert
# rate spread over a workflow's five writes (start, three steps, finish).
WRITES_PER_WORKFLOW = 5
BURST_CEILING_TARGET = 1.5
BURST_DBOS_TARGET = 25.0
QUEUE_PGQUEUER_TARGET = 1.0
# Against pgqueuer's batches of 100: the zero-step drain at least its rate, the one-step
# drain (a checkpoint more per workflow) three quarters of it.
ZERO_STEP_PGQUEUER_100_TARGET = 1.0
ONE_STEP_PGQUEUER_100_TARGET = 0.75
QUEUE_COMMITS_TARGET = 0.5
# A start awaited alone while the started workflows run, against a single-row autocommit
# INSERT timed in the same loop; and the rate of such a request loop against the `dbos`
# package's.
SERIAL_START_RAW_TARGET = 2.0
SERIAL_START_DBOS_TARGET = 10.0
ZERO_STEP_DRAIN_TARGET = 5000.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark dbos_async against the dbos package and raw asyncpg inserts.")
    parser.add_argument("--url", default=DEFAULT_URL,
                        help="a PostgreSQL server URL whose user may create databases "
                             f"(default {DEFAULT_URL})")
    parser.add_argument("--workflows", "-n", type=int, default=2000,
                        help="dbos_async workflows per measured round (default 2000)")
    parser.add_argument("--concurrency", "-c", type=int, default=100,
                        help="workflows (or inserts) in flight at once (default 100)")
    parser.add_argument("--burst", type=int, default=3000,
                        help="dbos_async workflows started at once in the burst rounds, on "
                             "each event loop (default 3000; 0 leaves the burst out)")
    parser.add_argument("--dbos-burst", type=int, default=None,
                        help="dbos package workflows started at once (default burst/10)")
    parser.add_argument("--pool-size", type=int, default=10,
                        help="connection pool size of all three (default 10, "
                             "dbos_async's default)")
    parser.add_argument("--dbos-workflows", type=int, default=None,
                        help="workflows per round for the dbos package (default N/4)")
    parser.add_argument("--db-prefix", default="bench",
                        help="scratch databases are PREFIX_dbos_async, PREFIX_dbos, PREFIX_raw")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measured rounds per system, interleaved; rates are medians "
                             "(default 3; 1 with --profile)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the results as JSON to PATH")
    parser.add_argument("--skip-dbos", action="store_true",
                        help="do not run the dbos package (no ratio)")
    parser.add_argument("--latency-samples", type=int, default=200,
                        help="dbos_async samples per latency operation (default 200; half "
                             "as many through another executor)")
    parser.add_argument("--dbos-latency-samples", type=int, default=50,
                        help="samples per latency operation for the dbos package (default 50)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--skip-latency", action="store_true",
                       help="do not measure the latencies (throughput only)")
    which.add_argument("--latency-only", action="store_true",
                       help="measure only the latencies (no throughput, no queues)")
    which.add_argument("--queues-only", action="store_true",
                       help="run only the queue section")
    which.add_argument("--waiters-only", action="store_true",
                       help="run only the waiting-workflows section")
    which.add_argument("--metrics-only", action="store_true",
                       help="run only the metrics off vs on section")
    parser.add_argument("--skip-metrics", action="store_true",
                        help="leave out the metrics off vs on section")
    parser.add_argument("--skip-queues", action="store_true",
                        help="leave out the queue section")
    parser.add_argument("--skip-waiters", action="store_true",
                        help="leave out the waiting-workflows section")
    parser.add_argument("--skip-transactions", action="store_true",
                        help="leave out the transactions section")
    parser.add_argument("--transactions", type=int, default=2000,
                        help="single-row INSERTs per way in the transactions section "
                             "(default 2000)")
    parser.add_argument("--waiters", type=int, default=10_000,
                        help="dbos_async workflows waiting at once (default 10000)")
    parser.add_argument("--dbos-waiters", type=int, default=1_000,
                        help="dbos package workflows waiting at once (default 1000)")
    parser.add_argument("--waiters-idle-seconds", type=float, default=10.0,
                        help="idle window in which statements are counted (default 10)")
    parser.add_argument("--queue-workflows", type=int, default=10_000,
                        help="workflows enqueued per dbos_async queue drain (default 10000)")
    parser.add_argument("--dbos-queue-workflows", type=int, default=1_000,
                        help="workflows per dbos package queue drain (default 1000)")
    parser.add_argument("--queue-worker-concurrency", type=int, default=100,
                        help="worker_concurrency of the benchmark queue, both systems, per "
                             "executor process (default 100)")
    parser.add_argument("--queue-polling-interval", type=float, default=0.1,
                        help="queue polling interval of both systems in seconds (default 0.1; "
                             "the dbos package's default, 1 s, is measured too)")
    parser.add_argument("--queue-latency-samples", type=int, default=100,
                        help="dbos_async enqueue -> start samples, notified path (default 100)")
    parser.add_argument("--queue-poll-samples", type=int, default=30,
                        help="enqueue -> start samples at the common polling interval, per "
                             "system (default 30)")
    parser.add_argument("--dbos-default-poll-samples", type=int, default=10,
                        help="enqueue -> start samples of the dbos package at its default "
                             "polling interval (default 10)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch databases after the run")
    parser.add_argument("--profile", action="store_true",
                        help="profile the dbos_async measured run with cProfile and print the "
                             "hotspots (its rates are then not comparable)")
    args = parser.parse_args(argv)
    if args.workflows < 1 or args.concurrency < 1 or args.pool_size < 2:
        parser.error("--workflows and --concurrency must be >= 1, --pool-size >= 2")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.dbos_workflows is not None and args.dbos_workflows < 1:
        parser.error("--dbos-workflows must be >= 1")
    if args.latency_samples < 1 or args.dbos_latency_samples < 1:
        parser.error("--latency-samples and --dbos-latency-samples must be >= 1")
    if args.skip_queues and args.queues_only:
        parser.error("--skip-queues and --queues-only exclude each other")
    if args.skip_waiters and args.waiters_only:
        parser.error("--skip-waiters and --waiters-only exclude each other")
    if min(args.waiters, args.dbos_waiters) < 1 or args.waiters_idle_seconds <= 0:
        parser.error("--waiters and --dbos-waiters must be >= 1, --waiters-idle-seconds > 0")
    if min(args.queue_workflows, args.dbos_queue_workflows, args.queue_worker_concurrency,
           args.queue_latency_samples, args.queue_poll_samples,
           args.dbos_default_poll_samples) < 1 or args.queue_polling_interval <= 0:
        parser.error("queue counts must be >= 1 and --queue-polling-interval > 0")
    if args.profile:
        args.rounds = 1
    if args.dbos_workflows is None:
        args.dbos_workflows = max(1, args.workflows // 4)
    if args.burst < 0 or (args.dbos_burst is not None and args.dbos_burst < 1):
        parser.error("--burst must be >= 0 and --dbos-burst >= 1")
    if args.dbos_burst is None:
        args.dbos_burst = max(1, args.burst // 10)
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    facts = await server_facts(args.url)
    results: dict[str, Any] = {
        "server": facts,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "parameters": {"pool_size": args.pool_size},
    }
    only = args.latency_only or args.queues_only or args.waiters_only or args.metrics_only
    if not only:
        await run_throughput(args, results)
    if not args.skip_queues and (args.queues_only or not only):
        results["queues"] = await bench_queues.run(
            args.url, args.db_prefix, workflows=args.queue_workflows,
            dbos_workflows=args.dbos_queue_workflows,
            worker_concurrency=args.queue_worker_concurrency,
            polling_interval=args.queue_polling_interval, pool_size=args.pool_size,
            latency_samples=args.queue_latency_samples, poll_samples=args.queue_poll_samples,
            dbos_default_samples=args.dbos_default_poll_samples, skip_dbos=args.skip_dbos,
            progress=_progress)
    if not args.skip_waiters and (args.waiters_only or not only):
        results["waiters"] = await run_waiters(args)
    if not args.skip_transactions and not only:
        _progress(f"transactions: {args.transactions} INSERTs bare, on the system database, "
                  "on an application database")
        results["transactions"] = await bench_transactions.run(
            args.url, f"{args.db_prefix}_txn", args.transactions, args.pool_size)
    if not args.skip_metrics and (args.metrics_only or not only):
        results["metrics"] = await bench_metrics.run(
            args.url, args.db_prefix, workflows=args.workflows, concurrency=args.concurrency,
            pool_size=args.pool_size, rounds=args.rounds, keep=args.keep, progress=_progress)
    if not args.skip_latency and (args.latency_only or not only):
        results["latency"] = await run_latency(args)
    return results


async def run_waiters(args: argparse.Namespace) -> dict[str, Any]:
    """Each system in its own child process, on its own scratch database."""
    out: dict[str, Any] = {}
    counts = {"dbos_async": args.waiters, "dbos": args.dbos_waiters}
    if args.skip_dbos:
        del counts["dbos"]
    for system, waiters in counts.items():
        name = f"{args.db_prefix}_waiters_{system}"
        url = await recreate_database(args.url, name)
        _progress(f"waiters: {system}, {waiters} waiting workflows (child process)")
        try:
            out[system] = await bench_waiters.run_subprocess(
                system, url, waiters=waiters, concurrency=args.concurrency,
                pool_size=args.pool_size, idle_seconds=args.waiters_idle_seconds)
        except RuntimeError as error:
            _progress(f"{system} waiters run failed: {error}")
            out[f"{system}_error"] = str(error)
        finally:
            if not args.keep:
                await drop_database(args.url, name)
    return out


async def run_throughput(args: argparse.Namespace, results: dict[str, Any]) -> None:
    n, c, pool = args.workflows, args.concurrency, args.pool_size
    names = {kind: f"{args.db_prefix}_{kind}"
             for kind in ("dbos_async", "dbos_async_sharded", "dbos", "raw")}
    results["parameters"].update({
        "workflows": n, "dbos_workflows": args.dbos_workflows, "concurrency": c,
        "steps_per_workflow": 3, "rounds": args.rounds,
    })
    rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in SYSTEMS}
    urls = {kind: await recreate_database(args.url, name) for kind, name in names.items()}
    try:
        # Rounds interleave the systems, so a burst of load elsewhere on the machine
        # hits all of them rather than one.
        for number in range(1, args.rounds + 1):
            _progress(f"round {number}/{args.rounds}: dbos_async, {n} workflows")
            rounds["dbos_async"].append(await bench_dbos_async.run(
                urls["dbos_async"], workflows=n, concurrency=c, pool_size=pool,
                warmup=min(n, 200), profile=args.profile,
            ))
            _progress(f"round {number}/{args.rounds}: dbos_async sharded, {n} workflows "
                      f"over {SHARD_KEYS} keys")
            rounds["dbos_async_sharded"].append(await bench_dbos_async.run(
                urls["dbos_async_sharded"], workflows=n, concurrency=c, pool_size=pool,
                warmup=min(n, 200), shard_keys=SHARD_KEYS,
            ))
            if not args.skip_dbos:
                m = args.dbos_workflows
                _progress(f"round {number}/{args.rounds}: dbos, {m} workflows (child process)")
                try:
                    rounds["dbos"].append(await bench_dbos.run_subprocess(
                        urls["dbos"], workflows=m, concurrency=c, pool_size=pool,
                        warmup=min(m, 50),
                    ))
                except RuntimeError as error:
                    # Reported, not fatal: the other figures still stand.
                    _progress(f"dbos package run failed: {error}")
                    results.setdefault("dbos_errors", []).append(str(error))
            for key in ("raw", "raw_default_reset"):
                _progress(f"round {number}/{args.rounds}: {key}, {3 * n} inserts")
                rounds[key].append(await bench_raw.run(
                    urls["raw"], inserts=3 * n, concurrency=c, pool_size=pool,
                    warmup=min(3 * n, 600), default_reset=key == "raw_default_reset",
                ))
    finally:
        if not args.keep:
            for name in names.values():
                await drop_database(args.url, name)
    for key, runs in rounds.items():
        if runs:
            results[key] = aggregate(key, runs)
    results["rounds"] = rounds
    if args.burst:
        results["burst"] = await run_burst(args)
    results["summary"] = summarize(results)


def default_loop() -> str:
    """The loop dbos_async.run picks here: "uvloop" or "asyncio"."""
    return "asyncio" if eventloop.loop_factory() is None else "uvloop"


async def run_burst(args: argparse.Namespace) -> dict[str, Any]:
    """B three-step workflows started at once, then their results gathered: dbos_async in a
    child process on each event loop (uvloop when it is installed, asyncio's), and the
    `dbos` package (B/10 by default); interleaved rounds, medians."""
    b, pool = args.burst, args.pool_size
    loops = ["uvloop", "asyncio"] if _uvloop_installed() else ["asyncio"]
    names = {kind: f"{args.db_prefix}_burst_{kind}" for kind in ("dbos_async", "dbos")}
    if args.skip_dbos:
        del names["dbos"]
    urls = {kind: await recreate_database(args.url, name) for kind, name in names.items()}
    rounds: dict[str, list[dict[str, Any]]] = {f"dbos_async_{loop}": [] for loop in loops}
    rounds["dbos"] = []
    out: dict[str, Any] = {"workflows": b, "dbos_workflows": args.dbos_burst,
                           "default_loop": default_loop(), "loops": loops}
    try:
        for number in range(1, args.rounds + 1):
            for loop in loops:
                _progress(f"burst {number}/{args.rounds}: dbos_async on {loop}, {b} "
                          "workflows at once (child process)")
                try:
                    rounds[f"dbos_async_{loop}"].append(await bench_dbos_async.run_subprocess(
                        urls["dbos_async"], workflows=b, pool_size=pool,
                        warmup=min(b, 200), loop=loop))
                except RuntimeError as error:
                    _progress(f"dbos_async burst on {loop} failed: {error}")
                    out.setdefault("errors", []).append(f"dbos_async {loop}: {error}")
            if "dbos" in urls:
                m = args.dbos_burst
                _progress(f"burst {number}/{args.rounds}: dbos, {m} workflows at once "
                          "(child process)")
                try:
                    rounds["dbos"].append(await bench_dbos.run_subprocess(
                        urls["dbos"], workflows=m, concurrency=m, pool_size=pool,
                        warmup=min(m, 50), burst=True))
                except RuntimeError as error:
                    _progress(f"dbos burst failed: {error}")
                    out.setdefault("errors", []).append(f"dbos: {error}")
    finally:
        if not args.keep:
            for name in names.values():
                await drop_database(args.url, name)
    for key, runs in rounds.items():
        if runs:
            out[key] = aggregate(key, runs)
    out["rounds"] = rounds
    return out


def _uvloop_installed() -> bool:
    try:
        eventloop.loop_factory(True)
    except ConfigurationError:
        return False
    return True


async def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    """dbos_async's latencies, then the dbos package's (child process), one operation at a
    time; figures per operation, and dbos median / dbos_async median."""
    samples, pool = args.latency_samples, args.pool_size
    other = max(1, samples // 2)
    names = {kind: f"{args.db_prefix}_latency_{kind}" for kind in ("dbos_async", "dbos")}
    if args.skip_dbos:
        del names["dbos"]
    out: dict[str, Any] = {}
    urls = {kind: await recreate_database(args.url, name) for kind, name in names.items()}
    try:
        _progress(f"latency: dbos_async, {samples} samples per operation "
                  f"({other} through another executor)")
        out["dbos_async"] = await bench_latency_dbos_async.run(
            urls["dbos_async"], samples=samples, other_samples=other,
            warmup=min(samples, 20), pool_size=pool)
        if "dbos" in urls:
            m = args.dbos_latency_samples
            _progress(f"latency: dbos, {m} samples per operation (child process)")
            try:
                out["dbos"] = await bench_latency_dbos.run_subprocess(
                    urls["dbos"], samples=m, warmup=min(m, 5), pool_size=pool)
            except RuntimeError as error:
                _progress(f"dbos package latency run failed: {error}")
                out["dbos_error"] = str(error)
    finally:
        if not args.keep:
            for name in names.values():
                await drop_database(args.url, name)
    out["ratio_dbos_over_dbos_async_median"] = _latency_ratios(out)
    return out


def _latency_ratios(out: dict[str, Any]) -> dict[str, dict[str, float]]:
    """dbos median / dbos_async median, per operation and per dbos_async path."""
    peer = out.get("dbos", {}).get("operations", {})
    ratios: dict[str, dict[str, float]] = {}
    for path in ("same_executor", "other_executor"):
        for op, fast in out["dbos_async"][path].items():
            slow = peer.get(op, {})
            if fast.get("median_ms") and slow.get("median_ms"):
                ratios.setdefault(path, {})[op] = slow["median_ms"] / fast["median_ms"]
    return ratios


SYSTEMS = ("dbos_async", "dbos_async_sharded", "dbos", "raw", "raw_default_reset")
SHARD_KEYS = 100
"""Keys the sharded round spreads its workflows over (plain PostgreSQL, sharded schema)."""
RATES = ("workflows_per_s", "steps_per_s", "inserts_per_s")


def aggregate(key: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rates over the rounds (with their spread); statement counts summed."""
    merged: dict[str, Any] = {"rounds": len(runs)}
    for name in ("workflows", "inserts", "steps", "dbos_version", "pool_size", "pool_reset",
                 "conductor", "otlp"):
        if name in runs[0]:
            merged[name] = runs[0][name]
    merged["seconds"] = statistics.median(r["seconds"] for r in runs)
    for rate in RATES:
        if rate in runs[0]:
            values = [r[rate] for r in runs]
            merged[rate] = statistics.median(values)
            merged[rate + "_range"] = [min(values), max(values)]
    if "server" in runs[0]:
        unit = "workflows" if "workflows" in runs[0] else "inserts"
        transactions = sum(r["server"]["transactions"] for r in runs)
        merged["server"] = {"transactions": transactions,
                            f"transactions_per_{unit[:-1]}":
                                transactions / sum(r[unit] for r in runs)}
    if key.startswith("dbos_async"):
        merged["statements"] = _merge_statements(runs)
        total_wf = sum(r["workflows"] for r in runs)
        merged["server"].update({
            "workflow_status_inserts":
                sum(r["server"]["workflow_status_inserts"] for r in runs),
            "operation_outputs_inserts":
                sum(r["server"]["operation_outputs_inserts"] for r in runs),
        })
        merged["measured_workflows_total"] = total_wf
        merged["pool_connections"] = [r["pool_connections"] for r in runs]
        merged["event_loop"] = runs[0]["event_loop"]
        if "profile" in runs[0]:
            merged["profile"] = runs[0]["profile"]
    if key == "dbos":
        counts: Counter[str] = Counter()
        for r in runs:
            counts.update(r["client_counts"])
        total_wf = sum(r["workflows"] for r in runs)
        merged["client_counts_per_workflow"] = {k: v / total_wf for k, v in counts.items()}
        merged["round_trips_per_workflow"] = sum(counts.values()) / total_wf
    return merged


def _merge_statements(runs: list[dict[str, Any]]) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    for r in runs:
        kinds.update(r["statements"]["by_kind"])
    return bench_dbos_async.statement_figures(
        kinds, sum(r["workflows"] for r in runs), sum(r["steps"] for r in runs))


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    fast = results["dbos_async"]
    statements = fast["statements"]
    summary: dict[str, Any] = {
        "step_fraction_of_raw": fast["steps_per_s"] / results["raw"]["inserts_per_s"],
        "step_fraction_of_raw_default_reset":
            fast["steps_per_s"] / results["raw_default_reset"]["inserts_per_s"],
        # Every statement counted, per second, against the same floor: 100% is the ceiling
        # here, while 3 steps out of 5 statements cap the step fraction at 60%.
        "statement_fraction_of_raw": fast["workflows_per_s"] * statements["per_workflow"]
            / results["raw"]["inserts_per_s"],
        "statements_per_workflow": statements["per_workflow"],
        "statements_per_step": statements["per_step"],
        "round_trips_per_workflow": statements["round_trips_per_workflow"],
        "round_trips_per_step": statements["round_trips_per_step"],
        "server_commits_per_workflow": fast["server"]["transactions_per_workflow"],
    }
    if "dbos" in results:
        summary["workflow_ratio_vs_dbos"] = (
            fast["workflows_per_s"] / results["dbos"]["workflows_per_s"])
    burst = results.get("burst", {})
    fast_burst = burst.get(f"dbos_async_{burst.get('default_loop')}")
    if fast_burst:
        ceiling = results["raw"]["inserts_per_s"] / WRITES_PER_WORKFLOW
        summary["burst_one_write_per_commit_ceiling"] = ceiling
        summary["burst_over_ceiling"] = fast_burst["workflows_per_s"] / ceiling
        if "dbos" in burst:
            summary["burst_over_dbos"] = (fast_burst["workflows_per_s"]
                                          / burst["dbos"]["workflows_per_s"])
    if "dbos_async_uvloop" in burst and "dbos_async_asyncio" in burst:
        summary["burst_uvloop_over_asyncio"] = (burst["dbos_async_uvloop"]["workflows_per_s"]
                                                / burst["dbos_async_asyncio"]["workflows_per_s"])
    if "dbos_async_sharded" in results:
        keyed = results["dbos_async_sharded"]
        summary["sharded_fraction_of_unsharded"] = (
            keyed["workflows_per_s"] / fast["workflows_per_s"])
        summary["sharded_round_trips_per_step"] = keyed["statements"]["round_trips_per_step"]
    return summary


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _verdict(ok: bool) -> str:
    return "ok" if ok else "BELOW TARGET"


def report(results: dict[str, Any], profiled: bool) -> str:
    server = results["server"]
    out = [
        "dbos_async benchmark",
        f"  PostgreSQL {server['server_version']}: synchronous_commit="
        f"{server['synchronous_commit']}, fsync={server['fsync']}, "
        f"shared_buffers={server['shared_buffers']}",
        f"  {results['machine']['cpus']} CPUs, Python {results['machine']['python']}",
    ]
    if "summary" in results:
        out += throughput_report(results, profiled)
    if "queues" in results:
        out += queue_report(results["queues"])
    if "waiters" in results:
        out += waiters_report(results["waiters"])
    if "latency" in results:
        out += latency_report(results["latency"])
    if "transactions" in results:
        out += ["", *bench_transactions.report(results["transactions"])]
    if "metrics" in results:
        out += bench_metrics.report(results["metrics"])
    out += targets_report(results)
    return "\n".join(out)


def targets(results: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(figure, measured, target, met) for each target this run measured."""
    rows: list[tuple[str, str, str, bool | None]] = []
    s = results.get("summary", {})
    if "burst_over_ceiling" in s:
        rows.append(("burst wf/s / one-write-per-commit ceiling "
                     f"({s['burst_one_write_per_commit_ceiling']:,.0f} wf/s = raw inserts/s / "
                     f"{WRITES_PER_WORKFLOW})", f"{s['burst_over_ceiling']:.2f}x",
                     f">= {BURST_CEILING_TARGET}x",
                     s["burst_over_ceiling"] >= BURST_CEILING_TARGET))
    if "burst_over_dbos" in s:
        rows.append(("burst wf/s, dbos_async / dbos", f"{s['burst_over_dbos']:.1f}x",
                     f">= {BURST_DBOS_TARGET:.0f}x", s["burst_over_dbos"] >= BURST_DBOS_TARGET))
    if "burst_uvloop_over_asyncio" in s:
        rows.append(("burst wf/s, uvloop / asyncio loop",
                     f"{s['burst_uvloop_over_asyncio']:.2f}x", "", None))
    q = results.get("queues", {})
    drains = q.get("throughput", {})
    one, zero = drains.get("dbos_async_1"), drains.get("dbos_async_0step_1")
    pgq = q.get("pgqueuer", {}).get("runs", {}).get("10")
    if one and pgq:
        ratio = one["workflows_per_s"] / pgq["jobs_per_s"]
        rows.append(("1-step drain wf/s, dbos_async / pgqueuer at batch size 10",
                     f"{ratio:.2f}x", f">= {QUEUE_PGQUEUER_TARGET:.0f}x",
                     ratio >= QUEUE_PGQUEUER_TARGET))
    pgq100 = q.get("pgqueuer", {}).get("runs", {}).get("100")
    for label, r, target in (("0-step", zero, ZERO_STEP_PGQUEUER_100_TARGET),
                             ("1-step", one, ONE_STEP_PGQUEUER_100_TARGET)):
        if r and pgq100:
            ratio = r["workflows_per_s"] / pgq100["jobs_per_s"]
            rows.append((f"{label} drain wf/s, dbos_async / pgqueuer at batch size 100",
                         f"{ratio:.2f}x", f">= {target:g}x", ratio >= target))
    for label, r in (("0-step", drains.get("dbos_async_wide_0step_1")),
                     ("1-step", drains.get("dbos_async_wide_1"))):
        if r and pgq100:  # no target: pgqueuer's drain caps no jobs in flight
            ratio = r["workflows_per_s"] / pgq100["jobs_per_s"]
            rows.append((f"{label} drain wf/s at worker_concurrency "
                         f"{r['worker_concurrency']}, dbos_async / pgqueuer at batch size 100",
                         f"{ratio:.2f}x", "", None))
    for label, r in (("1-step", one), ("0-step", zero)):
        if r and r.get("server"):
            per = r["server"]["transactions_per_workflow"]
            rows.append((f"{label} drain commits per workflow", f"{per:.2f}",
                         f"<= {QUEUE_COMMITS_TARGET}", per <= QUEUE_COMMITS_TARGET))
    idle = q.get("throughput", {}).get("dbos_async_idle_1")
    for label, r in (("1-step drain", one), ("after an idle spell", idle)):
        if r:  # the backlog's writer sends no notification itself
            poll_ms = r["polling_interval"] * 1000
            after = f", {r['idle_seconds']:g} s idle" if r.get("idle_seconds") else ""
            rows.append((f"un-notified backlog: commit -> first start ({label}{after})",
                         f"{r['commit_to_first_start_ms']:.0f} ms",
                         f"<= {poll_ms:.0f} ms (poll)",
                         r["commit_to_first_start_ms"] <= poll_ms))
    if zero:
        rows.append(("0-step drain wf/s", f"{zero['workflows_per_s']:,.0f}",
                     f">= {ZERO_STEP_DRAIN_TARGET:,.0f}",
                     zero["workflows_per_s"] >= ZERO_STEP_DRAIN_TARGET))
    lone = results.get("latency", {}).get("dbos_async", {}).get("alone")
    start_result = (results.get("latency", {}).get("dbos_async", {})
                    .get("same_executor", {}).get("start_result", {}))
    if lone:
        per_step = (lone["statements"]["by_kind"].get("step checkpoint", 0)
                    / (lone["workflows"] * lone["steps_per_workflow"]))
        rows.append(("workflow alone: step checkpoint round trips per step", f"{per_step:.2f}",
                     f"{EXPECTED_PER_STEP:.0f}", per_step <= EXPECTED_PER_STEP * COUNT_TOLERANCE))
    if "median_ms" in start_result:
        rows.append(("workflow alone: start -> result median",
                     f"{start_result['median_ms']:.1f} ms",
                     f"< {LATENCY_MEDIAN_TARGET_MS:.0f} ms",
                     start_result["median_ms"] < LATENCY_MEDIAN_TARGET_MS))
    rows += _serial_start_targets(results.get("latency", {}))
    notify = q.get("latency", {}).get("dbos_async", {}).get("notify", {})
    if "median_ms" in notify:
        rows.append(("enqueue -> start median (notified)", f"{notify['median_ms']:.1f} ms",
                     f"< {QUEUE_LATENCY_TARGET_MS:.0f} ms",
                     notify["median_ms"] < QUEUE_LATENCY_TARGET_MS))
    if "transactions" in results:
        added = bench_transactions.added_per_transaction(results["transactions"])
        rows.append(("statements a transactional step adds beyond the user's SQL",
                     f"{added:.2f}", f"<= {bench_transactions.ADDED_TARGET}",
                     round(added, 2) <= bench_transactions.ADDED_TARGET))
    if "metrics" in results:
        m = results["metrics"]
        for mode in bench_metrics.EXPORTERS:
            rows.append((f"CPU cost of metrics per workflow ({mode}): run (on - off) + "
                         "collection",
                         f"{m[mode]['cpu_cost_us']:+.1f} + {m[mode]['collect_cpu_us']:.1f} = "
                         f"{bench_metrics.total_cost_us(m, mode):+.1f} us",
                         f"<= noise ({m['off']['cpu_spread_us']:.0f} us)",
                         bench_metrics.within_noise(m, mode)))
    return rows


def _serial_start_targets(lat: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """A start alone while others run against a raw insert, and serial starts against the
    `dbos` package's (see latency.serial_start)."""
    serial = lat.get("dbos_async", {}).get("same_executor", {}).get("serial_start", {})
    if "median_ms" not in serial or "median_ms" not in serial["insert_row"]:
        return []
    ratio = serial["median_ms"] / serial["insert_row"]["median_ms"]
    rows: list[tuple[str, str, str, bool | None]] = [(
        "start awaited alone while others run: median / raw single-row insert's",
        f"{ratio:.2f}x ({serial['median_ms']:.2f} / {serial['insert_row']['median_ms']:.2f} ms)",
        f"<= {SERIAL_START_RAW_TARGET:g}x", ratio <= SERIAL_START_RAW_TARGET)]
    peer = lat.get("dbos", {}).get("operations", {}).get("serial_start", {})
    if "starts_per_s" in peer:
        ratio = serial["starts_per_s"] / peer["starts_per_s"]
        rows.append(("serial starts: dbos_async / dbos",
                     f"{ratio:.1f}x ({serial['starts_per_s']:,.0f} / "
                     f"{peer['starts_per_s']:,.0f} per s)",
                     f">= {SERIAL_START_DBOS_TARGET:g}x", ratio >= SERIAL_START_DBOS_TARGET))
    return rows


def targets_report(results: dict[str, Any]) -> list[str]:
    rows = targets(results)
    if not rows:
        return []
    lines: list[tuple[str, ...]] = [("figure", "measured", "target", "")]
    for figure, measured, target, met in rows:
        lines.append((figure, measured, target, "" if met is None else _verdict(met)))
    return ["", "Targets, all from this run", *table(lines, "<><<")]


def _commits(result: dict[str, Any]) -> str:
    """Transactions per workflow (or insert) from pg_stat_database, for a table cell."""
    server = result.get("server") or {}
    value = server.get("transactions_per_workflow", server.get("transactions_per_insert"))
    return f"{value:.2f}" if value is not None else ""


def _per_step(result: dict[str, Any]) -> str:
    return f"{result['statements']['per_step']:.2f}" if "statements" in result else ""


def throughput_report(results: dict[str, Any], profiled: bool) -> list[str]:
    p, s = results["parameters"], results["summary"]
    fast = results["dbos_async"]
    out = [
        "",
        "Throughput: three-step workflows, at most C started-and-awaited at a time",
        f"  N={p['workflows']} workflows for dbos_async, {p['dbos_workflows']} for dbos; "
        f"concurrency C={p['concurrency']}; pool size {p['pool_size']} for all three",
        f"  {p['rounds']} interleaved round(s) per system; rates are medians (min-max); "
        "commits/wf: xact_commit + xact_rollback per workflow (per insert for raw), "
        "pg_stat_database; stmts/step: the client's query logger",
        f"  dbos_async here runs on {fast['event_loop']}",
        "",
    ]
    rows: list[tuple[str, ...]] = [
        ("system", "per round", "seconds", "workflows/s", "steps or inserts/s", "min-max",
         "commits/wf", "stmts/step")]

    def spread(result: dict[str, Any], rate: str) -> str:
        low, high = result[rate + "_range"]
        return f"{low:,.0f}-{high:,.0f}" if result["rounds"] > 1 else ""

    rows.append(("dbos_async" + (" (PROFILED)" if profiled else ""),
                 f"{fast['workflows']} wf", f"{fast['seconds']:.2f}",
                 f"{fast['workflows_per_s']:,.0f}", f"{fast['steps_per_s']:,.0f}",
                 spread(fast, "steps_per_s"), _commits(fast), _per_step(fast)))
    if "dbos_async_sharded" in results:
        keyed = results["dbos_async_sharded"]
        rows.append((f"dbos_async, sharded schema, {SHARD_KEYS} keys",
                     f"{keyed['workflows']} wf", f"{keyed['seconds']:.2f}",
                     f"{keyed['workflows_per_s']:,.0f}", f"{keyed['steps_per_s']:,.0f}",
                     spread(keyed, "steps_per_s"), _commits(keyed), _per_step(keyed)))
    if "dbos" in results:
        peer = results["dbos"]
        rows.append((f"dbos {peer.get('dbos_version') or ''} (child process)".replace("  ", " "),
                     f"{peer['workflows']} wf", f"{peer['seconds']:.2f}",
                     f"{peer['workflows_per_s']:,.1f}", f"{peer['steps_per_s']:,.0f}",
                     spread(peer, "steps_per_s"), _commits(peer), ""))
    for key, label in (("raw", "raw asyncpg INSERT, no pool reset"),
                       ("raw_default_reset", "raw asyncpg INSERT, default pool reset")):
        raw = results[key]
        rows.append((label, f"{raw['inserts']} rows", f"{raw['seconds']:.2f}", "",
                     f"{raw['inserts_per_s']:,.0f}", spread(raw, "inserts_per_s"),
                     _commits(raw), ""))
    out += table(rows, "<>>>>>>>")
    if "burst" in results:
        out += burst_report(results["burst"], s)

    out += ["", "Targets"]
    rows = [("figure", "measured", "target", "")]
    if "workflow_ratio_vs_dbos" in s:
        ratio = s["workflow_ratio_vs_dbos"]
        rows.append(("workflows/s, dbos_async / dbos", f"{ratio:.1f}x",
                     f">= {WORKFLOW_RATIO_TARGET:.0f}x (DESIGN {WORKFLOW_RATIO_DESIGN:.0f}x)",
                     _verdict(ratio >= WORKFLOW_RATIO_TARGET)))
    if "sharded_fraction_of_unsharded" in s:
        keyed = s["sharded_fraction_of_unsharded"]
        rows.append((f"workflows/s, sharded ({SHARD_KEYS} keys) / unsharded", f"{keyed:.0%}",
                     ">= 85%", _verdict(keyed >= 0.85)))
        rows.append(("  round trips per step, sharded",
                     f"{s['sharded_round_trips_per_step']:.2f}", f"{EXPECTED_PER_STEP:.0f}",
                     _verdict(s["sharded_round_trips_per_step"] < EXPECTED_PER_STEP + 0.1)))
    frac = s["step_fraction_of_raw"]
    rows.append(("step checkpoints/s / raw inserts/s", f"{frac:.0%}",
                 f">= {RAW_FRACTION_TARGET:.0%}", _verdict(frac >= RAW_FRACTION_TARGET)))
    rows.append(("  (vs raw with default pool reset)",
                 f"{s['step_fraction_of_raw_default_reset']:.0%}", "", ""))
    rows.append(("  (all dbos_async statements/s / raw)",
                 f"{s['statement_fraction_of_raw']:.0%}", "", ""))
    for label, key, expected in (
        ("statements per step (dbos_async SQL)", "statements_per_step", EXPECTED_PER_STEP),
        ("statements per 3-step workflow", "statements_per_workflow", EXPECTED_PER_WORKFLOW),
        ("round trips per step (incl. pool reset)", "round_trips_per_step", EXPECTED_PER_STEP),
        ("round trips per workflow (incl. reset)", "round_trips_per_workflow",
         EXPECTED_PER_WORKFLOW),
        ("server commits per workflow", "server_commits_per_workflow", EXPECTED_PER_WORKFLOW),
    ):
        rows.append((label, f"{s[key]:.2f}", f"{expected:.0f}",
                     _verdict(s[key] <= expected * COUNT_TOLERANCE)))
    out += table(rows, "<>><")

    out += ["", "dbos_async statements in the measured runs (client-side query logger)"]
    rows = [("kind", "count", "per workflow")]
    for kind, count in fast["statements"]["by_kind"].items():
        rows.append((kind, str(count), f"{count / fast['measured_workflows_total']:.2f}"))
    total = fast["statements"]["total_with_pool_reset"]
    rows.append(("total", str(total), f"{total / fast['measured_workflows_total']:.2f}"))
    out += table(rows, "<>>")
    srv = fast["server"]
    out += [
        "",
        "dbos_async, server side (pg_stat_database / pg_stat_user_tables deltas)",
        f"  commits {srv['transactions']} ({srv['transactions_per_workflow']:.2f} per "
        "workflow), "
        f"workflow_status inserts {srv['workflow_status_inserts']}, "
        f"operation_outputs inserts {srv['operation_outputs_inserts']}",
        f"  pool connections before/after the run: {fast['pool_connections']}",
    ]
    for error in results.get("dbos_errors", []):
        out += ["", "dbos package: a round FAILED (see stderr):", "  " + error.splitlines()[0]]
    if "dbos" in results:
        peer = results["dbos"]
        per = peer["client_counts_per_workflow"]
        out += [
            "",
            "dbos package, client side (SQLAlchemy events, approximate round trips)",
            "  per workflow: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items()))
            + f"; total {peer['round_trips_per_workflow']:.1f}",
            f"  conductor connected: {peer['conductor']}, OTLP export: {peer['otlp']}",
        ]
    if "profile" in fast:
        out += ["", "cProfile of the dbos_async measured run"]
        for title, text in fast["profile"].items():
            out += ["", f"--- {title} ---", text.rstrip()]
    return out


def burst_report(burst: dict[str, Any], s: dict[str, Any]) -> list[str]:
    out = [
        "",
        f"Burst: {burst['workflows']} three-step workflows started at once with start_workflow,"
        f" then every result gathered ({burst['dbos_workflows']} for dbos); each round a child"
        " process per system and event loop",
        "",
    ]
    rows: list[tuple[str, ...]] = [("system", "event loop", "workflows", "seconds",
                                    "workflows/s", "min-max", "commits/wf", "stmts/step")]
    for key in [f"dbos_async_{loop}" for loop in burst["loops"]] + ["dbos"]:
        r = burst.get(key)
        if r is None:
            continue
        low, high = r["workflows_per_s_range"]
        system = "dbos_async" if key != "dbos" else f"dbos {r.get('dbos_version') or ''}"
        loop = key.removeprefix("dbos_async_") if key != "dbos" else "asyncio (its own)"
        if key == f"dbos_async_{burst['default_loop']}":
            loop += " (dbos_async.run's choice)"
        rows.append((system.rstrip(), loop, str(r["workflows"]), f"{r['seconds']:.2f}",
                     f"{r['workflows_per_s']:,.0f}",
                     f"{low:,.0f}-{high:,.0f}" if r["rounds"] > 1 else "",
                     _commits(r), _per_step(r)))
    out += table(rows, "<<>>>>>>")
    if "burst_uvloop_over_asyncio" in s:
        out.append(f"  uvloop / asyncio loop, dbos_async burst workflows/s: "
                   f"{s['burst_uvloop_over_asyncio']:.2f}x")
    elif len(burst["loops"]) == 1:
        out.append("  uvloop is not installed (the speed extra): no loop comparison")
    for error in burst.get("errors", []):
        out.append("  FAILED: " + error.splitlines()[0])
    return out


def pgqueuer_report(pgq: dict[str, Any]) -> list[str]:
    if "skipped" in pgq or "error" in pgq:
        return ["", "pgqueuer: " + ("skipped: " + pgq["skipped"] if "skipped" in pgq
                                    else "FAILED: " + pgq["error"].splitlines()[0])]
    if not pgq:
        return []
    out = ["", f"pgqueuer {pgq['pgqueuer_version']} (child process, {pgq['event_loop']}): "
           "trivial jobs enqueued in one batched call, then drained by a QueueManager in "
           "drain mode", ""]
    rows: list[tuple[str, ...]] = [("batch size", "jobs", "enqueue s", "enqueue/s", "drain s",
                                    "jobs/s", "commits/job")]
    for r in pgq["runs"].values():
        rows.append((str(r["batch_size"]), str(r["jobs"]), f"{r['enqueue_seconds']:.2f}",
                     f"{r['enqueue_per_s']:,.0f}", f"{r['drain_seconds']:.2f}",
                     f"{r['jobs_per_s']:,.0f}", f"{r['transactions_per_job']:.2f}"))
    return out + table(rows, ">>>>>>>")


def queue_report(q: dict[str, Any]) -> list[str]:
    p = q["parameters"]
    out = [
        "",
        "Queues: drain a backlog enqueued by a separate client process "
        "(SQL function dbos.enqueue_workflow, one transaction)",
        f"  one-step workflows; {p['workflows']} for dbos_async, {p['dbos_workflows']} for dbos; "
        f"worker_concurrency {p['worker_concurrency']} per executor process, polling "
        f"interval {p['polling_interval']:g} s, pool size {p['pool_size']}, for both",
        "  drain = first start to last completion (workflow_status timestamps)",
        "",
    ]
    rows: list[tuple[str, ...]] = [("system", "workflow", "executors", "workflows", "drain s",
                                    "workflows/s", "commits/wf", "commit->1st start",
                                    "split", "enqueue/s")]
    for r in q["throughput"].values():
        workflow = r.get("workflow", "one_step")
        if r.get("idle_seconds"):
            workflow += f", {r['idle_seconds']:g} s idle"
        if r.get("worker_concurrency", p["worker_concurrency"]) != p["worker_concurrency"]:
            workflow += f", worker_concurrency {r['worker_concurrency']}"
        rows.append((r["system"], workflow, str(r["processes"]),
                     str(r["workflows"]), f"{r['drain_seconds']:.2f}",
                     f"{r['workflows_per_s']:,.0f}", _commits(r),
                     f"{r['commit_to_first_start_ms']:.0f} ms",
                     "/".join(str(n) for n in r["per_executor"].values()),
                     f"{r['enqueue']['per_s']:,.0f}"))
        if r["succeeded"] != r["workflows"]:
            rows.append(("", "", "", f"only {r['succeeded']} succeeded", "", "", "", "", "",
                         ""))
    out += table(rows, "<<>>>>>><>")
    out += ["  commits/wf: xact_commit + xact_rollback over the drain per workflow "
            "(pg_stat_database; dbos_async only; the enqueue's one transaction included)"]
    out += pgqueuer_report(q.get("pgqueuer", {}))
    for processes, ratio in q["ratio_dbos_async_over_dbos"].items():
        out.append(f"  drain rate dbos_async / dbos, {processes} executor process(es): "
                   f"{ratio:.1f}x (target >= {QUEUE_RATIO_TARGET:.0f}x: "
                   f"{_verdict(ratio >= QUEUE_RATIO_TARGET)})")
    out += ["", "Queues: enqueue -> start latency, one at a time (ms from the SQL function's "
            "return, its commit done, to the workflow body's first line; one clock)"]
    rows = [("system", "enqueue", "poll s", "samples", "median", "p99", "max", "target")]
    lat = q["latency"]
    lines: list[tuple[str, str, dict[str, Any] | None, bool]] = [
        ("dbos_async", "SQL function + NOTIFY", lat.get("dbos_async", {}).get("notify"), True),
        ("dbos_async", "SQL function only", lat.get("dbos_async", {}).get("equal_poll"),
         False),
        ("dbos " + str(lat.get("dbos", {}).get("dbos_version") or ""), "SQL function",
         lat.get("dbos", {}).get("equal_poll"), False),
        ("dbos " + str(lat.get("dbos", {}).get("dbos_version") or ""),
         "SQL function (default poll)", lat.get("dbos", {}).get("default_poll"), False),
    ]
    for system, how, figures, targeted in lines:
        if not figures or "median_ms" not in figures:
            continue
        target = ""
        if targeted:
            target = (f"< {QUEUE_LATENCY_TARGET_MS:.0f} ms "
                      + _verdict(figures["median_ms"] < QUEUE_LATENCY_TARGET_MS))
        rows.append((system.rstrip(), how, f"{figures['polling_interval']:g}",
                     str(figures["samples"]) + (f" ({figures['lost']} lost)"
                                                if figures["lost"] else ""),
                     _ms(figures, "median_ms"), _ms(figures, "p99_ms"),
                     _ms(figures, "max_ms"), target))
    out += table(rows, "<<>>>>><")
    dbos_lat = lat.get("dbos")
    if dbos_lat:
        out.append(f"  dbos: conductor connected: {dbos_lat['conductor']}, "
                   f"OTLP export: {dbos_lat['otlp']}")
    for error in q.get("errors", []):
        out += ["  FAILED: " + error.splitlines()[0]]
    return out


def waiters_report(w: dict[str, Any]) -> list[str]:
    out = [
        "",
        "Waiting workflows: W workflows in one process, each in recv (10 min timeout), then "
        "one message each",
        "  memory is resident memory above the warmed-up baseline; idle statements are the "
        "pool's, counted on the client while all W wait",
        "",
    ]
    rows: list[tuple[str, ...]] = [("system", "W", "start s", "all waiting s", "KiB/waiter",
                                    "threads", "idle stmts/s", "wake all s", "woken/s")]
    for system in ("dbos_async", "dbos"):
        r = w.get(system)
        if r is None:
            if f"{system}_error" in w:
                rows.append((system, "FAILED", "", "", "", "", "", "", ""))
            continue
        rows.append((f"{system} {r['version']}", f"{r['waiters']:,}", f"{r['start_s']:.1f}",
                     f"{r['all_waiting_s']:.1f}", f"{r['kib_per_waiter']:.1f}",
                     f"{r['threads_baseline']} -> {r['threads_waiting']}",
                     f"{r['idle_statements_per_s']:.1f}", f"{r['send_to_last_result_s']:.1f}",
                     f"{r['woken_per_s']:,.0f}"))
    out += table(rows, "<>>>>>>>>")
    fast, peer = w.get("dbos_async"), w.get("dbos")
    if fast and peer:
        def per_waiter(r: dict[str, Any]) -> float:
            return (r["threads_waiting"] - r["threads_baseline"]) / r["waiters"]

        out += [
            f"  threads added per waiting workflow: dbos_async {per_waiter(fast):.3f}, "
            f"dbos {per_waiter(peer):.3f}",
            f"  memory per waiting workflow, dbos / dbos_async: "
            f"{peer['kib_per_waiter'] / max(fast['kib_per_waiter'], 0.001):.1f}x; "
            f"wake-up rate dbos_async / dbos: {fast['woken_per_s'] / peer['woken_per_s']:.1f}x",
        ]
    for system in ("dbos_async", "dbos"):
        if f"{system}_error" in w:
            out.append(f"  {system} FAILED: " + w[f"{system}_error"].splitlines()[0])
    return out


def _ms(figures: dict[str, Any], name: str) -> str:
    return f"{figures[name]:.1f}" if name in figures else "n/a"


def latency_report(lat: dict[str, Any]) -> list[str]:
    fast = lat["dbos_async"]
    peer = lat.get("dbos")
    ratios = lat["ratio_dbos_over_dbos_async_median"]
    dbos_label = f"dbos {peer.get('dbos_version') or ''}".rstrip() if peer else "dbos"
    out = [
        "",
        "Latency: one operation at a time, ms from the write call to the waiter's wake-up",
        f"  dbos_async: {fast['samples']} samples per operation through the executor running "
        f"the workflows, {fast['other_executor_samples']} through another executor (a second "
        "DBOS instance: LISTEN/NOTIFY, "
        f"notification_coalesce_ms={fast['notification_coalesce_ms']:g}), after "
        f"{fast['warmup']} warm-up samples",
    ]
    if peer:
        out.append(f"  {dbos_label} (child process): {peer['samples']} samples per operation "
                   f"after {peer['warmup']}; with so few, p99 is close to the maximum")
    out.append("  p99 is nearest-rank; 'skipped': samples whose waiter was not waiting yet")
    rows: list[tuple[str, ...]] = [("operation", "system", "samples", "median", "p99", "max",
                                    "skipped", "dbos/this", "target")]
    for op, label in latency.OPERATIONS.items():
        systems = [("dbos_async", fast["same_executor"].get(op),
                    ratios.get("same_executor", {}).get(op)),
                   ("dbos_async, other executor", fast["other_executor"].get(op),
                    ratios.get("other_executor", {}).get(op))]
        if peer:
            systems.append((f"{dbos_label} (child process)",
                            peer["operations"].get(op), None))
        elif "dbos_error" in lat:
            systems.append(("dbos (FAILED, see stderr)", None, None))
        for index, (system, figures, ratio) in enumerate(systems):
            first = label if index == 0 else ""
            if figures is None or "error" in figures:
                note = figures["error"].splitlines()[0][:60] if figures else "n/a"
                rows.append((first, system, "", "n/a", "n/a", "", "", "", note
                             if figures else ""))
                continue
            target = ""
            if system.startswith("dbos_async") and "median_ms" in figures:
                target = (f"< {LATENCY_MEDIAN_TARGET_MS:.0f} ms "
                          + _verdict(figures["median_ms"] < LATENCY_MEDIAN_TARGET_MS))
            rows.append((first, system, str(figures["samples"]), _ms(figures, "median_ms"),
                         _ms(figures, "p99_ms"), _ms(figures, "max_ms"),
                         str(figures["not_waiting"]) if figures["not_waiting"] else "",
                         f"{ratio:.1f}x" if ratio is not None else "", target))
    out += table(rows, "<<>>>>>><")
    serial = fast["same_executor"].get("serial_start", {})
    if "starts_per_s" in serial:
        peer_serial = (peer or {}).get("operations", {}).get("serial_start", {})
        out.append(f"  serial starts: {serial['starts_per_s']:,.0f} per s"
                   + (f" ({dbos_label}: {peer_serial['starts_per_s']:,.0f} per s)"
                      if "starts_per_s" in peer_serial else "")
                   + "; a single-row autocommit INSERT timed after each start: median "
                   f"{serial['insert_row']['median_ms']:.2f}, p99 "
                   f"{serial['insert_row']['p99_ms']:.2f} ms")
    lone = fast.get("alone")
    if lone:
        kinds, count = lone["statements"]["by_kind"], lone["workflows"]
        others = ", ".join(f"{kind.removeprefix('other: ')[:50]} {n / count:.2f}"
                           for kind, n in kinds.items() if kind.startswith("other"))
        out.append(f"  a workflow alone ({count} one-step workflows, one at a time), "
                   f"statements per workflow: start {kinds.get('workflow start', 0) / count:.2f}"
                   f", step checkpoint {kinds.get('step checkpoint', 0) / count:.2f}, finish "
                   f"{kinds.get('workflow finish', 0) / count:.2f}"
                   + (f"; other: {others}" if others else ""))
    if peer:
        out.append(f"  {dbos_label}: conductor connected: {peer['conductor']}, "
                   f"OTLP export: {peer['otlp']}")
    if "dbos_error" in lat:
        out += ["  dbos package latency run FAILED:",
                "  " + lat["dbos_error"].splitlines()[0]]
    return out


def _without_profile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_profile(v) for k, v in value.items() if k != "profile"}
    if isinstance(value, list):
        return [_without_profile(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = dbos_async.run(run(args))
    print(report(results, args.profile))
    if args.json is not None:
        data = _without_profile(results)
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"\nResults written to {args.json}")


if __name__ == "__main__":
    main()
