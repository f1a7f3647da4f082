"""Which node of a Citus cluster a system database URL leads to, where its schema is
migrated, and which other nodes its notifications may be sent on.

With metadata synced to the workers, every node of a Citus cluster runs statements on the
distributed tables, so an executor may use any node. The schema is another matter: DDL runs
on the coordinator only (it propagates it to the workers), and ``dbos_migrations`` is a
table local to the coordinator. So the schema is migrated, or verified, through the
coordinator, whichever node the URL names. And a NOTIFY reaches only the sessions of the
node it is sent on, so a process listens on every node (:class:`CitusNodes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from dbos_async._database_url import Host
from dbos_async._sysdb import connection
from dbos_async._sysdb.statements.servers import (
    CITUS_INSTALLED,
    CITUS_NODE,
    CITUS_OTHER_NODES,
    CITUS_SHARDS_WITHOUT_TABLE,
)
from dbos_async.errors import ConfigurationError

_SYNC_METADATA = ("enable metadata sync to it (SELECT start_metadata_sync_to_node(host, "
                  "port) on the coordinator), or connect to the coordinator")


def node_url(url: str, node: Host) -> str:
    """``url`` (its user, password, database and options) on one node's server (the
    coordinator's, another worker's) instead of the servers it lists."""
    return connection.parsed_url(url).with_server(node)


@dataclass(frozen=True)
class CitusNodes:
    """The other nodes of the Citus cluster a system database URL is on, reached with that
    URL's user, password, database and options: where a process listens for the
    notifications writers connected to them send."""

    url: str
    connect_timeout: float
    connection_name: str

    async def others(self, conn: asyncpg.Connection) -> list[Host]:
        """The active primary nodes other than ``conn``'s own, as ``conn``'s node knows
        them (:data:`CITUS_OTHER_NODES`)."""
        return [Host(row["nodename"], row["nodeport"])
                for row in await conn.fetch(CITUS_OTHER_NODES)]

    async def connect(self, node: Host) -> asyncpg.Connection:
        """A connection to the system database on ``node`` (no timeline fence: Citus nodes
        have none to compare: see ``SERVER_STATE`` in dbos_async/_sysdb/statements/servers.py)."""
        return await connection.connect(node_url(self.url, node), self.connect_timeout,
                                        self.connection_name)


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
    return node_url(url, Host(node["coordinator_host"], node["coordinator_port"]))
