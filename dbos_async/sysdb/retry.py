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

logger = logging.getLogger("dbos_async")

T = TypeVar("T")

# Admin shutdown, crash shutdown, cannot connect now, too many connections, out of resources,
# serialization failure and deadlock: the statement can be run again as it is.
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "53400", "40001", "40P01"})


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is a connection loss or a server condition that retrying can outlive."""
    if isinstance(error, asyncpg.PostgresError):
        code = error.sqlstate or ""
        return code.startswith("08") or code in _TRANSIENT_SQLSTATES
    return isinstance(
        error,
        asyncpg.exceptions.ConnectionDoesNotExistError
        | asyncpg.exceptions.InternalClientError
        | ConnectionError
        | OSError
        | TimeoutError,
    )


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
        deadline = time.monotonic() + self.max_elapsed
        delay = self.initial_delay
        while True:
            try:
                return await operation()
            except Exception as error:
                if not is_transient(error) or self.stopping():
                    raise
                if time.monotonic() + delay > deadline:
                    raise
                logger.warning("Retrying %s after a transient database error: %r", what, error)
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.max_delay)
