"""What every family of system-database operations runs on: the pool, the retry policy, the
statements for the schema and the owner of the rows it writes.

:class:`~dbos_async._sysdb.database.SystemDatabase` joins the families built on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from dbos_async import _metrics as metrics
from dbos_async._sysdb import connection, migrations, setup
from dbos_async._sysdb.clock import SYSTEM_CLOCK, Clock
from dbos_async._sysdb.fencing import TimelineFence
from dbos_async._sysdb.health import DatabaseHealth, DatabaseWatch, describe_waits
from dbos_async._sysdb.notifications import (
    ENQUEUE_CHANNEL,
    NotificationDispatcher,
    keyed,
    payload_key,
)
from dbos_async._sysdb.retry import RetryPolicy, UnavailableAfterRetries, is_connection_loss
from dbos_async._sysdb.statements import Query, Statements
from dbos_async._sysdb.statements.sharded import ShardedStatements
from dbos_async._sysdb.writes.templates import StatementTemplates
from dbos_async.errors import (
    ApplicationOwnershipError,
    DatabaseUnavailableError,
    QueryTimeoutError,
)

T = TypeVar("T")

PooledConnection: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"
"""A connection of the pool, as a transaction of the system database runs on it."""

DEFAULT_IDLE_TRANSACTION_TIMEOUT_MS = 60_000
"""How long a transaction holding row locks may sit idle before PostgreSQL ends its session
(DBOS Transact's default)."""

DEFAULT_OBSERVABILITY_QUERY_TIMEOUT_MS = 30_000
"""How long one statement of an observability read may run (the ``dbos`` package's
default)."""


PER_KEY_ROUND_TRIPS = 2
"""Into how many transactions, sent at once, a batch of per-key statements is split."""

MIN_KEYS_PER_ROUND_TRIP = 8
"""Fewer per-key statements than this go in one round trip: another would cost more than
the server's time it saves."""


class DatabaseCore:
    """The system database's pool and retries, and its lifecycle."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "dbos",
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        retry_timeout: float = 60.0,
        startup_wait: float = 3.0,
        connection_name: str = "dbos_async",
        application_name: str | None = None,
        sharded: bool = False,
        idle_transaction_timeout_ms: int = DEFAULT_IDLE_TRANSACTION_TIMEOUT_MS,
        observability_query_timeout_ms: int = DEFAULT_OBSERVABILITY_QUERY_TIMEOUT_MS,
        clock: Clock = SYSTEM_CLOCK,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        # The time every timestamp written and every durable timer is read from.
        self.clock = clock
        # Every connection of this handle goes to a server the fence admits.
        self.fence = TimelineFence(url, connect_options)
        self.schema = schema
        # Which kind of schema this handle migrates, verifies and addresses.
        self.sharded = sharded
        statements = ShardedStatements if sharded else Statements
        self.sql = statements(migrations.quote_schema(schema))
        # Ownership of rows when several applications share this database (see
        # StatementBase.app_scope); None leaves everything unscoped.
        self.application_name = application_name
        self.sql.app_name = application_name
        self.templates = StatementTemplates()
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._connection_name = connection_name
        self._pool: asyncpg.Pool | None = None
        self._closing = False
        self._retry_timeout = retry_timeout
        # Which operations wait on the database, and whether it answers (see health()).
        self.watch = DatabaseWatch(connection.parsed_url(url).describe(), startup_wait)
        self._retry = RetryPolicy(max_elapsed=retry_timeout, stopping=lambda: self._closing,
                                  watch=self.watch, on_standby=self._replace_connections)
        # Safety limits (0: the session's own, off unless the URL sets them): see
        # locking_transaction and _observed_fetch.
        self.idle_transaction_timeout_ms = idle_transaction_timeout_ms
        self.observability_query_timeout_ms = observability_query_timeout_ms
        # Set by the executor once started; None means every wait polls.
        self.notifications: NotificationDispatcher | None = None
        # Whether the multi-table writes run as transactions of single-table statements
        # (a sharded schema on Citus, read at open; see dbos_async/_sysdb/writes/routed.py).
        self.routes_single_tables = False
        # Whether the server announces every workflow inserted ENQUEUED or DELAYED at its
        # commit (the enqueue trigger, read at open; see dbos_async/_sysdb/migrations.py).
        self.enqueue_trigger = False
        # Whether the schema has the depth samples table (read at open; see
        # sql/additions/depth_samples.sql): without it, no depth is sampled or read back.
        self.depth_samples_table = False
        # Where the schema is migrated and the executor IDs' advisory locks are held, which
        # every executor must see: the coordinator's URL on a Citus worker node (set at open).
        self.coordination_url = url
        self.coordination_fence = self.fence

    def waiter_key(self, workflow_id: str, name: str | None = None) -> str:
        """What notifications about ``workflow_id`` (and its topic or key ``name``) carry:
        see :func:`~dbos_async._sysdb.notifications.keyed`, with the workflow's bound key."""
        key = self.sql.key_hint(workflow_id)
        return keyed(workflow_id, key) if name is None else payload_key(workflow_id, name, key)

    def notify(self, channel: str, key: str) -> None:
        """Announce a committed write: wake the waiters on (channel, key) here now and
        NOTIFY other processes (see :meth:`NotificationDispatcher.notify`); nothing before
        the dispatcher is started."""
        if self.notifications is not None:
            self.notifications.notify(channel, key)

    def notify_each(self, channel: str, keys: Sequence[str]) -> None:
        """:meth:`notify` of each of ``keys`` on ``channel`` (a batch's writes)."""
        if self.notifications is not None:
            self.notifications.notify_each(channel, keys)

    def announce_insert(self, key: str) -> None:
        """Announce a committed insert of a workflow ENQUEUED or DELAYED (``key``: its
        queue, or the queue watchers' key): wake the waiters here now and, unless the
        enqueue trigger has done so at the commit, NOTIFY other processes."""
        if self.notifications is None:
            return
        if self.enqueue_trigger:
            self.notifications.wake(ENQUEUE_CHANNEL, key)
        else:
            self.notifications.notify(ENQUEUE_CHANNEL, key)

    # ---- Lifecycle ----

    async def open(self, *, run_migrations: bool = True, patient: bool = False) -> None:
        """Create the database if allowed, migrate or verify the schema, and open the pool.

        A schema of the other kind (sharded for an unsharded handle, or the reverse) is refused
        with a :class:`~dbos_async.errors.ConfigurationError` before any row is read or
        written and before any migration: migrate and verify check the kind first.

        A connection lost or refused meanwhile raises :class:`DatabaseUnavailableError`
        naming the server and the cause; ``patient`` (an executor's start-up), only once
        retrying for up to ``retry_timeout`` did not outlive it (migrating again is safe: a
        step already done is skipped). An impatient opener (a client, the command line)
        fails at once, so that an unreachable server is said at once.
        """
        run = self.retried if patient else self._once
        _, self.coordination_url = await run(
            "preparing the system database", lambda: setup.prepare(
            self.url, self.schema, sharded=self.sharded, run_migrations=run_migrations,
            connect_timeout=self._connect_timeout, connection_name=self._connection_name,
            fence=self.fence))
        if self.coordination_url != self.url:
            self.coordination_fence = TimelineFence(self.coordination_url,
                                                    self.fence.options)
        self._pool = await run("opening the connection pool", lambda: (
            connection.create_pool(self.url, self._pool_size, self._connect_timeout,
                                   self._connection_name, self.fence)))
        metrics.watch_pool(self._pool, "system")
        if self.sharded:
            citus = self.sql.routes_single_tables()
            self.routes_single_tables = bool(await run(
                "reading the database's extensions", lambda: self.pool.fetchval(citus.sql)))
        else:
            additions = await run(
                "reading the schema's additions",
                lambda: migrations.read_additions(self.pool, self.schema))
            self.enqueue_trigger = additions.enqueue_trigger
            self.depth_samples_table = additions.depth_samples

    async def check_connection(self) -> None:
        """One round trip on a connection of the pool, within the connect timeout and not
        retried: raises :class:`DatabaseUnavailableError` if the database does not answer."""

        async def round_trip() -> None:
            try:
                async with asyncio.timeout(self._connect_timeout), \
                        self.pool.acquire() as conn:
                    await conn.fetchval("SELECT 1")
            except TimeoutError:
                raise DatabaseUnavailableError(
                    f"The system database {connection.parsed_url(self.url).describe()} did "
                    f"not answer within {self._connect_timeout} s") from None

        await self._once("checking the connection", round_trip)

    async def _replace_connections(self) -> None:
        """Close the pool's connections as they come back (a server under them became a
        standby): the next ones connect afresh, to the primary a multi-host URL names."""
        if self._pool is not None:
            await self._pool.expire_connections()

    def health(self) -> DatabaseHealth:
        """Whether the database answers, and what waits on it (see :class:`DatabaseHealth`)."""
        return self.watch.snapshot()

    async def watch_health(self) -> None:
        """Log outages and slow waits of this database while they last (a background task
        of the executor, from the start of its entry)."""
        await self.watch.watch(self._diagnose)

    async def _diagnose(self) -> str:
        """What this process's sessions wait on, read on a connection of its own (the
        pool's may all be stuck)."""
        conn = await connection.connect(self.url, self._connect_timeout,
                                        f"{self._connection_name} health", self.fence)
        try:
            query = self.sql.session_waits(self._connection_name)
            rows = await conn.fetch(query.sql, *query.params)
        finally:
            await conn.close()
        return describe_waits([(row["wait_event_type"], row["wait_event"]) for row in rows])

    async def close(self) -> None:
        self._closing = True
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("The system database is not open")
        return self._pool

    # ---- Running statements ----

    async def retried(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation``, safe to run again, through the retry policy (as every
        statement here runs): for the executor's start-up steps outside this layer."""
        return await self._retried(what, operation)

    async def _retried(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        return await self._retried_again(what, lambda _again: operation())

    async def _retried_again(self, what: str, operation: Callable[[bool], Awaitable[T]]) -> T:
        """Run ``operation`` through the retry policy (telling it whether an earlier attempt
        failed, see :meth:`RetryPolicy.run_again`); a connection loss outlasting
        ``db_retry_timeout`` raises :class:`DatabaseUnavailableError`."""
        try:
            return await self._retry.run_again(operation, what)
        except Exception as error:
            canceled = connection.canceled_statement(error, what)
            if canceled is not None:
                raise canceled from error
            if not is_connection_loss(error):
                raise
            raise self.unavailable(what, error) from error

    async def _once(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` once; a connection loss raises :class:`DatabaseUnavailableError`."""
        try:
            return await operation()
        except Exception as error:
            canceled = connection.canceled_statement(error, what)
            if canceled is not None:
                raise canceled from error
            if not is_connection_loss(error):
                raise
            raise self.unavailable(what, error, retried=False) from error

    def unavailable(self, what: str, error: BaseException,
                    retried: bool = True) -> DatabaseUnavailableError:
        """The error for a connection loss: :class:`UnavailableAfterRetries` once retrying
        did not outlive it (nothing retries it again); a plain
        :class:`~dbos_async.errors.DatabaseUnavailableError` for an operation that is not
        retried itself, which a retry around it (``retried``) may still run again."""
        target = connection.parsed_url(self.url).describe()
        if not retried:
            return DatabaseUnavailableError(
                f"The system database {target} was unavailable while {what}: "
                f"{type(error).__name__}: {error}")
        return UnavailableAfterRetries(
            f"The system database {target} was unavailable while {what} (retried for up "
            f"to {self._retry_timeout:g}s): {type(error).__name__}: {error}")

    async def _fetch(self, query: Query, what: str) -> list[asyncpg.Record]:
        return await self._retried(what, lambda: self.pool.fetch(query.sql, *query.params))

    async def _fetchrow(self, query: Query, what: str) -> asyncpg.Record | None:
        return await self._retried(what, lambda: self.pool.fetchrow(query.sql, *query.params))

    async def _fetch_per_key(self, statements: Sequence[tuple[str | None, Query]], what: str
                             ) -> dict[str | None, list[asyncpg.Record] | Exception]:
        """One statement per shard key, in one round trip or a few at once (each statement
        stays on its key's shard); by key, the rows it returned (told apart by the
        ``shard_key`` column each must read back, see ``key_columns``) or the error that
        refused it, which wrote none of its rows.

        The statements of one text go as one prepared statement executed once per key
        before a single Sync (asyncpg's ``fetchmany``), which PostgreSQL runs as one
        implicit transaction. The server runs them one after another, so many keys are
        split into :data:`PER_KEY_ROUND_TRIPS` such transactions sent at once on as many
        connections, which it runs side by side: each row's write is judged on its own, so
        they need not commit together. The keys go in sorted order, so any two such
        transactions lock their rows in one order and cannot deadlock."""
        if len(statements) == 1:
            key, query = statements[0]
            try:
                return {key: await self._fetch(query, what)}
            except Exception as error:
                return {key: error}
        texts: dict[str, list[tuple[str | None, Sequence[object]]]] = {}
        for key, query in sorted(statements, key=lambda statement: statement[0] or ""):
            texts.setdefault(query.sql, []).append((key, query.params))
        parts: list[tuple[str, list[tuple[str | None, Sequence[object]]]]] = []
        for sql, of_text in texts.items():
            count = max(1, min(PER_KEY_ROUND_TRIPS, len(of_text) // MIN_KEYS_PER_ROUND_TRIP))
            size = -(-len(of_text) // count)
            parts += ((sql, of_text[start:start + size]) for start in range(0, len(of_text), size))
        # Every part's transaction is awaited, failed or not: each writes its own rows.
        results: dict[str | None, list[asyncpg.Record] | Exception] = {}
        for found in await asyncio.gather(*(self._fetch_many(sql, of_text, what)
                                            for sql, of_text in parts)):
            results.update(found)
        return results

    async def _fetch_many(self, sql: str, of_text: Sequence[tuple[str | None, Sequence[object]]],
                          what: str) -> dict[str | None, list[asyncpg.Record] | Exception]:
        """One statement text executed once per key in one implicit transaction: the rows
        by key, or the error that ended it. A transaction the database refuses is run
        again key by key, so one key's bad row fails only that key's statement."""
        try:
            found = await self._retried(what, functools.partial(
                self.pool.fetchmany, sql, [params for _, params in of_text]))
        except asyncpg.PostgresError as error:
            if len(of_text) == 1:
                return {of_text[0][0]: error}
            results: dict[str | None, list[asyncpg.Record] | Exception] = {}
            for one in of_text:
                results.update(await self._fetch_many(sql, [one], what))
            return results
        except Exception as error:
            return {key: error for key, _ in of_text}
        rows: dict[str | None, list[asyncpg.Record]] = {key: [] for key, _ in of_text}
        for row in found:
            rows[row["shard_key"]].append(row)
        return {**rows}

    @contextlib.asynccontextmanager
    async def locking_transaction(self, isolation: Literal["serializable"] | None = None
                                  ) -> AsyncIterator[PooledConnection]:
        """A pooled connection in a transaction that takes row locks (a cancel, resume,
        fork, rewind, delete or claim): bounded by ``idle_in_transaction_session_timeout``,
        so a caller that stalls in it (a frozen process, a lost network) cannot keep a
        workflow locked forever. The background jobs' lock sets its own, shorter bound."""
        async with connection.pooled_transaction(self.pool, isolation=isolation) as conn:
            if self.idle_transaction_timeout_ms > 0:
                q = self.sql.idle_transaction_timeout(self.idle_transaction_timeout_ms)
                await conn.execute(q.sql, *q.params)
            yield conn

    async def _observed_fetch(self, query: Query, what: str) -> list[asyncpg.Record]:
        """An observability read (listings, counts, exports): its statement is bounded by
        ``statement_timeout``, so one scanning a huge table is stopped instead of holding a
        connection and vacuum's horizon for minutes. Running over raises
        :class:`~dbos_async.errors.QueryTimeoutError` naming the setting."""
        timeout_ms = self.observability_query_timeout_ms
        if timeout_ms <= 0:
            return await self._fetch(query, what)

        async def run() -> list[asyncpg.Record]:
            async with connection.pooled_transaction(self.pool, readonly=True) as conn:
                limit = self.sql.statement_timeout(timeout_ms)
                await conn.execute(limit.sql, *limit.params)
                try:
                    return await conn.fetch(query.sql, *query.params)
                except asyncpg.QueryCanceledError as error:
                    # Our own bound, stopping the read on purpose: never retried.
                    if "statement timeout" not in str(error):
                        raise
                    raise QueryTimeoutError(what, timeout_ms / 1000) from None

        return await self._retried(what, run)

    async def _execute(self, query: Query, what: str) -> None:
        await self._retried(what, lambda: self.pool.execute(query.sql, *query.params))

    def _check_owner(self, kind: str, name: str, current: str | None) -> None:
        """Raise if ``current``, the owner of a queue or version name, is another
        application: such names are unique across the applications sharing the database."""
        owner = self.application_name
        if current is None or owner is None or current == owner:
            return
        advice = (f"set a distinct application_version for {owner!r}"
                  if kind == "Application version"
                  else f"give {owner!r} a different {kind.lower()} name")
        raise ApplicationOwnershipError(
            f"{kind} {name!r} is already registered by application {current!r} in this "
            f"system database; {kind.lower()} names must be unique across the applications "
            f"sharing it: {advice}")
