"""What the executor's metrics cost: the same throughput workload (three-step workflows, C
in flight) with metrics off, exported through OpenTelemetry ("otel": an SDK meter provider
with an in-memory reader, so every event is recorded and aggregated) and through the
Prometheus endpoint ("prometheus": a PrometheusMetrics, no OpenTelemetry SDK), each round
in a child process of its own (a process sets its meter provider once), the three
interleaved.

The cost per workflow is the difference of the medians from "off", in the child's CPU
time and in wall time per workflow; the spread of the "off" rounds is the noise it is
measured against. The metrics reach an exporter when it collects (``dbos_async/_metrics.py``),
so each child with metrics on also times one collection after its run (what a periodic
reader or a scrape does once per interval: the SDK's collection, or the endpoint's
rendering); that cost per workflow is printed beside the run's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import bench_dbos_async
from common import drop_database, recreate_database, table

MODES = ("off", "otel", "prometheus")
EXPORTERS = MODES[1:]


async def run(url: str, db_prefix: str, *, workflows: int, concurrency: int, pool_size: int,
              rounds: int, keep: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    name = f"{db_prefix}_metrics"
    database = await recreate_database(url, name)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    try:
        for number in range(1, rounds + 1):
            for mode in MODES:
                progress(f"metrics {number}/{rounds}: {mode}, {workflows} workflows "
                         "(child process)")
                runs[mode].append(await bench_dbos_async.run_subprocess(
                    database, workflows=workflows, pool_size=pool_size,
                    warmup=min(workflows, 200), loop="default", burst=False,
                    concurrency=concurrency, metrics=None if mode == "off" else mode))
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
    for mode in EXPORTERS:
        on = runs[mode]
        out[mode].update(
            collect_cpu_us=statistics.median(
                r["collect_cpu_seconds"] / r["workflows"] * 1e6 for r in on),
            # What the collection's cost is made of: the histogram values it reads.
            collect_values_per_workflow=statistics.median(
                r["collect_values"] / r["workflows"] for r in on),
            collect_us_per_value=statistics.median(
                [r["collect_cpu_seconds"] / r["collect_values"] * 1e6 for r in on
                 if r["collect_values"]] or [0.0]),
            cpu_cost_us=out[mode]["cpu_us_per_workflow"] - out["off"]["cpu_us_per_workflow"],
            wall_cost_us=(out[mode]["wall_us_per_workflow"]
                          - out["off"]["wall_us_per_workflow"]))
    return out


def total_cost_us(m: dict[str, Any], mode: str) -> float:
    """The CPU metrics cost per workflow in all through exporter ``mode``: on the
    workflow's path (on - off) and at collection."""
    return float(m[mode]["cpu_cost_us"] + m[mode]["collect_cpu_us"])


def within_noise(m: dict[str, Any], mode: str) -> bool:
    """The whole CPU cost per workflow is no larger than the spread of the "off" rounds."""
    return total_cost_us(m, mode) <= m["off"]["cpu_spread_us"]


def report(m: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, ...]] = [("metrics", "wf/s", "CPU us/wf", "wall us/wf",
                                    "CPU spread us")]
    for mode in MODES:
        r = m[mode]
        rows.append((mode, f"{r['workflows_per_s']:,.0f}", f"{r['cpu_us_per_workflow']:.0f}",
                     f"{r['wall_us_per_workflow']:.0f}", f"{r['cpu_spread_us']:.0f}"))
    lines = ["", f"Metrics off vs on through each exporter ({m['workflows']} three-step "
                 "workflows per round, medians of interleaved rounds, each a child process)",
             *table(rows, "<>>>>")]
    for mode, collection in (("otel", "the SDK aggregating the run's histogram values"),
                             ("prometheus", "one scrape rendering the store")):
        r = m[mode]
        lines += [f"  {mode}: cost per workflow {r['cpu_cost_us']:+.1f} us CPU, "
                  f"{r['wall_cost_us']:+.1f} us wall (noise: the off rounds' CPU spread, "
                  f"{m['off']['cpu_spread_us']:.0f} us)",
                  f"  {mode} at collection ({collection}): {r['collect_cpu_us']:+.2f} us CPU "
                  f"per workflow ({r['collect_values_per_workflow']:.1f} values per workflow, "
                  f"{r['collect_us_per_value']:.3f} us each)"]
    lines.append("  CPU us/wf per round: " + "; ".join(
        f"{mode} {_rounds(m, mode)}" for mode in MODES))
    return lines


def _rounds(m: dict[str, Any], mode: str) -> str:
    return " ".join(f"{r['cpu_seconds'] / r['workflows'] * 1e6:.0f}" for r in m["rounds"][mode])
