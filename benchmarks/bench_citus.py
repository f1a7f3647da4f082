"""Citus against plain PostgreSQL: the same sharded workload on both, in one run, with the CPU
time every server spends on it and the round trips the executor sends.

    python benchmarks/bench_citus.py --citus-url postgresql://postgres@127.0.0.1:5433/citus
    DBOS_BENCH_CITUS_URL=postgresql://postgres@127.0.0.1:5433/citus make bench-citus

The Citus URL names a database with the citus extension on the coordinator of a cluster with
worker nodes, as a user that may create databases; the plain server is ``--plain-url``
(127.0.0.1:5432 by default). Each run makes fresh databases: ``PREFIX_plain`` on the plain
server, and ``PREFIX`` on every node of the cluster with the extension, knowing the same
nodes (:func:`dbos_async.testing.create_citus_database`); both are dropped at the end.

The workload, plain server first, then Citus: an executor (``DBOS(sharding=True)``, the
sharded schema) runs three-step workflows, workflow ``i`` under the key ``tenant-{i % K}``
(K = 100), C = 100 started-and-awaited at a time, W = 200 of warm-up then N = 1,000
measured. On Citus the executor is connected to the coordinator, or with
``--executor-node worker`` to the first worker node.

Measured over the N workflows only:

- workflows/s: N over the wall time;
- server CPU seconds per 1,000 workflows, per node: each server's whole process tree
  (postmaster and children, backends that exited included; see ``server_cpu.py``), read
  before and after. Where a server is not on this machine its CPU is not measurable and
  the report says so. Beside it, the part of the backends connected to the benchmark's
  database (alive at the end): a server shared with other work is also busy with theirs;
- client CPU seconds per 1,000 workflows: ``resource.getrusage`` of this process, which is
  the executor (and the driver of the load);
- the executor's statements and round trips per workflow and per step (a workflow's over
  its three steps), counted at asyncpg's calls in this process (``round_trips.py``), by kind.

Then the ratios: total server CPU per workflow Citus / plain, the coordinator's share of the
cluster's CPU, throughput Citus / plain, and round trips per write (a step's checkpoint, the
start and the outcome: 5 per workflow).

Capacity at 2, 4, 8 and 16 worker nodes, projected from the measured CPU per workflow
(method, also printed): every node has the same K cores, and CPU is what limits it. With c
the coordinator's CPU seconds per workflow and w the workers' together (both measured on
this cluster, with its number of workers), a cluster of N workers runs at most
``throughput(N) = min(K / c, N * K / w)`` workflows/s: the coordinator's K cores bound it
whatever N, the workers' N * K bound it in proportion. Linear scaling is ``N * K / w``
(the coordinator never the limit); the ratio to linear is ``min(1, w / (N * c))``. It
assumes a workflow costs the workers the same at any N (every statement of a key goes to
one node), that each worker holds as many shards as measured (a batch's cost grows with the
shards it spans: shards are split as workers are added, see docs/operations/citus.md) and
that the executors, which scale by adding processes, are not the limit.

The tables are distributed in one shard per worker node (``citus.shard_count`` set so for
the benchmark's database): the migration's default, which a ``citus.shard_count`` in the
cluster's own configuration would override. ``--shard-count N`` measures N shards, and
``--shard-count 0`` whatever the cluster's configuration gives.

Nothing here asserts a timing: the script prints the figures of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncpg
import round_trips
import server_cpu
from bench_dbos_async import workload
from common import DEFAULT_URL, drive, drop_database, recreate_database, server_facts, table

import dbos_async
from dbos_async import DBOS, SetShardKey
from dbos_async._database_url import Host, parse_database_url
from dbos_async.testing import (
    CitusNode,
    citus_nodes,
    create_citus_database,
    drop_citus_database,
    node_url,
)
from dbos_async.testing.databases import quoted_name

CITUS_URL_ENV = "DBOS_BENCH_CITUS_URL"
STEPS = 3
WRITES_PER_WORKFLOW = STEPS + 2
"""A step's checkpoint each, the start and the outcome."""
PROJECTED_WORKERS = (2, 4, 8, 16)
PER = 1000
"""CPU is reported per this many workflows."""
DATABASE_BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
CITUS_FACTS = ("SELECT (SELECT extversion FROM pg_extension WHERE extname = 'citus') AS citus")
SHARD_COUNT = ("SELECT count(*) FROM pg_dist_shard "
               "WHERE logicalrelid = 'dbos.workflow_status'::regclass")
"""How many shards the migration gave ``workflow_status`` (and each table co-located with
it)."""


@dataclass(frozen=True)
class Node:
    """One server whose CPU is measured: its role and label, and a URL of the benchmark's
    database on it."""

    role: str
    """``plain``, ``coordinator`` or ``worker``."""
    label: str
    url: str


@dataclass(frozen=True)
class Projection:
    workers: int
    workflows_per_s: float
    bound: str
    linear: float

    @property
    def ratio_to_linear(self) -> float:
        return self.workflows_per_s / self.linear


def project(coordinator_per_workflow: float, workers_per_workflow: float, cores: float,
            worker_counts: Sequence[int] = PROJECTED_WORKERS) -> list[Projection]:
    """``throughput(N) = min(K / c, N * K / w)`` for each N (see the module docstring); c and
    w in CPU seconds per workflow, K = ``cores`` per node."""
    projections = []
    for workers in worker_counts:
        by_workers = workers * cores / workers_per_workflow
        by_coordinator = (cores / coordinator_per_workflow if coordinator_per_workflow > 0
                          else float("inf"))
        bound = "coordinator" if by_coordinator < by_workers else "workers"
        projections.append(Projection(workers, min(by_coordinator, by_workers), bound,
                                      by_workers))
    return projections


# ---- the measured run ----

async def postmasters(nodes: Sequence[Node]) -> dict[str, int | None]:
    """Each node's postmaster PID by label, None where the server is not on this machine."""
    found: dict[str, int | None] = {}
    for node in nodes:
        conn = await asyncpg.connect(node.url)
        try:
            found[node.label] = await server_cpu.local_postmaster(conn)
        finally:
            await conn.close()
    return found


async def database_backends(nodes: Sequence[Node]) -> dict[str, list[int]]:
    """The backends connected to the benchmark's database on each node, by label."""
    backends = {}
    for node in nodes:
        conn = await asyncpg.connect(node.url)
        try:
            backends[node.label] = [r["pid"] for r in await conn.fetch(DATABASE_BACKENDS)
                                    if r["pid"] != conn.get_server_pid()]
        finally:
            await conn.close()
    return backends


def client_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(executor_url: str, nodes: Sequence[Node], args: argparse.Namespace,
                  ) -> dict[str, Any]:
    """The workload through an executor on ``executor_url``, and the CPU of ``nodes``."""
    with round_trips.not_counted():
        pids = await postmasters(nodes)
    dbos = DBOS(system_database_url=executor_url, pool_size=args.pool_size,
                name="bench_citus", application_version="bench", sharding=True)
    three_steps = workload(dbos)

    async def one(i: int) -> None:
        with SetShardKey(f"tenant-{i % args.shard_keys}"):
            handle = await dbos.start_workflow(three_steps, i)
        result = await handle.get_result()
        if result != (i + 1) * 2 - 2:
            raise RuntimeError(f"workflow {i} returned {result!r}")

    local = [pid for pid in pids.values() if pid is not None]
    async with dbos:
        await drive(args.warmup, args.concurrency, one)
        trees_before = server_cpu.read_trees(local)
        client_before = client_cpu_seconds()
        counted_before = round_trips.COUNTER.snapshot()
        began = time.perf_counter()
        await drive(args.workflows, args.concurrency, one)
        elapsed = time.perf_counter() - began
        counted = round_trips.COUNTER.since(counted_before)
        client = client_cpu_seconds() - client_before
        trees_after = server_cpu.read_trees(local)
        with round_trips.not_counted():
            backends = await database_backends(nodes)

    n = args.workflows
    servers = []
    for node in nodes:
        pid = pids[node.label]
        figures: dict[str, Any] = {"role": node.role, "label": node.label, "postmaster": pid}
        if pid is not None and pid in trees_before and pid in trees_after:
            before, after = trees_before[pid], trees_after[pid]
            figures["seconds"] = server_cpu.seconds_between(before, after)
            figures["database_backends_seconds"] = server_cpu.children_seconds_between(
                before, after, backends[node.label])
        servers.append(figures)
    kinds = counted.by_kind()
    return {
        "executor_url": executor_url,
        "workflows": n,
        "seconds": elapsed,
        "workflows_per_s": n / elapsed,
        "servers": servers,
        "client_cpu_seconds": client,
        "executor": {
            "round_trips": counted.round_trips,
            "statements": counted.statement_count,
            "transaction_control": dict(counted.transactions),
            "prepares": counted.prepares,
            "by_kind": dict(kinds.most_common()),
        },
    }


async def citus_facts(url: str) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(CITUS_FACTS)
        assert row is not None  # one row
        return {"server_version": await conn.fetchval("SHOW server_version"), **dict(row)}
    finally:
        await conn.close()


async def set_shard_count(url: str, name: str, shards: int) -> None:
    """Have the migration distribute the tables in ``shards`` shards (``citus.shard_count``
    is read when a table is distributed)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"ALTER DATABASE {quoted_name(name)} "
                           f"SET citus.shard_count = {int(shards)}")
    finally:
        await conn.close()


async def shard_count(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(SHARD_COUNT))
    finally:
        await conn.close()


def cluster_nodes(url: str, nodes: Sequence[CitusNode]) -> list[Node]:
    """The nodes of the cluster with the benchmark's database, the coordinator first."""
    made, workers = [], 0
    for node in nodes:
        server = Host(node.host, node.port)
        if node.is_coordinator:
            made.append(Node("coordinator", f"coordinator {server}", node_url(url, node)))
        else:
            workers += 1
            made.append(Node("worker", f"worker {workers} {server}", node_url(url, node)))
    return made


async def run(args: argparse.Namespace) -> dict[str, Any]:
    round_trips.install()
    name = args.db_prefix
    try:
        nodes = await citus_nodes(args.citus_url)
    except asyncpg.UndefinedTableError:
        raise SystemExit(f"{args.citus_url} is not a Citus database: no pg_dist_node (run "
                         "CREATE EXTENSION citus in it on the coordinator)") from None
    if not any(not node.is_coordinator for node in nodes):
        raise SystemExit(f"the Citus cluster of {args.citus_url} has no worker node")
    loop = type(asyncio.get_running_loop())
    results: dict[str, Any] = {
        "parameters": {"workflows": args.workflows, "warmup": args.warmup,
                       "concurrency": args.concurrency, "shard_keys": args.shard_keys,
                       "pool_size": args.pool_size, "executor_node": args.executor_node,
                       "cores_per_node": args.cores_per_node},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "event_loop": f"{loop.__module__}.{loop.__qualname__}"},
    }
    try:
        plain_url = await recreate_database(args.plain_url, f"{name}_plain")
        await drop_citus_database(args.citus_url, name)
        citus_url = await create_citus_database(args.citus_url, name)
        workers = sum(1 for node in nodes if not node.is_coordinator)
        if args.shard_count != 0:
            await set_shard_count(citus_url, name, args.shard_count or workers)
        plain_server = parse_database_url(plain_url).hosts[0]
        plain_nodes = [Node("plain", f"plain {plain_server}", plain_url)]
        cluster = cluster_nodes(citus_url, nodes)
        executor_url = (cluster[1].url if args.executor_node == "worker" else cluster[0].url)
        results["plain_server"] = await server_facts(plain_url)
        results["citus_server"] = await citus_facts(citus_url)
        _progress(f"plain PostgreSQL: {args.warmup} + {args.workflows} workflows")
        results["plain"] = await measure(plain_url, plain_nodes, args)
        _progress(f"Citus, executor on the {args.executor_node}: {args.warmup} + "
                  f"{args.workflows} workflows")
        results["citus"] = await measure(executor_url, cluster, args)
        results["citus_server"]["shard_count"] = await shard_count(citus_url)
        results["citus_server"]["workers"] = workers
    finally:
        if not args.keep:
            await drop_database(args.plain_url, f"{name}_plain")
            await drop_citus_database(args.citus_url, name)
    results["summary"] = summarize(results, args.cores_per_node)
    return results


# ---- figures and report ----

def _cpu(result: dict[str, Any], role: str) -> float | None:
    """CPU seconds of the nodes of ``role`` together, None if one is not measurable."""
    seconds = [s.get("seconds") for s in result["servers"] if s["role"] == role]
    return None if not seconds or None in seconds else sum(s for s in seconds if s is not None)


def summarize(results: dict[str, Any], cores: float) -> dict[str, Any]:
    plain, citus = results["plain"], results["citus"]
    summary: dict[str, Any] = {
        "throughput_citus_over_plain": citus["workflows_per_s"] / plain["workflows_per_s"],
        "round_trips_per_write": {
            key: results[key]["executor"]["round_trips"]
            / (results[key]["workflows"] * WRITES_PER_WORKFLOW) for key in ("plain", "citus")},
    }
    plain_cpu = _cpu(plain, "plain")
    coordinator, workers = _cpu(citus, "coordinator"), _cpu(citus, "worker")
    if coordinator is not None and workers is not None:
        cluster = coordinator + workers
        summary["coordinator_share"] = coordinator / cluster if cluster else 0.0
        if plain_cpu:
            summary["server_cpu_citus_over_plain"] = (
                (cluster / citus["workflows"]) / (plain_cpu / plain["workflows"]))
        n = citus["workflows"]
        summary["projection"] = {
            "measured_workers": sum(1 for s in citus["servers"] if s["role"] == "worker"),
            "coordinator_cpu_per_workflow": coordinator / n,
            "workers_cpu_per_workflow": workers / n,
            "cores_per_node": cores,
            "rows": [{**asdict(p), "ratio_to_linear": p.ratio_to_linear}
                     for p in project(coordinator / n, workers / n, cores)],
        }
    return summary


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _per_thousand(seconds: float | None, workflows: int) -> str:
    return "" if seconds is None else f"{seconds * PER / workflows:.2f}"


def report(results: dict[str, Any]) -> str:
    p, plain, citus = results["parameters"], results["plain"], results["citus"]
    s, facts = results["summary"], results["citus_server"]
    out = [
        "Citus benchmark: 3-step workflows on the sharded schema, the same workload on plain "
        "PostgreSQL and on Citus",
        f"  {p['shard_keys']} shard keys, {p['concurrency']} in flight, {p['workflows']:,} "
        f"measured after {p['warmup']} of warm-up, pool of {p['pool_size']}; "
        f"{results['machine']['event_loop']}, {results['machine']['cpus']} CPUs, Python "
        f"{results['machine']['python']}",
        f"  plain: PostgreSQL {results['plain_server']['server_version']}; Citus "
        f"{facts['citus']} on PostgreSQL {facts['server_version']}, {facts['shard_count']} "
        f"shards over {facts['workers']} worker nodes, executor on the {p['executor_node']}",
        "",
        "Throughput and CPU (CPU seconds per 1,000 workflows; 'this db': the backends "
        "connected to the benchmark's database)",
    ]
    rows: list[tuple[str, ...]] = [("", "wf/s", "server", "this db", "client")]
    for label, result in (("plain", plain), ("Citus", citus)):
        n = result["workflows"]
        rows.append((label, f"{result['workflows_per_s']:,.1f}", "", "",
                     _per_thousand(result["client_cpu_seconds"], n)))
        for server in result["servers"]:
            if "seconds" not in server:
                rows.append((f"  {server['label']}", "", "CPU: not measurable (server not "
                             "local)", "", ""))
                continue
            rows.append((f"  {server['label']}", "", _per_thousand(server["seconds"], n),
                         _per_thousand(server["database_backends_seconds"], n), ""))
        if len(result["servers"]) > 1:
            total = (None if any("seconds" not in x for x in result["servers"])
                     else sum(x["seconds"] for x in result["servers"]))
            rows.append(("  all nodes", "", _per_thousand(total, n), "", ""))
    out += table(rows, "<>>>>")
    out += ["", "Executor: what it sends, counted at asyncpg's calls (per workflow; per step = "
            "a workflow's over its 3 steps)"]
    rows = [("", "round trips", "statements", "BEGIN/COMMIT/ROLLBACK", "prepares",
             "round trips/step", "statements/step")]
    for label, result in (("plain", plain), ("Citus", citus)):
        e, n = result["executor"], result["workflows"]
        control = sum(e["transaction_control"].values())
        rows.append((label, f"{e['round_trips'] / n:.2f}", f"{e['statements'] / n:.2f}",
                     f"{control / n:.2f}", f"{e['prepares'] / n:.2f}",
                     f"{e['round_trips'] / n / STEPS:.2f}",
                     f"{e['statements'] / n / STEPS:.2f}"))
    out += table(rows, "<>>>>>>")
    out += ["  prepares: statements asyncpg parsed first (not in its statement cache), one "
            "more round trip each, not in the round trips", "", "  by kind, per workflow:"]
    kinds = list(dict.fromkeys([*citus["executor"]["by_kind"], *plain["executor"]["by_kind"]]))
    rows = [("  kind", "plain", "Citus")]
    for kind in kinds:
        rows.append((f"  {kind}", _per(plain, kind), _per(citus, kind)))
    out += table(rows, "<>>")
    out += ["", "Ratios, from this run"]
    rows = [("figure", "value")]
    rows.append(("throughput, Citus / plain", f"{s['throughput_citus_over_plain']:.3f}"))
    if "server_cpu_citus_over_plain" in s:
        rows.append(("total server CPU per workflow, Citus (all nodes) / plain",
                     f"{s['server_cpu_citus_over_plain']:.1f}x"))
    else:
        rows.append(("total server CPU per workflow, Citus / plain", "not measurable"))
    if "coordinator_share" in s:
        rows.append(("coordinator's share of the cluster's CPU",
                     f"{s['coordinator_share']:.0%}"))
    for key, label in (("plain", "plain"), ("citus", "Citus")):
        rows.append((f"round trips per write (step + start + outcome), {label}",
                     f"{s['round_trips_per_write'][key]:.2f}"))
    out += table(rows, "<>")
    out += projection_report(s.get("projection"))
    return "\n".join(out)


def _per(result: dict[str, Any], kind: str) -> str:
    count = result["executor"]["by_kind"].get(kind)
    return "" if count is None else f"{count / result['workflows']:.2f}"


def projection_report(projection: dict[str, Any] | None) -> list[str]:
    if projection is None:
        return ["", "Capacity projection: not possible (the cluster's CPU is not measurable)"]
    c, w = projection["coordinator_cpu_per_workflow"], projection["workers_cpu_per_workflow"]
    k, measured = projection["cores_per_node"], projection["measured_workers"]
    out = [
        "",
        f"Capacity projection from the measured CPU (with {measured} worker nodes): "
        f"c = {c * 1000:.1f} ms coordinator, w = {w * 1000:.1f} ms all workers, per workflow",
        "  method: every node has the same K cores and CPU limits it; "
        "throughput(N) = min(K / c, N * K / w);",
        "  linear = N * K / w (the coordinator never the limit); the workers' cost per "
        f"workflow taken as at the measured size; K = {k:g} here, figures scale with K;",
        "  the shards per worker as measured: a cluster of N workers has as many shards per "
        "worker (split when workers are added)",
    ]
    rows: list[tuple[str, ...]] = [("workers", "wf/s", "bound by", "linear wf/s",
                                    "ratio to linear")]
    for row in projection["rows"]:
        rows.append((str(row["workers"]), f"{row['workflows_per_s']:,.1f}", row["bound"],
                     f"{row['linear']:,.1f}", f"{row['ratio_to_linear']:.2f}"))
    return out + table(rows, ">><>>")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The sharded workload on a Citus cluster and on plain PostgreSQL: "
                    "throughput, server and client CPU, round trips, capacity projection.")
    parser.add_argument("--citus-url", default=os.environ.get(CITUS_URL_ENV),
                        help="a database with the citus extension on the coordinator of a "
                             f"cluster with worker nodes (default: ${CITUS_URL_ENV})")
    parser.add_argument("--plain-url", default=DEFAULT_URL,
                        help=f"a plain PostgreSQL server (default {DEFAULT_URL})")
    parser.add_argument("--executor-node", choices=("coordinator", "worker"),
                        default="coordinator",
                        help="which Citus node the executor connects to (default coordinator; "
                             "worker: the first worker node)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller counts (50 warm-up, 200 measured) unless given")
    parser.add_argument("--workflows", "-n", type=int, default=None,
                        help="measured workflows on each database (default 1000)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up workflows before them (default 200)")
    parser.add_argument("--concurrency", "-c", type=int, default=100,
                        help="workflows in flight at once (default 100)")
    parser.add_argument("--shard-keys", type=int, default=100,
                        help="workflow i runs under the key tenant-{i %% K} (default 100)")
    parser.add_argument("--pool-size", type=int, default=10,
                        help="the executor's connection pool (default 10, dbos_async's)")
    parser.add_argument("--shard-count", type=int, default=None,
                        help="shards of each distributed table (default: one per worker "
                             "node, the migration's default; 0: the cluster's "
                             "citus.shard_count)")
    parser.add_argument("--cores-per-node", type=float, default=1.0,
                        help="K of the capacity projection (default 1: wf/s per core)")
    parser.add_argument("--db-prefix", default="bench_citus",
                        help="the databases are PREFIX (Citus) and PREFIX_plain "
                             "(default bench_citus)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the databases afterwards")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    if not args.citus_url:
        parser.error(f"give --citus-url or set {CITUS_URL_ENV}")
    if args.workflows is None:
        args.workflows = 200 if args.quick else 1000
    if args.warmup is None:
        args.warmup = 50 if args.quick else 200
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = dbos_async.run(run(args))
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"\nResults written to {args.json}")


if __name__ == "__main__":
    main()
