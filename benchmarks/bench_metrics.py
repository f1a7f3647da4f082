"""What the executor's OpenTelemetry metrics cost: the same throughput workload (three-step
workflows, C in flight) with metrics off (no meter provider) and on (an SDK meter provider
with an in-memory reader, so every event is recorded and aggregated), each round in a child
process of its own (a process sets its meter provider once), the two interleaved.

The cost per workflow is the difference of the medians, in the child's CPU time and in
wall time per workflow; the spread of the "off" rounds is the noise it is measured against.
The histograms reach the SDK when the provider collects (``dbos_async/_metrics.py``), so the
"on" child also times one collection after its run (what a periodic reader or a scrape does
once per interval): that cost per workflow is printed beside the run's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import bench_dbos_async
from common import drop_database, recreate_database, table


async def run(url: str, db_prefix: str, *, workflows: int, concurrency: int, pool_size: int,
              rounds: int, keep: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    name = f"{db_prefix}_metrics"
    database = await recreate_database(url, name)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    try:
        for number in range(1, rounds + 1):
            for mode in ("off", "on"):
                progress(f"metrics {number}/{rounds}: {mode}, {workflows} workflows "
                         "(child process)")
                runs[mode].append(await bench_dbos_async.run_subprocess(
                    database, workflows=workflows, pool_size=pool_size,
                    warmup=min(workflows, 200), loop="default", burst=False,
                    concurrency=concurrency, metrics=mode == "on"))
    finally:
        if not keep:
            await drop_database(url, name)
    out: dict[str, Any] = {"workflows": workflows, "rounds": runs}
    for mode, results in runs.items():
        cpu = [r["cpu_seconds"] / r["workflows"] * 1e6 for r in results]
        wall = [r["seconds"] / r["workflows"] * 1e6 for r in results]
        out[mode] = {"cpu_us_per_workflow": statistics.median(cpu),
                     "wall_us_per_workflow": statistics.median(wall),
                     "cpu_spread_us": max(cpu) - min(cpu),
                     "wall_spread_us": max(wall) - min(wall),
                     "workflows_per_s": statistics.median(r["workflows_per_s"]
                                                          for r in results)}
    out["collect_cpu_us"] = statistics.median(r["collect_cpu_seconds"] / r["workflows"] * 1e6
                                              for r in runs["on"])
    # What the collection's cost is made of: the histogram values it hands the SDK.
    out["collect_values_per_workflow"] = statistics.median(
        r["collect_values"] / r["workflows"] for r in runs["on"])
    out["collect_us_per_value"] = statistics.median(
        r["collect_cpu_seconds"] / r["collect_values"] * 1e6 for r in runs["on"]
        if r["collect_values"])
    out["cpu_cost_us"] = out["on"]["cpu_us_per_workflow"] - out["off"]["cpu_us_per_workflow"]
    out["wall_cost_us"] = (out["on"]["wall_us_per_workflow"]
                           - out["off"]["wall_us_per_workflow"])
    return out


def total_cost_us(m: dict[str, Any]) -> float:
    """The CPU metrics cost per workflow in all: on the workflow's path (on - off) and at
    collection, where the histograms' values reach the SDK."""
    return float(m["cpu_cost_us"] + m["collect_cpu_us"])


def within_noise(m: dict[str, Any]) -> bool:
    """The whole CPU cost per workflow is no larger than the spread of the "off" rounds."""
    return total_cost_us(m) <= m["off"]["cpu_spread_us"]


def report(m: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, ...]] = [("metrics", "wf/s", "CPU us/wf", "wall us/wf",
                                    "CPU spread us")]
    for mode in ("off", "on"):
        r = m[mode]
        rows.append((mode, f"{r['workflows_per_s']:,.0f}", f"{r['cpu_us_per_workflow']:.0f}",
                     f"{r['wall_us_per_workflow']:.0f}", f"{r['cpu_spread_us']:.0f}"))
    return ["", f"Metrics on vs off ({m['workflows']} three-step workflows per round, "
                "medians of interleaved rounds, each a child process)", *table(rows, "<>>>>"),
            f"  cost of metrics per workflow: {m['cpu_cost_us']:+.1f} us CPU, "
            f"{m['wall_cost_us']:+.1f} us wall (noise: the off rounds' CPU spread, "
            f"{m['off']['cpu_spread_us']:.0f} us)",
            f"  at collection (the SDK aggregating the run's histogram values): "
            f"{m['collect_cpu_us']:+.1f} us CPU per workflow "
            f"({m['collect_values_per_workflow']:.1f} values per workflow, "
            f"{m['collect_us_per_value']:.1f} us each)",
            "  CPU us/wf per round: off " + _rounds(m, "off") + "; on " + _rounds(m, "on")]


def _rounds(m: dict[str, Any], mode: str) -> str:
    return " ".join(f"{r['cpu_seconds'] / r['workflows'] * 1e6:.0f}" for r in m["rounds"][mode])
