"""Application databases: the databases a user's transactions write to, each with its own
pool and a ``datasource_outputs`` table created by its own migration.

A transaction on an application database records its outcome there, in the transaction
itself, so the user's writes and the record commit together (see
:mod:`dbos_async._executor.transactions` for how the system database's checkpoint follows).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import asyncpg

from dbos_async import _metrics as metrics
from dbos_async._sysdb.connection import keep_session, parsed_url
from dbos_async._sysdb.core import PooledConnection
from dbos_async._sysdb.migrations import quote_schema
from dbos_async._sysdb.retry import is_transient
from dbos_async._sysdb.statements.base import Query, WorkflowAddress
from dbos_async._sysdb.statements.transactions import ApplicationStatements, checkpoint_id
from dbos_async.errors import ConfigurationError, DatabaseUnavailableError, DBOSError

logger = logging.getLogger("dbos_async")

IsolationLevel = Literal["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
ISOLATION_LEVELS: dict[str, str] = {
    "READ COMMITTED": "read_committed",
    "REPEATABLE READ": "repeatable_read",
    "SERIALIZABLE": "serializable",
}
"""The isolation levels a transaction may ask for, as asyncpg names them."""

Connection: TypeAlias = "asyncpg.Connection | PooledConnection"
"""A connection, pooled or not."""


@dataclass(frozen=True)
class StoredOutput:
    """A transaction's outcome as an application database recorded it."""

    output: str | None
    error: str | None
    serialization: str | None


OUTPUT_COLUMNS = ("step_id", "output", "error", "serialization", "created_at")
"""The columns of a ``datasource_outputs`` row an export carries (its ``workflow_id`` is the
exported workflow's, with its key)."""


class OpenTransaction:
    """A connection in a transaction the caller commits (or not): leaving
    :func:`transaction` without :meth:`commit` rolls it back."""

    def __init__(self, conn: Connection, tx: asyncpg.transaction.Transaction) -> None:
        self.conn = conn
        self._tx = tx
        self.committed = False

    def lost(self) -> bool:
        """Whether the connection closed under the transaction (a pooled one is detached
        from its proxy then)."""
        try:
            return bool(self.conn.is_closed())
        except asyncpg.InterfaceError:
            return True

    async def commit(self) -> None:
        self.committed = True  # whatever the reply: a lost one leaves it unknown, not undone
        await self._tx.commit()


OPEN_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
               OSError, TimeoutError)
"""What opening a transaction raises when no connection can be had (refused, not accepting
connections, timed out) or the one the pool gave was lost before the transaction began."""


@contextlib.asynccontextmanager
async def _begun(pool: asyncpg.Pool, isolation: IsolationLevel,
                 read_only: bool) -> AsyncIterator[OpenTransaction]:
    """A pooled connection in a new transaction, rolled back at the exit unless the block
    committed it (a connection whose rollback fails is closed).

    A connection the server ended while it sat in the pool (terminated, the server
    restarted) fails to begin one: it is discarded and another taken, so the caller meets
    what a new connection meets, not a stale one's state. At most as many tries as the pool
    holds connections, and one more."""
    tries = pool.get_max_size() + 1
    for left in range(tries - 1, -1, -1):
        async with pool.acquire() as conn:
            tx = conn.transaction(isolation=ISOLATION_LEVELS[isolation],  # type: ignore[arg-type]
                                  readonly=read_only)
            try:
                await tx.start()
            except OPEN_ERRORS as error:
                if not left or not _ended_in_pool(conn, error):
                    raise
                with contextlib.suppress(asyncpg.InterfaceError):
                    conn.terminate()
                continue
            opened = OpenTransaction(conn, tx)
            try:
                yield opened
            finally:
                if not opened.committed:
                    try:
                        await tx.rollback()
                    except OPEN_ERRORS:
                        # Unusable: closed (a lost one is already detached from the pool).
                        with contextlib.suppress(asyncpg.InterfaceError):
                            conn.terminate()
            return


def _ended_in_pool(conn: Connection, error: BaseException) -> bool:
    """Whether ``conn`` failed to begin a transaction because it had ended already: closed,
    or its protocol still consuming the server's farewell (asyncpg's "another operation is
    in progress")."""
    if isinstance(error, asyncpg.InternalClientError):
        return True
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True  # a proxy detached from its closed connection


@contextlib.asynccontextmanager
async def transaction(pool: asyncpg.Pool, isolation: IsolationLevel, read_only: bool,
                      described: str, idle_timeout: Query | None = None
                      ) -> AsyncIterator[OpenTransaction]:
    """A pooled connection in a new transaction at ``isolation``; rolled back at the exit
    unless the block committed it (a connection whose rollback fails is closed).
    ``idle_timeout``: the statement bounding how long it may sit idle, for a pool whose
    sessions are not bounded already.

    Raises:
        DatabaseUnavailableError: the transaction could not be opened on ``described``
            (the database, in words), the driver's error its cause: nothing of it ran.
    """
    began = False
    try:
        async with _begun(pool, isolation, read_only) as opened:
            if idle_timeout is not None:
                await opened.conn.execute(idle_timeout.sql, *idle_timeout.params)
            began = True
            yield opened
    except OPEN_ERRORS as error:
        if began:
            raise  # the block's own, or its end's
        raise DatabaseUnavailableError(
            f"Could not open a transaction on {described}: {type(error).__name__}: "
            f"{error}") from error


class ApplicationDatabase:
    """One application database: its pool, its schema's migration, and the statements on
    its ``datasource_outputs``."""

    def __init__(self, name: str, url: str, *, schema: str = "dbos", pool_size: int = 10,
                 connect_timeout: float = 10.0, connection_name: str = "dbos_async",
                 idle_transaction_timeout_ms: int = 60_000) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigurationError(f"Data source {name!r} needs a database URL")
        self.name = name
        self.url = url
        self.described = parsed_url(url).describe()
        self.schema = schema
        self.sql = ApplicationStatements(quote_schema(schema))
        self.pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._connection_name = connection_name
        # Every session of the pool: a transaction idle this long (a frozen process) ends
        # with its session. The fence of a transaction relies on it (see transactions.py).
        self.idle_transaction_timeout_ms = idle_transaction_timeout_ms
        self._pool: asyncpg.Pool | None = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise DBOSError(f"Data source {self.name!r} is not open: enter DBOS first")
        return self._pool

    async def open(self, *, run_migrations: bool = True) -> None:
        """Open the pool and bring the schema to the latest version (or check it is)."""
        settings = {
            "application_name": self._connection_name,
            "idle_in_transaction_session_timeout": str(self.idle_transaction_timeout_ms),
        }
        try:
            self._pool = await asyncpg.create_pool(
                self.url, min_size=1, max_size=self.pool_size, timeout=self._connect_timeout,
                server_settings=settings, reset=keep_session)
            metrics.watch_pool(self._pool, "application")
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            raise DatabaseUnavailableError(
                f"Cannot connect to the application database of data source {self.name!r} "
                f"({self.described}): {type(error).__name__}: {error}") from error
        try:
            await self._migrate(run_migrations)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _migrate(self, run_migrations: bool) -> None:
        latest = len(self.sql.migrations())
        async with self.pool.acquire() as conn:
            if await self._version(conn) >= latest:
                return
            if not run_migrations:
                raise ConfigurationError(
                    f"The application database of data source {self.name!r} "
                    f"({self.described}) has no up-to-date {self.schema}.datasource_outputs "
                    "table, and migrations are off here: an executor entered with "
                    "run_migrations=True creates it")
            async with conn.transaction():
                q = self.sql.migration_lock(self.schema)
                await conn.execute(q.sql, *q.params)
                current = await self._version(conn)  # under the lock: maybe done meanwhile
                if current >= latest:
                    return
                await conn.execute(self.sql.create_schema())
                await conn.execute(self.sql.create_versions())
                for version, statement in enumerate(self.sql.migrations(), 1):
                    if version > current:
                        logger.info("Applying migration %d of data source %s", version,
                                    self.name)
                        await conn.execute(statement)
                q = self.sql.set_version(current, latest)
                await conn.execute(q.sql, *q.params)

    async def _version(self, conn: Connection) -> int:
        q = self.sql.versions_present()
        if not await conn.fetchval(q.sql, *q.params):
            return 0
        return int(await conn.fetchval(self.sql.read_version()) or 0)

    def transaction(self, isolation: IsolationLevel,
                    read_only: bool) -> contextlib.AbstractAsyncContextManager[OpenTransaction]:
        return transaction(self.pool, isolation, read_only,
                           f"the application database of data source {self.name!r} "
                           f"({self.described})")

    # ---- Outcomes ----

    async def record_output(self, conn: Connection, workflow: WorkflowAddress,
                            step_id: int, output: str | None, serialization: str,
                            created_at: int) -> bool:
        """Record the output in the caller's transaction; False: a record was there."""
        q = self.sql.record_output(checkpoint_id(*workflow), step_id, output, serialization,
                                   created_at)
        return await conn.fetchrow(q.sql, *q.params) is not None

    async def recorded_output(self, workflow: WorkflowAddress, step_id: int,
                              conn: Connection | None = None) -> StoredOutput | None:
        """The outcome recorded for the step (in the caller's transaction, if given)."""
        q = self.sql.recorded_output(checkpoint_id(*workflow), step_id)
        if conn is not None:  # its errors are the transaction's to judge
            row = await conn.fetchrow(q.sql, *q.params)
        else:
            try:
                row = await self.pool.fetchrow(q.sql, *q.params)
            except OPEN_ERRORS as error:
                raise self.failure("reading a transaction's outcome", error) from error
        return None if row is None else StoredOutput(row["output"], row["error"],
                                                     row["serialization"])

    async def delete_outputs(self, workflows: Sequence[WorkflowAddress], from_step: int = 0
                             ) -> None:
        """Forget these workflows' outcomes from step ``from_step`` on (retried through a
        lost connection: deleting again is harmless)."""
        if not workflows:
            return
        q = self.sql.delete_outputs([checkpoint_id(*w) for w in workflows], from_step)
        for attempt in range(3):
            try:
                await self.pool.execute(q.sql, *q.params)
                return
            except Exception as error:
                if attempt == 2 or not is_transient(error):
                    raise self.failure("deleting outcomes", error) from error

    async def delete_outputs_before(self, cutoff_ms: int, batch_size: int) -> int:
        """Delete the records created before ``cutoff_ms``, ``batch_size`` per statement;
        returns how many."""
        q = self.sql.delete_outputs_before(cutoff_ms, batch_size)
        total = 0
        try:
            while True:
                deleted = int(await self.pool.fetchval(q.sql, *q.params))
                total += deleted
                if deleted < batch_size:
                    return total
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
            raise self.failure("deleting old outcomes", error) from error

    async def export_outputs(self, workflow: WorkflowAddress) -> list[dict[str, Any]]:
        """The workflow's rows, each of :data:`OUTPUT_COLUMNS`."""
        q = self.sql.export_outputs([checkpoint_id(*workflow)])
        try:
            rows = await self.pool.fetch(q.sql, *q.params)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
            raise self.failure("exporting outcomes", error) from error
        return [{column: r[column] for column in OUTPUT_COLUMNS} for r in rows]

    async def import_outputs(self, workflow: WorkflowAddress,
                             rows: Sequence[dict[str, Any]]) -> None:
        """Insert exported rows (each of :data:`OUTPUT_COLUMNS`); those there stand."""
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                for r in rows:
                    q = self.sql.import_output(checkpoint_id(*workflow), r["step_id"],
                                               r["output"], r["error"], r["serialization"],
                                               r["created_at"])
                    await conn.execute(q.sql, *q.params)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
            raise self.failure("importing outcomes", error) from error

    def failure(self, what: str, error: BaseException) -> DBOSError:
        """A driver error while ``what``, as the error a caller gets."""
        return DatabaseUnavailableError(
            f"The application database of data source {self.name!r} ({self.described}) "
            f"failed while {what}: {type(error).__name__}: {error}")
