"""A clock a test moves: durable time that stands still until the test advances it.

Give it to an executor (``DBOS(..., clock=clock)``, or the pytest plugin's ``dbos_clock``
fixture) and every durable timer of that executor waits on it: ``dbos.sleep``, the
timeouts of ``recv`` / ``get_event`` / ``read_stream``, workflow timeouts and deadlines, step
retry backoff, queue delays and ``set_workflow_delay``, debounce windows, rate-limit
periods, cron fire times and maintenance ages. The values recorded are the clock's, so a
run under it writes what a real run would have written at those times.

:meth:`TestClock.advance` moves time forward from timer to timer: each timer that falls due
fires, and the clock waits until the tasks it woke, and the others that use the clock, are
quiet (finished, or waiting on the clock again) before moving to the next one, so a chain
of timers (a retry backoff that grows, a cron schedule firing hourly) fires as it would
have in real time, and none is missed because its task was busy when time moved.

Poll intervals, reconnect backoff and liveness checks stay on real time (see
``dbos_async/_sysdb/clock.py``): they are not durable time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType

SETTLE_LIMIT = 5.0
"""Real seconds :meth:`TestClock.advance` waits, before each move, for the tasks that use the
clock to be quiet again (a task busy with something else, a step awaiting an event the test
sets later, is left to it after that)."""


@dataclass(eq=False)
class _Registration:
    """A wait (or a deadline scope) of one task on the clock."""

    due_ms: int | None
    task: asyncio.Task[object] | None
    scope: _ClockTimeout
    # A wait parks its task on the clock; a deadline scope around work does not.
    parks: bool
    order: int = field(default=0)


class _ClockTimeout:
    """``asyncio.timeout`` whose deadline is on a :class:`TestClock` (and whose ``cap``,
    if any, is real seconds)."""

    def __init__(self, clock: TestClock, until_ms: int | None, cap: float | None,
                 parks: bool) -> None:
        self._timeout = asyncio.timeout(cap)
        self._clock = clock
        self._until_ms = until_ms
        self._parks = parks
        self._registration: _Registration | None = None

    async def __aenter__(self) -> _ClockTimeout:
        await self._timeout.__aenter__()
        if self._until_ms is not None and self._until_ms <= self._clock.now_ms():
            self._timeout.reschedule(asyncio.get_running_loop().time())  # due already
        else:
            self._registration = self._clock._register(self._until_ms, self, self._parks)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None,
                        exc_tb: TracebackType | None) -> bool | None:
        if self._registration is not None:
            self._clock._unregister(self._registration)
            self._registration = None
        await self._timeout.__aexit__(exc_type, exc_val, exc_tb)
        return None

    def expired(self) -> bool:
        return self._timeout.expired()

    def fire(self) -> None:
        """The clock reached the deadline: expire now (unless the cap did already)."""
        self._registration = None
        if not self._timeout.expired():
            self._timeout.reschedule(asyncio.get_running_loop().time())


class TestClock:
    """Durable time under a test's control, shared by every executor and client given it.

    Args:
        start: The time it starts at (an aware datetime; naive ones are UTC); default: the
            real time now.
    """

    __test__ = False  # not a test class, for pytest

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            self._now_ms = int(datetime.now(UTC).timestamp() * 1000)
        else:
            if start.tzinfo is None:
                start = start.replace(tzinfo=UTC)
            self._now_ms = math.floor(start.timestamp() * 1000)
        self._registrations: set[_Registration] = set()
        self._order = itertools.count()
        # Futures of the waits for a change of registrations (a wait begun or ended, a
        # woken task done).
        self._watchers: list[asyncio.Future[None]] = []
        # The tasks that have waited on the clock and not ended; those with a deadline on
        # it too, each followed to its end.
        self._users: set[asyncio.Task[object]] = set()
        self._followed: set[asyncio.Task[object]] = set()

    # ---- The clock (see dbos_async/_sysdb/clock.py) ----

    def now_ms(self) -> int:
        """The clock's time, in epoch milliseconds: it moves only when the test moves it."""
        return self._now_ms

    def wait_until(self, until_ms: int | None, cap: float | None = None) -> _ClockTimeout:
        """A timeout that falls due when the clock reaches ``until_ms``; a parked wait."""
        return _ClockTimeout(self, until_ms, cap, parks=True)

    def deadline(self, until_ms: int) -> _ClockTimeout:
        """A timeout that falls due when the clock reaches ``until_ms``, not counted as a
        parked wait."""
        return _ClockTimeout(self, until_ms, None, parks=False)

    async def sleep_until(self, until_ms: int) -> None:
        """Return once the clock has reached ``until_ms``."""
        with contextlib.suppress(TimeoutError):
            async with self.wait_until(until_ms):
                await asyncio.get_running_loop().create_future()

    # ---- What a test does with it ----

    def now(self) -> datetime:
        """The clock's time, as an aware UTC datetime."""
        return datetime.fromtimestamp(self._now_ms / 1000, UTC)

    @property
    def next_due(self) -> datetime | None:
        """When the earliest pending timer falls due (None: no timer waits)."""
        due = self._earliest()
        return None if due is None else datetime.fromtimestamp(due / 1000, UTC)

    async def advance(self, delta: timedelta | None = None, *, days: float = 0,
                      hours: float = 0, minutes: float = 0, seconds: float = 0,
                      milliseconds: float = 0) -> None:
        """Move the clock forward by ``delta`` (or the sum of the keyword arguments),
        firing every timer that falls due on the way, in order, and letting the tasks each
        one wakes react before moving on (so timers they start within the span fire too).

        Raises:
            ValueError: The span is negative: time never goes back.
        """
        span = (delta or timedelta()) + timedelta(
            days=days, hours=hours, minutes=minutes, seconds=seconds,
            milliseconds=milliseconds)
        if span < timedelta():
            raise ValueError(f"A clock only moves forward: advance({span}) is negative")
        target = self._now_ms + math.ceil(span / timedelta(milliseconds=1))
        await self._settle(self._others())
        while (due := self._earliest()) is not None and due <= target:
            await self._move_to(due)
        await self._move_to(target)

    async def advance_to_next(self) -> datetime | None:
        """Skip to when the earliest pending timer falls due and fire it (and any due at
        the same time); returns that time, or None (not moving) when no timer waits."""
        await self._settle(self._others())
        due = self._earliest()
        if due is None:
            return None
        await self._move_to(due)
        return self.now()

    async def wait_for_timers(self, count: int = 1, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Return once at least ``count`` timers wait on the clock (a workflow has reached
        its sleep or its ``recv``), so that an advance that follows finds them.

        Raises:
            TimeoutError: Fewer timers waited after ``timeout`` real seconds.
        """
        async with asyncio.timeout(timeout):
            await self._until(
                lambda: sum(r.due_ms is not None for r in self._registrations) >= count)

    # ---- Inside ----

    def _earliest(self) -> int | None:
        return min((r.due_ms for r in self._registrations if r.due_ms is not None),
                   default=None)

    def _register(self, due_ms: int | None, scope: _ClockTimeout,
                  parks: bool) -> _Registration:
        task = asyncio.current_task()
        registration = _Registration(due_ms, task, scope, parks, next(self._order))
        self._registrations.add(registration)
        if task is not None and task not in self._followed:  # its end is a change too
            self._followed.add(task)
            task.add_done_callback(self._ended)
        if parks and task is not None:
            self._users.add(task)
        self._wake()
        return registration

    def _unregister(self, registration: _Registration) -> None:
        self._registrations.discard(registration)
        self._wake()

    def _ended(self, task: asyncio.Task[object]) -> None:
        self._followed.discard(task)
        self._users.discard(task)
        self._wake()

    def _wake(self) -> None:
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)

    async def _until(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked at every change of registrations."""
        while not condition():
            watcher = asyncio.get_running_loop().create_future()
            self._watchers.append(watcher)
            await watcher

    async def _move_to(self, moment_ms: int) -> None:
        """Set the time to ``moment_ms`` (never back), fire what is due, and wait until the
        tasks it woke, and those its effects woke, are quiet again."""
        quiet = {task for task in self._others() if self._reacted(task)}
        self._now_ms = max(self._now_ms, moment_ms)
        due = sorted((r for r in self._registrations
                      if r.due_ms is not None and r.due_ms <= self._now_ms),
                     key=lambda r: (r.due_ms or 0, r.order))
        woken = set()
        for registration in due:
            self._registrations.discard(registration)
            registration.scope.fire()
            if registration.task is not None:
                woken.add(registration.task)
        await self._settle(quiet | woken)

    def _others(self) -> set[asyncio.Task[object]]:
        """The tasks that use the clock, but the one moving it (a test that waited for a
        result on it before)."""
        return self._users - {asyncio.current_task()}

    def _reacted(self, task: asyncio.Task[object]) -> bool:
        """Whether ``task`` is quiet: ended, or waiting on the clock."""
        return task.done() or any(r.task is task and r.parks for r in self._registrations)

    async def _settle(self, tasks: set[asyncio.Task[object]]) -> None:
        """Wait (at most :data:`SETTLE_LIMIT` real seconds) until each of ``tasks`` has
        ended or waits on the clock."""
        await asyncio.sleep(0)  # the woken tasks run first
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLE_LIMIT):
                await self._until(lambda: all(self._reacted(task) for task in tasks))
        for _ in range(3):  # what their last step scheduled
            await asyncio.sleep(0)
