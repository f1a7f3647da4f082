"""``dbos-async metrics ...``: the aggregates of the system database over a time range
(workflows by status, name, queue, version or executor; steps by name and outcome, each
with duration percentiles) and each queue's backlog."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from dbos_async._executor.observability import Durations, QueueMetrics
from dbos_async._sysdb.statements.observability import TIME_COLUMNS, WORKFLOW_GROUPS
from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options
from dbos_async.cli.workflows import time_bound

DURATION_HEADERS = ["COUNT", "MEAN MS", "P50 MS", "P95 MS", "P99 MS"]


@click.group("metrics")
def metrics() -> None:
    """Workflow and step counts, durations and queue backlogs."""


def _range_options(command: Any) -> Any:
    for option in reversed([
        click.option("--start-time", metavar="TIME",
                     help="Range start, ISO 8601 or epoch ms (default: an hour before the end)."),
        click.option("--end-time", metavar="TIME",
                     help="Range end, exclusive, ISO 8601 or epoch ms (default: now)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table."),
    ]):
        command = option(command)
    return command


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _durations(row: Durations) -> list[str]:
    return [str(row.count), *("" if v is None else f"{v:.1f}"
                              for v in (row.mean_ms, row.p50_ms, row.p95_ms, row.p99_ms))]


@metrics.command("workflows")
@click.option("--group-by", "group_by", multiple=True, type=click.Choice(WORKFLOW_GROUPS),
              help="A column to group by (repeatable; default: status and name).")
@click.option("--by", "time_column", type=click.Choice(tuple(TIME_COLUMNS)), default="created",
              show_default=True, help="The timestamp the range applies to.")
@_range_options
@target_options
def workflow_metrics(target: Target, group_by: tuple[str, ...], time_column: str,
                     start_time: str | None, end_time: str | None, as_json: bool) -> None:
    """Workflows counted per group over a time range, with run-time percentiles."""
    groups = group_by or ("status", "name")

    async def read() -> list[Any]:
        async with target.client() as client:
            return await client.get_workflow_aggregates(
                group_by=groups, time_column=time_column, start_time=time_bound(start_time),
                end_time=time_bound(end_time))

    found = run(read())
    if as_json:
        render.print_json([dataclasses.asdict(a) for a in found])
        return
    render.table([g.upper() for g in groups] + DURATION_HEADERS,
                 [[_text(getattr(a, g)) for g in groups] + _durations(a) for a in found])


@metrics.command("steps")
@_range_options
@target_options
def step_metrics(target: Target, start_time: str | None, end_time: str | None,
                 as_json: bool) -> None:
    """Steps completed in a time range, per name and outcome, with duration percentiles."""

    async def read() -> list[Any]:
        async with target.client() as client:
            return await client.get_step_aggregates(start_time=time_bound(start_time),
                                                    end_time=time_bound(end_time))

    found = run(read())
    if as_json:
        render.print_json([dataclasses.asdict(a) for a in found])
        return
    render.table(["NAME", "OUTCOME", *DURATION_HEADERS],
                 [[s.name, s.outcome, *_durations(s)] for s in found])


@metrics.command("queues")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@target_options
def queue_metrics(target: Target, as_json: bool) -> None:
    """Each queue's backlog: workflows DELAYED, ENQUEUED and PENDING, and how long the
    oldest waiting one has waited."""

    async def read() -> list[QueueMetrics]:
        async with target.client() as client:
            return await client.get_queue_metrics()

    found = run(read())
    if as_json:
        render.print_json([dataclasses.asdict(q) for q in found])
        return
    render.table(["QUEUE", "DELAYED", "ENQUEUED", "PENDING", "OLDEST WAITING", "WAITED MS"],
                 [[q.queue_name, str(q.delayed), str(q.enqueued), str(q.pending),
                   _text(q.oldest_waiting_id), _text(q.oldest_waiting_ms)]
                  for q in found])
