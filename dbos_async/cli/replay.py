"""``dbos-async replay``: the replay check before a deploy, and moving the workflows an
old version left waiting to the current one once they pass."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any

import click

from dbos_async._executor.dbos import DBOS
from dbos_async._executor.replay import ReplayResult
from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options
from dbos_async.cli.workflows import filter_options
from dbos_async.statuses import WorkflowStatusString
from dbos_async.testing.replay import replay_check

WAITING = (WorkflowStatusString.PENDING, WorkflowStatusString.ENQUEUED)
"""The statuses ``--move`` moves: work an executor of the workflow's version would run."""


@click.command("replay")
@click.argument("app", metavar="MODULE:ATTRIBUTE")
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Check the workflows of this export file (dbos-async export) instead "
                   "of the database's.")
@filter_options
@click.option("--workflow-id", "workflow_ids", multiple=True, metavar="ID",
              help="Check (and move) these workflows (repeatable).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds each workflow body gets.")
@click.option("--move", is_flag=True,
              help="If every workflow checked passes, resume the PENDING and ENQUEUED ones "
                   "of other versions under the application's version.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as JSON (and what --move moved) instead of lines.")
@target_options
def replay(target: Target, app: str, path: Path | None, filters: dict[str, Any],
           workflow_ids: tuple[str, ...], timeout: float, move: bool, as_json: bool) -> None:
    """Check that the application's code, as it is now, replays recorded workflows.

    MODULE:ATTRIBUTE names the application's DBOS instance (as `shop:dbos`; the current
    directory is importable). Each workflow's body runs against its checkpoints: no step
    body runs, nothing is written, no sleep waits. A workflow passes when the code makes
    the recorded calls (steps, children, sends, events, sleeps, patches) in the same
    order; one still in flight is checked up to its last checkpoint. The workflows come
    from the system database (the filters of `workflow list`; without any, all of the
    application's) or from --file. Exit status: 0 when all pass, 1 otherwise."""
    dbos = load_application(app)
    if workflow_ids:
        filters["workflow_ids"] = list(workflow_ids)
    if path is not None and any(filters.values()):
        raise click.UsageError("--file takes no filters: export the workflows to check")

    async def check() -> tuple[list[ReplayResult], list[str]]:
        if path is not None and not move:
            return await replay_check(dbos, path=path, time_limit=timeout), []
        async with target.client() as client:
            if path is not None:
                results = await replay_check(dbos, path=path, time_limit=timeout)
            else:
                results = await replay_check(dbos, client=client, time_limit=timeout, **filters)
            if not move or not all(r.passed for r in results):
                return results, []
            version = dbos.application_version
            waiting = [r for r in results
                       if r.status in WAITING and r.application_version != version]
            for key in dict.fromkeys(r.shard_key for r in waiting):
                await client.resume_workflows(
                    [r.workflow_id for r in waiting if r.shard_key == key],
                    shard_key=key, application_version=version)
            return results, [r.workflow_id for r in waiting]

    results, moved = run(check())
    failed = sum(not r.passed for r in results)
    if as_json:
        render.print_json({"application_version": dbos.application_version,
                           "results": [dataclasses.asdict(r) for r in results],
                           "moved": moved})
        if failed:
            sys.exit(1)
        return
    for result in results:
        click.echo(result.summary())
    click.echo(f"{len(results) - failed} of {len(results)} workflow(s) replay on version "
               f"{dbos.application_version}")
    if move:
        if failed:
            click.echo("Moved nothing: the check did not pass")
        else:
            click.echo(f"Moved {len(moved)} workflow(s) to version {dbos.application_version}"
                       + (f": {', '.join(moved)}" if moved else ""))
    if failed:
        sys.exit(1)


def load_application(spec: str) -> DBOS:
    """The DBOS instance ``module:attribute`` names, imported with the current directory
    on the path."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r}: give MODULE:ATTRIBUTE, e.g. shop:dbos",
                                 param_hint="MODULE:ATTRIBUTE")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise click.BadParameter(f"cannot import {module_name!r}: {error}",
                                 param_hint="MODULE:ATTRIBUTE") from None
    dbos = getattr(module, attribute, None)
    if not isinstance(dbos, DBOS):
        raise click.BadParameter(f"{spec!r} is not a DBOS instance",
                                 param_hint="MODULE:ATTRIBUTE")
    return dbos

