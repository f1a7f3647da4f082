"""Retrying database operations through transient failures.

Only operations that are safe to run twice go through here: reads, and writes made idempotent
by a key, a creator token or an ownership fence. A statement timeout or a constraint violation
is not transient and is raised at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from dbos_async.errors import DatabaseUnavailableError, StaleServerError

logger = logging.getLogger("dbos_async")

T = TypeVar("T")

# Admin shutdown, crash shutdown, cannot connect now, too many connections, out of resources,
# serialization failure and deadlock: the statement can be run again as it is.
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "53400", "40001", "40P01"})
_CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})


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


def is_connection_loss(error: BaseException) -> bool:
    """Whether ``error`` is transient for want of the database (a lost connection, a
    server shutting down or refusing connections), rather than a conflict between
    transactions (serialization failure, deadlock) that its caller resolves."""
    if isinstance(error, DatabaseUnavailableError):
        return False  # already said so
    if isinstance(error, asyncpg.PostgresError) and error.sqlstate in _CONFLICT_SQLSTATES:
        return False
    return is_transient(error)


class RetryPolicy:
    """Exponential backoff with jitter, bounded in total time and stopped by shutdown."""

    def __init__(
        self,
        *,
        max_elapsed: float = 60.0,
        initial_delay: float = 0.05,
        max_delay: float = 2.0,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.max_elapsed = max_elapsed
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.stopping = stopping

    async def run(self, operation: Callable[[], Awaitable[T]], what: str) -> T:
        return await self.run_again(lambda _again: operation(), what)

    async def run_again(self, operation: Callable[[bool], Awaitable[T]], what: str) -> T:
        """:meth:`run`, telling ``operation`` whether an earlier attempt failed (``True``):
        that attempt may have committed before its reply was lost, so an operation whose
        outcome it reports (a cancel's changed rows, a fork's new row) looks for what that
        attempt did."""
        deadline = time.monotonic() + self.max_elapsed
        delay = self.initial_delay
        again = False
        while True:
            try:
                return await operation(again)
            except Exception as error:
                if not is_transient(error) or self.stopping():
                    raise
                if time.monotonic() + delay > deadline:
                    raise
                logger.warning("Retrying %s after a transient database error: %r", what, error)
            again = True
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.max_delay)
