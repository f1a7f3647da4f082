"""Compatibility of our migrations with the `dbos` package (3.4.0), the schema's owner.

(a) Our SQL builds the same catalog as DBOS's own migrations, plus our own additions (the
    enqueue triggers and their functions, the depth samples table, see sql/additions/) and
    nothing else.
(b) DBOS launched on a database we migrated runs no migration, and runs workflows.
(c) Our runner accepts a database DBOS migrated, and changes nothing in it but adding our
    additions (verifying changes nothing at all).
"""

from __future__ import annotations

import asyncio
import difflib
import sys
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from dbos._migration import ensure_dbos_schema, run_dbos_migrations

from dbos_async._sysdb.migrations import (
    DEPTH_SAMPLES_TABLE,
    ENQUEUE_TRIGGER,
    LATEST_VERSION,
    REQUEUE_TRIGGER,
    migrate,
    verify,
)

ADDITIONS = {ENQUEUE_TRIGGER, REQUEUE_TRIGGER, "dbos_async_enqueue_notify",
             "dbos_async_requeue_notify", DEPTH_SAMPLES_TABLE, f"{DEPTH_SAMPLES_TABLE}_pkey",
             f"_{DEPTH_SAMPLES_TABLE}"}
"""The names of the objects our runner adds to DBOS's schema (sql/additions/)."""

# Each query returns rows describing one kind of object in schema $1. Text that names the schema
# (constraint, index and trigger definitions) has it replaced by <schema>, so two schemas with
# different names, or in different databases, compare equal when their objects do.
_NORMALISE = "replace({expr}, quote_ident($1) || '.', '<schema>.')"

_CATALOG_QUERIES: dict[str, str] = {
    # Every relation (tables, indexes, sequences, views...), so nothing extra goes unnoticed.
    "relations": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text, c.reloptions
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1
        ORDER BY c.relname
    """,
    "columns": f"""
        SELECT c.relname, a.attnum, a.attname,
               format_type(a.atttypid, a.atttypmod) AS type,
               a.attnotnull, a.attidentity::text, a.attgenerated::text,
               {_NORMALISE.format(expr="pg_get_expr(d.adbin, d.adrelid)")} AS default
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = $1 AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum
    """,
    "constraints": f"""
        SELECT c.relname, k.conname, k.contype::text,
               k.condeferrable, k.condeferred, k.convalidated,
               {_NORMALISE.format(expr="pg_get_constraintdef(k.oid)")} AS definition
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = k.connamespace
        WHERE n.nspname = $1
        ORDER BY c.relname, k.conname
    """,
    "indexes": f"""
        SELECT t.relname AS table, i.relname AS index, x.indisunique, x.indisprimary,
               x.indisvalid,
               {_NORMALISE.format(expr="pg_get_indexdef(x.indexrelid)")} AS definition
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_class t ON t.oid = x.indrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = $1
        ORDER BY i.relname
    """,
    "triggers": f"""
        SELECT c.relname, g.tgname, g.tgenabled::text,
               {_NORMALISE.format(expr="pg_get_triggerdef(g.oid)")} AS definition
        FROM pg_trigger g
        JOIN pg_class c ON c.oid = g.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND NOT g.tgisinternal
        ORDER BY c.relname, g.tgname
    """,
    # Signatures with argument names and defaults, plus every attribute a caller can observe.
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS identity,
               pg_get_function_arguments(p.oid) AS arguments,
               pg_get_function_result(p.oid) AS result,
               p.prokind::text, p.provolatile::text, p.proisstrict, p.prosecdef,
               p.proleakproof, p.proparallel::text, p.proretset, l.lanname, p.proconfig
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        JOIN pg_language l ON l.oid = p.prolang
        WHERE n.nspname = $1
        ORDER BY p.proname, identity
    """,
    "types": """
        SELECT t.typname, t.typtype::text
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = $1
        ORDER BY t.typname
    """,
}


async def catalog(url: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """A comparable description of everything in `schema`."""
    conn = await asyncpg.connect(url)
    try:
        return {
            kind: [tuple(row.values()) for row in await conn.fetch(query, schema)]
            for kind, query in _CATALOG_QUERIES.items()
        }
    finally:
        await conn.close()


def additions(catalog: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of ``catalog`` naming one of our additions."""
    return {kind: [row for row in rows if ADDITIONS & set(map(str, row))]
            for kind, rows in catalog.items()}


def without_additions(catalog: dict[str, list[tuple[Any, ...]]]
                      ) -> dict[str, list[tuple[Any, ...]]]:
    """``catalog`` less the rows naming one of our additions."""
    return {kind: [row for row in rows if not ADDITIONS & set(map(str, row))]
            for kind, rows in catalog.items()}


def assert_added(catalog: dict[str, list[tuple[Any, ...]]]) -> None:
    """The additions are there: two triggers on workflow_status, their functions, and the
    depth samples table with its key."""
    added = additions(catalog)
    assert sorted(row[:2] for row in added["triggers"]) == [
        ("workflow_status", ENQUEUE_TRIGGER), ("workflow_status", REQUEUE_TRIGGER)]
    assert sorted(row[0] for row in added["functions"]) == ["dbos_async_enqueue_notify",
                                                            "dbos_async_requeue_notify"]
    assert sorted(row[:2] for row in added["relations"]) == [
        (DEPTH_SAMPLES_TABLE, "r"), (f"{DEPTH_SAMPLES_TABLE}_pkey", "i")]
    assert [row[2] for row in added["columns"]] == [
        "application_name", "minute_epoch_ms", "queue_name", "waiting", "sampled_at_epoch_ms"]
    assert [row[:3] for row in added["constraints"]] == [
        (DEPTH_SAMPLES_TABLE, f"{DEPTH_SAMPLES_TABLE}_pkey", "p")]
    assert [row[:2] for row in added["indexes"]] == [
        (DEPTH_SAMPLES_TABLE, f"{DEPTH_SAMPLES_TABLE}_pkey")]
    assert sorted(row[0] for row in added["types"]) == [f"_{DEPTH_SAMPLES_TABLE}",
                                                        DEPTH_SAMPLES_TABLE]


def assert_same_catalog(
    expected: dict[str, list[tuple[Any, ...]]], actual: dict[str, list[tuple[Any, ...]]]
) -> None:
    """Assert equality with a unified diff per kind of object, which a bare == would not show."""
    diffs = []
    for kind in _CATALOG_QUERIES:
        if expected[kind] != actual[kind]:
            diffs.append(
                f"--- {kind} differ ---\n"
                + "\n".join(
                    difflib.unified_diff(
                        [repr(row) for row in expected[kind]],
                        [repr(row) for row in actual[kind]],
                        "dbos 3.4.0",
                        "dbos_async",
                        lineterm="",
                    )
                )
            )
    assert not diffs, "\n".join(diffs)


def _sqlalchemy_url(url: str) -> str:
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def _dbos_migrate_sync(url: str, schema: str) -> None:
    engine = sa.create_engine(_sqlalchemy_url(url))
    try:
        ensure_dbos_schema(engine, schema)
        # use_listen_notify=True is DBOS's default on PostgreSQL (it adds the trigger).
        run_dbos_migrations(engine, schema, True)
    finally:
        engine.dispose()


async def dbos_migrate(url: str, schema: str) -> None:
    """Migrate with the dbos package's own code, as `DBOS.launch()` would."""
    await asyncio.to_thread(_dbos_migrate_sync, url, schema)


async def our_migrate(url: str, schema: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return await migrate(conn, schema)
    finally:
        await conn.close()


async def object_ids(url: str, schema: str) -> list[tuple[str, str, int]]:
    """OIDs of every relation and function: an object dropped and re-created changes this."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            """
            SELECT 'rel', c.relname, c.oid::int8 FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
            UNION ALL
            SELECT 'proc', p.proname, p.oid::int8 FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
            UNION ALL
            SELECT 'trigger', g.tgname, g.oid::int8 FROM pg_trigger g
            JOIN pg_class c ON c.oid = g.tgrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
            ORDER BY 1, 2, 3
            """,
            schema,
        )
        return [tuple(r.values()) for r in rows]
    finally:
        await conn.close()


async def recorded_versions(url: str, schema: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(f"SELECT version FROM {_pg_quote(schema)}.dbos_migrations")
        return [r["version"] for r in rows]
    finally:
        await conn.close()


def _pg_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@pytest.fixture
async def second_database_url(create_database: Callable[[], Awaitable[str]]) -> str:
    """Another empty database next to `database_url`, for side-by-side comparisons."""
    return await create_database()


# --- (a) same catalog ----------------------------------------------------------------------


@pytest.mark.parametrize("schema", ["dbos", 'Tenant "A" sys'])
async def test_catalog_matches_dbos(
    database_url: str, second_database_url: str, schema: str
) -> None:
    await dbos_migrate(database_url, schema)
    assert await our_migrate(second_database_url, schema) == LATEST_VERSION

    theirs = await catalog(database_url, schema)
    ours = await catalog(second_database_url, schema)
    # Guard against comparing two empty catalogs: the queries must have found the schema.
    assert len(theirs["relations"]) > 40 and theirs["functions"] and theirs["triggers"]
    assert not any(additions(theirs).values())
    assert_added(ours)
    assert_same_catalog(theirs, without_additions(ours))
    assert await recorded_versions(database_url, schema) == [LATEST_VERSION]
    assert await recorded_versions(second_database_url, schema) == [LATEST_VERSION]


# --- (b) DBOS runs on our database ---------------------------------------------------------

_INTEROP_SCRIPT = textwrap.dedent(
    """
    import sys
    from dbos import DBOS

    DBOS(config={
        "name": "interop",
        "system_database_url": sys.argv[1],
        "dbos_system_schema": sys.argv[2],
        "log_level": "INFO",  # so that an applied migration would show in the output
    })

    @DBOS.step()
    def double(x: int) -> int:
        return 2 * x

    @DBOS.workflow()
    def compute(x: int) -> str:
        return "result=" + str(double(x))

    DBOS.launch()
    try:
        print("INTEROP", compute(21), flush=True)
    finally:
        DBOS.destroy()
    """
)


@pytest.mark.parametrize("schema", ["dbos", "interop app"])
async def test_dbos_runs_on_our_database_without_migrating(database_url: str, schema: str) -> None:
    assert await our_migrate(database_url, schema) == LATEST_VERSION
    before = await catalog(database_url, schema)
    ids_before = await object_ids(database_url, schema)

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _INTEROP_SCRIPT,
        database_url,
        schema,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    stdout, stderr = out.decode(), err.decode()
    assert proc.returncode == 0, f"dbos exited with {proc.returncode}\n{stdout}\n{stderr}"
    assert "INTEROP result=42" in stdout, f"{stdout}\n{stderr}"
    # DBOS logs each migration it applies; it must not have applied any.
    assert "Applying DBOS system database schema migration" not in stdout + stderr

    # No DDL: the catalog is exactly as we left it, and so is the version row.
    assert_same_catalog(before, await catalog(database_url, schema))
    assert await object_ids(database_url, schema) == ids_before
    assert await recorded_versions(database_url, schema) == [LATEST_VERSION]

    # The workflow and its step were recorded in our tables.
    conn = await asyncpg.connect(database_url)
    try:
        q = _pg_quote(schema)
        status = await conn.fetchrow(
            f"SELECT workflow_uuid, status FROM {q}.workflow_status WHERE name LIKE '%compute'"
        )
        assert status is not None and status["status"] == "SUCCESS"
        steps = await conn.fetch(
            f"SELECT function_name FROM {q}.operation_outputs WHERE workflow_uuid = $1",
            status["workflow_uuid"],
        )
        names = [s["function_name"] for s in steps]
        assert len(names) == 1 and names[0].endswith("double"), names
    finally:
        await conn.close()


# --- (c) we accept DBOS's database ---------------------------------------------------------


async def test_we_accept_a_database_dbos_migrated(database_url: str) -> None:
    await dbos_migrate(database_url, "dbos")
    before = await catalog(database_url, "dbos")
    ids_before = await object_ids(database_url, "dbos")

    conn = await asyncpg.connect(database_url)
    try:
        assert await verify(conn) == LATEST_VERSION
        assert_same_catalog(before, await catalog(database_url, "dbos"))
        assert await migrate(conn) == LATEST_VERSION
        assert await verify(conn) == LATEST_VERSION
    finally:
        await conn.close()

    after = await catalog(database_url, "dbos")
    assert_added(after)
    assert_same_catalog(before, without_additions(after))
    # DBOS's objects were left in place (not dropped and re-created).
    ids_after = await object_ids(database_url, "dbos")
    assert [row for row in ids_after if row[1] not in ADDITIONS] == ids_before
    assert await recorded_versions(database_url, "dbos") == [LATEST_VERSION]
