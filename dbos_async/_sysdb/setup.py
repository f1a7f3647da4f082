"""Preparing a system database for use: create it if it is missing, then migrate or verify
its schema. An executor does this on entering; :func:`migrate` does it on its own, for
deployments that migrate before the application starts (``dbos-async migrate``)."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from dbos_async._sysdb import citus_nodes, connection, migrations
from dbos_async._sysdb.fencing import TimelineFence
from dbos_async.config import DBOSConfig
from dbos_async.errors import ConfigurationError


async def prepare(url: str, schema: str, *, sharded: bool, run_migrations: bool,
                  connect_timeout: float, connection_name: str,
                  fence: TimelineFence | None = None) -> tuple[int, str]:
    """Migrate the schema (creating the database first if allowed), or only verify it,
    on a server ``fence`` admits; returns its version and the URL it was migrated through.
    A sharded schema on a Citus worker node is migrated or verified through its
    coordinator (see :mod:`~dbos_async._sysdb.citus_nodes`): no DDL is ever run on a
    worker, and what must be seen by every node's executors (the executor IDs' advisory
    locks) is held there too."""
    if run_migrations:
        await connection.ensure_database(url, connect_timeout, connection_name, fence)
    conn = await connection.connect(url, connect_timeout, connection_name, fence)
    try:
        coordinator = (await citus_nodes.migration_url(conn, url, schema)
                       if sharded else None)
        if coordinator is None:
            return await _migrate_or_verify(conn, schema, sharded, run_migrations), url
    finally:
        await conn.close()
    conn = await connection.connect(coordinator, connect_timeout, connection_name,
                                    TimelineFence(coordinator, fence.options if fence else None))
    try:
        return await _migrate_or_verify(conn, schema, sharded, run_migrations), coordinator
    finally:
        await conn.close()


async def _migrate_or_verify(conn: asyncpg.Connection, schema: str, sharded: bool,
                             run_migrations: bool) -> int:
    if run_migrations:
        return await migrations.migrate(conn, schema, sharded=sharded)
    return await migrations.verify(conn, schema, sharded=sharded)


async def sharded(config: DBOSConfig) -> bool:
    """Whether to address a sharded schema: the ``sharding`` setting where one is given,
    else the kind of schema the database holds (unsharded when it holds none)."""
    if "sharding" in config.model_fields_set:
        return config.sharding
    if config.system_database_url is None:
        return False
    return await migrations.holds_sharded_schema(config.system_database_url, config.schema_name)


async def migrate(system_database_url: str | None = None, *, schema_name: str | None = None,
                  sharding: bool | None = None,
                  config_file: str | Path | None = None) -> int:
    """Create the system database if it is missing and bring its DBOS schema to the latest
    version; returns that version. Safe to run from several processes at once and again on
    an up-to-date database (it then changes nothing).

    Settings not given come from the configuration file and the environment, as an
    executor's do (``DBOS_SYSTEM_DATABASE_URL``, ``DBOS_SCHEMA_NAME``, ``DBOS_SHARDING``).
    Without a ``sharding`` setting the schema keeps its kind: sharded if it already is,
    else unsharded.
    """
    config = DBOSConfig.load(config_file, system_database_url=system_database_url,
                             schema_name=schema_name, sharding=sharding)
    url = config.system_database_url
    if url is None:
        raise ConfigurationError(
            "migrate() needs a system database URL: pass system_database_url, or set "
            "DBOS_SYSTEM_DATABASE_URL or system_database_url in the configuration file")
    version, _ = await prepare(url, config.schema_name, sharded=await sharded(config),
                         run_migrations=True,
                         connect_timeout=config.connect_timeout,
                         connection_name=config.connection_name,
                         fence=TimelineFence(url, config.connect_options))
    return version
