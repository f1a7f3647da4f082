"""The executor ID a process holds: claimed at entry, kept, and re-acquired after a lost
connection (the statements are in :mod:`dbos_async._sysdb.statements.executor_ids`).

An executor takes the first free one of its base ID (``executor_id``, or ``local`` when
none is given), ``<base>-2``, ``<base>-3``, ... by holding its advisory lock on a
connection of its own for its lifetime. So two live processes started from one
configuration never share an ID (each one's recovery takes only its own ID's ``PENDING``
workflows), a process that dies frees its ID with its session, and a restarted single
process gets its base ID back and recovers what it left.

The lock is also how executors know which others are alive, with no heartbeat writes: an
ID with ``PENDING`` workflows whose lock is free belongs to a dead process, and failover
(:mod:`dbos_async._executor.failover`) takes its workflows over while holding that lock
(:meth:`ExecutorIdLock.holding_other`).

If the lock's connection is lost while the executor runs, the ID is re-acquired on a new
connection at once; meanwhile :meth:`ExecutorIdLock.ensure_held` holds back new work. If
another process took the ID in that window (holding it longer than a failover check
would), this process no longer owns it: the ID is lost for good and every new start,
claim or recovery raises :class:`~dbos_async.errors.ExecutorIdLostError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Literal

import anyio
import asyncpg

from dbos_async._sysdb.notifications import Supervise
from dbos_async._sysdb.retry import outlasts_outages
from dbos_async._sysdb.statements import Query, Statements
from dbos_async.errors import ConfigurationError, DatabaseUnavailableError, ExecutorIdLostError

logger = logging.getLogger("dbos_async")

Connect = Callable[[], Awaitable[asyncpg.Connection]]

MAX_EXECUTOR_IDS = 1000
"""How many IDs (``local`` to ``local-1000``) an executor tries before giving up."""

HEALTH_CHECK_INTERVAL = 30.0
"""Seconds between checks that an idle lock connection still answers (its loss by a
server restart or a terminated backend is noticed at once, without one). Long, so that an
idle executor stays quiet; a silently dead session is no danger meanwhile, as owner tokens
fence off whatever this process writes after another took its workflows over."""

HEALTH_CHECK_TIMEOUT = 5.0
REACQUIRE_MAX_DELAY = 2.0

CONTESTED_PATIENCE = 5.0
"""Seconds another session may hold this executor's ID while it re-acquires it before the ID
counts as lost: another executor's failover check holds an ID for a moment (and its
take-over for the length of one claim), a process that claimed the ID holds it for good."""

State = Literal["unclaimed", "held", "reacquiring", "lost", "closed"]


def executor_id_slot(base: str, number: int) -> str:
    """The ``number``-th ID of ``base``: ``local``, ``local-2``, ``local-3``, ..."""
    return base if number == 1 else f"{base}-{number}"


class ExecutorIdLock:
    """The executor ID this process holds, by a session advisory lock on one connection."""

    def __init__(self, sql: Statements, connect: Connect, base: str, patience: float) -> None:
        self._sql = sql
        self._connect = connect
        self._base = base
        # How long new work waits for the ID while it is being re-acquired.
        self._patience = patience
        self.executor_id = base
        self.state: State = "unclaimed"
        self._connection: asyncpg.Connection | None = None
        # The holding session, as PostgreSQL knows it: (backend pid, backend start).
        self._session: tuple[int, datetime] | None = None
        self._lost = asyncio.Event()
        self._settled = asyncio.Event()
        # Why the latest attempt to re-acquire the ID failed (for the error new work gets).
        self.last_error: str | None = None
        # One statement at a time on the lock's connection (health checks, failover probes).
        self._using = asyncio.Lock()

    # ---- Claiming ----

    async def claim(self) -> str:
        """Take the first free ID and keep its connection; return the ID."""
        conn = await self._connect()
        try:
            for number in range(1, MAX_EXECUTOR_IDS + 1):
                candidate = executor_id_slot(self._base, number)
                if await self._try(conn, candidate):
                    self._hold(conn, candidate)
                    return candidate
        except BaseException:
            conn.terminate()
            raise
        conn.terminate()
        raise ConfigurationError(
            f"Every executor ID from {self._base!r} to "
            f"{executor_id_slot(self._base, MAX_EXECUTOR_IDS)!r} is held by a live process; "
            "set executor_id explicitly")

    async def _try(self, conn: asyncpg.Connection, executor_id: str) -> bool:
        row = await _fetchrow(conn, self._sql.try_executor_lock(executor_id),
                              f"claiming executor ID {executor_id!r}")
        if row is None or not row["acquired"]:
            return False
        self._session = (conn.get_server_pid(), row["session_start"])
        return True

    def _hold(self, conn: asyncpg.Connection, executor_id: str) -> None:
        self.executor_id = executor_id
        self._connection = conn
        self._lost.clear()
        conn.add_termination_listener(lambda _conn: self._lost.set())
        self._set_state("held")

    def _set_state(self, state: State) -> None:
        self.state = state
        if state == "reacquiring":
            self._settled.clear()
        else:
            self._settled.set()

    # ---- While running ----

    def start_watching(self, supervise: Supervise) -> None:
        """Watch the lock's connection (a supervised task of the caller's owner) and
        re-acquire the ID when it is lost."""
        supervise(self._watch, "executor ID keeper")

    async def ensure_held(self) -> None:
        """Return once this process holds its ID; while it is being re-acquired (the
        database was lost), wait up to the patience given, or for as long as it takes in
        code that outlasts outages (a workflow starting a child). Raises
        :class:`ExecutorIdLostError` if another process took it,
        :class:`DatabaseUnavailableError` if the database is not back in time."""
        if self.state == "reacquiring":
            with anyio.move_on_after(math.inf if outlasts_outages() else self._patience):
                await self._settled.wait()
        if self.state == "held":
            return
        if self.state == "lost":
            raise ExecutorIdLostError(self.executor_id)
        if self.state == "closed":
            raise DatabaseUnavailableError(
                f"Executor ID {self.executor_id!r} is released: the executor is shutting down")
        cause = f": {self.last_error}" if self.last_error else ""
        raise DatabaseUnavailableError(
            f"The system database is unreachable{cause}; executor {self.executor_id!r} "
            f"waited {self._patience:g}s (db_retry_timeout) to hold its ID on it again and "
            "starts nothing meanwhile (workflows already running here pause and continue)")

    async def _watch(self) -> None:
        # Restarted after a failure mid-way through re-acquiring: finish that first.
        if self._connection is None and self.state == "reacquiring" \
                and not await self._reacquire():
            return
        while await self._until_lost():
            if self.state == "closed":
                return
            logger.warning("Executor %s lost the connection holding its ID; re-acquiring it",
                           self.executor_id)
            self._set_state("reacquiring")
            self._drop_connection()
            if not await self._reacquire():
                return

    async def _until_lost(self) -> bool:
        """Return (True) when the lock's connection is gone or stops answering."""
        conn = self._connection
        assert conn is not None
        while True:
            with anyio.move_on_after(HEALTH_CHECK_INTERVAL):
                await self._lost.wait()
                return True
            try:
                with anyio.fail_after(HEALTH_CHECK_TIMEOUT):
                    async with self._using:
                        await conn.fetchval("SELECT 1")
            except Exception:
                return True

    # ---- Other executors' IDs (failover) ----

    async def is_free(self, executor_id: str) -> bool:
        """Whether no live session holds ``executor_id`` now (its process is gone)."""
        async with self.holding_other(executor_id) as held:
            return held

    @contextlib.asynccontextmanager
    async def holding_other(self, executor_id: str) -> AsyncIterator[bool]:
        """Hold another executor's ID lock, on this lock's connection, for the body (yields
        False, holding nothing, if a live session has it). While held, no process can
        claim that ID, so its workflows can be taken over without it coming back."""
        # The lock is reentrant: this session would "take" its own ID.
        assert executor_id != self.executor_id, "an executor's own ID is never taken over"
        conn = self._connection
        if self.state != "held" or conn is None:
            raise DatabaseUnavailableError(
                f"Executor ID {self.executor_id!r} is not held; no other ID is checked")
        async with self._using:
            row = await _fetchrow(conn, self._sql.try_other_executor_lock(executor_id),
                                  f"checking executor ID {executor_id!r}")
        acquired = row is not None and bool(row["acquired"])
        try:
            yield acquired
        finally:
            if acquired and not conn.is_closed():
                # (A lost connection released it already.) Shielded: a cancelled body
                # still frees the ID for the process that claims it next.
                with contextlib.suppress(DatabaseUnavailableError), \
                        anyio.move_on_after(HEALTH_CHECK_TIMEOUT, shield=True):
                    async with self._using:
                        await _fetchrow(conn, self._sql.release_other_executor_lock(executor_id),
                                        f"releasing executor ID {executor_id!r}")

    async def _reacquire(self) -> bool:
        """Hold the same ID again on a new connection; False if another process has it."""
        delay = 0.05
        contested_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await self._connect()
                old_session = self._session
                if await self._try(conn, self.executor_id):
                    self._hold(conn, self.executor_id)
                    conn = None
                    logger.warning("Executor %s re-acquired its ID", self.executor_id)
                    return True
                holder = await _fetchrow(conn, self._sql.executor_lock_holder(self.executor_id),
                                         "reading the executor ID's holder")
                if holder is None:
                    pass  # released between the two reads: try again
                elif old_session == (holder["pid"], holder["session_start"]):
                    # This process's own old session, half-open on the server: end it.
                    await _fetchrow(conn, self._sql.end_session(holder["pid"]),
                                    "ending the old session")
                elif contested_since is None:
                    contested_since = loop.time()  # perhaps a failover check: try again
                elif loop.time() - contested_since < CONTESTED_PATIENCE:
                    pass
                else:
                    self._set_state("lost")
                    logger.error(
                        "Executor ID %r was taken by another process (its session: pid %s, "
                        "application_name %r) while this executor's connection holding it "
                        "was down. This executor no longer starts, claims or recovers "
                        "workflows (those running here finish or are fenced out); restart "
                        "the process to claim a free executor ID.",
                        self.executor_id, holder["pid"], holder["application_name"])
                    return False
            except Exception as error:
                self.last_error = f"{type(error).__name__}: {error}"
                logger.debug("Re-acquiring executor ID %s failed, retrying: %r",
                             self.executor_id, error)
            finally:
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, REACQUIRE_MAX_DELAY)

    def _drop_connection(self) -> None:
        conn, self._connection = self._connection, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        """Release the ID (close its connection); call after every write under it."""
        self._set_state("closed")
        conn, self._connection = self._connection, None
        if conn is not None and not conn.is_closed():
            try:
                with anyio.move_on_after(5.0, shield=True):
                    await conn.close()
            finally:
                if not conn.is_closed():
                    conn.terminate()


async def _fetchrow(conn: asyncpg.Connection, query: Query, what: str) -> asyncpg.Record | None:
    try:
        return await conn.fetchrow(query.sql, *query.params)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
        raise DatabaseUnavailableError(
            f"The system database failed while {what}: {type(error).__name__}: {error}"
        ) from error
