"""Routing by shard key on Citus (dbos_async/_sysdb/citus_shards.py): ``hash_text`` is the
server's ``hashtext()``, a ``ShardMap`` names the node Citus itself says holds a key (read
on the coordinator or on a worker, before and after a shard moves or splits), and
``NodePools`` opens one pool per node."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from helpers import execute, fetch, fetchval, new_dbos, unique_name, wait_until

from dbos_async import SetShardKey, SetWorkflowID, WorkflowCancelledError
from dbos_async._database_url import Host, parse_database_url
from dbos_async._sysdb.citus_shards import NodePools, ShardInterval, ShardMap, hash_text
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.statements import Query
from dbos_async._sysdb.statements.sharded import ShardedStatements
from dbos_async._sysdb.writes import routed as routed_writes
from dbos_async._sysdb.writes.routed import SHARD_MOVED, Step, encode
from dbos_async.errors import ConfigurationError

# A schema name that must be quoted: capitals, a space, a double quote.
SCHEMA = 'Tenants "A"'


def generated_keys() -> list[str]:
    """About 2,000 keys: empty, ASCII of every length up to 40 (each tail length of the
    hash's 12-byte blocks, several times), multi-byte UTF-8 of 2, 3 and 4 bytes a
    character, and long keys."""
    draw = random.Random(20240613)
    ascii_letters = [chr(c) for c in range(0x20, 0x7F)]
    wide = ["é", "ß", "Ж", "中", "€", "ﬁ", "😀", "𝄞", "\u0301"]
    keys = [""]
    for length in range(1, 41):
        keys += ["".join(draw.choices(ascii_letters, k=length)) for _ in range(25)]
    for length in range(1, 41):
        keys += ["".join(draw.choices(ascii_letters + wide, k=length)) for _ in range(24)]
        keys.append("".join(draw.choices(wide, k=length)))
    keys += ["".join(draw.choices(ascii_letters + wide, k=draw.randint(100, 2000)))
             for _ in range(60)]
    keys += ["tenant-42", "acme", "x" * 127, "x" * 128, "\x7f" * 12, "\U0010ffff" * 3]
    return keys


KEYS = generated_keys()


async def test_hash_text_is_the_servers_hashtext(conn: asyncpg.Connection) -> None:
    """Both of the server's code paths: an array's elements have 4-byte headers (hashfn.c
    reads their bytes word-aligned), a table's short values 1-byte headers (unaligned)."""
    assert len(KEYS) >= 2000
    from_array = await conn.fetch(
        "SELECT k, hashtext(k) AS h FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) "
        "ORDER BY i", KEYS)
    await conn.execute("CREATE TABLE keys (i int PRIMARY KEY, k text NOT NULL)")
    await conn.executemany("INSERT INTO keys VALUES ($1, $2)", list(enumerate(KEYS)))
    from_table = await conn.fetch("SELECT k, hashtext(k) AS h FROM keys ORDER BY i")
    for rows in (from_array, from_table):
        assert [row["k"] for row in rows] == KEYS
        mismatched = [(row["k"], row["h"], hash_text(row["k"]))
                      for row in rows if hash_text(row["k"]) != row["h"]]
        assert mismatched == []
    assert len({hash_text(k) for k in set(KEYS)}) > len(set(KEYS)) - 5  # not a constant, say


async def test_no_map_on_plain_postgresql(database_url: str) -> None:
    sysdb = SystemDatabase(database_url, sharded=True, pool_size=1)
    await sysdb.open()
    try:
        async with sysdb.pool.acquire() as conn:
            assert await ShardMap.load(conn, "dbos") is None
    finally:
        await sysdb.close()


def test_a_map_must_cover_every_hash_once() -> None:
    node = Host("10.0.0.1", 5432)
    low = ShardInterval(1, -(2**31), -1, node)
    high = ShardInterval(2, 0, 2**31 - 1, Host("10.0.0.2", 5432))
    shards = ShardMap([high, low])
    assert shards.shards == (low, high)
    assert shards.nodes() == [node, Host("10.0.0.2", 5432)]
    for key in KEYS[:200]:
        assert shards.node_of(key) == (low.node if hash_text(key) < 0 else high.node)
    with pytest.raises(ConfigurationError, match="where 0 was to come next"):
        ShardMap([low, ShardInterval(2, 1, 2**31 - 1, node)])
    with pytest.raises(ConfigurationError, match="end before"):
        ShardMap([low])


# ---- On Citus ----


@dataclass(frozen=True)
class Cluster:
    """A sharded system schema on a Citus cluster: the URL and its nodes'."""

    url: str
    workers: tuple[Host, ...]

    def on(self, node: Host) -> str:
        return parse_database_url(self.url).with_server(node)


@pytest.fixture
async def cluster(citus_url: str) -> AsyncIterator[Cluster]:
    """``SCHEMA`` migrated as a sharded schema on the Citus database of ``citus_url``."""
    sysdb = SystemDatabase(citus_url, schema=SCHEMA, sharded=True, pool_size=1)
    await sysdb.open()
    await sysdb.close()
    conn = await asyncpg.connect(citus_url)
    try:
        workers = await conn.fetch("SELECT nodename, nodeport FROM pg_dist_node "
                                   "WHERE groupid <> 0 AND noderole = 'primary' ORDER BY groupid")
    finally:
        await conn.close()
    if len(workers) < 2:
        pytest.skip("needs a Citus cluster with two worker nodes")
    yield Cluster(citus_url, tuple(Host(w["nodename"], w["nodeport"]) for w in workers))


async def citus_placements(url: str, keys: list[str]) -> dict[str, tuple[int, Host]]:
    """Each key's shard and the node of its placement, as Citus computes them."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT k, p.shardid, n.nodename, n.nodeport "
            "FROM unnest($1::text[]) AS k "
            "JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column("
            "    format('%I.%I', $2::text, 'workflow_status')::regclass, k) "
            "JOIN pg_dist_node n USING (groupid)", keys, SCHEMA)
    finally:
        await conn.close()
    placements = {row["k"]: (row["shardid"], Host(row["nodename"], row["nodeport"]))
                  for row in rows}
    assert len(placements) == len(keys) == len(rows)  # one placement each
    return placements


async def load_map(url: str) -> ShardMap:
    conn = await asyncpg.connect(url)
    try:
        shards = await ShardMap.load(conn, SCHEMA)
    finally:
        await conn.close()
    assert shards is not None
    return shards


def routed(shards: ShardMap, keys: list[str]) -> dict[str, tuple[int, Host]]:
    return {key: (shards.shard_of(key).shard_id, shards.node_of(key)) for key in keys}


ROUTED_KEYS = [f"tenant-{i}" for i in range(400)] + KEYS[::20][:100]


@pytest.mark.citus
async def test_map_routes_each_key_to_its_placement(cluster: Cluster) -> None:
    assert len(ROUTED_KEYS) == 500
    expected = await citus_placements(cluster.url, ROUTED_KEYS)
    assert {node for _, node in expected.values()} == set(cluster.workers)
    on_coordinator = await load_map(cluster.url)
    on_worker = await load_map(cluster.on(cluster.workers[1]))
    for shards in (on_coordinator, on_worker):
        assert routed(shards, ROUTED_KEYS) == expected
        assert set(shards.nodes()) == set(cluster.workers)
        assert 0 <= shards.age < 60
    assert on_worker.shards == on_coordinator.shards
    assert on_worker.loaded_at > on_coordinator.loaded_at


@pytest.mark.citus
async def test_a_reloaded_map_follows_a_moved_shard(cluster: Cluster) -> None:
    before = await load_map(cluster.url)
    moved = before.shards[0]
    [target] = [node for node in cluster.workers if node != moved.node]
    conn = await asyncpg.connect(cluster.url)
    try:
        await conn.execute(
            "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, 'block_writes')",
            moved.shard_id, moved.node.address, moved.node.port, target.address, target.port)
    finally:
        await conn.close()
    after = await load_map(cluster.url)
    moved_keys = [key for key in ROUTED_KEYS if before.shard_of(key) == moved]
    assert moved_keys
    assert {after.node_of(key) for key in moved_keys} == {target}
    assert {before.node_of(key) for key in moved_keys} == {moved.node}
    assert routed(after, ROUTED_KEYS) == await citus_placements(cluster.url, ROUTED_KEYS)
    assert [s for s in after.shards if s.shard_id != moved.shard_id] == \
        [s for s in before.shards if s.shard_id != moved.shard_id]

    # A statement sent by the old map to the old node still reaches the key's rows: Citus
    # there routes it to the new one.
    stale = await asyncpg.connect(cluster.on(moved.node))
    try:
        plan = await stale.fetchval(
            f"EXPLAIN (FORMAT JSON) SELECT * FROM {quoted(SCHEMA)}.workflow_status "
            f"WHERE shard_key = {literal(moved_keys[0])}")
    finally:
        await stale.close()
    assert f"host={target.address} port={target.port}" in plan
    assert f"port={moved.node.port}" not in plan


def quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@pytest.mark.citus
async def test_load_refuses_what_is_not_a_sharded_schema(citus_url: str) -> None:
    unsharded = SystemDatabase(citus_url, schema="plain", pool_size=1)
    await unsharded.open()
    await unsharded.close()
    conn = await asyncpg.connect(citus_url)
    try:
        with pytest.raises(ConfigurationError, match=r"^plain\.workflow_status is a"):
            await ShardMap.load(conn, "plain")
        with pytest.raises(ConfigurationError, match=r"missing\.workflow_status does not exist"):
            await ShardMap.load(conn, "missing")
    finally:
        await conn.close()


@pytest.mark.citus
async def test_node_pools_one_per_node(cluster: Cluster) -> None:
    name = unique_name("node_pools")
    pools = NodePools(cluster.url, size=2, connect_timeout=10, name=name)
    nodes = list(cluster.workers)
    asked = [node for node in nodes for _ in range(5)]
    got = await asyncio.gather(*(pools.pool_for(node) for node in asked))
    assert set(pools.pools) == set(nodes)
    for node, pool in zip(asked, got, strict=True):
        assert pool is pools.pools[node]
        assert await pool.fetchval("SELECT inet_server_port()") == node.port
        assert await pool.fetchval("SELECT current_setting('application_name')") == name
    # One pool each: a second pool would have opened a connection of its own.
    for node in nodes:
        conn = await asyncpg.connect(cluster.on(node))
        try:
            assert await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                "AND datname = current_database()", name) == 1
        finally:
            await conn.close()
    assert await pools.pool_for(nodes[0]) is got[0]

    await pools.aclose()
    assert all(pool.is_closing() for pool in got)
    assert pools.pools == {}
    with pytest.raises(RuntimeError, match="closed"):
        await pools.pool_for(nodes[0])


# ---- Writes that name a shard's tables ----


async def move_shard(url: str, shard: ShardInterval, target: Host) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, 'block_writes')",
            shard.shard_id, shard.node.address, shard.node.port, target.address, target.port)
    finally:
        await conn.close()


NODE_ID = "SELECT nodeid FROM pg_dist_node WHERE nodename = $1 AND nodeport = $2"


async def split_shard(url: str, shard: ShardInterval, targets: tuple[Host, Host]) -> int:
    """Split ``shard`` (with its co-located shards of every table) at the midpoint of its
    hash interval, the lower half onto ``targets[0]`` and the upper onto ``targets[1]``,
    blocking writes to it during the copy; the split point (the lower half's last hash)."""
    midpoint = (shard.min_hash + shard.max_hash) // 2
    conn = await asyncpg.connect(url)
    try:
        node_ids = [await conn.fetchval(NODE_ID, node.address, node.port) for node in targets]
        await conn.execute(
            "SELECT citus_split_shard_by_split_points($1, $2, $3, 'block_writes')",
            shard.shard_id, [str(midpoint)], node_ids)
    finally:
        await conn.close()
    return midpoint


@pytest.mark.citus
async def test_a_program_naming_a_shard_runs_only_where_the_shard_is(cluster: Cluster) -> None:
    shards = await load_map(cluster.url)
    shard = shards.shards[0]
    [other] = [node for node in cluster.workers if node != shard.node]
    table = f"{quoted(SCHEMA)}.workflow_status_{shard.shard_id}"
    count = Step(Query(f"SELECT count(*) AS n FROM {table}"), rows=True)
    sql = ShardedStatements(quoted(SCHEMA)).run_routed("k", encode([count]), shard.shard_id)

    async def run_on(node: Host) -> Any:
        conn = await asyncpg.connect(cluster.on(node))
        try:
            return await conn.fetchval(sql.sql, *sql.params)
        finally:
            await conn.close()

    async def refused_on(node: Host) -> None:
        with pytest.raises(asyncpg.PostgresError, match="has no placement") as refused:
            await run_on(node)
        assert refused.value.sqlstate == SHARD_MOVED

    assert json.loads(await run_on(shard.node)) == [{"n": 0}]
    await refused_on(other)
    # Once moved, the old node refuses it (the old table may not be dropped yet) and the
    # new one runs it.
    await move_shard(cluster.url, shard, other)
    await refused_on(shard.node)
    assert json.loads(await run_on(other)) == [{"n": 0}]


@pytest.mark.citus
async def test_writes_by_a_stale_map_follow_a_moved_shard(citus_url: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    # The map is not read again for its age during the test: only a refusal makes it.
    monkeypatch.setattr(routed_writes, "SHARD_MAP_MAX_AGE", 3600.0)
    dbos = new_dbos(citus_url, sharding=True)

    @dbos.step(name="double")
    async def double(n: int) -> int:
        return 2 * n

    @dbos.workflow(name="twice")
    async def twice(n: int) -> int:
        return await double(await double(n))

    async with dbos:
        sysdb = dbos._system_database
        with SetShardKey("tenant-7"):
            assert await twice(1) == 4
        stale = sysdb._shard_map
        assert stale is not None
        shard = stale.shard_of("tenant-7")
        [target] = [node for node in stale.nodes() if node != shard.node]
        await move_shard(citus_url, shard, target)
        # The first program goes to the old node by the stale map; that node refuses it,
        # and it is sent again by a map read anew.
        with SetShardKey("tenant-7"), SetWorkflowID("after-move"):
            assert await twice(2) == 8
        assert sysdb._shard_map is not stale
        assert await sysdb.node_of("tenant-7") == target
        steps = await dbos.list_workflow_steps("after-move", shard_key="tenant-7")
        assert [s.name for s in steps] == ["double", "double"]


@pytest.mark.citus
async def test_a_program_naming_a_split_shard_is_refused_where_its_tables_linger(
        cluster: Cluster) -> None:
    """After a split the old shard's tables stay on its node until Citus's deferred cleanup
    drops them; a program naming them is refused there (its shard has no placement any
    more), while a program naming a new half runs where that half is."""
    shards = await load_map(cluster.url)
    shard = shards.shards[0]
    [other] = [node for node in cluster.workers if node != shard.node]
    on_old_node = await asyncpg.connect(cluster.on(shard.node))
    try:
        split = await split_shard(cluster.url, shard, (shard.node, other))
        # Dropped only by the cleanup, every 15 s by default: looked for at once.
        lingers = await on_old_node.fetchval(
            "SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL",
            SCHEMA, f"workflow_status_{shard.shard_id}")
    finally:
        await on_old_node.close()
    assert lingers
    after = await load_map(cluster.url)
    low, high = after.shards[0], after.shards[1]
    assert (low.min_hash, low.max_hash, high.min_hash, high.max_hash) == (
        shard.min_hash, split, split + 1, shard.max_hash)
    assert (low.node, high.node) == (shard.node, other)
    assert shard.shard_id not in {low.shard_id, high.shard_id}
    assert after.shards[2:] == shards.shards[1:]

    async def run_on(node: Host, on: ShardInterval) -> Any:
        table = f"{quoted(SCHEMA)}.workflow_status_{on.shard_id}"
        count = Step(Query(f"SELECT count(*) AS n FROM {table}"), rows=True)
        sql = ShardedStatements(quoted(SCHEMA)).run_routed("k", encode([count]), on.shard_id)
        conn = await asyncpg.connect(cluster.on(node))
        try:
            return await conn.fetchval(sql.sql, *sql.params)
        finally:
            await conn.close()

    with pytest.raises(asyncpg.PostgresError, match="has no placement") as refused:
        await run_on(shard.node, shard)
    assert refused.value.sqlstate == SHARD_MOVED
    assert json.loads(await run_on(shard.node, low)) == [{"n": 0}]
    assert json.loads(await run_on(other, high)) == [{"n": 0}]


@pytest.mark.citus
async def test_writes_by_a_stale_map_follow_a_split_shard(citus_url: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A shard split in two, its lower half kept on its node and its upper half put on the
    other worker: the next workflow under a key of either half finishes, the program the
    stale map sent naming the old shard refused (its tables linger on the old node until
    Citus's cleanup drops them) and sent again by a map read anew, which names the new
    shards and places each key's half."""
    monkeypatch.setattr(routed_writes, "SHARD_MAP_MAX_AGE", 3600.0)
    dbos = new_dbos(citus_url, sharding=True)

    @dbos.step(name="double")
    async def double(n: int) -> int:
        return 2 * n

    @dbos.workflow(name="twice")
    async def twice(n: int) -> int:
        return await double(await double(n))

    async with dbos:
        sysdb = dbos._system_database
        stale = await sysdb._current_shard_map()
        assert stale is not None
        shard = stale.shard_of("tenant-7")
        midpoint = (shard.min_hash + shard.max_hash) // 2
        keys = [key for key in (f"tenant-{i}" for i in range(5000))
                if stale.shard_of(key) == shard]
        low = next(key for key in keys if hash_text(key) <= midpoint)
        high = next(key for key in keys if hash_text(key) > midpoint)
        for key in (low, high):
            with SetShardKey(key), SetWorkflowID(f"before-{key}"):
                assert await twice(1) == 4
        assert sysdb._shard_map is stale
        [other] = [node for node in stale.nodes() if node != shard.node]
        assert await split_shard(citus_url, shard, (shard.node, other)) == midpoint
        # Each program goes to the shard's old node, naming the old shard's tables, by the
        # stale map; the node refuses it, and it is sent again by a map read anew.
        for key in (low, high):
            with SetShardKey(key), SetWorkflowID(f"after-{key}"):
                assert await twice(2) == 8
        fresh = sysdb._shard_map
        assert fresh is not None and fresh is not stale
        assert (await sysdb.node_of(low), await sysdb.node_of(high)) == (shard.node, other)
        halves = (fresh.shard_of(low), fresh.shard_of(high))
        assert [(half.min_hash, half.max_hash) for half in halves] == [
            (shard.min_hash, midpoint), (midpoint + 1, shard.max_hash)]
        assert shard.shard_id not in {half.shard_id for half in halves}
        assert len(fresh.shards) == len(stale.shards) + 1
        for key in (low, high):
            for workflow_id in (f"before-{key}", f"after-{key}"):
                steps = await dbos.list_workflow_steps(workflow_id, shard_key=key)
                assert [s.name for s in steps] == ["double", "double"]
    statuses = await fetch(citus_url, "SELECT workflow_uuid, status "
                                      "FROM dbos.workflow_status ORDER BY 1")
    assert [tuple(r) for r in statuses] == sorted(
        (f"{when}-{key}", "SUCCESS") for key in (low, high) for when in ("before", "after"))


@pytest.mark.citus
async def test_a_role_not_owning_the_tables_writes_on_the_distributed_ones(citus_url: str
                                                                          ) -> None:
    owner = new_dbos(citus_url, sharding=True)
    async with owner:  # migrates the schema as its owner
        pass
    role = unique_name("writer")
    conn = await asyncpg.connect(citus_url)
    try:
        await conn.execute(f"CREATE ROLE {role} LOGIN")
        await conn.execute(f"GRANT USAGE ON SCHEMA dbos TO {role}")
        await conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA dbos TO {role}")
    finally:
        await conn.close()
    as_role = citus_url.replace("postgresql://postgres@", f"postgresql://{role}@")
    assert role in as_role
    dbos = new_dbos(as_role, sharding=True)

    @dbos.step(name="double")
    async def double(n: int) -> int:
        return 2 * n

    @dbos.workflow(name="twice")
    async def twice(n: int) -> int:
        return await double(await double(n))

    async with dbos:
        with SetShardKey("tenant-9"), SetWorkflowID("by-writer"):
            assert await twice(3) == 12
        assert not dbos._system_database._writes_on_shards
        steps = await dbos.list_workflow_steps("by-writer", shard_key="tenant-9")
        assert [s.name for s in steps] == ["double", "double"]


async def set_shard_count(url: str, shards: int) -> None:
    """Have the migration of ``url``'s database distribute its tables in ``shards`` shards
    (the migration reads ``citus.shard_count`` where it is set)."""
    conn = await asyncpg.connect(url)
    try:
        name = await conn.fetchval("SELECT quote_ident(current_database())")
        await conn.execute(f"ALTER DATABASE {name} SET citus.shard_count = {int(shards)}")
    finally:
        await conn.close()


@pytest.mark.citus
@pytest.mark.parametrize("spread", ["one shard", "several shards of a node"])
async def test_a_batch_writes_the_rows_of_several_keys_of_a_node_in_one_statement(
        citus_url: str, spread: str) -> None:
    """Checkpoints queued behind a blocked one go as the next batch of their node: one
    statement for the node, whose part on each shard's own table writes the rows of all
    its keys, each judged on its own: a cancelled workflow's and a fenced-out one's are
    refused, the others land. Their keys share one shard, or are on several shards of one
    node (the tables then have several shards per node: the statement has a part for each
    of the node's shards, and locks those it writes)."""
    if spread != "one shard":
        await set_shard_count(citus_url, 8)
    dbos = new_dbos(citus_url, sharding=True)
    release_lead, release_rest = asyncio.Event(), asyncio.Event()
    arrived: set[str] = set()
    everyone_in = asyncio.Event()

    @dbos.step(name="held", cancellable=False)
    async def held(workflow_id: str) -> str:
        arrived.add(workflow_id)
        if len(arrived) == len(placed):
            everyone_in.set()
        await (release_lead if workflow_id == "lead" else release_rest).wait()
        return workflow_id

    @dbos.step(name="after")
    async def after(value: str) -> str:
        return value + "!"

    @dbos.workflow(name="work")
    async def work(workflow_id: str) -> str:
        return await after(await held(workflow_id))

    logged: list[tuple[str, tuple[Any, ...]]] = []
    async with dbos:
        sysdb = dbos._system_database
        shards = await sysdb._current_shard_map()
        assert shards is not None
        shard = shards.shard_of("tenant-0")
        candidates = [f"tenant-{i}" for i in range(5000)]
        if spread == "one shard":
            keys = [key for key in candidates if shards.shard_of(key) == shard][:4]
        else:
            # The lead's key on one shard, each of the other three on another shard of the
            # same node.
            keys, used = ["tenant-0"], {shard.shard_id}
            for key in candidates:
                other = shards.shard_of(key)
                if other.node == shard.node and other.shard_id not in used and len(keys) < 4:
                    keys.append(key)
                    used.add(other.shard_id)
            assert len(keys) == 4, "the node needs four shards"
        # The shards the queued checkpoints (the three others' keys) are written on.
        locked = {str(shards.shard_of(key).shard_id) for key in keys[1:]}
        # Four keys of one shard; two workflows under one of them.
        placed = {"lead": keys[0], "healthy-1": keys[1], "healthy-2": keys[2],
                  "cancelled": keys[3], "fenced": keys[1]}
        handles = {}
        for workflow_id, key in placed.items():
            with SetShardKey(key), SetWorkflowID(workflow_id):
                handles[workflow_id] = await dbos.start_workflow(work, workflow_id)
        await asyncio.wait_for(everyone_in.wait(), 30)
        row = "WHERE shard_key = $1 AND workflow_uuid = $2"
        await execute(citus_url, "UPDATE dbos.workflow_status SET status = 'CANCELLED' " + row,
                      placed["cancelled"], "cancelled")
        await execute(citus_url, "UPDATE dbos.workflow_status SET owner_xid = 'elsewhere' "
                      + row, placed["fenced"], "fenced")
        pool = await sysdb._node_pool(keys[0], on_shards=True)
        held_connections = [await pool.acquire() for _ in range(pool.get_max_size())]
        for connection in held_connections:
            connection.add_query_logger(
                lambda q: logged.append((q.query, tuple(q.args or ()))))
        for connection in held_connections:
            await pool.release(connection)
        node_url = parse_database_url(citus_url).with_server(shard.node)
        blocker = await asyncpg.connect(citus_url)
        try:
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("SELECT 1 FROM dbos.workflow_status " + row + " FOR UPDATE",
                                  placed["lead"], "lead")
            release_lead.set()  # its checkpoint goes alone and waits for the row

            async def lead_waits() -> bool:
                return bool(await fetchval(
                    node_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                              "wait_event_type = 'Lock' AND datname = current_database()"))

            await wait_until(lead_waits, what="the lead's checkpoint waiting for its row")
            release_rest.set()  # the others queue behind it, in the node's lane
            await tx.rollback()
            results = {w: await asyncio.wait_for(handles[w].get_result(), 30)
                       for w in ("lead", "healthy-1", "healthy-2")}
            with pytest.raises(WorkflowCancelledError):
                await asyncio.wait_for(handles["cancelled"].get_result(), 30)
        finally:
            await blocker.close()
    assert results == {w: w + "!" for w in ("lead", "healthy-1", "healthy-2")}
    # The queued checkpoints (step 0 of the four others) went as one statement of the
    # node, naming their shards and locking them (its last parameter; the lead's next
    # checkpoint may join them): several keys' rows of one shard, or of several shards of
    # the node.
    batched: list[set[str]] = []
    for sql, args in logged:
        if ("lock_shards_here(" in sql
                and all(f"workflow_status_{shard_id}" in sql for shard_id in locked)
                and locked <= set(args[-1])):
            batched.append({word for arg in args if isinstance(arg, list)
                            for word in arg if isinstance(word, str)})
    assert any({"healthy-1", "healthy-2", "cancelled", "fenced", *keys[1:]} <= words
               for words in batched), batched
    steps = await fetch(citus_url, "SELECT workflow_uuid, function_name "
                                   "FROM dbos.operation_outputs ORDER BY 1, function_id")
    assert [tuple(r) for r in steps] == [
        ("healthy-1", "held"), ("healthy-1", "after"), ("healthy-2", "held"),
        ("healthy-2", "after"), ("lead", "held"), ("lead", "after")]
    fenced = await fetch(citus_url, "SELECT status, owner_xid FROM dbos.workflow_status "
                                    "WHERE workflow_uuid = 'fenced'")
    assert [tuple(r) for r in fenced] == [("PENDING", "elsewhere")]
