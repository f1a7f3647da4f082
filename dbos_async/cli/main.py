"""The ``dbos-async`` command: its groups, and ``migrate``."""

from __future__ import annotations

import click

from dbos_async._database_url import redact
from dbos_async._sysdb.setup import migrate as migrate_database
from dbos_async.cli.applications import application
from dbos_async.cli.console import console
from dbos_async.cli.metrics import metrics
from dbos_async.cli.queues import queue
from dbos_async.cli.replay import replay
from dbos_async.cli.schedules import schedule
from dbos_async.cli.target import Target, run, target_options
from dbos_async.cli.transfer import export_workflows, import_workflows
from dbos_async.cli.versions import version
from dbos_async.cli.workflows import workflow


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dbos_async")
def cli() -> None:
    """Operate the durable workflows in a dbos_async (DBOS) system database."""


@cli.command()
@target_options
def migrate(target: Target) -> None:
    """Create or migrate the system database.

    Creates the database if it is missing and brings its schema to the latest version;
    safe to repeat, and to run while executors run."""

    async def run_migration() -> tuple[str, str, int]:
        config = target.config()
        assert config.system_database_url is not None
        version = await migrate_database(config.system_database_url,
                                         schema_name=config.schema_name,
                                         sharding=target.sharding,
                                         config_file=target.config_file)
        return redact(config.system_database_url), config.schema_name, version

    url, schema, version = run(run_migration())
    click.echo(f"System schema {schema!r} at {url} is at version {version}")


@cli.command()
@click.argument("role")
@target_options
def grant(target: Target, role: str) -> None:
    """Grant database role ROLE what an application needs on the system schema.

    Run as the schema's owner (the user that migrated it); ROLE may then run executors
    and clients, but not alter or drop the tables."""

    async def run_grant() -> str:
        async with target.client() as client:
            await client.grant_permissions(role)
            return client.config.schema_name

    schema = run(run_grant())
    click.echo(f"Granted {role} the permissions of an application on schema {schema!r}")


cli.add_command(workflow)
cli.add_command(queue)
cli.add_command(version)
cli.add_command(schedule)
cli.add_command(application)
cli.add_command(console)
cli.add_command(export_workflows)
cli.add_command(import_workflows)
cli.add_command(replay)
cli.add_command(metrics)


def main() -> None:
    """The console script's entry point."""
    cli(prog_name="dbos-async")
