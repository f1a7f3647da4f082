"""Retrying database operations through transient failures.

Only operations that are safe to run twice go through here: reads, and writes made idempotent
by a key, a creator token or an ownership fence. A statement timeout or a constraint violation
is not transient and is raised at once.

How long to retry depends on who waits. A caller outside workflows (a request handler, a
client, the command line) gets :class:`UnavailableAfterRetries` once ``db_retry_timeout``
has passed, so it can answer its own caller. A workflow retries for as long as the outage
lasts (:func:`outlasting_outages`): an infrastructure error must never become its outcome,
so it pauses at its next write, holding no connection, and continues from there when the
database answers again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TypeVar

import asyncpg

from dbos_async._sysdb.health import DatabaseWatch
from dbos_async.errors import DatabaseUnavailableError, StaleServerError

logger = logging.getLogger("dbos_async")

T = TypeVar("T")

# Admin shutdown, crash shutdown, cannot connect now, too many connections, out of resources,
# serialization failure and deadlock: the statement can be run again as it is.
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "53400", "40001", "40P01",
                                  "25006"})
_CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})

# read_only_sql_transaction: the server under a pooled connection is (now) a standby, as
# after a failover demoted it. The pool's connections are replaced, so the next attempt
# connects afresh and a multi-host URL's target_session_attrs finds the primary.
_STANDBY_SQLSTATE = "25006"

_outlasting: ContextVar[bool] = ContextVar("dbos_async_outlasting_outages", default=False)


class outlasting_outages:
    """Within the block (and the tasks it starts), operations retry through a lost database
    for as long as it stays lost, instead of for ``db_retry_timeout``: what a workflow
    does pauses during an outage, and never fails for it. Shutdown still stops them. (A
    plain class, cheaper to enter than a generator's context manager: it wraps every
    workflow run.)"""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        # Set only when it changes (a set allocates): a child started by a workflow's body
        # inherits it.
        self._token = None if _outlasting.get() else _outlasting.set(True)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _outlasting.reset(self._token)


def outlasts_outages() -> bool:
    """Whether the running code waits out outages (see :func:`outlasting_outages`)."""
    return _outlasting.get()


# How asyncpg's InterfaceError says the connection under an operation died (its other
# InterfaceErrors, such as a DataError for a bad argument or "pool is closing", are not
# transient): "cannot call Transaction.__aexit__(): the underlying connection is closed",
# "cannot perform operation: connection is closed" and "another operation is in progress"
# (a protocol left mid-operation by a dropped connection).
_DEAD_CONNECTION_MESSAGES = ("connection is closed", "connection was closed",
                             "another operation is in progress")


class UnavailableAfterRetries(DatabaseUnavailableError):
    """A connection loss that retrying for ``db_retry_timeout`` did not outlive: not
    retried again by a retry around the operation that gave up."""


class NeverAnsweredError(UnavailableAfterRetries):
    """A database that refused every connection within ``startup_wait`` and had never
    answered this process: a wrong host, port or socket path, most likely."""

    def __init__(self, error: BaseException, startup_wait: float) -> None:
        super().__init__(
            f"{error} (refused throughout startup_wait={startup_wait:g}s, and it has never "
            "answered this process: "
            "check the host and port of the system database URL, or raise startup_wait "
            "(DBOS_STARTUP_WAIT) to wait for a server that starts with the application)")


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is a connection loss or a server condition that retrying can outlive.

    A :class:`~dbos_async.errors.DatabaseUnavailableError` raised while connecting is
    judged by its cause: a refused or reset connection is transient, a bad password or a
    missing database is not; one that retrying already gave up on is not either. A server
    refused as an old primary (:class:`~dbos_async.errors.StaleServerError`) is transient.
    """
    if isinstance(error, StaleServerError):
        return True  # an old primary refused: its HA manager may be fencing it right now
    if isinstance(error, DatabaseUnavailableError):
        cause = error.__cause__
        return not isinstance(error, UnavailableAfterRetries) and cause is not None \
            and is_transient(cause)
    if isinstance(error, asyncpg.PostgresError):
        code = error.sqlstate or ""
        return code.startswith("08") or code in _TRANSIENT_SQLSTATES
    if isinstance(error, asyncpg.exceptions.ConnectionDoesNotExistError
                  | asyncpg.exceptions.InternalClientError
                  | ConnectionError
                  | OSError
                  | TimeoutError):
        return True
    if isinstance(error, asyncpg.InterfaceError) and not isinstance(error, asyncpg.DataError):
        message = str(error)
        return any(m in message for m in _DEAD_CONNECTION_MESSAGES)
    return False


def is_canceled(error: BaseException) -> bool:
    """Whether the server canceled the statement (a timeout of the URL's, an operator's
    ``pg_cancel_backend``): final for a caller outside workflows (it gets
    :class:`~dbos_async.errors.StatementCanceledError`), retried with backoff for a
    workflow, whose outcome it must not become. Our own deliberate bounds (an
    observability read's) are raised as errors of their own before they get here."""
    return isinstance(error, asyncpg.QueryCanceledError) or (
        isinstance(error, asyncpg.LockNotAvailableError) and "lock timeout" in str(error))


def is_connection_loss(error: BaseException) -> bool:
    """Whether ``error`` is transient for want of the database (a lost connection, a
    server shutting down or refusing connections), rather than a conflict between
    transactions (serialization failure, deadlock) that its caller resolves."""
    if isinstance(error, DatabaseUnavailableError):
        return False  # already said so
    if isinstance(error, asyncpg.PostgresError) and error.sqlstate in _CONFLICT_SQLSTATES:
        return False
    return is_transient(error)


def is_refused(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a connection refused: nothing listens at
    the address (or no socket file is at the path)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError | FileNotFoundError):
            return True
        # asyncio's error for a host name with several addresses, each refused.
        text = str(seen)
        if isinstance(seen, OSError) and text.startswith("Multiple exceptions: ") \
                and text.count("[Errno ") == text.count(f"[Errno {errno.ECONNREFUSED}]"):
            return True
        seen = seen.__cause__
    return False


class RetryPolicy:
    """Exponential backoff with jitter, bounded in total time and stopped by shutdown.

    A database that refuses connections and has never answered this process is most
    likely a wrong host or port: it is retried for the watch's ``startup_wait`` seconds
    only, quietly, and then raised. Once it has answered, a refusal is an outage like any
    other."""

    def __init__(
        self,
        *,
        max_elapsed: float = 60.0,
        initial_delay: float = 0.05,
        max_delay: float = 2.0,
        stopping: Callable[[], bool] = lambda: False,
        watch: DatabaseWatch | None = None,
        on_standby: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.max_elapsed = max_elapsed
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.stopping = stopping
        self.watch = watch or DatabaseWatch("")
        self.on_standby = on_standby

    async def run(self, operation: Callable[[], Awaitable[T]], what: str) -> T:
        return await self.run_again(lambda _again: operation(), what)

    async def run_again(self, operation: Callable[[bool], Awaitable[T]], what: str) -> T:
        """:meth:`run`, telling ``operation`` whether an earlier attempt failed (``True``):
        that attempt may have committed before its reply was lost, so an operation whose
        outcome it reports (a cancel's changed rows, a fork's new row) looks for what that
        attempt did.

        Retries end after ``max_elapsed`` seconds, or never within
        :func:`outlasting_outages`; the first retry of an operation is logged (the
        :class:`DatabaseWatch` logs an outage as a whole)."""
        started = time.monotonic()
        patient = _outlasting.get()
        deadline = float("inf") if patient else started + self.max_elapsed
        delay = self.initial_delay
        again = False
        watch = self.watch
        token = watch.begin(what, started)
        try:
            while True:
                try:
                    result = await operation(again)
                except Exception as error:
                    if not (is_transient(error) or (patient and is_canceled(error))) \
                            or self.stopping():
                        raise
                    if is_connection_loss(error) or isinstance(error, DatabaseUnavailableError):
                        watch.lost(error)
                    if isinstance(error, asyncpg.PostgresError) \
                            and error.sqlstate == _STANDBY_SQLSTATE and self.on_standby:
                        await self.on_standby()
                    now = time.monotonic()
                    if now + delay > deadline:
                        raise
                    never_answered = not watch.has_answered and is_refused(error)
                    if never_answered and now + delay > started + watch.startup_wait:
                        raise NeverAnsweredError(error, watch.startup_wait) from error
                    log = logger.debug if again or never_answered else logger.warning
                    log("Retrying %s after a transient database error: %r", what, error)
                else:
                    watch.answered()
                    return result
                again = True
                # Real time, not the clock of durable timers (sysdb/clock.py): the server
                # comes back in real seconds, whatever a test clock says.
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_delay)
        finally:
            watch.end(token)
