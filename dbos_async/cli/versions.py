"""``dbos-async version ...``: the registered application versions, which is latest, and
the work waiting for each."""

from __future__ import annotations

import dataclasses

import click

from dbos_async._executor.management.control import ApplicationVersion
from dbos_async._sysdb.records import VersionBacklog
from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options


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


@version.command("waiting")
@click.option("--other-than", metavar="VERSION",
              help="Leave this version out (default: the latest).")
@click.option("--all", "every_version", is_flag=True, help="Count every version's work.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@target_options
def waiting(target: Target, other_than: str | None, every_version: bool,
            as_json: bool) -> None:
    """Count the PENDING and ENQUEUED workflows of each application version other than
    the latest: work only an executor of that version runs (check it against new code
    and move it with `dbos-async replay --move`)."""

    async def read() -> list[VersionBacklog]:
        async with target.client() as client:
            left_out = other_than
            if left_out is None and not every_version:
                latest = await client.get_latest_application_version()
                left_out = latest.version_name if latest is not None else None
            return await client.list_waiting_versions(other_than=left_out)

    backlog = run(read())
    if as_json:
        render.print_json([dataclasses.asdict(b) for b in backlog])
        return
    render.table(["VERSION", "PENDING", "ENQUEUED"],
                 [[b.application_version, str(b.pending), str(b.enqueued)] for b in backlog])
