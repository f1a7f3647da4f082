"""Which node of a Citus cluster holds a shard key's rows, and a connection pool per node, so
that each key's statements can go straight to that node instead of through another node.

Citus hashes a ``text`` distribution column with PostgreSQL's ``hashtext()`` and keeps each
shard's interval of hash values in its metadata. :func:`hash_text` computes the same hash
here, and :class:`ShardMap` holds the intervals of ``workflow_status`` (every per-workflow
table is co-located with it, so a key's rows of every table are on one node) with the node
of each, read in one statement; :class:`NodePools` opens a pool per node on first use.

A map is a snapshot: after a shard moves, the old map still names the old node, where
Citus then forwards the statement (every node with metadata routes statements on
distributed tables). Routing by a stale map is so still correct, only slower; reload the map
(``ShardMap.load``) to route straight again.
"""

from __future__ import annotations

import asyncio
import struct
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from dbos_async._database_url import Host
from dbos_async._sysdb import connection
from dbos_async._sysdb.fencing import TimelineFence
from dbos_async._sysdb.statements.citus_shards import SHARD_PLACEMENTS, SHARDED_TABLE
from dbos_async._sysdb.statements.servers import CITUS_INSTALLED
from dbos_async.errors import ConfigurationError, DatabaseUnavailableError

# ---- hashtext() ----

_MASK = 0xFFFFFFFF
_INITIAL = 0x9E3779B9 + 3923095
"""The hash state's starting value, before the key's length is added (hashfn.c's)."""


@cache
def _words_of(blocks: int) -> Callable[[bytes], tuple[int, ...]]:
    """Reads ``blocks`` 12-byte blocks as little-endian 32-bit words, three a block."""
    return struct.Struct(f"<{3 * blocks}I").unpack


@lru_cache(maxsize=4096)
def hash_text(key: str) -> int:
    """PostgreSQL's ``hashtext(key)`` under a deterministic collation, which Citus uses to
    hash a ``text`` distribution column: Bob Jenkins' lookup3 ``hash_bytes`` as
    PostgreSQL's src/common/hashfn.c has it, over the key's UTF-8 bytes, as a signed 32-bit
    integer (``int4``), as a little-endian server (x86-64, arm64) computes it.

    The key is read as 32-bit words, three at a time, each block mixed into the state; the
    last 0 to 11 bytes go into the state as words too, zero-padded, the third one shifted
    left one byte (hashfn.c keeps the lowest byte of ``c`` for the length). hashfn.c reads
    an aligned key word by word and an unaligned one byte by byte; on a little-endian
    server both give these words.

    The hashes of the keys met lately are kept: a write asks for its key's shard several
    times (its lane, its batch's order, the shard its statement names).
    """
    data = key.encode()
    length = len(data)
    blocks = length // 12
    words = _words_of(blocks + 1)(data + bytes(12 * (blocks + 1) - length))
    a = b = c = (_INITIAL + length) & _MASK
    for i in range(0, 3 * blocks, 3):
        # mix(a, b, c), each block's words added first; every value is masked to 32 bits
        # before it is rotated.
        b = (b + words[i + 1]) & _MASK
        c = (c + words[i + 2]) & _MASK
        a = (a + words[i] - c) & _MASK
        a ^= ((c << 4) | (c >> 28)) & _MASK
        c = (c + b) & _MASK
        b = (b - a) & _MASK
        b ^= ((a << 6) | (a >> 26)) & _MASK
        a = (a + c) & _MASK
        c = (c - b) & _MASK
        c ^= ((b << 8) | (b >> 24)) & _MASK
        b = (b + a) & _MASK
        a = (a - c) & _MASK
        a ^= ((c << 16) | (c >> 16)) & _MASK
        c = (c + b) & _MASK
        b = (b - a) & _MASK
        b ^= ((a << 19) | (a >> 13)) & _MASK
        a = (a + c) & _MASK
        c = (c - b) & _MASK
        c ^= ((b << 4) | (b >> 28)) & _MASK
        b = (b + a) & _MASK
    last = 3 * blocks
    a = (a + words[last]) & _MASK
    b = (b + words[last + 1]) & _MASK
    c = (c + (words[last + 2] << 8)) & _MASK
    # final(a, b, c): subtracting an unmasked rotation is the same modulo 2**32.
    c ^= b
    c = (c - ((b << 14) | (b >> 18))) & _MASK
    a ^= c
    a = (a - ((c << 11) | (c >> 21))) & _MASK
    b ^= a
    b = (b - ((a << 25) | (a >> 7))) & _MASK
    c ^= b
    c = (c - ((b << 16) | (b >> 16))) & _MASK
    a ^= c
    a = (a - ((c << 4) | (c >> 28))) & _MASK
    b ^= a
    b = (b - ((a << 14) | (a >> 18))) & _MASK
    c ^= b
    c = (c - ((b << 24) | (b >> 8))) & _MASK
    return c - 0x100000000 if c & 0x80000000 else c


# ---- The shard map ----

Connection: TypeAlias = "asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]"
"""A connection of its own or a pool's, either of which reads the map."""

_INT4_MIN = -(2**31)
_INT4_MAX = 2**31 - 1


@dataclass(frozen=True)
class ShardInterval:
    """One shard of ``workflow_status``: the keys whose :func:`hash_text` lies in
    ``[min_hash, max_hash]``, the node holding it, and the shard of the same interval of each
    table co-located with it (``colocated``: table name and shard ID, its own among them)."""

    shard_id: int
    min_hash: int
    max_hash: int
    node: Host
    colocated: tuple[tuple[str, int], ...] = ()


class ShardMap:
    """The shards of a sharded system schema on Citus, by hash interval, and their nodes, as
    read at ``loaded_at`` (see the module docstring on staleness)."""

    def __init__(self, shards: Iterable[ShardInterval], loaded_at: float | None = None) -> None:
        """
        Args:
            shards: intervals that cover every 32-bit hash value once, in any order.
            loaded_at: when they were read (``time.monotonic()``); now if not given.

        Raises:
            ConfigurationError: the intervals leave a gap or overlap.
        """
        self.shards = tuple(sorted(shards, key=lambda shard: shard.min_hash))
        self.loaded_at = time.monotonic() if loaded_at is None else loaded_at
        _check_coverage(self.shards)
        self._min_hashes = [shard.min_hash for shard in self.shards]

    @classmethod
    async def load(cls, conn: Connection, schema: str) -> ShardMap | None:
        """The map of ``schema``'s ``workflow_status``, read through ``conn``, a connection
        (or a pool's) to the coordinator or to a worker node with metadata synced to it;
        None where the database is not a Citus one (no ``citus`` extension: nothing to
        route). One statement; on a database without Citus it fails and a second one looks
        for the extension, so ``conn`` must not be in a transaction there.

        Raises:
            ConfigurationError: the table is missing on that node, or not distributed by
                hash (an unsharded schema, or a worker node without the cluster's metadata).
            DatabaseUnavailableError: a shard has no active placement on an active primary
                node.
        """
        loaded_at = time.monotonic()
        try:
            rows = await conn.fetch(SHARD_PLACEMENTS, schema)
        except asyncpg.UndefinedTableError:
            if not await conn.fetchval(CITUS_INSTALLED):
                return None
            raise
        if not rows:
            raise await _not_distributed(conn, schema)
        unplaced = [row["shard_id"] for row in rows if row["node_host"] is None]
        if unplaced:
            raise DatabaseUnavailableError(
                f"Shards {unplaced} of {schema}.workflow_status have no active placement on "
                "an active primary node of the Citus cluster")
        return cls((ShardInterval(row["shard_id"], row["min_hash"], row["max_hash"],
                                  Host(row["node_host"], row["node_port"]),
                                  tuple(zip(row["tables"], map(int, row["shards"]),
                                            strict=True)))
                    for row in rows),
                   loaded_at)

    @property
    def age(self) -> float:
        """Seconds since the map was read."""
        return time.monotonic() - self.loaded_at

    def shard_of(self, shard_key: str) -> ShardInterval:
        """The shard holding ``shard_key``'s rows."""
        return self.shards[bisect_right(self._min_hashes, hash_text(shard_key)) - 1]

    def node_of(self, shard_key: str) -> Host:
        """The node holding ``shard_key``'s rows."""
        return self.shard_of(shard_key).node

    def nodes(self) -> list[Host]:
        """The nodes holding shards, each once, in the order of their first shard."""
        return list(dict.fromkeys(shard.node for shard in self.shards))


def _check_coverage(shards: tuple[ShardInterval, ...]) -> None:
    """Every 32-bit hash value in exactly one of ``shards`` (sorted by ``min_hash``)."""
    expected = _INT4_MIN
    for shard in shards:
        if shard.min_hash != expected or shard.max_hash < shard.min_hash:
            raise ConfigurationError(
                f"The shards' hash intervals do not cover every hash value once: shard "
                f"{shard.shard_id} holds [{shard.min_hash}, {shard.max_hash}], where "
                f"{expected} was to come next")
        expected = shard.max_hash + 1
    if expected != _INT4_MAX + 1:
        raise ConfigurationError(
            f"The shards' hash intervals do not cover every hash value: they end before "
            f"{expected}")


async def _not_distributed(conn: Connection, schema: str) -> ConfigurationError:
    """Why ``schema.workflow_status`` has no shards on ``conn``'s node."""
    row = await conn.fetchrow(SHARDED_TABLE, schema)
    assert row is not None  # one row, always
    if not row["table_exists"]:
        return ConfigurationError(
            f"{schema}.workflow_status does not exist on this node: the schema is not "
            "migrated, or this is a Citus worker node without its cluster's metadata "
            "(connect to the coordinator or to a node with metadata synced)")
    how = ("a Citus table not distributed by hash" if row["partition_method"] is not None
           else "a table Citus does not distribute")
    return ConfigurationError(
        f"{schema}.workflow_status is {how}: it is not a sharded schema on Citus, so there "
        "are no shards to route to")


# ---- A pool per node ----


class NodePools:
    """A connection pool per node of a Citus cluster, each opened on first use with the
    system database URL's user, password, database and options on that node's host and
    port, and the same size, timeouts and name as the caller's own pool."""

    def __init__(self, url: str, *, size: int, connect_timeout: float, name: str,
                 fence: Callable[[str], TimelineFence] | None = TimelineFence,
                 settings: Mapping[str, str] | None = None) -> None:
        """
        Args:
            url: the system database URL (any node of the cluster, or several).
            size, connect_timeout, name, settings: as :func:`connection.create_pool` takes
                them.
            fence: given a node's URL, the fence its pool's connections go through (one per
                node: a fence connects to the servers of its own URL, so the caller's, built
                for its URL, cannot serve another node); None: unfenced.
        """
        self._url = connection.parsed_url(url)
        self._size = size
        self._connect_timeout = connect_timeout
        self._name = name
        self._fence = fence
        self._settings = settings
        self._pools: dict[Host, asyncpg.Pool] = {}
        # One creator per node at a time: a caller waiting on it finds the pool made.
        self._opening: dict[Host, asyncio.Lock] = {}
        self._closed = False

    def url_of(self, node: Host) -> str:
        """The system database URL on ``node``."""
        return self._url.with_server(node)

    @property
    def pools(self) -> dict[Host, asyncpg.Pool]:
        """The pools opened so far, by node."""
        return dict(self._pools)

    async def pool_for(self, node: Host) -> asyncpg.Pool:
        """``node``'s pool, opened now if it is the first call for it. Callers asking for
        the same node at once share the one pool; if opening it fails, each raises and the
        next call tries again.

        Raises:
            RuntimeError: the pools are closed.
            DatabaseUnavailableError, ConfigurationError: as :func:`connection.create_pool`.
        """
        pool = self._pools.get(node)
        if pool is not None:
            return pool
        async with self._opening.setdefault(node, asyncio.Lock()):
            self._refuse_if_closed()
            pool = self._pools.get(node)
            if pool is None:
                url = self.url_of(node)
                pool = await connection.create_pool(
                    url, self._size, self._connect_timeout, self._name,
                    self._fence(url) if self._fence is not None else None, self._settings)
                if self._closed:  # closed while this one opened: it is not kept
                    await pool.close()
                    self._refuse_if_closed()
                self._pools[node] = pool
            return pool

    async def aclose(self) -> None:
        """Close every pool, waiting for their connections to be released; later calls of
        :meth:`pool_for` raise."""
        self._closed = True
        pools = list(self._pools.values())
        self._pools.clear()
        outcomes = await asyncio.gather(*(pool.close() for pool in pools),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise RuntimeError("The Citus node pools are closed")
