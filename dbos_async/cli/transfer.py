"""``dbos-async export`` and ``dbos-async import``: whole workflows as JSON lines, through the
client (see :meth:`~dbos_async.DBOSClient.export_workflows`)."""

from __future__ import annotations

from typing import IO, Any

import click

from dbos_async._executor.transfer import ExportedWorkflow, ImportSummary
from dbos_async.cli.target import Target, run, target_options
from dbos_async.cli.workflows import filter_options


@click.command("export")
@filter_options
@click.option("--output", "-o", type=click.File("w", encoding="utf-8"), default="-",
              help="Write the lines to this file (default: standard output).")
@target_options
def export_workflows(target: Target, filters: dict[str, Any], output: IO[str]) -> None:
    """Export workflows as JSON lines, oldest first: one line per workflow with every row
    it owns (status, inputs, outputs, steps, messages, events, streams).

    Takes the filters of `workflow list`; without any, every workflow of the application.
    The lines come from one read-only snapshot; `dbos-async import` reads them."""

    async def export() -> int:
        count = 0
        async with target.client() as client:
            async for workflow in client.export_workflows(**filters):
                output.write(workflow.to_json() + "\n")
                count += 1
        return count

    count = run(export())
    output.flush()
    # On standard error: standard output may be the export itself.
    click.echo(f"Exported {count} workflow(s)", err=True)


@click.command("import")
@click.argument("source", type=click.File("r", encoding="utf-8"), default="-")
@click.option("--shard-key", metavar="KEY",
              help="Store every imported workflow under KEY (a sharded target; default: "
                   "the keys the lines carry).")
@click.option("--batch-size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Workflows per transaction.")
@target_options
def import_workflows(target: Target, source: IO[str], shard_key: str | None,
                     batch_size: int) -> None:
    """Import workflows from a file of JSON lines written by `dbos-async export` (or from
    standard input, with `-` or no SOURCE).

    Every line is checked before anything is written; then each batch is written in one
    transaction. A workflow already there with the same rows is left alone, so importing
    the same file again changes nothing."""

    def under_the_key(_: ExportedWorkflow) -> str:
        assert shard_key is not None
        return shard_key

    async def load() -> ImportSummary:
        workflows = [ExportedWorkflow.from_json(line, number)
                     for number, line in enumerate(source, start=1) if line.strip()]
        async with target.client() as client:
            return await client.import_workflows(
                workflows, batch_size=batch_size,
                shard_key_of=under_the_key if shard_key is not None else None)

    summary = run(load())
    click.echo(f"Imported {summary.imported} workflow(s); {summary.unchanged} already there "
               "unchanged")
