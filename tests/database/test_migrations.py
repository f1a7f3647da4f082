"""The migration runner and the SQL interface the migrations install (functions, trigger)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import asyncpg
import pytest

from dbos_async._sysdb.migrations import LATEST_VERSION, migrate, quote_schema, verify
from dbos_async.errors import ConfigurationError, MigrationError

TABLES = {
    "application_versions",
    "dbos_async_depth_samples",
    "dbos_migrations",
    "event_dispatch_kv",
    "notifications",
    "operation_outputs",
    "queues",
    "streams",
    "workflow_events",
    "workflow_events_history",
    "workflow_input",
    "workflow_output",
    "workflow_schedules",
    "workflow_status",
}


@pytest.fixture
async def db(conn: asyncpg.Connection) -> asyncpg.Connection:
    """A connection to a fresh database migrated into the default schema."""
    assert await migrate(conn) == LATEST_VERSION
    return conn


async def tables(conn: asyncpg.Connection, schema: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relkind = 'r'",
        schema,
    )
    return {r["relname"] for r in rows}


async def schema_exists(conn: asyncpg.Connection, schema: str) -> bool:
    return bool(await conn.fetchval("SELECT true FROM pg_namespace WHERE nspname = $1", schema))


async def versions(conn: asyncpg.Connection, schema: str = "dbos") -> list[int]:
    rows = await conn.fetch(f"SELECT version FROM {quote_schema(schema)}.dbos_migrations")
    return [r["version"] for r in rows]


async def objects(conn: asyncpg.Connection, schema: str) -> list[tuple[str, int]]:
    """Every relation and function with its OID: any re-creation or addition changes this."""
    rows = await conn.fetch(
        """
        SELECT c.relname AS name, c.oid::int8 AS oid FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
        UNION ALL
        SELECT p.proname, p.oid::int8 FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
        ORDER BY 1, 2
        """,
        schema,
    )
    return [(r["name"], r["oid"]) for r in rows]


async def advisory_locks(conn: asyncpg.Connection) -> int:
    """Advisory locks held in this database (other tests' databases may hold their own)."""
    count = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    return int(count)


async def set_recorded_version(conn: asyncpg.Connection, version: int) -> None:
    """Make the database look like one another DBOS release left at `version`."""
    await conn.execute(
        "CREATE SCHEMA dbos; CREATE TABLE dbos.dbos_migrations (version bigint PRIMARY KEY)"
    )
    await conn.execute("INSERT INTO dbos.dbos_migrations VALUES ($1)", version)


# --- the runner ----------------------------------------------------------------------------


async def test_migrate_builds_the_schema(conn: asyncpg.Connection) -> None:
    assert LATEST_VERSION == 125
    assert await migrate(conn) == LATEST_VERSION
    assert await tables(conn, "dbos") == TABLES
    assert await versions(conn) == [LATEST_VERSION]
    functions = await conn.fetch(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'dbos' ORDER BY 1"
    )
    assert [f["proname"] for f in functions] == [
        "dbos_async_enqueue_notify",
        "dbos_async_requeue_notify",
        "enqueue_workflow",
        "notifications_function",
        "send_message",
    ]
    for trigger in ("dbos_notifications_trigger", "dbos_async_enqueue_trigger",
                    "dbos_async_requeue_trigger"):
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_trigger WHERE tgname = $1", trigger)
            == 1
        )


async def test_migrate_is_idempotent(db: asyncpg.Connection) -> None:
    before = await objects(db, "dbos")
    row_version = await db.fetchval("SELECT xmin::text FROM dbos.dbos_migrations")

    assert await migrate(db) == LATEST_VERSION
    assert await migrate(db, "dbos") == LATEST_VERSION

    assert await objects(db, "dbos") == before
    # The version row was not even rewritten.
    assert await db.fetchval("SELECT xmin::text FROM dbos.dbos_migrations") == row_version
    assert await versions(db) == [LATEST_VERSION]


async def test_concurrent_migrate(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    conns = [await asyncpg.connect(database_url) for _ in range(4)]
    try:
        with caplog.at_level(logging.INFO, logger="dbos_async._sysdb.migrations"):
            results = await asyncio.gather(*(migrate(c) for c in conns))
        assert results == [LATEST_VERSION] * 4
        # Exactly one of them applied the baseline; the others found it done.
        applied = [r for r in caplog.records if "to version 125" in r.getMessage()]
        assert len(applied) == 1
        assert await versions(conns[0]) == [LATEST_VERSION]
        assert await tables(conns[0], "dbos") == TABLES
        # All session locks were released.
        assert await advisory_locks(conns[0]) == 0
    finally:
        for c in conns:
            await c.close()


async def test_migrate_waits_for_dbos_migration_lock(database_url: str) -> None:
    # DBOS (Python) holds advisory lock 1234567890 while it migrates; we must not interleave.
    dbos_process = await asyncpg.connect(database_url)
    ours = await asyncpg.connect(database_url)
    try:
        await dbos_process.execute("SELECT pg_advisory_lock(1234567890)")
        task = asyncio.create_task(migrate(ours))
        # Wait (without a time limit on correctness) until our migrate blocks on that lock.
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = 1234567890 AND pid <> pg_backend_pid() "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        while not await dbos_process.fetchval(waiting):
            assert not task.done(), "migrate did not wait for the DBOS migration lock"
            await asyncio.sleep(0.01)
        assert not await schema_exists(dbos_process, "dbos")
        await dbos_process.execute("SELECT pg_advisory_unlock(1234567890)")
        assert await asyncio.wait_for(task, 30) == LATEST_VERSION
        assert await versions(dbos_process) == [LATEST_VERSION]
    finally:
        await dbos_process.close()
        await ours.close()


@pytest.mark.parametrize(
    "schema",
    [
        "my app",  # needs quoting for the space
        'We"ird.Schema',  # a quote, a dot and upper case
        "x$dbos_fn$y",  # contains the dollar-quote tag of the function bodies
        "Ω-" + "s" * 60,  # 63 bytes, the longest name PostgreSQL keeps
    ],
)
async def test_custom_schema(conn: asyncpg.Connection, schema: str) -> None:
    assert await migrate(conn, schema) == LATEST_VERSION
    assert await verify(conn, schema) == LATEST_VERSION
    assert await tables(conn, schema) == TABLES
    assert await versions(conn, schema) == [LATEST_VERSION]
    assert not await schema_exists(conn, "dbos")
    with pytest.raises(MigrationError):
        await verify(conn)

    # The functions write to their own schema, whatever the caller's search_path.
    q = quote_schema(schema)
    await conn.execute("SET search_path = public")
    wf = await conn.fetchval(f"SELECT {q}.enqueue_workflow('wf', 'q')")
    await conn.execute(f"SELECT {q}.send_message($1, '1'::json)", wf)
    assert await conn.fetchval(f"SELECT count(*) FROM {q}.workflow_status") == 1
    assert await conn.fetchval(f"SELECT count(*) FROM {q}.workflow_input") == 1
    assert await conn.fetchval(f"SELECT count(*) FROM {q}.notifications") == 1


async def test_two_schemas_in_one_database(conn: asyncpg.Connection) -> None:
    assert await migrate(conn, "app_a") == LATEST_VERSION
    assert await migrate(conn, "app_b") == LATEST_VERSION
    await conn.execute("SELECT app_a.enqueue_workflow('wf', 'q', workflow_id => 'only-in-a')")
    assert await conn.fetchval("SELECT count(*) FROM app_a.workflow_status") == 1
    assert await conn.fetchval("SELECT count(*) FROM app_b.workflow_status") == 0


async def test_verify_on_empty_database(conn: asyncpg.Connection) -> None:
    with pytest.raises(MigrationError, match=r"schema 'dbos' does not exist.*migrate\(\)"):
        await verify(conn)
    assert not await schema_exists(conn, "dbos")


async def test_verify_without_version_table(conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE SCHEMA dbos")
    with pytest.raises(MigrationError, match="no dbos_migrations table"):
        await verify(conn)
    assert await tables(conn, "dbos") == set()


async def test_verify_after_migrate(db: asyncpg.Connection) -> None:
    before = await objects(db, "dbos")
    assert await verify(db) == LATEST_VERSION
    assert await objects(db, "dbos") == before


async def test_older_dbos_version_is_refused(conn: asyncpg.Connection) -> None:
    await set_recorded_version(conn, 50)
    with pytest.raises(MigrationError) as raised:
        await migrate(conn)
    message = str(raised.value)
    assert "older DBOS release" in message
    assert "version 50" in message
    assert "dbos migrate" in message
    with pytest.raises(MigrationError, match="older DBOS release"):
        await verify(conn)
    # Nothing was touched.
    assert await tables(conn, "dbos") == {"dbos_migrations"}
    assert await versions(conn) == [50]


async def test_newer_version_is_accepted(db: asyncpg.Connection) -> None:
    await db.execute("UPDATE dbos.dbos_migrations SET version = 130")
    before = await objects(db, "dbos")
    assert await migrate(db) == 130
    assert await verify(db) == 130
    assert await objects(db, "dbos") == before
    assert await versions(db) == [130]


async def test_version_table_without_row(conn: asyncpg.Connection) -> None:
    # What a DBOS process leaves if it dies between creating the table and its first migration.
    await conn.execute(
        "CREATE SCHEMA dbos; CREATE TABLE dbos.dbos_migrations (version bigint PRIMARY KEY)"
    )
    with pytest.raises(MigrationError, match="records no migration"):
        await verify(conn)
    assert await migrate(conn) == LATEST_VERSION
    assert await versions(conn) == [LATEST_VERSION]


async def test_failed_step_leaves_nothing_behind(conn: asyncpg.Connection) -> None:
    # A stray table makes the baseline fail half-way: none of it may remain, nor a version.
    await conn.execute("CREATE SCHEMA dbos; CREATE TABLE dbos.queues (x int)")
    with pytest.raises(MigrationError, match="to version 125 failed"):
        await migrate(conn)
    assert await tables(conn, "dbos") == {"dbos_migrations", "queues"}
    assert await versions(conn) == []
    assert await advisory_locks(conn) == 0


async def test_migrate_refuses_to_run_in_a_transaction(conn: asyncpg.Connection) -> None:
    async with conn.transaction():
        with pytest.raises(MigrationError, match="outside a transaction"):
            await migrate(conn)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ("", "must not be empty"),
        ("a\x00b", "NUL"),
        ("s" * 64, "64 bytes"),
        ("é" * 32, "64 bytes"),  # 32 characters, but 64 bytes in UTF-8
    ],
)
async def test_bad_schema_names(conn: asyncpg.Connection, schema: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        quote_schema(schema)
    with pytest.raises(ConfigurationError, match=problem):
        await migrate(conn, schema)
    with pytest.raises(ConfigurationError, match=problem):
        await verify(conn, schema)


def test_quote_schema() -> None:
    assert quote_schema("dbos") == '"dbos"'
    assert quote_schema("my app") == '"my app"'
    assert quote_schema('a"b') == '"a""b"'
    assert quote_schema("s" * 63) == '"' + "s" * 63 + '"'


# --- enqueue_workflow ----------------------------------------------------------------------


async def status_row(db: asyncpg.Connection, workflow_id: str) -> dict[str, Any]:
    row = await db.fetchrow(
        "SELECT * FROM dbos.workflow_status WHERE workflow_uuid = $1", workflow_id
    )
    assert row is not None
    return dict(row)


async def inputs_of(db: asyncpg.Connection, workflow_id: str) -> Any:
    text = await db.fetchval(
        "SELECT inputs FROM dbos.workflow_input WHERE workflow_uuid = $1", workflow_id
    )
    assert text is not None
    return json.loads(text)


async def test_enqueue_workflow(db: asyncpg.Connection) -> None:
    now_ms = await db.fetchval("SELECT (extract(epoch FROM now()) * 1000)::bigint")
    wf = await db.fetchval(
        """
        SELECT dbos.enqueue_workflow(
            'process', 'jobs', ARRAY['1', '"two"', '{"x": null}']::json[], '{"k": [1, 2]}'::json,
            class_name => 'Cls', config_name => 'cfg', workflow_id => 'wf-1',
            app_version => 'v1', timeout_ms => 5000, deadline_epoch_ms => 99,
            priority => 3, queue_partition_key => 'p', authenticated_user => 'alice',
            authenticated_roles => '["admin"]', application_name => 'app')
        """
    )
    assert wf == "wf-1"
    row = await status_row(db, wf)
    assert row["status"] == "ENQUEUED"
    assert row["serialization"] == "portable_json"
    assert (row["name"], row["class_name"], row["config_name"]) == ("process", "Cls", "cfg")
    assert (row["queue_name"], row["priority"], row["queue_partition_key"]) == ("jobs", 3, "p")
    assert (row["application_version"], row["application_name"]) == ("v1", "app")
    assert (row["authenticated_user"], row["authenticated_roles"]) == ("alice", '["admin"]')
    assert (row["workflow_timeout_ms"], row["workflow_deadline_epoch_ms"]) == (5000, 99)
    assert row["recovery_attempts"] == 0
    assert row["delay_until_epoch_ms"] is None
    assert row["deduplication_id"] is None
    assert row["inputs"] is None  # inputs live in workflow_input since version 113
    assert row["created_at"] == row["updated_at"] >= now_ms
    uuid.UUID(row["owner_xid"])
    assert row["executor_id"] is None and row["parent_workflow_id"] is None

    assert await inputs_of(db, wf) == {
        "positionalArgs": [1, "two", {"x": None}],
        "namedArgs": {"k": [1, 2]},
    }


async def test_enqueue_workflow_defaults(db: asyncpg.Connection) -> None:
    wf = await db.fetchval("SELECT dbos.enqueue_workflow('process', 'jobs')")
    uuid.UUID(wf)
    row = await status_row(db, wf)
    assert (row["status"], row["priority"], row["application_name"]) == ("ENQUEUED", 0, None)
    assert await inputs_of(db, wf) == {"positionalArgs": [], "namedArgs": {}}
    # Explicit NULL arguments are stored as empty ones, not as JSON null.
    wf2 = await db.fetchval("SELECT dbos.enqueue_workflow('process', 'jobs', NULL, NULL)")
    assert await inputs_of(db, wf2) == {"positionalArgs": [], "namedArgs": {}}
    # asyncpg passes json[] as a list of JSON texts.
    wf3 = await db.fetchval(
        "SELECT dbos.enqueue_workflow('process', 'jobs', $1::json[])", ["[1]", "null"]
    )
    assert await inputs_of(db, wf3) == {"positionalArgs": [[1], None], "namedArgs": {}}


async def test_enqueue_workflow_delayed(db: asyncpg.Connection) -> None:
    wf = await db.fetchval(
        "SELECT dbos.enqueue_workflow('process', 'jobs', delay_until_epoch_ms => 12345)"
    )
    row = await status_row(db, wf)
    assert (row["status"], row["delay_until_epoch_ms"]) == ("DELAYED", 12345)
    wf0 = await db.fetchval(
        "SELECT dbos.enqueue_workflow('process', 'jobs', delay_until_epoch_ms => 0)"
    )
    assert (await status_row(db, wf0))["status"] == "DELAYED"


async def test_enqueue_workflow_twice_is_a_no_op(db: asyncpg.Connection) -> None:
    call = "SELECT dbos.enqueue_workflow('process', 'jobs', ARRAY[$1::json], workflow_id => 'w')"
    assert await db.fetchval(call, "1") == "w"
    # Simulate progress since the first call: it must be kept, only updated_at moves.
    await db.execute("UPDATE dbos.workflow_status SET status = 'PENDING', updated_at = 0")
    assert await db.fetchval(call, "2") == "w"
    row = await status_row(db, "w")
    assert row["status"] == "PENDING"
    assert row["updated_at"] > 0
    assert await inputs_of(db, "w") == {"positionalArgs": [1], "namedArgs": {}}
    assert await db.fetchval("SELECT count(*) FROM dbos.workflow_status") == 1


async def test_enqueue_workflow_deduplication(db: asyncpg.Connection) -> None:
    await db.execute(
        "SELECT dbos.enqueue_workflow('process', 'jobs', workflow_id => 'a', "
        "deduplication_id => 'dedup')"
    )
    with pytest.raises(asyncpg.UniqueViolationError) as raised:
        await db.execute(
            "SELECT dbos.enqueue_workflow('process', 'jobs', workflow_id => 'b', "
            "deduplication_id => 'dedup')"
        )
    assert raised.value.args[0] == "DBOS queue duplicated"
    assert raised.value.sqlstate == "23505"
    assert "dedup" in (raised.value.detail or "")
    # The duplicate left no trace.
    assert await db.fetchval("SELECT count(*) FROM dbos.workflow_status") == 1
    assert await db.fetchval("SELECT count(*) FROM dbos.workflow_input") == 1
    # The same deduplication ID on another queue is fine.
    await db.execute(
        "SELECT dbos.enqueue_workflow('process', 'other', workflow_id => 'c', "
        "deduplication_id => 'dedup')"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("'', 'jobs'", "workflow_name must be a non-empty string"),
        ("NULL, 'jobs'", "workflow_name must be a non-empty string"),
        ("'process', ''", "queue_name must be a non-empty string"),
        ("'process', NULL", "queue_name must be a non-empty string"),
        ("'process', 'jobs', named_args => '[1]'", "named_args must be a JSON object, not array"),
        ("'process', 'jobs', workflow_id => ''", "workflow_id must not be empty"),
        ("'process', 'jobs', delay_until_epoch_ms => -1", "delay_until_epoch_ms must be >= 0"),
    ],
)
async def test_enqueue_workflow_validation(
    db: asyncpg.Connection, arguments: str, message: str
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
        await db.execute(f"SELECT dbos.enqueue_workflow({arguments})")
    assert await db.fetchval("SELECT count(*) FROM dbos.workflow_status") == 0


# --- send_message and the notification trigger ---------------------------------------------


async def test_send_message(db: asyncpg.Connection) -> None:
    wf = await db.fetchval("SELECT dbos.enqueue_workflow('process', 'jobs')")
    await db.execute("SELECT dbos.send_message($1, '{\"a\": 1}'::json)", wf)
    row = await db.fetchrow("SELECT * FROM dbos.notifications")
    assert row is not None
    assert row["destination_uuid"] == wf
    assert row["topic"] == "__null__topic__"
    assert json.loads(row["message"]) == {"a": 1}
    assert row["serialization"] == "portable_json"
    assert row["consumed"] is False
    uuid.UUID(row["message_uuid"])


async def test_send_message_with_id_is_idempotent(db: asyncpg.Connection) -> None:
    wf = await db.fetchval("SELECT dbos.enqueue_workflow('process', 'jobs')")
    for _ in range(2):
        await db.execute("SELECT dbos.send_message($1, '\"hi\"'::json, 'greeting', 'm-1')", wf)
    rows = await db.fetch("SELECT message_uuid, topic, message FROM dbos.notifications")
    assert [tuple(r.values()) for r in rows] == [("m-1", "greeting", '"hi"')]


async def test_send_message_to_missing_workflow(db: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="DBOS non-existent workflow") as e:
        await db.execute("SELECT dbos.send_message('nobody', '1'::json)")
    assert "nobody" in (e.value.detail or "")
    assert await db.fetchval("SELECT count(*) FROM dbos.notifications") == 0


async def test_notification_trigger(db: asyncpg.Connection, database_url: str) -> None:
    wf = await db.fetchval("SELECT dbos.enqueue_workflow('process', 'jobs')")
    payloads: asyncio.Queue[str] = asyncio.Queue()

    def on_notify(_c: Any, _pid: int, _channel: str, payload: object) -> None:
        payloads.put_nowait(str(payload))

    listener = await asyncpg.connect(database_url)
    try:
        await listener.add_listener("dbos_notifications_channel", on_notify)
        await db.execute("SELECT dbos.send_message($1, '1'::json, 'topic-1')", wf)
        await db.execute("SELECT dbos.send_message($1, '2'::json)", wf)
        # The timeout only keeps a broken trigger from hanging the test.
        got = [await asyncio.wait_for(payloads.get(), 10) for _ in range(2)]
        assert got == [f"{wf}::topic-1", f"{wf}::__null__topic__"]
    finally:
        await listener.close()


async def test_public_migrate_creates_the_database_and_keeps_the_schema_kind(
    make_database_url: Any, admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dbos_async import DBOSClient
    from dbos_async import migrate as migrate_database
    from dbos_async.testing import drop_database

    for name in ("DBOS_SYSTEM_DATABASE_URL", "DBOS_SHARDING", "DBOS_SCHEMA_NAME",
                 "DBOS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    name = f"dbos_test_{uuid.uuid4().hex}"
    url = make_database_url(name)
    try:
        # Not created yet: migrate creates it, sharded as asked.
        assert await migrate_database(url, sharding=True) == LATEST_VERSION
        # Without a sharding setting the schema keeps its kind (an unsharded run would be
        # refused by the kind check); the URL may come from the environment.
        monkeypatch.setenv("DBOS_SYSTEM_DATABASE_URL", url)
        assert await migrate_database() == LATEST_VERSION
        with pytest.raises(ConfigurationError, match="is sharded"):
            await migrate_database(sharding=False)
        async with DBOSClient(url, sharding=True) as client:
            assert await client.list_workflows() == []
    finally:
        await drop_database(admin_url, name)


async def test_public_migrate_needs_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from dbos_async import migrate as migrate_database

    monkeypatch.delenv("DBOS_SYSTEM_DATABASE_URL", raising=False)
    monkeypatch.delenv("DBOS_CONFIG_FILE", raising=False)
    with pytest.raises(ConfigurationError, match="DBOS_SYSTEM_DATABASE_URL"):
        await migrate_database()
