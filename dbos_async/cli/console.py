"""``dbos-async console``: serve the workflow console (the ``console`` extra) over a
client of the target system database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import click

from dbos_async.cli.target import Target, one_line, run, target_options
from dbos_async.client import DBOSClient
from dbos_async.errors import ConfigurationError


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; one that is not loopback needs DBOS_CONSOLE_TOKEN "
                   "or DBOS_CONSOLE_BASIC_AUTH.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on.")
@click.option("--allow-actions", is_flag=True,
              help="Offer cancel, resume, fork and schedule actions (read-only without).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A host name the console is reached by besides localhost, 127.0.0.1 and "
                   "[::1] (console.example.com, *.example.com, or * for any); repeatable. "
                   "Requests to other names are refused, against DNS rebinding (with an "
                   "auth setting, only when given).")
@target_options
def console(target: Target, host: str, port: int, allow_actions: bool,
            allowed_hosts: tuple[str, ...]) -> None:
    """Serve the workflow console: web pages to see (and, with --allow-actions, operate)
    the workflows, queues and schedules of the system database.

    Set DBOS_CONSOLE_TOKEN (16 characters or more; open the console once as
    /?token=TOKEN) or DBOS_CONSOLE_BASIC_AUTH=user:password to require authentication;
    without either it listens on loopback addresses only."""
    try:
        from dbos_async.console.app import build_console
        from dbos_async.console.safety import ConsoleAuth, check_bind
        from dbos_async.console.server import console_server
    except ImportError as error:
        raise click.ClickException(
            f"The console needs the console extra ({error.name} is missing): "
            "pip install 'dbos_async[console]'") from None
    connected: dict[str, DBOSClient] = {}

    @asynccontextmanager
    async def connect(_: Any) -> AsyncIterator[None]:
        async with target.client() as client:
            connected["client"] = client
            yield

    try:
        auth = ConsoleAuth.from_environment()
        check_bind(host, auth)
        target.config()
        app = build_console(lambda: connected["client"], allow_actions=allow_actions,
                            auth=auth, allowed_hosts=allowed_hosts or None, lifespan=connect)
    except ConfigurationError as error:
        raise click.ClickException(one_line(error)) from None
    click.echo(f"Console on http://{host}:{port}/ "
               f"({'actions allowed' if allow_actions else 'read-only'})")
    # Served on the loop dbos_async.run picks (uvloop unless DBOS_UVLOOP turns it off),
    # not on uvicorn's own choice, so that one setting decides for every command.
    server = console_server(app, host, port)
    run(server.serve())
    if not server.started:  # uvicorn has logged why (the port in use, say)
        raise click.ClickException(f"the console could not listen on {host}:{port}")
