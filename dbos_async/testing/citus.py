"""Throwaway databases on a Citus cluster: a database of its own on every node, with the
``citus`` extension, knowing the same nodes as the cluster's admin database.

Citus keeps its metadata per database: a new database has the extension nowhere and knows no
node, so a fresh database for distributed tables needs more than ``CREATE DATABASE`` on the
coordinator. The test suite's ``citus_url`` fixture and the Citus benchmark make theirs here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg

from dbos_async._database_url import Host, parse_database_url, with_database
from dbos_async.testing.databases import quoted_name

PRIMARY_NODES = ("SELECT groupid, nodename, nodeport, shouldhaveshards FROM pg_dist_node "
                 "WHERE noderole = 'primary' AND isactive ORDER BY groupid")
"""The cluster's active primary nodes, the coordinator (group 0) first."""


@dataclass(frozen=True)
class CitusNode:
    """One primary node of a Citus cluster, as ``pg_dist_node`` lists it."""

    group: int
    host: str
    port: int
    holds_shards: bool

    @property
    def is_coordinator(self) -> bool:
        """Whether this node is the coordinator (group 0)."""
        return self.group == 0


def node_url(url: str, node: CitusNode, database: str | None = None) -> str:
    """``url`` (its user, password and options) on ``node``, in ``database`` (by default
    the URL's own)."""
    on_node = parse_database_url(url).with_server(Host(node.host, node.port))
    return with_database(on_node, database) if database is not None else on_node


async def citus_nodes(url: str) -> list[CitusNode]:
    """The active primary nodes of the cluster whose coordinator ``url`` names (a database
    there with the citus extension), the coordinator first."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        rows = await conn.fetch(PRIMARY_NODES)
    finally:
        await conn.close()
    return [CitusNode(r["groupid"], r["nodename"], r["nodeport"], r["shouldhaveshards"])
            for r in rows]


async def create_citus_database(admin_url: str, name: str) -> str:
    """Create database ``name`` on every node of ``admin_url``'s cluster and make it a Citus
    database of the same nodes; returns its URL on the coordinator.

    ``CREATE DATABASE`` itself is propagated to the workers when asked (Citus >= 12.1); the
    extension is then created on each node, and the new database is told the admin
    database's node list (the coordinator's host and whether it holds shards, then each
    worker).
    """
    nodes = await citus_nodes(admin_url)
    admin = await asyncpg.connect(admin_url, timeout=10)
    try:
        await admin.execute("SET citus.enable_create_database_propagation = on")
        for attempt in range(5):
            try:
                await admin.execute(f"CREATE DATABASE {quoted_name(name)}")
                break
            except asyncpg.ObjectInUseError:  # another CREATE DATABASE at the same moment
                if attempt == 4:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
    finally:
        await admin.close()
    workers = [node for node in nodes if not node.is_coordinator]
    for node in workers:
        worker = await asyncpg.connect(node_url(admin_url, node, name), timeout=10)
        try:
            await worker.execute("CREATE EXTENSION citus")
        finally:
            await worker.close()
    url = with_database(admin_url, name)
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute("CREATE EXTENSION citus")
        for node in nodes:
            if node.is_coordinator:
                await conn.execute("SELECT citus_set_coordinator_host($1, $2)",
                                   node.host, node.port)
                await conn.execute(
                    "SELECT citus_set_node_property($1, $2, 'shouldhaveshards', $3)",
                    node.host, node.port, node.holds_shards)
        for node in workers:
            await conn.execute("SELECT citus_add_node($1, $2)", node.host, node.port)
    finally:
        await conn.close()
    return url


async def drop_citus_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` on every node, each on its own (workers first): a drop that
    Citus propagates is not atomic across nodes, and a worker may still hold a session in
    the database (a connection the coordinator cached, Citus's maintenance daemon) after
    the coordinator's WITH (FORCE) ended its own."""
    nodes = await citus_nodes(admin_url)
    admin_database = parse_database_url(admin_url).database_name
    for node in sorted(nodes, key=lambda n: n.is_coordinator):
        conn = await asyncpg.connect(node_url(admin_url, node, admin_database), timeout=10)
        try:
            for attempt in range(10):
                try:
                    await conn.execute(f"DROP DATABASE IF EXISTS {quoted_name(name)} WITH (FORCE)")
                    break
                except asyncpg.ObjectInUseError as error:
                    if attempt == 9:
                        raise
                    if "prepared transaction" in str(error):
                        await _abandon_prepared(node_url(admin_url, node, name))
                    await asyncio.sleep(0.1 * (attempt + 1))
        finally:
            await conn.close()


async def _abandon_prepared(url: str) -> None:
    """Roll back the transactions prepared in the database of ``url``: a database a prepared
    transaction uses cannot be dropped, and Citus settles the ones its two-phase commits left
    only once a minute. The database is being dropped, so their outcome no longer matters."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        for row in await conn.fetch("SELECT gid FROM pg_prepared_xacts "
                                    "WHERE database = current_database()"):
            gid = row["gid"].replace("'", "''")
            await conn.execute(f"ROLLBACK PREPARED '{gid}'")
    finally:
        await conn.close()

