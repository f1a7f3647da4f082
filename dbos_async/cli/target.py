"""Which system database a command works on, and the client it works through.

Every command takes the same options. A setting not given on the command line comes from
the environment, then the configuration file, exactly as an executor's does
(:meth:`dbos_async.DBOSConfig.load`). Without a sharding setting, the schema says whether it
is sharded (:func:`dbos_async._sysdb.setup.sharded`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from dbos_async._eventloop import run as run_loop
from dbos_async._sysdb.embedded import embedded_database_url, has_embedded_database
from dbos_async._sysdb.setup import sharded
from dbos_async.client import DBOSClient
from dbos_async.config import DBOSConfig
from dbos_async.errors import ConfigurationError, DBOSError

T = TypeVar("T")

NO_URL = ("no system database URL: pass --url, set DBOS_SYSTEM_DATABASE_URL, or set "
          "system_database_url in the configuration file (--config, DBOS_CONFIG_FILE, or "
          "[tool.dbos_async] in ./pyproject.toml)")

_ANNOUNCED: set[str] = set()
"""The embedded databases this process has said it uses."""


@dataclass(frozen=True)
class Target:
    """The command line's connection options (None: not given)."""

    url: str | None
    schema: str | None
    application_name: str | None
    sharding: bool | None
    config_file: Path | None
    data_sources: tuple[str, ...] = ()
    """``NAME=URL`` of each application database the client registers."""

    def config(self) -> DBOSConfig:
        """These options over the environment and the configuration file. Without a URL,
        the embedded database an application run here kept (under ``data_dir``, ``.dbos/``
        by default: the same defaults, the same folder) is started or joined; fails when
        there is none."""
        config = DBOSConfig.load(self.config_file, system_database_url=self.url,
                                 schema_name=self.schema,
                                 application_name=self.application_name,
                                 sharding=self.sharding)
        if config.system_database_url is not None:
            return config
        if not has_embedded_database(config.data_dir):
            raise ConfigurationError(
                f"{NO_URL}; nor is there an embedded database in {config.data_dir}/ (an "
                "application run without a URL keeps one there)")
        url = embedded_database_url(config.data_dir)
        if url not in _ANNOUNCED:
            _ANNOUNCED.add(url)
            click.echo(f"Using the embedded PostgreSQL in {config.data_dir.resolve()}",
                       err=True)
        return config.model_copy(update={"system_database_url": url})

    @asynccontextmanager
    async def client(self) -> AsyncIterator[DBOSClient]:
        """A connected client on the target, with the smallest pool. Its notifier stays on:
        a cancel, resume or fork wakes the executors concerned at once."""
        config = self.config()
        client = DBOSClient(
            config.system_database_url, schema_name=config.schema_name,
            application_name=config.application_name, sharding=await sharded(config),
            config_file=self.config_file, pool_size=2)
        for source in self.data_sources:
            name, equals, url = source.partition("=")
            if not (name and equals and url):
                raise ConfigurationError(f"--data-source takes NAME=URL, got {source!r}")
            client.data_source(name, url)
        async with client:
            yield client


def one_line(error: BaseException) -> str:
    """An error's message on one line, for a shell."""
    return " ".join(str(error).split()) or type(error).__name__


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on the event loop :func:`dbos_async.run` picks; a
    dbos_async error becomes a one-line message and exit status 1 (click's usage errors exit
    with 2)."""
    try:
        return run_loop(coroutine)
    except DBOSError as error:
        raise click.ClickException(one_line(error)) from None


def target_options(command: Callable[..., T]) -> Callable[..., T]:
    """Add the connection options to ``command``, passed to it as ``target``."""

    @click.option("--url", "-u", "--sys-db-url", "-s", "url", metavar="URL",
                  help="System database URL (default: DBOS_SYSTEM_DATABASE_URL, then the "
                       "configuration file).")
    @click.option("--schema", metavar="NAME",
                  help="Schema of the system tables (default: DBOS_SCHEMA_NAME, or dbos).")
    @click.option("--application-name", metavar="NAME",
                  help="Act for this application when several share the database: scopes "
                       "listings and versions (default: DBOS_APPLICATION_NAME).")
    @click.option("--sharding/--no-sharding", default=None,
                  help="Whether the schema is sharded (default: DBOS_SHARDING, else what "
                       "the schema is).")
    @click.option("--config", "config_file", metavar="FILE",
                  type=click.Path(dir_okay=False, path_type=Path),
                  help="TOML configuration file (default: DBOS_CONFIG_FILE, else "
                       "[tool.dbos_async] in ./pyproject.toml).")
    @click.option("--data-source", "data_sources", metavar="NAME=URL", multiple=True,
                  help="An application database the executors' transactions record in "
                       "(its datasource_outputs in schema dbos; repeatable): rewind, "
                       "delete, export and import cover its records.")
    @functools.wraps(command)
    def with_target(**options: Any) -> T:
        target = Target(*(options.pop(name) for name in _TARGET_OPTIONS))
        return command(target=target, **options)

    return with_target


_TARGET_OPTIONS = ("url", "schema", "application_name", "sharding", "config_file",
                   "data_sources")
