"""``dbos-async application rename``: give an application's rows another owner name."""

from __future__ import annotations

import click

from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options


@click.group("application")
def application() -> None:
    """Operate the applications sharing the system database."""


@application.command("rename")
@click.argument("new_name")
@click.option("--from", "old_name", metavar="NAME",
              help="The application's current name.")
@click.option("--adopt-unclaimed", is_flag=True,
              help="Also take the rows no application owns.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@target_options
def rename(target: Target, new_name: str, old_name: str | None, adopt_unclaimed: bool,
           as_json: bool) -> None:
    """Give NEW_NAME every row (queues, schedules, versions, workflows, steps) that the
    application --from NAME owns, and with --adopt-unclaimed the unclaimed ones, in one
    transaction. Run it while that application is stopped."""

    async def move() -> dict[str, int]:
        async with target.client() as client:
            return await client.rename_application(old_name, new_name,
                                                   adopt_unclaimed_rows=adopt_unclaimed)

    moved = run(move())
    if as_json:
        render.print_json(moved)
        return
    render.table(["TABLE", "ROWS"], [[table, str(rows)] for table, rows in moved.items()])
