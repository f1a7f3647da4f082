"""LISTEN/NOTIFY: one listener connection, a registry of waiters, and a coalescing notifier.

Waiters follow one protocol so that no wake-up is lost: register first, then read the
database, then wait. A notification that arrives between the read and the wait leaves the
waiter's flag set, so the wait returns at once and the caller reads again.

- The listener is a dedicated connection (not a pool slot) LISTENing on the channels below.
  When it drops, every waiter is woken (each re-reads the database) and the listener
  reconnects with backoff; until it is back, waits are capped at the poll interval.
- Writers never NOTIFY inside their transactions: :meth:`NotificationDispatcher.notify`
  queues a payload (and wakes this process's waiters at once); the notifier task sends each
  batch, coalesced for ``coalesce_ms``, in one ``pg_notify`` statement after the writes
  committed.
- With ``use_listen_notify=False`` there is no listener and no NOTIFY: waits poll at
  ``poll_interval``. A semaphore bounds how many polling reads run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Protocol

import anyio
import asyncpg

from dbos_async.sysdb.retry import is_transient

logger = logging.getLogger("dbos_async")

NOTIFICATIONS_CHANNEL = "dbos_notifications_channel"
"""Fed by the trigger on ``notifications``; payload ``<destination>::<topic>``."""
WORKFLOW_EVENTS_CHANNEL = "dbos_workflow_events_channel"
"""Payload ``<workflow>::<key>``, sent after set_event."""
STREAMS_CHANNEL = "dbos_streams_channel"
"""Payload ``<workflow>::<key>``, sent after a stream write or close."""
WORKFLOW_COMPLETION_CHANNEL = "dbos_workflow_completion_channel"
"""Payload: the workflow ID, sent when a workflow reaches a terminal status."""
ENQUEUE_CHANNEL = "dbos_enqueue_channel"
"""Payload: a queue name, sent when a workflow is enqueued."""
WORKFLOW_CANCEL_CHANNEL = "dbos_workflow_cancel_channel"
"""Payload: the workflow ID, sent after a cancel of that workflow committed."""

TRIGGER_FED_CHANNELS = frozenset({NOTIFICATIONS_CHANNEL})
"""Channels the database notifies itself (a trigger), whoever writes: while the listener is
up, their waiters need no periodic re-read."""

CHANNELS = (
    NOTIFICATIONS_CHANNEL,
    WORKFLOW_EVENTS_CHANNEL,
    STREAMS_CHANNEL,
    WORKFLOW_COMPLETION_CHANNEL,
    ENQUEUE_CHANNEL,
    WORKFLOW_CANCEL_CHANNEL,
)

Target = tuple[str, str]

LISTENER_HEALTH_CHECK_INTERVAL = 30.0
"""Seconds between checks that an idle listener connection still answers. A dropped
connection is noticed at once without one; a silently dead one costs at most this long of
notifications from other processes, which every poll covers within its backed-off interval
anyway. Long, so that an idle executor stays quiet."""


class BackgroundTask(Protocol):
    """A background task started by a :data:`Supervise`."""

    async def stop(self) -> None:
        """End the task for good and wait until it has ended."""
        ...


Supervise = Callable[[Callable[[], Coroutine[Any, Any, None]], str], BackgroundTask]
"""Runs ``factory()`` as a background task of the caller's owner, named, started again with
backoff whenever it raises, and ended when the owner closes (see
``dbos_async.executor.tasks.TaskOwner.supervise``)."""
Connect = Callable[[], Awaitable[asyncpg.Connection]]

_NOTIFY_SQL = "SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS t(c, p)"


def keyed(workflow_id: str, shard_key: str | None = None) -> str:
    """A workflow as a notification names it: its ID, prefixed on a sharded database by its
    key (length first, so no pair of key and ID reads as another), as IDs repeat across
    keys and a waiter must not wake for a same-ID workflow of another key."""
    return workflow_id if shard_key is None else f"{len(shard_key)}:{shard_key}:{workflow_id}"


def payload_key(workflow_id: str, name: str, shard_key: str | None = None) -> str:
    """The payload of a message, event or stream notification: ``<workflow>::<name>``,
    with the workflow :func:`keyed`."""
    return f"{keyed(workflow_id, shard_key)}::{name}"


class Waiter:
    """A registration for one or more (channel, key) targets; use it as a context manager."""

    def __init__(self, dispatcher: NotificationDispatcher, targets: Sequence[Target]) -> None:
        self._dispatcher = dispatcher
        self.targets = tuple(targets)
        self._event = asyncio.Event()
        self._registered = False

    def _attach(self) -> None:
        if not self._registered:
            self._dispatcher._attach(self)
            self._registered = True

    def close(self) -> None:
        if self._registered:
            self._dispatcher._detach(self)
            self._registered = False

    def wake(self) -> None:
        self._event.set()

    @property
    def woken(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None, *, polled: bool = False) -> bool:  # noqa: ASYNC109
        """Wait for a notification or ``timeout`` seconds; True if notified.

        The wait is capped by the dispatcher (:meth:`NotificationDispatcher.wait_cap`), so the
        caller re-reads the database at least that often; ``polled``: the caller's work is
        polled for already (see ``wait_cap``). The flag is cleared on return, so a
        notification arriving while the caller reads again is not lost.
        """
        cap = self._dispatcher.wait_cap(self.targets, polled=polled)
        if cap is not None:
            timeout = cap if timeout is None else min(timeout, cap)
        if timeout is None or timeout > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._event.wait()
        notified = self._event.is_set()
        self._event.clear()
        return notified

    def __enter__(self) -> Waiter:
        self._attach()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Waiter:
        self._attach()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class NotificationDispatcher:
    """The listener, the waiter registry and the notifier of one executor."""

    def __init__(
        self,
        *,
        connect: Connect,
        pool: Callable[[], asyncpg.Pool],
        use_listen_notify: bool = True,
        coalesce_ms: float = 10.0,
        poll_interval: float = 1.0,
        listening_poll_interval: float = 10.0,
        max_polling_queries: int = 5,
        reconnect_max_delay: float = 5.0,
        trigger_fed: frozenset[str] = TRIGGER_FED_CHANNELS,
    ) -> None:
        self._connect = connect
        self._pool = pool
        self.use_listen_notify = use_listen_notify
        self.coalesce = coalesce_ms / 1000
        self.poll_interval = poll_interval
        self.listening_poll_interval = listening_poll_interval
        self.reconnect_max_delay = reconnect_max_delay
        # The channels every write reaches this listener on, whoever writes and wherever.
        self.trigger_fed = trigger_fed
        self._poll_slots = asyncio.Semaphore(max(1, max_polling_queries))
        self._waiters: dict[Target, set[Waiter]] = {}
        # Callbacks receiving every key notified on a channel (the cancellation watcher).
        self._subscribers: dict[str, list[Callable[[str], None]]] = {}
        self._pending: list[Target] = []
        self._pending_event = asyncio.Event()
        self._connection: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self._stopping = False
        self._tasks: list[BackgroundTask] = []
        self.reconnects = 0
        """How many times the listener reconnected after losing its connection."""
        self.listener_error: str | None = None
        """Why the listener's latest attempt to connect or LISTEN failed (None once it did)."""
        self.notifications_sent = 0
        """How many payloads the notifier sent (after coalescing)."""
        self.batches_sent = 0

    # ---- Waiters ----

    def register(self, channel: str, key: str, also: Iterable[Target] = ()) -> Waiter:
        """A waiter for ``key`` on ``channel`` (and any ``also`` targets).

        It is registered at once (and again on ``with``); read the database after this call
        and before :meth:`Waiter.wait`.
        """
        waiter = Waiter(self, [(channel, key), *also])
        waiter._attach()
        return waiter

    def _attach(self, waiter: Waiter) -> None:
        for target in waiter.targets:
            self._waiters.setdefault(target, set()).add(waiter)

    def _detach(self, waiter: Waiter) -> None:
        for target in waiter.targets:
            waiters = self._waiters.get(target)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[target]

    def waiter_count(self) -> int:
        return len({w for ws in self._waiters.values() for w in ws})

    def wake(self, channel: str, key: str) -> None:
        """Wake this process's waiters on (channel, key)."""
        for waiter in self._waiters.get((channel, key), ()):
            waiter.wake()
        for callback in self._subscribers.get(channel, ()):
            callback(key)

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(key)`` for every notification on ``channel`` (local or remote)."""
        self._subscribers.setdefault(channel, []).append(callback)

    def wake_all(self) -> None:
        """Wake every waiter, so each reads the database again."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.wake()

    @property
    def listening(self) -> bool:
        return self._connection is not None and not self._connection.is_closed()

    def not_listening(self) -> str | None:
        """Why notifications do not arrive (waits poll meanwhile), or None while the
        listener is connected or LISTEN/NOTIFY is turned off."""
        if not self.use_listen_notify or self.listening:
            return None
        cause = f" ({self.listener_error})" if self.listener_error else ""
        return ("the notification listener is not connected" + cause
                + f"; waits poll every {self.poll_interval:g}s meanwhile")

    @property
    def listener_pid(self) -> int | None:
        """The server process ID of the listener's connection, while connected."""
        conn = self._connection
        return conn.get_server_pid() if conn is not None and not conn.is_closed() else None

    def wait_cap(self, targets: Iterable[Target], *, polled: bool = False) -> float | None:
        """The longest a waiter on ``targets`` may wait before reading again (None: no limit).

        While LISTEN is live: none when every target's channel is fed by a trigger (losing
        the listener wakes every waiter), or when the caller is ``polled`` for writers that
        send no notification by a poll of its own (the queue watcher); else long (for such
        writers, e.g. other SDKs). Short while LISTEN is off or down.
        """
        if self.use_listen_notify and self.listening:
            if polled or all(channel in self.trigger_fed for channel, _ in targets):
                return None
            return self.listening_poll_interval
        return self.poll_interval

    def polling(self) -> asyncio.Semaphore:
        """Hold this (``async with``) around a waiter's read, to bound concurrent polls."""
        return self._poll_slots

    # ---- Outgoing notifications ----

    def notify(self, channel: str, key: str) -> None:
        """Wake local waiters now and queue a NOTIFY for other processes.

        Call this only after the write it announces has committed.
        """
        self.wake(channel, key)
        if not self.use_listen_notify or self._stopping:
            return
        self._pending.append((channel, key))
        self._pending_event.set()

    async def flush(self) -> None:
        """Send the queued notifications now, in one statement."""
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self._pending_event.clear()
        unique = list(dict.fromkeys(batch))
        channels = [c for c, _ in unique]
        payloads = [p for _, p in unique]
        try:
            await self._pool().execute(_NOTIFY_SQL, channels, payloads)
        except asyncio.CancelledError:
            # Stopped mid-send (a client leaving right after a write): the batch goes back,
            # for stop()'s final flush. A notification sent twice only wakes twice.
            self._pending = batch + self._pending
            raise
        except Exception as error:
            if not (is_transient(error) or isinstance(error, asyncpg.PostgresError
                                                      | asyncpg.InterfaceError)):
                # Unexpected: the batch goes back, and the notifier's supervisor logs the
                # error and starts it again.
                self._pending = unique + self._pending
                self._pending_event.set()
                raise
            # Waiters elsewhere fall back to their poll intervals; nothing is lost for good.
            logger.warning("Could not send %d notifications: %r", len(unique), error)
            return
        self.notifications_sent += len(unique)
        self.batches_sent += 1

    async def _run_notifier(self) -> None:
        # Leading edge: the first notification after a quiet spell goes out at once; those
        # arriving while the window is open form the next batch.
        while True:
            await self._pending_event.wait()
            await self.flush()
            if self.coalesce > 0:
                await asyncio.sleep(self.coalesce)

    # ---- The listener ----

    def _on_notification(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        self.wake(channel, str(payload))

    def _on_termination(self, _conn: object) -> None:
        self._lost.set()

    async def _listen_once(self) -> bool:
        """Open the listener connection and LISTEN on every channel; False if it failed."""
        try:
            conn = await self._connect()
        except Exception as error:  # any failure means: retry later
            logger.warning("The notification listener could not connect: %r", error)
            self.listener_error = f"{type(error).__name__}: {error}"
            return False
        try:
            for channel in CHANNELS:
                await conn.add_listener(channel, self._on_notification)
            conn.add_termination_listener(self._on_termination)
        except Exception as error:
            logger.warning("The notification listener could not LISTEN: %r", error)
            self.listener_error = f"{type(error).__name__}: {error}"
            conn.terminate()
            return False
        self.listener_error = None
        self._lost.clear()
        self._connection = conn
        return True

    def _drop_connection(self) -> None:
        conn, self._connection = self._connection, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def _run_listener(self) -> None:
        delay = 0.05
        try:
            while True:
                if self._connection is None:
                    if await self._listen_once():
                        delay = 0.05
                        self.reconnects += 1
                        # Notifications may have been missed while disconnected.
                        self.wake_all()
                    else:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, self.reconnect_max_delay)
                        continue
                await self._watch_connection()
                logger.warning("The notification listener lost its connection; reconnecting")
                self._drop_connection()
                # Every waiter re-reads now, and polls until the listener is back.
                self.wake_all()
        finally:
            self._drop_connection()

    async def _watch_connection(self) -> None:
        """Return when the listener's connection is lost."""
        conn = self._connection
        assert conn is not None
        while True:
            try:
                async with asyncio.timeout(LISTENER_HEALTH_CHECK_INTERVAL):
                    await self._lost.wait()
                return
            except TimeoutError:
                pass
            # A health check catches a silently dead connection.
            try:
                async with asyncio.timeout(5.0):
                    await conn.fetchval("SELECT 1")
            except Exception:
                return

    # ---- Lifecycle ----

    async def start(self, supervise: Supervise) -> None:
        """Connect the listener (if enabled) and start the listener and the notifier, each
        a supervised background task of the owner's, until :meth:`stop`."""
        if not self.use_listen_notify:
            return
        await self._listen_once()
        self._tasks = [supervise(self._run_listener, "notification listener"),
                       supervise(self._run_notifier, "notifier")]

    async def stop(self) -> None:
        """Stop the listener and notifier, send what is still queued and close the listener
        connection."""
        self._stopping = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await task.stop()
        with anyio.move_on_after(5.0) as flushing:
            await self.flush()
        if flushing.cancelled_caught:
            logger.warning("Gave up sending the last notifications on shutdown")
        self._drop_connection()
        self.wake_all()


def remaining(deadline_ms: int | None) -> float | None:
    """Seconds until ``deadline_ms`` (epoch milliseconds), or None for no deadline."""
    if deadline_ms is None:
        return None
    return max(0.0, deadline_ms / 1000 - time.time())
