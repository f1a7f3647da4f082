"""``dbos-async schedule ...``: the stored cron schedules, and pausing, resuming,
triggering, backfilling and deleting one."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import click

from dbos_async._executor.schedules.definition import WorkflowSchedule
from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options
from dbos_async.client import DBOSClient


@click.group("schedule")
def schedule() -> None:
    """Inspect and operate cron schedules."""


def schedule_json(s: WorkflowSchedule) -> dict[str, Any]:
    data = dataclasses.asdict(s)
    data["last_fired_at"] = s.last_fired_at.isoformat() if s.last_fired_at else None
    return data


def _with_client(target: Target, action: Callable[[DBOSClient], Awaitable[Any]]) -> Any:
    async def act() -> Any:
        async with target.client() as client:
            return await action(client)

    return run(act())


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@target_options
def list_schedules(target: Target, as_json: bool) -> None:
    """List schedules by name."""
    schedules: list[WorkflowSchedule] = _with_client(target, lambda c: c.list_schedules())
    if as_json:
        render.print_json([schedule_json(s) for s in schedules])
        return
    render.table(["SCHEDULE", "WORKFLOW", "CRON", "TIME ZONE", "STATUS", "LAST FIRED"], [
        [s.schedule_name, s.workflow_name, s.schedule, s.cron_timezone or "UTC", s.status,
         s.last_fired_at.isoformat() if s.last_fired_at else ""]
        for s in schedules
    ])


def _simple(verb: str, done: str, call: Callable[[DBOSClient, str], Awaitable[None]]
            ) -> click.Command:
    @click.argument("name")
    @target_options
    def command(target: Target, name: str) -> None:
        _with_client(target, lambda c: call(c, name))
        click.echo(f"Schedule {name} {done}")

    command.__doc__ = f"{verb.capitalize()} schedule NAME."
    return schedule.command(verb)(command)


_simple("pause", "paused", lambda c, n: c.pause_schedule(n))
_simple("resume", "resumed", lambda c, n: c.resume_schedule(n))
_simple("delete", "deleted", lambda c, n: c.delete_schedule(n))


@schedule.command("trigger")
@click.argument("name")
@target_options
def trigger(target: Target, name: str) -> None:
    """Fire schedule NAME now; prints the workflow ID."""
    handle = _with_client(target, lambda c: c.trigger_schedule(name))
    click.echo(handle.workflow_id)


@schedule.command("backfill")
@click.argument("name")
@click.argument("start", type=click.DateTime(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"]))
@click.argument("end", type=click.DateTime(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"]))
@target_options
def backfill(target: Target, name: str, start: datetime, end: datetime) -> None:
    """Fire every time of schedule NAME strictly between START and END (UTC); times fired
    already are not run again. Prints the workflow IDs."""
    handles = _with_client(target, lambda c: c.backfill_schedule(name, start, end))
    for handle in handles:
        click.echo(handle.workflow_id)
