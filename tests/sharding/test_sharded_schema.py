"""The sharded migration track on plain PostgreSQL: its catalog, its runner, the guards that
keep each kind of handle off the other kind of schema, and its SQL functions."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest

from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.migrations import LATEST_VERSION, holds_sharded_schema, migrate, verify
from dbos_async.errors import ConfigurationError, DBOSError

PER_WORKFLOW_TABLES = {
    "workflow_status",
    "workflow_input",
    "workflow_output",
    "operation_outputs",
    "notifications",
    "workflow_events",
    "workflow_events_history",
    "streams",
}
GLOBAL_TABLES = {"queues", "application_versions", "workflow_schedules", "event_dispatch_kv"}
SHARDED_MESSAGE = (
    "The DBOS system schema dbos is sharded. Enable sharding to use it: set sharding=True in "
    "DBOS(...) or DBOSClient(..., sharding=True), or DBOS_SHARDING=true."
)


@pytest.fixture
async def db(conn: asyncpg.Connection) -> asyncpg.Connection:
    """A connection to a fresh database with the sharded schema in ``dbos``."""
    assert await migrate(conn, sharded=True) == LATEST_VERSION
    return conn


async def columns(conn: asyncpg.Connection, schema: str, table: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = $1::regclass "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        f'"{schema}".{table}',
    )
    return [r["attname"] for r in rows]


async def constraints(conn: asyncpg.Connection, schema: str) -> dict[str, tuple[str, str]]:
    """Every constraint of the schema: name -> (table, definition)."""
    rows = await conn.fetch(
        """
        SELECT c.conname AS name, t.relname AS tbl, pg_get_constraintdef(c.oid) AS def
        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = $1
        """,
        schema,
    )
    return {r["name"]: (r["tbl"], r["def"]) for r in rows}


async def indexes(conn: asyncpg.Connection, schema: str) -> dict[str, tuple[str, str]]:
    """Every index of the schema (those of constraints too): name -> (table, definition)."""
    rows = await conn.fetch(
        "SELECT indexname, tablename, indexdef FROM pg_indexes WHERE schemaname = $1", schema
    )
    return {r["indexname"]: (r["tablename"], r["indexdef"]) for r in rows}


async def objects(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    """Every relation and function of every schema but the catalogs, with its OID."""
    rows = await conn.fetch(
        """
        SELECT n.nspname || '.' || c.relname AS name, c.oid::int8 AS oid FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
        UNION ALL
        SELECT n.nspname || '.' || p.proname, p.oid::int8 FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
        ORDER BY 1, 2
        """
    )
    return [(r["name"], r["oid"]) for r in rows]


async def snapshot(conn: asyncpg.Connection) -> tuple[object, ...]:
    """The objects, the version row as written, and every table's row count."""
    counts = [
        await conn.fetchval(f"SELECT count(*) FROM dbos.{t}")
        for t in sorted(PER_WORKFLOW_TABLES | GLOBAL_TABLES)
    ]
    version_row = await conn.fetch("SELECT version, xmin::text FROM dbos.dbos_migrations")
    return (await objects(conn), [tuple(r) for r in version_row], counts)


@contextlib.asynccontextmanager
async def listening(url: str, channel: str) -> AsyncIterator[asyncio.Queue[str]]:
    """A listener on ``channel`` (its own connection); payloads arrive in the queue."""
    received: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(url)
    try:
        await listener.add_listener(channel, lambda *args: received.put_nowait(args[3]))
        yield received
    finally:
        await listener.close()


async def next_payload(received: asyncio.Queue[str]) -> str:
    return await asyncio.wait_for(received.get(), 10)


# --- the catalog ---------------------------------------------------------------------------


async def test_sharded_migrate_builds_the_schema(db: asyncpg.Connection) -> None:
    tables = await db.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'dbos' AND c.relkind = 'r'"
    )
    assert {t["relname"] for t in tables} == PER_WORKFLOW_TABLES | GLOBAL_TABLES | {
        "dbos_migrations"
    }
    assert await db.fetchval("SELECT array_agg(version) FROM dbos.dbos_migrations") == [125]
    functions = await db.fetch(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'dbos' ORDER BY 1"
    )
    assert [f["proname"] for f in functions] == ["enqueue_workflow", "lock_shards_here",
                                                 "run_routed", "send_message"]
    assert functions[1]["args"] == "shards bigint[]"
    assert functions[2]["args"] == ("shard_key text, steps jsonb, shard bigint, "
                                    "prepared_here text[], shards bigint[]")
    assert functions[3]["args"] == (
        "destination_id text, message json, topic text, message_id text, shard_key text"
    )
    assert functions[0]["args"].endswith("application_name text, shard_key text")
    # Writers notify: no trigger in the schema (but the foreign keys' internal ones).
    assert await db.fetchval(
        "SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'dbos' AND NOT g.tgisinternal"
    ) == 0


async def test_sharded_tables_are_the_unsharded_ones_with_keys(db: asyncpg.Connection) -> None:
    assert await migrate(db, "plain") == LATEST_VERSION
    extra = {
        "workflow_status": ["parent_shard_key"],
        "operation_outputs": ["child_shard_key"],
        "workflow_schedules": ["workflow_shard_key"],
    }
    for table in PER_WORKFLOW_TABLES | GLOBAL_TABLES:
        key = ["shard_key"] if table in PER_WORKFLOW_TABLES else []
        expected = key + await columns(db, "plain", table) + extra.get(table, [])
        assert await columns(db, "dbos", table) == expected, table
    # Every constraint and index keeps its unsharded name; one index is the sharded
    # schema's own (the keys with ENQUEUED work on a queue), and the depth samples' table
    # is an addition of the unsharded schema alone.
    unsharded_only = {"dbos_async_depth_samples_pkey"}
    assert set(await constraints(db, "dbos")) == set(await constraints(db, "plain")) - (
        unsharded_only)
    assert set(await indexes(db, "dbos")) == (
        set(await indexes(db, "plain")) - unsharded_only | {"idx_workflow_status_queue_keys"})


async def test_shard_key_leads_every_key(db: asyncpg.Connection) -> None:
    defs = await constraints(db, "dbos")
    index_defs = await indexes(db, "dbos")
    for table in PER_WORKFLOW_TABLES:
        assert defs[f"{table}_pkey"][1].startswith("PRIMARY KEY (shard_key, "), table
    unique = [(name, d) for name, (t, d) in index_defs.items()
              if t in PER_WORKFLOW_TABLES and d.startswith("CREATE UNIQUE")]  # fmt: skip
    assert len(unique) == len(PER_WORKFLOW_TABLES) + 1  # the primary keys and deduplication
    for name, definition in unique:
        assert "USING btree (shard_key, " in definition, name
    assert defs["workflow_status_pkey"][1] == "PRIMARY KEY (shard_key, workflow_uuid)"
    assert defs["notifications_pkey"][1] == "PRIMARY KEY (shard_key, message_uuid)"
    assert index_defs["uq_workflow_status_dedup_id"][1].endswith(
        "(shard_key, queue_name, deduplication_id) WHERE (deduplication_id IS NOT NULL)"
    )
    # Global tables keep their keys.
    assert defs["queues_name_key"][1] == "UNIQUE (name)"
    assert defs["workflow_schedules_schedule_name_key"][1] == "UNIQUE (schedule_name)"

    foreign = await db.fetch(
        """
        SELECT c.conname, t.relname, pg_get_constraintdef(c.oid) AS def
        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = 'dbos' AND c.contype = 'f' ORDER BY 2
        """
    )
    target = "REFERENCES dbos.workflow_status(shard_key, workflow_uuid) ON DELETE CASCADE"
    assert {f["relname"]: f["def"] for f in foreign} == {
        "notifications": f"FOREIGN KEY (shard_key, destination_uuid) {target}",
        "streams": f"FOREIGN KEY (shard_key, workflow_uuid) {target}",
        "workflow_events": f"FOREIGN KEY (shard_key, workflow_uuid) {target}",
        "workflow_events_history": f"FOREIGN KEY (shard_key, workflow_uuid) {target}",
    }
    # Statements confined to one key find its rows by index.
    for index in (
        "idx_workflow_status_in_flight_v2",
        "idx_workflow_status_partition_dequeue_v3",
        "idx_workflow_status_rate_limited",
        "idx_workflow_status_delayed",
        "idx_workflow_status_deadline",
        "idx_workflow_status_pending",
        "idx_workflow_status_forked_from",
        "idx_workflow_topic",
    ):
        assert " (shard_key, " in index_defs[index][1], index
    assert "(parent_shard_key, parent_workflow_id)" in (
        index_defs["idx_workflow_status_parent_workflow_id"][1]
    )


# --- the runner ----------------------------------------------------------------------------


async def test_sharded_migrate_is_idempotent_and_verifies(db: asyncpg.Connection) -> None:
    before = await snapshot(db)
    assert await migrate(db, sharded=True) == LATEST_VERSION
    assert await migrate(db, "dbos", sharded=True) == LATEST_VERSION
    assert await verify(db, sharded=True) == LATEST_VERSION
    assert await snapshot(db) == before


async def test_runners_refuse_the_other_kind(db: asyncpg.Connection) -> None:
    before = await snapshot(db)
    for check in (migrate(db), verify(db)):
        with pytest.raises(ConfigurationError) as refused:
            await check
        assert str(refused.value) == SHARDED_MESSAGE
    assert await snapshot(db) == before

    assert await migrate(db, "plain") == LATEST_VERSION
    for check in (migrate(db, "plain", sharded=True), verify(db, "plain", sharded=True)):
        with pytest.raises(ConfigurationError, match=r"schema plain is not sharded\. Disable"):
            await check


async def test_concurrent_runners_of_both_kinds(database_url: str) -> None:
    """On an empty schema one kind wins; the other, checking again under the lock, refuses."""
    conns = [await asyncpg.connect(database_url) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(migrate(c, sharded=i % 2 == 0) for i, c in enumerate(conns)),
            return_exceptions=True,
        )
        won = [r for r in results if r == LATEST_VERSION]
        refused = [r for r in results if isinstance(r, ConfigurationError)]
        assert len(won) == 2 and len(refused) == 2, results
        sharded = await holds_sharded_schema(database_url, "dbos")
        assert [r == LATEST_VERSION for r in results] == [sharded, not sharded] * 2
    finally:
        for c in conns:
            await c.close()


# --- the guards of SystemDatabase.open -----------------------------------------------------


@pytest.mark.parametrize("run_migrations", [True, False], ids=["migrate", "verify"])
async def test_unsharded_handle_refuses_sharded_schema(
    db: asyncpg.Connection, database_url: str, run_migrations: bool
) -> None:
    before = await snapshot(db)
    sysdb = SystemDatabase(database_url)
    with pytest.raises(DBOSError) as refused:
        await sysdb.open(run_migrations=run_migrations)
    assert str(refused.value) == SHARDED_MESSAGE
    await sysdb.close()
    assert await snapshot(db) == before


@pytest.mark.parametrize("run_migrations", [True, False], ids=["migrate", "verify"])
async def test_sharded_handle_refuses_unsharded_schema(
    conn: asyncpg.Connection, database_url: str, run_migrations: bool
) -> None:
    await migrate(conn)
    before = await snapshot(conn)
    sysdb = SystemDatabase(database_url, sharded=True)
    with pytest.raises(DBOSError, match=r"^The DBOS system schema dbos is not sharded\."):
        await sysdb.open(run_migrations=run_migrations)
    await sysdb.close()
    assert await snapshot(conn) == before


async def test_sharded_handle_opens_sharded_schema(database_url: str) -> None:
    sysdb = SystemDatabase(database_url, sharded=True)
    await sysdb.open()
    try:
        assert sysdb.sharded
        assert await holds_sharded_schema(database_url)
    finally:
        await sysdb.close()
    verifying = SystemDatabase(database_url, sharded=True)
    await verifying.open(run_migrations=False)
    await verifying.close()


async def test_holds_sharded_schema(db: asyncpg.Connection, database_url: str) -> None:
    assert await holds_sharded_schema(database_url)
    assert await holds_sharded_schema(database_url, "dbos")
    assert not await holds_sharded_schema(database_url, "plain")
    await migrate(db, "plain")
    assert not await holds_sharded_schema(database_url, "plain")


async def test_holds_sharded_schema_unsharded_or_unreachable(
    conn: asyncpg.Connection, database_url: str, make_database_url: Callable[[str], str]
) -> None:
    assert not await holds_sharded_schema(database_url)
    await migrate(conn)
    assert not await holds_sharded_schema(database_url)
    assert not await holds_sharded_schema(database_url, "dbos")
    assert not await holds_sharded_schema(make_database_url("dbos_test_no_such_database"))
    assert not await holds_sharded_schema("postgresql://postgres@127.0.0.1:1/postgres")
    assert not await holds_sharded_schema("not a url")


# --- the SQL functions ---------------------------------------------------------------------


async def sent(db: asyncpg.Connection) -> list[tuple[str, ...]]:
    rows = await db.fetch(
        "SELECT shard_key, destination_uuid, topic, message FROM dbos.notifications ORDER BY 1"
    )
    return [tuple(r) for r in rows]


async def test_send_message_stores_under_the_key_and_notifies(
    db: asyncpg.Connection, database_url: str
) -> None:
    key = "ключ:1"  # 6 characters, 10 bytes; a colon does not end it
    wf = await db.fetchval("SELECT dbos.enqueue_workflow('wf', 'q', shard_key => $1)", key)
    async with listening(database_url, "dbos_notifications_channel") as received:
        await db.execute("SELECT dbos.send_message($1, '1'::json, 'greeting', NULL, $2)", wf, key)
        assert await next_payload(received) == f"6:{key}:{wf}::greeting"
        await db.execute("SELECT dbos.send_message($1, '2'::json, shard_key => $2)", wf, key)
        assert await next_payload(received) == f"6:{key}:{wf}::__null__topic__"
        # With a message ID the send is idempotent: the repeat stores and notifies nothing.
        for _ in range(2):
            await db.execute("SELECT dbos.send_message($1, '3'::json, 't', 'm-1', $2)", wf, key)
        assert await next_payload(received) == f"6:{key}:{wf}::t"
        await db.execute("SELECT pg_notify('dbos_notifications_channel', 'fence')")
        assert await next_payload(received) == "fence"
    assert await sent(db) == [
        (key, wf, "greeting", "1"),
        (key, wf, "__null__topic__", "2"),
        (key, wf, "t", "3"),
    ]


async def test_send_message_needs_a_key_and_a_destination_under_it(
    db: asyncpg.Connection,
) -> None:
    wf = await db.fetchval("SELECT dbos.enqueue_workflow('wf', 'q', shard_key => 'a')")
    for key in (None, ""):
        with pytest.raises(asyncpg.InvalidParameterValueError, match="shard_key"):
            await db.execute("SELECT dbos.send_message($1, '1'::json, shard_key => $2)", wf, key)
    with pytest.raises(asyncpg.InvalidParameterValueError, match="shard_key"):
        await db.execute("SELECT dbos.send_message($1, '1'::json)", wf)
    # The destination exists, but under another key: a message lives under its destination's.
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="DBOS non-existent workflow"):
        await db.execute("SELECT dbos.send_message($1, '1'::json, shard_key => 'b')", wf)
    assert await sent(db) == []


async def test_enqueue_workflow_under_a_key(db: asyncpg.Connection, database_url: str) -> None:
    async with listening(database_url, "dbos_enqueue_channel") as received:
        for key in ("a", "b"):  # one workflow ID, under two keys
            wf = await db.fetchval(
                "SELECT dbos.enqueue_workflow('wf', 'queue-1', ARRAY['1'::json], "
                "workflow_id => 'wf-1', deduplication_id => 'dedup', shard_key => $1)",
                key,
            )
            assert wf == "wf-1"
            assert await next_payload(received) == "queue-1"
    rows = await db.fetch(
        "SELECT s.shard_key, s.status, s.queue_name, i.inputs FROM dbos.workflow_status s "
        "JOIN dbos.workflow_input i USING (shard_key, workflow_uuid) ORDER BY 1"
    )
    assert [tuple(r) for r in rows] == [
        (key, "ENQUEUED", "queue-1", '{"positionalArgs" : [1], "namedArgs" : {}}')
        for key in ("a", "b")
    ]
    # Deduplication is per key: the same ID under the same key is refused.
    with pytest.raises(asyncpg.UniqueViolationError, match="DBOS queue duplicated"):
        await db.execute(
            "SELECT dbos.enqueue_workflow('wf', 'queue-1', deduplication_id => 'dedup', "
            "shard_key => 'a')"
        )
    for key in (None, ""):
        with pytest.raises(asyncpg.InvalidParameterValueError, match="shard_key"):
            await db.execute("SELECT dbos.enqueue_workflow('wf', 'q', shard_key => $1)", key)


async def test_functions_write_to_their_schema(conn: asyncpg.Connection) -> None:
    """Whatever the schema's name and the caller's search_path."""
    schema = "x'$dbos_fn$\"y"
    quoted = '"' + schema.replace('"', '""') + '"'
    assert await migrate(conn, schema, sharded=True) == LATEST_VERSION
    await conn.execute("SET search_path = public")
    wf = await conn.fetchval(f"SELECT {quoted}.enqueue_workflow('wf', 'q', shard_key => 'k')")
    await conn.execute(f"SELECT {quoted}.send_message($1, '1'::json, shard_key => 'k')", wf)
    for table in ("workflow_status", "workflow_input", "notifications"):
        assert await conn.fetchval(f"SELECT count(*) FROM {quoted}.{table}") == 1

