"""Which node of a Citus cluster a system database URL leads to, and where its schema is
migrated.

With metadata synced to the workers, every node of a Citus cluster runs statements on the
distributed tables, so an executor may use any node. The schema is another matter: DDL runs
on the coordinator only (it propagates it to the workers), and ``dbos_migrations`` is a
table local to the coordinator. So the schema is migrated, or verified, through the
coordinator, whichever node the URL names.
"""

from __future__ import annotations

import asyncpg

from dbos_async.database_url import Host
from dbos_async.errors import ConfigurationError
from dbos_async.sysdb import connection
from dbos_async.sysdb.statements.servers import (
    CITUS_INSTALLED,
    CITUS_NODE,
    CITUS_SHARDS_WITHOUT_TABLE,
)

_SYNC_METADATA = ("enable metadata sync to it (SELECT start_metadata_sync_to_node(host, "
                  "port) on the coordinator), or connect to the coordinator")


def coordinator_url(url: str, coordinator: Host) -> str:
    """``url`` (its user, password, database and options) on the coordinator's server
    instead of the servers it lists."""
    return connection.parsed_url(url).with_server(coordinator)


async def migration_url(conn: asyncpg.Connection, url: str, schema: str) -> str | None:
    """Where the schema is migrated or verified, for ``conn``, a connection through ``url``:
    None where it is this server itself (plain PostgreSQL, a Citus coordinator or single
    node), else the URL of the coordinator of the Citus worker node it reached.

    Raises:
        ConfigurationError: the server is a Citus worker node that does not know its
            cluster (no metadata synced to it), or knows no coordinator.
    """
    if not await conn.fetchval(CITUS_INSTALLED):
        return None
    node = await conn.fetchrow(CITUS_NODE)
    assert node is not None  # pg_dist_local_group holds one row
    where = connection.parsed_url(url).describe()
    if node["group_id"] == 0:
        if not node["knows_nodes"] and await conn.fetchval(CITUS_SHARDS_WITHOUT_TABLE, schema):
            raise ConfigurationError(
                f"The system database {where} is on a Citus worker node without its "
                f"cluster's metadata (it holds shards of {schema}.workflow_status but not the "
                f"table): {_SYNC_METADATA}")
        return None
    if node["coordinator_host"] is None:
        raise ConfigurationError(
            f"The system database {where} is on a Citus worker node (group "
            f"{node['group_id']}) that knows no coordinator, where its schema is migrated: "
            f"{_SYNC_METADATA}")
    return coordinator_url(url, Host(node["coordinator_host"], node["coordinator_port"]))
