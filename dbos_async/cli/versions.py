"""``dbos-async version ...``: the registered application versions, and which is latest."""

from __future__ import annotations

import click

from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options
from dbos_async.executor.control import ApplicationVersion


@click.group("version")
def version() -> None:
    """Inspect and choose application versions."""


@version.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@target_options
def list_versions(target: Target, as_json: bool) -> None:
    """List application versions, latest first.

    Unversioned queued work runs on executors of the latest version."""

    async def read() -> list[ApplicationVersion]:
        async with target.client() as client:
            return await client.list_application_versions()

    versions = run(read())
    if as_json:
        render.print_json([render.version_json(v) for v in versions])
        return
    render.table(["VERSION", "LATEST", "TIMESTAMP (UTC)", "REGISTERED (UTC)"], [
        [v.version_name, "*" if i == 0 else "", render.timestamp(v.version_timestamp),
         render.timestamp(v.created_at)]
        for i, v in enumerate(versions)
    ])


@version.command("set-latest")
@click.argument("name")
@target_options
def set_latest(target: Target, name: str) -> None:
    """Make NAME the latest application version (registering it if unknown)."""

    async def promote() -> None:
        async with target.client() as client:
            await client.set_latest_application_version(name)

    run(promote())
    click.echo(f"{name} is now the latest application version")
