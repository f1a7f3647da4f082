"""The SQL of an application database: its ``datasource_outputs`` table, where a
transaction's outcome is recorded in the transaction itself, and the migration creating it.

The table is the one the ``dbos`` package's datasources use (``workflow_id``, ``step_id``,
``output``, ``error``, ``serialization``, ``created_at``; keyed by the first two), so either
SDK finds the other's records. Its migrations are versioned in ``dbos_datasource_migrations``
of the same schema, apart from the system database's, since both may share a database.
"""

from __future__ import annotations

from collections.abc import Sequence

from dbos_async._sysdb.statements.base import Params, Query
from dbos_async._sysdb.statements.management.control import advisory_lock_key

MIGRATIONS_TABLE = "dbos_datasource_migrations"

MIGRATION_IDLE_TIMEOUT_MS = 30_000
"""How long a migrating transaction may sit idle holding the migration lock."""


def checkpoint_id(workflow_id: str, shard_key: str | None) -> str:
    """The ``workflow_id`` a workflow's rows carry: its ID, prefixed by its shard key
    (``<length>:<key>:``) when it has one, since workflow IDs are unique only per key."""
    return workflow_id if shard_key is None else f"{len(shard_key)}:{shard_key}:{workflow_id}"


def migration_lock_key(schema: str) -> int:
    """The advisory lock migrators of the schema take turns on (the ``dbos`` package's key,
    so the two never migrate one schema at once)."""
    return advisory_lock_key(f"dbos.datasource_migrations.{schema}")


class ApplicationStatements:
    """The statements of one application database's schema (quoted once here)."""

    def __init__(self, quoted_schema: str) -> None:
        self.schema = quoted_schema
        self.outputs = f"{quoted_schema}.datasource_outputs"

    # ---- Migration ----

    def migrations(self) -> list[str]:
        """The numbered migrations, in order (version n is the n-th). The first is IF NOT
        EXISTS, so a table the ``dbos`` package created before versioning is adopted."""
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.outputs} (
                  workflow_id TEXT NOT NULL,
                  step_id INT4 NOT NULL,
                  output TEXT,
                  error TEXT,
                  serialization TEXT,
                  created_at BIGINT NOT NULL
                    DEFAULT (EXTRACT(EPOCH FROM now()) * 1000)::bigint,
                  PRIMARY KEY (workflow_id, step_id)
                )""",
        ]

    def migration_lock(self, schema: str) -> Query:
        """Take the migration lock for this transaction, bounding how long a stalled
        migrator may keep it (its session ends and the lock with it)."""
        p = Params()
        return Query(
            f"""SELECT pg_catalog.pg_advisory_xact_lock({p(migration_lock_key(schema), 'bigint')})
                FROM pg_catalog.set_config('idle_in_transaction_session_timeout',
                                           {p(str(MIGRATION_IDLE_TIMEOUT_MS))}, true)""",
            p.values)

    def versions_present(self) -> Query:
        """Whether the schema's version table exists (not yet: version 0)."""
        p = Params()
        return Query(
            f"""SELECT pg_catalog.to_regclass({p(f'{self.schema}.{MIGRATIONS_TABLE}')})
                       IS NOT NULL AS present""", p.values)

    def read_version(self) -> str:
        return f"SELECT version FROM {self.schema}.{MIGRATIONS_TABLE}"

    def create_schema(self) -> str:
        return f"CREATE SCHEMA IF NOT EXISTS {self.schema}"

    def create_versions(self) -> str:
        return (f"CREATE TABLE IF NOT EXISTS {self.schema}.{MIGRATIONS_TABLE} "
                "(version BIGINT NOT NULL PRIMARY KEY)")

    def set_version(self, previous: int, version: int) -> Query:
        p = Params()
        if previous == 0:
            return Query(f"INSERT INTO {self.schema}.{MIGRATIONS_TABLE} (version) "
                         f"VALUES ({p(version, 'bigint')})", p.values)
        return Query(f"UPDATE {self.schema}.{MIGRATIONS_TABLE} "
                     f"SET version = {p(version, 'bigint')}", p.values)

    # ---- A transaction's outcome ----

    def record_output(self, checkpoint_id: str, step_id: int, output: str | None,
                      serialization: str, created_at: int) -> Query:
        """Record a transaction's output in the transaction itself. ON CONFLICT DO NOTHING:
        a record already there (an earlier execution's commit) stands, and RETURNING no row
        tells the caller to roll back and replay it; under REPEATABLE READ or SERIALIZABLE a
        record committed after the snapshot fails the transaction instead, and the retry
        finds it. ``created_at`` is the runtime's clock, not the server's: retention ages
        it on that clock."""
        p = Params()
        return Query(
            f"""INSERT INTO {self.outputs}
                  (workflow_id, step_id, output, error, serialization, created_at)
                VALUES ({p(checkpoint_id, 'text')}, {p(step_id, 'integer')},
                        {p(output, 'text')}, NULL, {p(serialization, 'text')},
                        {p(created_at, 'bigint')})
                ON CONFLICT (workflow_id, step_id) DO NOTHING
                RETURNING step_id""",
            p.values)

    def recorded_output(self, checkpoint_id: str, step_id: int) -> Query:
        p = Params()
        return Query(
            f"""SELECT output, error, serialization FROM {self.outputs}
                WHERE workflow_id = {p(checkpoint_id, 'text')}
                  AND step_id = {p(step_id, 'integer')}""",
            p.values)

    def delete_outputs(self, checkpoint_ids: Sequence[str], from_step: int = 0) -> Query:
        """Delete these workflows' records from step ``from_step`` on (a rewind's cut, or 0:
        all of them, as a delete does)."""
        p = Params()
        return Query(
            f"""DELETE FROM {self.outputs}
                WHERE workflow_id = ANY({p.array(checkpoint_ids, 'text')})
                  AND step_id >= {p(from_step, 'integer')}""",
            p.values)

    def delete_outputs_before(self, cutoff_ms: int, batch_size: int) -> Query:
        """Delete up to ``batch_size`` records created before ``cutoff_ms`` (retention: by
        then their workflows' own checkpoints hold the outcomes); returns how many."""
        p = Params()
        return Query(
            f"""WITH gone AS (
                  DELETE FROM {self.outputs} WHERE ctid IN (
                    SELECT ctid FROM {self.outputs}
                    WHERE created_at < {p(cutoff_ms, 'bigint')}
                    LIMIT {p(batch_size, 'integer')})
                  RETURNING 1)
                SELECT count(*) FROM gone""",
            p.values)

    def export_outputs(self, checkpoint_ids: Sequence[str]) -> Query:
        p = Params()
        return Query(
            f"""SELECT workflow_id, step_id, output, error, serialization, created_at
                FROM {self.outputs}
                WHERE workflow_id = ANY({p.array(checkpoint_ids, 'text')})
                ORDER BY workflow_id, step_id""",
            p.values)

    def import_output(self, checkpoint_id: str, step_id: int, output: str | None,
                      error: str | None, serialization: str | None,
                      created_at: int) -> Query:
        """Insert an exported record; one already there stands."""
        p = Params()
        return Query(
            f"""INSERT INTO {self.outputs}
                  (workflow_id, step_id, output, error, serialization, created_at)
                VALUES ({p(checkpoint_id, 'text')}, {p(step_id, 'integer')},
                        {p(output, 'text')}, {p(error, 'text')}, {p(serialization, 'text')},
                        {p(created_at, 'bigint')})
                ON CONFLICT (workflow_id, step_id) DO NOTHING""",
            p.values)
