"""System-database migrations: build, check and record the DBOS system schema.

The schema is the one the ``dbos`` package (3.4.0) creates, so a database made here can be
used by DBOS itself and the other way round. DBOS records its schema version as the single row
of ``<schema>.dbos_migrations``; this module reads and writes that same row.

Migration files
    The SQL lives in ``sql/`` at the repository root (shipped in wheels as ``dbos_async/_sql``).
    A file is named ``<version>_<part>.sql``, e.g. ``0125_01_tables.sql``: the four-digit
    number is the DBOS schema version the file brings the database to. All files sharing a
    version form one *step*; a step's files run in name order, in one transaction, together with
    the update of ``dbos_migrations``. So a step is either fully applied and recorded, or not at
    all. A future DBOS migration 126 becomes ``0126_<part>.sql``.

    The lowest version is the *baseline* (125): it builds the whole schema from nothing. This
    package ships no history before it, so a database recorded at 1..124 (made by an older DBOS)
    must first be upgraded with DBOS's own tooling (e.g. ``dbos migrate``); :func:`migrate` then
    refuses it with a :class:`MigrationError` rather than guessing.

Placeholders
    Files write ``{{schema}}`` wherever the schema is named; it is replaced by the output of
    :func:`quote_schema`, a validated, double-quoted identifier, so any schema name (spaces,
    quotes, upper case) is safe. Function bodies are dollar-quoted as ``$dbos_fn$``; if that text
    occurs inside the quoted schema name, another tag is used so the body cannot end early.

Versions newer than this package knows
    A database recorded above :data:`LATEST_VERSION` was migrated by a newer DBOS. DBOS keeps
    such databases usable by older releases (DBOS itself runs on a database ahead of it), so it
    is accepted, with a log line: :func:`migrate` changes nothing and :func:`verify` passes,
    both returning the recorded version.

The bookkeeping table ``dbos_migrations`` is created by the runner, not by a step, because it
must exist before any step can be recorded (DBOS does the same).

Two tracks: unsharded and sharded
    ``sql/`` builds the unsharded schema; ``sql/sharded/`` builds the sharded one, where every
    per-workflow table starts with a ``shard_key`` column that leads its keys, so workflows of
    different shard keys (tenants) can be spread over nodes. Its files follow the same rules and
    placeholders. Where the ``citus`` extension is installed in the database, its last file also
    distributes the per-workflow tables by ``shard_key`` and makes the global ones reference
    tables; on plain PostgreSQL the same files build the same schema, undistributed.
    :func:`migrate` and :func:`verify` run one track or the other (``sharded=``).

Additions of this package's own
    ``sql/additions/`` holds objects DBOS's schema lacks and this package adds to the
    unsharded track, each file an addition of its own: the triggers that NOTIFY the enqueue
    channel for every workflow inserted ENQUEUED or DELAYED, or updated back to ENQUEUED,
    whoever writes it; and the table of the queues' depth samples (see each file for why).
    They carry no version (DBOS's version row stays DBOS's): :func:`migrate` adds each one
    missing, in a transaction of its own under the lock, on a schema it built or one DBOS
    built; a role that may not add one is told so in a warning and goes on without it.
    :func:`verify` does not require them; :func:`read_additions` says which are there, so
    an executor on a schema without the trigger notifies by itself, and one without the
    table samples no depths. On the sharded track there is none: on Citus a trigger fires
    on a worker, whose NOTIFY never reaches the coordinator's listeners (its SQL functions
    notify by themselves), and the depth history there stays worked back.

    Both tracks record the DBOS version they build (125) in ``dbos_migrations``: the version
    says how far a schema is migrated, and the kind is read off the schema itself, as DBOS does:
    a schema is sharded iff ``workflow_status`` has a ``shard_key`` column. A distinct version
    number for the sharded track would not keep the kinds apart: an unsharded runner (this
    one, or DBOS's) reads a higher number as a newer schema and accepts it as is. Instead, each
    runner first checks the kind and refuses a schema of the other kind with a
    :class:`ConfigurationError`, before it takes a lock, reads a row or runs a step. A schema
    with no ``workflow_status`` yet has no kind and is built by whichever runner comes first;
    the advisory lock makes runners take turns, and each checks the kind again under it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from dbos_async._sysdb import connection
from dbos_async._sysdb.retry import is_transient
from dbos_async._sysdb.statements.base import DEPTH_SAMPLES_TABLE
from dbos_async.errors import ConfigurationError, MigrationError

__all__ = ["LATEST_VERSION", "check_schema_kind", "holds_sharded_schema", "migrate",
           "quote_schema", "verify"]

logger = logging.getLogger(__name__)

LATEST_VERSION: int = 125
"""The DBOS system-schema version this package builds and requires."""

_SCHEMA_PLACEHOLDER = "{{schema}}"
_BODY_TAG = "$dbos_fn$"
_FILE_NAME = re.compile(r"^(?P<version>\d{4})_[a-z0-9_]+\.sql$")
_MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1; longer names are silently cut.
_SHARDED_DIR = "sharded"
_ADDITIONS_DIR = "additions"
ENQUEUE_TRIGGER = "dbos_async_enqueue_trigger"
"""The insert trigger of ``sql/additions/enqueue_notify.sql``: whether executors rely on
the server's announcements (see :func:`read_additions`)."""
REQUEUE_TRIGGER = "dbos_async_requeue_trigger"
"""Its update trigger: with :data:`ENQUEUE_TRIGGER`, their presence records the addition."""


@dataclass(frozen=True)
class _Addition:
    file: str
    what: str
    """What it is, for the log ("dbos_async's <what>")."""
    without: str
    """What works otherwise while it is missing, for the warning."""


_ENQUEUE_NOTIFY = _Addition(
    "enqueue_notify.sql", "enqueue trigger",
    "workflows other writers enqueue are found by polling")
_DEPTH_SAMPLES = _Addition(
    "depth_samples.sql", "queue depth samples table",
    "queue depth histories are worked back from the workflows' rows")

# Which additions the schema holds: both triggers of enqueue_notify.sql on its
# workflow_status (and whether the insert one fires), and the depth samples table.
_ADDITIONS_PRESENT = """
    SELECT (SELECT count(*) = 2
            FROM pg_catalog.pg_trigger g
            JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = $1 AND c.relname = 'workflow_status'
              AND g.tgname = ANY($2::text[])) AS triggers,
           (SELECT g.tgenabled <> 'D'
            FROM pg_catalog.pg_trigger g
            JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = $1 AND c.relname = 'workflow_status'
              AND g.tgname = $3) AS enqueue_trigger_enabled,
           EXISTS (SELECT FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = $1 AND c.relname = $4 AND c.relkind = 'r')
               AS depth_samples
"""
# Bounds holds_sharded_schema's connection attempt, as the caller's own connection would be.
_PROBE_CONNECT_TIMEOUT = 10.0

# The advisory-lock key DBOS (Python) takes around its own migrations. Holding it too makes a
# dbos_async process and a DBOS process that start on the same empty database take turns
# instead of both creating the schema. Advisory locks are per database, so this never blocks
# work on other databases.
_DBOS_MIGRATION_LOCK_KEY = 1234567890

# What an unmigrated schema's error tells the user to run.
_HOW_TO_MIGRATE = ("run `dbos-async migrate` (or `await dbos_async.migrate()`), or start "
                   "an executor with run_migrations=True, first")


@dataclass(frozen=True)
class _Step:
    version: int
    files: tuple[str, ...]
    template: str


def quote_schema(schema: str) -> str:
    """Validate a schema name and return it as a double-quoted SQL identifier.

    Quoting (rather than restricting names to ``[a-z_]``) keeps every name PostgreSQL accepts
    usable, and makes the name impossible to misread as SQL.
    """
    if not isinstance(schema, str):
        raise ConfigurationError(f"schema name must be a string, not {type(schema).__name__}")
    if schema == "":
        raise ConfigurationError("schema name must not be empty")
    if "\x00" in schema:
        raise ConfigurationError(f"schema name {schema!r} must not contain a NUL character")
    size = len(schema.encode("utf-8"))
    if size > _MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"schema name {schema!r} is {size} bytes long; PostgreSQL identifiers are at most "
            f"{_MAX_IDENTIFIER_BYTES} bytes (longer names would be silently truncated)"
        )
    return '"' + schema.replace('"', '""') + '"'


def _lock_key(schema: str) -> int:
    """A stable advisory-lock key per schema, so different schemas migrate independently."""
    digest = hashlib.sha256(f"dbos_async.migrations:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _sql_dir(sharded: bool, track: str | None = None) -> Path:
    """Where a track's migration files are: the wheel's copy first, else the source checkout's."""
    here = Path(__file__).resolve()
    if track is None:
        track = _SHARDED_DIR if sharded else ""
    candidates = (here.parents[1] / "_sql" / track, here.parents[2] / "sql" / track)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise MigrationError(
        "cannot find the system-database migration files: looked in "
        + " and ".join(str(c) for c in candidates)
        + " (the package is installed incompletely)"
    )


@functools.cache
def _steps(sharded: bool) -> tuple[_Step, ...]:
    """Load and group a track's migration files once; they do not change while running."""
    directory = _sql_dir(sharded)
    grouped: dict[int, list[Path]] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(
                f"unexpected migration file name {path.name!r} in {directory}: "
                "expected <4-digit version>_<part>.sql, e.g. 0125_01_tables.sql"
            )
        grouped.setdefault(int(match["version"]), []).append(path)
    steps = tuple(
        _Step(
            version=version,
            files=tuple(p.name for p in paths),
            template="\n".join(p.read_text(encoding="utf-8") for p in paths),
        )
        for version, paths in sorted(grouped.items())
    )
    if not steps or steps[-1].version != LATEST_VERSION:
        found = steps[-1].version if steps else "none"
        raise MigrationError(
            f"migration files in {directory} end at version {found}, but this package "
            f"expects {LATEST_VERSION}"
        )
    return steps


@functools.cache
def _addition_sql(addition: _Addition) -> str:
    """An addition's SQL (see the module docstring), loaded once."""
    return (_sql_dir(False, _ADDITIONS_DIR) / addition.file).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Additions:
    """Which of this package's additions a schema holds (see the module docstring)."""

    enqueue_trigger: bool
    """The enqueue trigger is there, enabled: every workflow inserted ENQUEUED or DELAYED
    is announced by the server, at its commit."""
    depth_samples: bool
    """The depth samples table is there."""


async def _present(conn: asyncpg.Connection | asyncpg.Pool, schema: str) -> asyncpg.Record:
    row = await conn.fetchrow(_ADDITIONS_PRESENT, schema, [ENQUEUE_TRIGGER, REQUEUE_TRIGGER],
                              ENQUEUE_TRIGGER, DEPTH_SAMPLES_TABLE)
    assert row is not None
    return row


async def read_additions(conn: asyncpg.Connection | asyncpg.Pool, schema: str) -> Additions:
    """Which additions the (unsharded) schema holds, in one query."""
    row = await _present(conn, schema)
    return Additions(bool(row["enqueue_trigger_enabled"]), bool(row["depth_samples"]))


async def _missing_additions(conn: asyncpg.Connection, schema: str,
                             sharded: bool) -> list[_Addition]:
    if sharded:
        return []
    row = await _present(conn, schema)
    return [addition for addition, present in ((_ENQUEUE_NOTIFY, row["triggers"]),
                                                (_DEPTH_SAMPLES, row["depth_samples"]))
            if not present]


def _render(template: str, quoted_schema: str) -> str:
    """Fill in the schema, first moving the body tag out of its way if the name contains it."""
    tag = _BODY_TAG
    n = 0
    while tag in quoted_schema or (tag != _BODY_TAG and tag in template):
        n += 1
        tag = f"$dbos_fn_{n}$"
    if tag != _BODY_TAG:
        template = template.replace(_BODY_TAG, tag)
    return template.replace(_SCHEMA_PLACEHOLDER, quoted_schema)


async def _schema_exists(conn: asyncpg.Connection, schema: str) -> bool:
    found = await conn.fetchval(
        "SELECT true FROM pg_catalog.pg_namespace WHERE nspname = $1", schema
    )
    return bool(found)


async def _table_exists(conn: asyncpg.Connection, schema: str) -> bool:
    # pg_class, not information_schema: the latter hides tables the role has no rights on.
    found = await conn.fetchval(
        """
        SELECT true
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relname = 'dbos_migrations' AND c.relkind = 'r'
        """,
        schema,
    )
    return bool(found)


async def _recorded_version(conn: asyncpg.Connection, schema: str) -> int | None:
    """The recorded version; 0 if the table is empty; None if the table does not exist."""
    if not await _table_exists(conn, schema):
        return None
    version = await conn.fetchval(
        f"SELECT max(version) FROM {quote_schema(schema)}.dbos_migrations"
    )
    return int(version) if version is not None else 0


def _too_old(schema: str, version: int, sharded: bool) -> MigrationError:
    return MigrationError(
        f"the DBOS system schema {schema!r} was created by an older DBOS release and is at "
        f"version {version}; dbos_async only ships the version-{_steps(sharded)[0].version} "
        "baseline. "
        f"Upgrade it to version {LATEST_VERSION} with DBOS's own tooling first "
        f"(e.g. `dbos migrate` from the dbos Python package), then start again"
    )


def _needs_migration(schema: str, version: int, sharded: bool) -> bool:
    """Whether steps must run on a database at `version`; raises if they cannot."""
    if version >= LATEST_VERSION:
        _note_if_newer(schema, version)
        return False
    if 0 < version < _steps(sharded)[0].version:
        raise _too_old(schema, version, sharded)
    return True


def _note_if_newer(schema: str, version: int) -> None:
    if version > LATEST_VERSION:
        logger.info(
            "DBOS system schema %r is at version %d, newer than %d: it was migrated by a "
            "newer DBOS release; using it as is",
            schema,
            version,
            LATEST_VERSION,
        )


async def _holds_sharded_table(conn: asyncpg.Connection, schema: str) -> bool | None:
    """Whether the schema's workflow_status has a shard_key column; None if there is no
    workflow_status (the schema has no kind yet)."""
    # pg_catalog, not information_schema: the latter hides tables the role has no rights on.
    row = await conn.fetchrow(
        """
        SELECT EXISTS (
            SELECT 1 FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = c.oid AND a.attname = 'shard_key' AND NOT a.attisdropped
        ) AS sharded
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relname = 'workflow_status' AND c.relkind = 'r'
        """,
        schema,
    )
    return None if row is None else bool(row["sharded"])


async def check_schema_kind(conn: asyncpg.Connection, schema: str, *, sharded: bool) -> None:
    """Raise :class:`ConfigurationError` if the schema is of the other kind than ``sharded``.

    An unsharded handle's statements on a sharded schema would span every key's rows, and a
    sharded handle's name a column an unsharded schema lacks; either must stop before it
    touches a row. A schema without workflow_status passes: it has no kind yet.
    """
    found = await _holds_sharded_table(conn, schema)
    if found is None or found == sharded:
        return
    if found:
        raise ConfigurationError(
            f"The DBOS system schema {schema} is sharded. Enable sharding to use it: set "
            "sharding=True in DBOS(...) or DBOSClient(..., sharding=True), or DBOS_SHARDING=true."
        )
    raise ConfigurationError(
        f"The DBOS system schema {schema} is not sharded. Disable sharding to use it: set "
        "sharding=False in DBOS(...) or DBOSClient(..., sharding=False), or DBOS_SHARDING=false "
        "(a sharded system database needs a schema of its own)."
    )


async def holds_sharded_schema(url: str, schema: str | None = None) -> bool:
    """Whether the database at ``url`` holds a sharded DBOS system schema (``schema``, if
    given); for choosing which kind of handle to open.

    False if the database cannot be reached or read: the caller's own connection then reports
    the problem with its context, rather than this probe.
    """
    try:
        conn = await connection.connect(url, _PROBE_CONNECT_TIMEOUT,
                                        connection.DEFAULT_CONNECTION_NAME)
    except Exception:  # a malformed URL, a refused or timed-out connection, a bad login
        return False
    try:
        query = (
            "SELECT true FROM information_schema.columns "
            "WHERE table_name = 'workflow_status' AND column_name = 'shard_key'"
        )
        if schema is None:
            found = await conn.fetchval(query + " LIMIT 1")
        else:
            found = await conn.fetchval(query + " AND table_schema = $1 LIMIT 1", schema)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):  # refused, or lost mid-way
        return False
    finally:
        await conn.close()
    return bool(found)


async def migrate(conn: asyncpg.Connection, schema: str = "dbos", *, sharded: bool = False) -> int:
    """Bring the system schema up to :data:`LATEST_VERSION`; return the final version.

    ``sharded`` picks the track (see the module docstring); a schema of the other kind is
    refused by :func:`check_schema_kind` before anything else. Safe to call from many
    processes at once (an advisory lock serialises them; the losers find the work done) and
    on every start-up (an up-to-date database costs three queries). Call it outside a
    transaction: each step commits on its own.
    """
    quoted = quote_schema(schema)
    steps = _steps(sharded)
    if conn.is_in_transaction():
        raise MigrationError("migrate() must be called outside a transaction")
    await check_schema_kind(conn, schema, sharded=sharded)

    # Fast path without the lock: the usual case is a database that is already migrated.
    version = await _recorded_version(conn, schema)
    if (version is not None and not _needs_migration(schema, version, sharded)
            and not await _missing_additions(conn, schema, sharded)):
        return version

    held: list[int] = []
    try:
        for key in (_lock_key(schema), _DBOS_MIGRATION_LOCK_KEY):
            await conn.execute("SELECT pg_catalog.pg_advisory_lock($1)", key)
            held.append(key)
        await _ensure_bookkeeping(conn, schema, quoted)

        # Re-read under the lock: another process, of either kind, may have migrated meanwhile.
        await check_schema_kind(conn, schema, sharded=sharded)
        version = await _recorded_version(conn, schema)
        assert version is not None
        if _needs_migration(schema, version, sharded):
            for step in steps:
                if step.version > version:
                    await _apply(conn, schema, quoted, step)
                    version = step.version
        for addition in await _missing_additions(conn, schema, sharded):
            await _add(conn, schema, quoted, addition)
        return version
    finally:
        # A closed connection has already dropped its session locks.
        for key in reversed(held):
            if not conn.is_closed():
                await conn.execute("SELECT pg_catalog.pg_advisory_unlock($1)", key)


async def _ensure_bookkeeping(conn: asyncpg.Connection, schema: str, quoted: str) -> None:
    """Create the schema and dbos_migrations if missing.

    Existence is checked first because CREATE SCHEMA IF NOT EXISTS still demands the CREATE
    privilege on the database, which a role using a pre-made schema may lack.
    """
    try:
        if not await _schema_exists(conn, schema):
            await conn.execute(f"CREATE SCHEMA {quoted}")
        if not await _table_exists(conn, schema):
            await conn.execute(
                f"CREATE TABLE {quoted}.dbos_migrations (version bigint NOT NULL PRIMARY KEY)"
            )
    except asyncpg.PostgresError as e:
        if is_transient(e):
            raise  # a lost connection: the caller retries the migration
        raise MigrationError(f"cannot create the DBOS system schema {schema!r}: {e}") from e


async def _apply(conn: asyncpg.Connection, schema: str, quoted: str, step: _Step) -> None:
    """Run one step and record it atomically, so a failure leaves the old version intact."""
    logger.info(
        "migrating DBOS system schema %r to version %d (%s)",
        schema,
        step.version,
        ", ".join(step.files),
    )
    try:
        async with conn.transaction():
            await conn.execute(_render(step.template, quoted))
            # DBOS reads dbos_migrations as exactly one row: insert it once, then update it.
            updated = await conn.execute(
                f"UPDATE {quoted}.dbos_migrations SET version = $1", step.version
            )
            if updated == "UPDATE 0":
                await conn.execute(
                    f"INSERT INTO {quoted}.dbos_migrations (version) VALUES ($1)", step.version
                )
    except asyncpg.PostgresError as e:
        if is_transient(e):
            raise  # a lost connection: the step rolled back, the caller retries it
        raise MigrationError(
            f"migrating DBOS system schema {schema!r} to version {step.version} failed "
            f"({', '.join(step.files)}): {type(e).__name__}: {e}"
        ) from e


async def _add(conn: asyncpg.Connection, schema: str, quoted: str,
               addition: _Addition) -> None:
    """Create one addition in one transaction (see the module docstring)."""
    logger.info("adding dbos_async's %s to the DBOS system schema %r", addition.what, schema)
    try:
        async with conn.transaction():
            await conn.execute(_render(_addition_sql(addition), quoted))
    except asyncpg.InsufficientPrivilegeError as e:
        # A role that may use a schema another role made, but not add to it: everything
        # works without the addition, as on a verified schema.
        logger.warning("Could not add dbos_async's %s to the DBOS system schema %r (%s): %s",
                       addition.what, schema, e, addition.without)
    except asyncpg.PostgresError as e:
        if is_transient(e):
            raise
        raise MigrationError(
            f"adding dbos_async's {addition.what} to the DBOS system schema {schema!r} failed "
            f"({addition.file}): {type(e).__name__}: {e}") from e


async def verify(conn: asyncpg.Connection, schema: str = "dbos", *, sharded: bool = False) -> int:
    """Check, without changing anything, that the system schema is usable and of the kind
    ``sharded`` asks for; return its version.

    For deployments where the application role may not run DDL and migrations are applied
    separately (by :func:`migrate` or by DBOS's tooling).
    """
    quote_schema(schema)
    await check_schema_kind(conn, schema, sharded=sharded)
    if not await _schema_exists(conn, schema):
        raise MigrationError(
            f"the DBOS system schema {schema!r} does not exist in this database; "
            f"{_HOW_TO_MIGRATE}"
        )
    version = await _recorded_version(conn, schema)
    if version is None:
        raise MigrationError(
            f"schema {schema!r} has no dbos_migrations table, so it is not a DBOS system "
            f"schema (or was never migrated); {_HOW_TO_MIGRATE}"
        )
    if version == 0:
        raise MigrationError(
            f"the DBOS system schema {schema!r} records no migration; {_HOW_TO_MIGRATE}"
        )
    if version < _steps(sharded)[0].version:
        raise _too_old(schema, version, sharded)
    if version < LATEST_VERSION:
        raise MigrationError(
            f"the DBOS system schema {schema!r} is at version {version}, older than the "
            f"version {LATEST_VERSION} dbos_async requires; {_HOW_TO_MIGRATE}"
        )
    _note_if_newer(schema, version)
    return version
