"""A private Citus cluster that a test stops, starts and kills nodes of: a coordinator and
worker nodes, each a throwaway PostgreSQL server from the machine's own programs.

The shared cluster ``DBOS_TEST_CITUS_URL`` names must not lose a node under other tests, so
the fault tests build their own: each node is a copy of one initdb'd cluster (made once per
process), in a temporary directory, started on a free port of 127.0.0.1 (as the test-server
finder's ``local`` branch starts one, :class:`dbos_async.testing.servers.LocalBinaries`),
and started again on the same port after a stop or a kill, with Citus preloaded, prepared
transactions (Citus commits a transaction over several nodes in two phases), logical WAL
(a shard move that keeps writes going copies by logical replication), durable commits (an
acknowledged commit must survive a node's kill -9; fsync stays off: the machine itself does
not crash) and every login from 127.0.0.1 trusted. Database :data:`DATABASE` holds the
``citus`` extension on every node; the coordinator, which holds no shards, knows itself
(``citus_set_coordinator_host``) and every worker (``citus_add_node``, which syncs the
metadata to it, so every node can run the distributed tables' statements).

Nodes are numbered as Citus numbers their groups: 0 is the coordinator, 1, 2, ... the
workers. :meth:`CitusCluster.remove` stops every node and removes the files (an ``atexit``
hook is the backstop).
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from dbos_async.testing import servers
from dbos_async.testing.servers import LocalBinaries
from tests.helpers.cluster import clear_killed_server, kill_postmaster

DATABASE = "citus"
COORDINATOR = 0

# How many hash ranges the keys of database DATABASE fall into: few, so that the tables are
# distributed fast and a handful of keys already shares a shard (what moves with it); more
# than one per worker, so that a batch may span several shards of a node. Set on that
# database alone: another database of the cluster gets the migration's default.
SHARD_COUNT = 8

NODE_SETTINGS = (
    "shared_preload_libraries=citus",
    "max_prepared_transactions=100",
    "wal_level=logical",
    "synchronous_commit=on",
)

GROUP_OF_PORT = "SELECT groupid FROM pg_dist_node WHERE nodeport = $1"
SHARD_OF_KEY = ("SELECT get_shard_id_for_distribution_column('dbos.workflow_status', "
                "$1::text)")
NODE_OF_SHARD = ("SELECT n.groupid FROM pg_dist_placement p "
                 "JOIN pg_dist_node n USING (groupid) WHERE p.shardid = $1")


def citus_library(bindir: Path) -> Path:
    """Where the server programs in ``bindir`` load Citus from (``pg_config --pkglibdir``,
    else the ``lib`` beside ``bin`` of Debian's layout)."""
    pg_config = bindir / "pg_config"
    if pg_config.is_file():
        done = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True, text=True,
                              check=False, timeout=30)
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip()) / "citus.so"
    return bindir.parent / "lib" / "citus.so"


_templates: dict[Path, Path] = {}


def _node_template(binaries: LocalBinaries) -> Path:
    """The data directory every node starts as (made once per process, removed at its exit):
    a new cluster holding database :data:`DATABASE`, cleanly shut down. Copying it is much
    faster than initdb on each node. (The ``citus`` extension is created on each node: it
    gives each its own server ID, by which Citus tells a node from another.)"""
    made = _templates.get(binaries.bindir)
    if made is not None:
        return made
    base = binaries.make_dir()
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    data = base / "node"
    binaries.initdb(data)
    port = binaries.start(data, NODE_SETTINGS)
    try:
        servers.run_sync(_execute(f"postgresql://postgres@127.0.0.1:{port}/postgres",
                                  f'CREATE DATABASE "{DATABASE}"'))
    finally:
        binaries.stop(data, mode="fast")
    _templates[binaries.bindir] = data
    return data


async def _execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _copy_tree(source: Path, target: Path) -> None:
    """A copy of a stopped cluster's directory, with its owners and modes."""
    subprocess.run(["cp", "-a", str(source), str(target)], check=True, capture_output=True,
                   timeout=60)


@dataclass
class Node:
    """One server of the cluster: its Citus group number, data directory and port."""

    number: int
    data: Path
    port: int = 0


class CitusCluster:
    """A coordinator and ``workers`` worker nodes, running (see the module docstring).

    Skips the test where the machine has no PostgreSQL server programs or no Citus
    installed into them.
    """

    def __init__(self, workers: int = 2) -> None:
        try:
            self.binaries = LocalBinaries(*servers._check_local())
        except servers.Unavailable as why:
            pytest.skip(f"no local PostgreSQL binaries for a private Citus cluster: {why}")
        library = citus_library(self.binaries.bindir)
        if not library.is_file():
            pytest.skip(f"Citus is not installed into the PostgreSQL of "
                        f"{self.binaries.bindir} (no {library}): a private Citus cluster "
                        "needs it")
        template = _node_template(self.binaries)
        self.base = self.binaries.make_dir()
        self.nodes = [Node(n, self.base / ("coordinator" if n == COORDINATOR else f"worker{n}"))
                      for n in range(workers + 1)]
        atexit.register(self.remove)
        try:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda node: self._create_node(template, node), self.nodes))
            servers.run_sync(self._form_cluster())
        except BaseException:
            self.remove()
            raise

    @property
    def workers(self) -> list[int]:
        """The worker nodes' numbers."""
        return [node.number for node in self.nodes if node.number != COORDINATOR]

    def url(self, node: int = COORDINATOR, database: str = DATABASE) -> str:
        """The URL of ``database`` on ``node`` (0: the coordinator)."""
        return f"postgresql://postgres@127.0.0.1:{self.nodes[node].port}/{database}"

    def _create_node(self, template: Path, node: Node) -> None:
        _copy_tree(template, node.data)
        self._start(node)

    def _start(self, node: Node) -> None:
        node.port = self.binaries.start(node.data, NODE_SETTINGS, port=node.port or None)

    async def _form_cluster(self) -> None:
        """The extension on every node; the coordinator told of itself (holding no shards)
        and of each worker."""
        await asyncio.gather(*(_execute(self.url(node.number), "CREATE EXTENSION citus")
                               for node in self.nodes))
        conn = await asyncpg.connect(self.url(), timeout=10)
        try:
            coordinator = self.nodes[COORDINATOR].port
            await conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', $1)", coordinator)
            await conn.execute("SELECT citus_set_node_property('127.0.0.1', $1, "
                               "'shouldhaveshards', false)", coordinator)
            for number in self.workers:
                port = self.nodes[number].port
                await conn.execute("SELECT citus_add_node('127.0.0.1', $1)", port)
                group = await conn.fetchval(GROUP_OF_PORT, port)
                assert group == number, f"worker {number} joined as group {group}"
            await conn.execute(f"ALTER DATABASE {DATABASE} SET citus.shard_count = {SHARD_COUNT}")
        finally:
            await conn.close()

    # ---- Faults ----

    def stop_worker(self, number: int) -> None:
        """``pg_ctl stop -m fast``: worker ``number`` ends its sessions and shuts down."""
        self.binaries.stop(self._worker(number).data, mode="fast")

    def kill_worker(self, number: int) -> None:
        """kill -9 of worker ``number``'s postmaster, as a crash: its processes die with it,
        and it recovers from its WAL when started again."""
        kill_postmaster(self._worker(number).data)

    def start_worker(self, number: int) -> None:
        """Start worker ``number`` again on its port, after a stop or a kill."""
        node = self._worker(number)
        clear_killed_server(node.data, self.base, node.port)
        self._start(node)

    def _worker(self, number: int) -> Node:
        if number == COORDINATOR or not 0 < number < len(self.nodes):
            raise ValueError(f"no worker node {number}: the workers are {self.workers}")
        return self.nodes[number]

    # ---- Where keys live ----

    async def shard_of(self, key: str) -> int:
        """The shard of ``dbos.workflow_status`` holding ``key`` (its co-located shards of
        the other per-workflow tables move with it)."""
        conn = await asyncpg.connect(self.url(), timeout=10)
        try:
            return int(await conn.fetchval(SHARD_OF_KEY, key))
        finally:
            await conn.close()

    async def node_of(self, key: str) -> int:
        """The worker node holding ``key``'s rows now."""
        shard = await self.shard_of(key)
        conn = await asyncpg.connect(self.url(), timeout=10)
        try:
            return int(await conn.fetchval(NODE_OF_SHARD, shard))
        finally:
            await conn.close()

    def remove(self) -> None:
        """Stop every node and remove the files. Idempotent."""
        atexit.unregister(self.remove)
        for node in self.nodes:
            self.binaries.stop(node.data)
        shutil.rmtree(self.base, ignore_errors=True)
