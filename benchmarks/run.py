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

See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
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
import bench_raw
from common import DEFAULT_URL, drop_database, recreate_database, server_facts

WORKFLOW_RATIO_TARGET = 5.0
WORKFLOW_RATIO_DESIGN = 10.0
RAW_FRACTION_TARGET = 0.70
EXPECTED_PER_WORKFLOW = 5.0
EXPECTED_PER_STEP = 1.0
# Statement counts within 5% of the expectation pass: amortized extras (a batched
# notification statement, say) are reported but do not fail the line.
COUNT_TOLERANCE = 1.05


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
    if args.profile:
        args.rounds = 1
    if args.dbos_workflows is None:
        args.dbos_workflows = max(1, args.workflows // 4)
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n, c, pool = args.workflows, args.concurrency, args.pool_size
    names = {kind: f"{args.db_prefix}_{kind}" for kind in ("dbos_async", "dbos", "raw")}
    facts = await server_facts(args.url)
    results: dict[str, Any] = {
        "server": facts,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "parameters": {
            "workflows": n, "dbos_workflows": args.dbos_workflows, "concurrency": c,
            "pool_size": pool, "steps_per_workflow": 3, "rounds": args.rounds,
        },
    }
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
    results["summary"] = summarize(results)
    return results


SYSTEMS = ("dbos_async", "dbos", "raw", "raw_default_reset")
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
    if key == "dbos_async":
        merged["statements"] = _merge_statements(runs)
        commits = sum(r["server"]["xact_commits"] for r in runs)
        total_wf = sum(r["workflows"] for r in runs)
        merged["server"] = {
            "xact_commits": commits,
            "commits_per_workflow": commits / total_wf,
            "workflow_status_inserts":
                sum(r["server"]["workflow_status_inserts"] for r in runs),
            "operation_outputs_inserts":
                sum(r["server"]["operation_outputs_inserts"] for r in runs),
        }
        merged["measured_workflows_total"] = total_wf
        merged["pool_connections"] = [r["pool_connections"] for r in runs]
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
        "server_commits_per_workflow": fast["server"]["commits_per_workflow"],
    }
    if "dbos" in results:
        summary["workflow_ratio_vs_dbos"] = (
            fast["workflows_per_s"] / results["dbos"]["workflows_per_s"])
    return summary


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _table(rows: list[tuple[str, ...]], align: str) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(w) if a == "<" else cell.rjust(w)
                 for cell, w, a in zip(row, widths, align, strict=True)]
        lines.append("  " + "  ".join(cells).rstrip())
        if index == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


def _verdict(ok: bool) -> str:
    return "ok" if ok else "BELOW TARGET"


def report(results: dict[str, Any], profiled: bool) -> str:
    p, s = results["parameters"], results["summary"]
    fast, server = results["dbos_async"], results["server"]
    out = [
        "dbos_async benchmark: three-step workflows started concurrently",
        f"  PostgreSQL {server['server_version']}: synchronous_commit="
        f"{server['synchronous_commit']}, fsync={server['fsync']}, "
        f"shared_buffers={server['shared_buffers']}",
        f"  {results['machine']['cpus']} CPUs, Python {results['machine']['python']}",
        f"  N={p['workflows']} workflows for dbos_async, {p['dbos_workflows']} for dbos; "
        f"concurrency C={p['concurrency']}; pool size {p['pool_size']} for all three",
        f"  {p['rounds']} interleaved round(s) per system; rates are medians (min-max)",
        "",
        "Throughput",
    ]
    rows: list[tuple[str, ...]] = [
        ("system", "per round", "seconds", "workflows/s", "steps or inserts/s", "min-max")]

    def spread(result: dict[str, Any], rate: str) -> str:
        low, high = result[rate + "_range"]
        return f"{low:,.0f}-{high:,.0f}" if result["rounds"] > 1 else ""

    rows.append(("dbos_async" + (" (PROFILED)" if profiled else ""),
                 f"{fast['workflows']} wf", f"{fast['seconds']:.2f}",
                 f"{fast['workflows_per_s']:,.0f}", f"{fast['steps_per_s']:,.0f}",
                 spread(fast, "steps_per_s")))
    if "dbos" in results:
        peer = results["dbos"]
        rows.append((f"dbos {peer.get('dbos_version') or ''} (child process)".replace("  ", " "),
                     f"{peer['workflows']} wf", f"{peer['seconds']:.2f}",
                     f"{peer['workflows_per_s']:,.1f}", f"{peer['steps_per_s']:,.0f}",
                     spread(peer, "steps_per_s")))
    for key, label in (("raw", "raw asyncpg INSERT, no pool reset"),
                       ("raw_default_reset", "raw asyncpg INSERT, default pool reset")):
        raw = results[key]
        rows.append((label, f"{raw['inserts']} rows", f"{raw['seconds']:.2f}", "",
                     f"{raw['inserts_per_s']:,.0f}", spread(raw, "inserts_per_s")))
    out += _table(rows, "<>>>>>")

    out += ["", "Targets"]
    rows = [("figure", "measured", "target", "")]
    if "workflow_ratio_vs_dbos" in s:
        ratio = s["workflow_ratio_vs_dbos"]
        rows.append(("workflows/s, dbos_async / dbos", f"{ratio:.1f}x",
                     f">= {WORKFLOW_RATIO_TARGET:.0f}x (DESIGN {WORKFLOW_RATIO_DESIGN:.0f}x)",
                     _verdict(ratio >= WORKFLOW_RATIO_TARGET)))
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
    out += _table(rows, "<>><")

    out += ["", "dbos_async statements in the measured runs (client-side query logger)"]
    rows = [("kind", "count", "per workflow")]
    for kind, count in fast["statements"]["by_kind"].items():
        rows.append((kind, str(count), f"{count / fast['measured_workflows_total']:.2f}"))
    total = fast["statements"]["total_with_pool_reset"]
    rows.append(("total", str(total), f"{total / fast['measured_workflows_total']:.2f}"))
    out += _table(rows, "<>>")
    srv = fast["server"]
    out += [
        "",
        "dbos_async, server side (pg_stat_database / pg_stat_user_tables deltas)",
        f"  commits {srv['xact_commits']} ({srv['commits_per_workflow']:.2f} per workflow), "
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
    return "\n".join(out)


def _without_profile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_profile(v) for k, v in value.items() if k != "profile"}
    if isinstance(value, list):
        return [_without_profile(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    print(report(results, args.profile))
    if args.json is not None:
        data = _without_profile(results)
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"\nResults written to {args.json}")


if __name__ == "__main__":
    main()
