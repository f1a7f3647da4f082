"""Durable time: the one seam through which the runtime reads "now" and waits for a moment.

Every time that is recorded or that decides when a timer falls due goes through a
:class:`Clock`: the timestamps written to the system database (epoch milliseconds, as the
`dbos` package's columns), durable sleeps, ``recv`` / ``get_event`` / ``read_stream``
timeouts, workflow deadlines, step retry backoff, queue delays, debounce windows, rate-limit
periods, schedules and maintenance ages. The default is :data:`SYSTEM_CLOCK`, the wall
clock; ``dbos_async.testing.TestClock`` is one a test moves forward.

What is not durable time stays on the event loop's own clock: poll intervals, reconnect
backoff, liveness checks and timings for logs. Those wait out real delays between real
processes, and a test clock must not make them spin.
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from types import TracebackType
from typing import Protocol


class TimeoutScope(Protocol):
    """What :meth:`Clock.wait_until` and :meth:`Clock.deadline` return: an async context
    manager that raises :class:`TimeoutError` at its deadline, as ``asyncio.timeout``'s
    does."""

    async def __aenter__(self) -> object: ...

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        ...

    def expired(self) -> bool:
        """Whether the deadline was reached (the scope's own :class:`TimeoutError`)."""
        ...


class Clock(Protocol):
    """What "now" is and how to wait until a moment, for durable purposes."""

    def now_ms(self) -> int:
        """The current time, in epoch milliseconds."""
        ...

    def wait_until(self, until_ms: int | None, cap: float | None = None) -> TimeoutScope:
        """A scope around a wait that raises :class:`TimeoutError` once the clock reaches
        ``until_ms`` or after ``cap`` real seconds, whichever comes first (None: no bound)."""
        ...

    def deadline(self, until_ms: int) -> TimeoutScope:
        """A scope around work (not a wait) that is cancelled, raising
        :class:`TimeoutError`, once the clock reaches ``until_ms``."""
        ...

    async def sleep_until(self, until_ms: int) -> None:
        """Return once the clock reaches ``until_ms``."""
        ...


class SystemClock:
    """The wall clock: what production runs on."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def wait_until(self, until_ms: int | None, cap: float | None = None) -> TimeoutScope:
        delay = None if until_ms is None else max(0.0, until_ms / 1000 - time.time())
        if cap is not None:
            delay = cap if delay is None else min(delay, cap)
        return asyncio.timeout(delay)

    def deadline(self, until_ms: int) -> TimeoutScope:
        return self.wait_until(until_ms)

    async def sleep_until(self, until_ms: int) -> None:
        await asyncio.sleep(max(0.0, until_ms / 1000 - time.time()))


SYSTEM_CLOCK = SystemClock()
"""The clock of every executor and client not given another."""


def now_utc(clock: Clock) -> datetime:
    """The clock's now as an aware UTC datetime (what schedules count in)."""
    return datetime.fromtimestamp(clock.now_ms() / 1000, UTC)


def epoch_ms(moment: datetime) -> int:
    """An aware datetime in epoch milliseconds, rounded up (a wait for it never ends
    early)."""
    return math.ceil(moment.timestamp() * 1000)


def after(clock: Clock, seconds: float) -> int:
    """The moment ``seconds`` from the clock's now, in epoch milliseconds (rounded up, so a
    wait never ends early)."""
    return clock.now_ms() + max(0, math.ceil(seconds * 1000))
