"""How the system database answers: what ``health()`` reports about it, and what is logged
when it stops answering or answers slowly.

Every operation of the system database is counted here while it runs (see
:class:`~dbos_async._sysdb.retry.RetryPolicy`): one that fails for want of the database marks
it unreachable until the next one succeeds; one that has waited longer than
:data:`SLOW_AFTER` makes it slow. Nothing here reads the clock on an operation's path but the
retry policy's own start time, so the bookkeeping costs a dict entry per operation.

:meth:`DatabaseWatch.watch` (a background task of an executor, running from the start of
its entry) turns that into log lines: a warning once the database has been unreachable for
a second, or an operation has waited :data:`SLOW_AFTER` seconds, saying on what (the wait
events of this process's sessions, read on a connection of its own), a reminder every
:data:`REMIND_EVERY` seconds while it lasts, and a line when it is over.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger("dbos_async")

SLOW_AFTER = 5.0
"""Seconds an operation waits on the database before it counts (and is logged) as slow."""

UNREACHABLE_LOG_AFTER = 1.0
"""Seconds the database stays unreachable before it is logged: a lost connection that the
next attempt outlives is no outage."""

REMIND_EVERY = 30.0
"""Seconds between two reminders that an outage or a slow wait goes on."""

WATCH_INTERVAL = 1.0

DatabaseState = Literal["reachable", "unreachable", "slow"]

# What the wait events of a stuck session mean to whoever runs the database.
_WAIT_MEANINGS = {
    "SyncRep": "a synchronous standby to confirm the commit (synchronous_standby_names "
               "names a standby that is not answering)",
    "Lock": "a lock held by another session",
    "LWLock": "a lightweight lock inside the server",
    "IO": "disk I/O",
    "ClientRead": "this client",
}


@dataclass(frozen=True)
class DatabaseHealth:
    """How the system database answers this executor (part of
    :class:`~dbos_async.ExecutorHealth`).

    ``state`` is ``"reachable"``; ``"unreachable"`` while operations fail for want of it
    (workflows pause, callers outside workflows retry for up to ``db_retry_timeout``); or
    ``"slow"`` while an operation has waited longer than 5 seconds on it (a commit waiting
    for a synchronous standby, a lock, an exhausted pool). ``since`` (epoch seconds) is when
    that state began, ``waiting`` how many operations wait on it now and ``longest_wait``
    (seconds) how long the oldest has; ``last_error`` is the ``repr`` of the latest
    connection loss and ``waiting_on`` what the slow operations wait for, when known.
    """

    state: DatabaseState
    since: float | None = None
    waiting: int = 0
    longest_wait: float = 0.0
    last_error: str | None = None
    waiting_on: str | None = None

    @property
    def problem(self) -> str | None:
        """Why the database makes the executor degraded, in a sentence; None when not."""
        if self.state == "unreachable":
            return (f"the system database is unreachable ({self.last_error}); "
                    f"{self.waiting} operations wait for it")
        if self.state == "slow":
            on = f" on {self.waiting_on}" if self.waiting_on else ""
            return (f"{self.waiting} operations have waited up to {self.longest_wait:.1f}s "
                    f"for the system database{on}")
        return None


class DatabaseWatch:
    """The operations waiting on one system database, and whether it answers."""

    def __init__(self, target: str, startup_wait: float = 3.0) -> None:
        # The database's name and hosts, for log lines.
        self.target = target
        # Seconds a database that refuses connections and never answered is retried (see
        # RetryPolicy) and left unlogged here: its caller's error says it.
        self.startup_wait = startup_wait
        self._in_flight: dict[int, tuple[str, float]] = {}  # token -> (what, monotonic start)
        self._tokens = itertools.count()
        self._unreachable_since: float | None = None  # monotonic
        self._unreachable_epoch: float | None = None
        self.last_error: str | None = None
        self._waiting_on: str | None = None
        self._outage_logged = False
        # Whether any operation has succeeded: until then a refused connection is more
        # likely a wrong address than an outage (see RetryPolicy).
        self.has_answered = False

    # ---- Bookkeeping on every operation ----

    def begin(self, what: str, started: float) -> int:
        token = next(self._tokens)
        self._in_flight[token] = (what, started)
        return token

    def end(self, token: int) -> None:
        del self._in_flight[token]

    def lost(self, error: BaseException) -> None:
        """An operation failed for want of the database."""
        self.last_error = f"{type(error).__name__}: {error}"
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            self._unreachable_epoch = time.time()

    def answered(self) -> None:
        """An operation succeeded: the database answers (again)."""
        self.has_answered = True
        if self._unreachable_since is None:
            return
        lasted = time.monotonic() - self._unreachable_since
        self._unreachable_since = self._unreachable_epoch = None
        if self._outage_logged:
            self._outage_logged = False
            logger.warning("The system database %s answers again after %.1fs unreachable",
                           self.target, lasted)

    # ---- What health() reports ----

    def snapshot(self) -> DatabaseHealth:
        now = time.monotonic()
        oldest = min((started for _, started in self._in_flight.values()), default=now)
        waiting, longest = len(self._in_flight), now - oldest
        if self._unreachable_since is not None:
            return DatabaseHealth("unreachable", self._unreachable_epoch, waiting, longest,
                                  self.last_error)
        if longest >= SLOW_AFTER:
            return DatabaseHealth("slow", time.time() - longest + SLOW_AFTER, waiting, longest,
                                  self.last_error, self._waiting_on)
        return DatabaseHealth("reachable", None, waiting, longest, self.last_error)

    # ---- The watch ----

    async def watch(self, diagnose: Callable[[], Awaitable[str]]) -> None:
        """Log outages and slow waits as they begin, go on and end (a background task).
        ``diagnose`` says what this process's sessions wait on, from a connection of its
        own."""
        reminded: dict[str, float] = {}
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            now = time.monotonic()
            if self._unreachable_since is not None:
                lasted = now - self._unreachable_since
                quiet = UNREACHABLE_LOG_AFTER if self.has_answered \
                    else max(UNREACHABLE_LOG_AFTER, self.startup_wait)
                if lasted >= quiet and _due(reminded, "outage", now):
                    self._outage_logged = True
                    # A database that never answered is what entering waits for: past
                    # startup_wait the entry fails with the one error that says so, and a
                    # warning caught racing it would say it twice.
                    logger.log(
                        logging.WARNING if self.has_answered else logging.DEBUG,
                        "The system database %s has been unreachable for %.0fs (%s); %d "
                        "operations wait for it: workflows pause and continue when it "
                        "answers, other callers give up after db_retry_timeout",
                        self.target, lasted, self.last_error, len(self._in_flight))
                continue
            reminded.pop("outage", None)
            slow = [(what, now - started) for what, started in self._in_flight.values()
                    if now - started >= SLOW_AFTER]
            if not slow:
                self._waiting_on = None
                reminded.pop("slow", None)
                continue
            if _due(reminded, "slow", now):
                self._waiting_on = await _diagnosis(diagnose)
                what, longest = max(slow, key=lambda item: item[1])
                logger.warning(
                    "%d operations have waited over %.0fs for the system database %s (the "
                    "longest, %s, for %.0fs); its sessions here wait on %s",
                    len(slow), SLOW_AFTER, self.target, what, longest, self._waiting_on)


def _due(reminded: dict[str, float], kind: str, now: float) -> bool:
    """Whether a line about ``kind`` is due: the first, or a reminder after REMIND_EVERY."""
    last = reminded.get(kind)
    if last is not None and now - last < REMIND_EVERY:
        return False
    reminded[kind] = now
    return True


async def _diagnosis(diagnose: Callable[[], Awaitable[str]]) -> str:
    try:
        return await diagnose()
    except Exception as error:
        return f"something that keeps even a new connection from answering ({error!r})"


def describe_waits(events: list[tuple[str | None, str | None]]) -> str:
    """What sessions waiting on ``events`` ((wait event type, wait event) pairs) wait for,
    most common first, in words where the event is a familiar one."""
    if not events:
        return "nothing the server reports (the wait is on the client side: the pool)"
    counts = Counter(event or kind or "CPU" for kind, event in events)
    kinds = {event or kind or "CPU": kind for kind, event in events}
    parts = []
    for name, count in counts.most_common():
        meaning = _WAIT_MEANINGS.get(name) or _WAIT_MEANINGS.get(kinds[name] or "")
        label = f"{name}, {meaning}" if meaning else name
        parts.append(f"{label} ({count} sessions)" if count > 1 else label)
    return "; ".join(parts)
