"""LISTEN/NOTIFY: one listener connection, a registry of waiters, and a coalescing notifier.

Waiters follow one protocol so that no wake-up is lost: register first, then read the
database, then wait. A notification that arrives between the read and the wait leaves the
waiter's flag set, so the wait returns at once and the caller reads again.

- The listener is a dedicated connection (not a pool slot) LISTENing on the channels below;
  on a Citus cluster, one to every node, as a NOTIFY reaches only the sessions of its node
  (see dbos_async/_sysdb/listeners.py). When one drops, every waiter is woken (each re-reads
  the database) and it reconnects with backoff; until it is back, waits are capped at the
  poll interval.
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
import functools
import json
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Protocol

import anyio
import anyio.abc
import asyncpg

from dbos_async import _metrics as metrics
from dbos_async._database_url import Host
from dbos_async._sysdb.clock import SYSTEM_CLOCK, Clock
from dbos_async._sysdb.listeners import ClusterNodes, Connect, ServerListener, still_answers
from dbos_async._sysdb.repeats import Repeats
from dbos_async._sysdb.retry import is_transient

logger = logging.getLogger("dbos_async")

NOTIFICATIONS_CHANNEL = "dbos_notifications_channel"
"""Fed by the trigger on ``notifications``; payload ``<destination>::<topic>``."""
WORKFLOW_EVENTS_CHANNEL = "dbos_workflow_events_channel"
"""Payload ``<workflow>::<key>``, sent after set_event."""
STREAMS_CHANNEL = "dbos_streams_channel"
"""Payload ``<workflow>::<key>``, sent after a stream write or close."""
WORKFLOW_COMPLETION_CHANNEL = "dbos_workflow_completion_channel"
"""Payload: the workflow ID, sent when a workflow reaches a terminal status."""
WORKFLOW_COMPLETIONS_CHANNEL = "dbos_workflow_completions_channel"
"""Payload: a JSON list of workflow IDs, each as on ``WORKFLOW_COMPLETION_CHANNEL``: the
completions of one notifier batch packed into as few notifications as fit (see
:data:`PACKED_CHANNELS`)."""
ENQUEUE_CHANNEL = "dbos_enqueue_channel"
"""Payload: a queue name, sent when a workflow is enqueued."""
WORKFLOW_CANCEL_CHANNEL = "dbos_workflow_cancel_channel"
"""Payload: the workflow ID, sent after a cancel of that workflow committed."""

TRIGGER_FED_CHANNELS = frozenset({NOTIFICATIONS_CHANNEL})
"""Channels the database notifies itself (a trigger), whoever writes: while the listener is
up, their waiters need no periodic re-read."""

PACKED_CHANNELS = {WORKFLOW_COMPLETION_CHANNEL: WORKFLOW_COMPLETIONS_CHANNEL}
"""Channels whose keys a batch sends packed, several to a notification, on another channel:
a queue drain ends thousands of workflows a second, and every NOTIFY costs the server and
every listening session, this process's own listener included, about as much as a write.
A batch's lone key still goes on its own channel, as older releases expect. Only channels
of this SDK: other SDKs listen on the rest."""
_UNPACKED = {packed: channel for channel, packed in PACKED_CHANNELS.items()}
PACKED_PAYLOAD_BYTES = 7_000
"""The most a packed payload holds (the server refuses a NOTIFY payload of 8,000 bytes)."""
OWN_PACKED_KEPT = 64
"""How many of its own packed payloads a process remembers until its listener hears them."""

CHANNELS = (
    NOTIFICATIONS_CHANNEL,
    WORKFLOW_EVENTS_CHANNEL,
    STREAMS_CHANNEL,
    WORKFLOW_COMPLETION_CHANNEL,
    WORKFLOW_COMPLETIONS_CHANNEL,
    ENQUEUE_CHANNEL,
    WORKFLOW_CANCEL_CHANNEL,
)

Target = tuple[str, str]

NODES_PATIENCE = 2.0
"""How long an executor or client entering waits for its listeners on the other nodes of a
Citus cluster to connect."""


class BackgroundTask(Protocol):
    """A background task started by a :data:`Supervise`."""

    async def stop(self) -> None:
        """End the task for good and wait until it has ended."""
        ...


Supervise = Callable[[Callable[[], Coroutine[Any, Any, None]], str], BackgroundTask]
"""Runs ``factory()`` as a background task of the caller's owner, named, started again with
backoff whenever it raises, and ended when the owner closes (see
``dbos_async._executor.tasks.TaskOwner.supervise``)."""
_NOTIFY_SQL = "SELECT pg_notify(n ->> 0, n ->> 1) FROM json_array_elements($1::json) AS n"
"""A batch of notifications, sent as one JSON list of [channel, payload] pairs: one
parameter, which costs the client less to encode than two text arrays (a completion
announces every workflow that ends, thousands a second)."""


def packed(notifications: Sequence[Target]) -> list[Target]:
    """The notifications to send for a batch: the keys of a :data:`PACKED_CHANNELS`
    channel, when there are several, as JSON lists of at most
    :data:`PACKED_PAYLOAD_BYTES` on its packed channel; every other one as it is."""
    sent: list[Target] = []
    keys: dict[str, list[str]] = {}
    for channel, key in notifications:
        if channel in PACKED_CHANNELS:
            keys.setdefault(channel, []).append(key)
        else:
            sent.append((channel, key))
    for channel, group in keys.items():
        sent += _packed_lists(channel, group)
    return sent


def _packed_lists(channel: str, keys: list[str]) -> list[Target]:
    """``keys`` of ``channel`` in as few payloads as fit, halving a list that does not (one
    encoding per list: a batch's IDs usually fit in one)."""
    if len(keys) == 1:  # alone, or too long to share: on its own channel
        return [(channel, keys[0])]
    payload = json.dumps(keys, ensure_ascii=False)
    if len(payload) < PACKED_PAYLOAD_BYTES // 4 or len(payload.encode()) < PACKED_PAYLOAD_BYTES:
        return [(PACKED_CHANNELS[channel], payload)]
    half = len(keys) // 2
    return _packed_lists(channel, keys[:half]) + _packed_lists(channel, keys[half:])


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

    async def wait(self, timeout: float | None, *, until_ms: int | None = None,  # noqa: ASYNC109
                   polled: bool = False) -> bool:
        """Wait for a notification, ``timeout`` real seconds, or the dispatcher's clock to
        reach ``until_ms`` (a durable deadline, epoch milliseconds); True if notified.

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
                async with self._dispatcher.clock.wait_until(until_ms, timeout):
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
        cluster: ClusterNodes | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._pool = pool
        # Durable deadlines of waits (a recv's timeout) are on this clock; caps are real time.
        self.clock = clock
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
        # The notifier's failures to send, logged without a flood.
        self._send_failures = Repeats(logger)
        # The other nodes of a Citus cluster (None on plain PostgreSQL): the listener on the
        # system database URL's server reads them, and each has a listener of its own.
        self._cluster = cluster
        self._home = ServerListener(
            "", connect, CHANNELS, self._on_notification, self.wake_all,
            reconnect_max_delay=reconnect_max_delay,
            check=still_answers if cluster is None else self._read_nodes,
            on_connect=None if cluster is None else self._read_nodes)
        self._nodes: dict[Host, ServerListener] = {}
        # While the listener task runs: its task group, and each node listener's scope in it.
        self._group: anyio.abc.TaskGroup | None = None
        self._node_scopes: dict[Host, anyio.CancelScope] = {}
        self._stopping = False
        self._tasks: list[BackgroundTask] = []
        self.notifications_sent = 0
        """How many payloads the notifier sent (after coalescing)."""
        self.batches_sent = 0
        # The packed payloads sent from here that the listener has yet to hear: their keys
        # were woken here when notified, so their echo is dropped (oldest forgotten first).
        self._own_packed: dict[str, None] = {}

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
        waiters = self._waiters.get((channel, key), ())
        if waiters:
            for waiter in waiters:
                waiter.wake()
            metrics.woken(channel, len(waiters))
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

    def waiters_on(self, channel: str, key: str) -> int:
        """How many waiters here wait for a notification of ``key`` on ``channel``."""
        return len(self._waiters.get((channel, key), ()))

    @property
    def listening(self) -> bool:
        """Whether every notification reaches this process: the listener is connected to
        the server (on a Citus cluster, to every node)."""
        return self._home.listening and all(node.listening for node in self._nodes.values())

    def not_listening(self) -> str | None:
        """Why notifications do not arrive (waits poll meanwhile), or None while the
        listener is connected (to every node of a Citus cluster) or LISTEN/NOTIFY is turned
        off."""
        if not self.use_listen_notify or self.listening:
            return None
        meanwhile = f"; waits poll every {self.poll_interval:g}s meanwhile"
        if not self._home.listening:
            cause = f" ({self._home.error})" if self._home.error else ""
            return "the notification listener is not connected" + cause + meanwhile
        down = [f"{host}" + (f" ({node.error})" if node.error else "")
                for host, node in self._nodes.items() if not node.listening]
        return ("the notification listener is not connected to the Citus "
                + ("node " if len(down) == 1 else "nodes ") + ", ".join(down) + meanwhile)

    @property
    def listener_pid(self) -> int | None:
        """The server process ID of the listener's connection to the system database URL's
        server, while connected."""
        return self._home.pid

    @property
    def listener_error(self) -> str | None:
        """Why the listener's latest attempt to connect to the system database URL's server,
        or to LISTEN there, failed (None once one succeeded)."""
        return self._home.error

    @property
    def reconnects(self) -> int:
        """How many times a listener connection (to any node) connected again."""
        return self._home.reconnects + sum(node.reconnects for node in self._nodes.values())

    @property
    def nodes(self) -> list[Host]:
        """The other nodes of the Citus cluster the listener also listens on (as last read;
        none on plain PostgreSQL)."""
        return list(self._nodes)

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

    def notify_each(self, channel: str, keys: Sequence[str]) -> None:
        """:meth:`notify` of each of ``keys`` on ``channel`` (a batch's writes, committed
        together)."""
        for key in keys:
            self.wake(channel, key)
        if not keys or not self.use_listen_notify or self._stopping:
            return
        self._pending += [(channel, key) for key in keys]
        self._pending_event.set()

    async def flush(self) -> None:
        """Send the queued notifications now, in one statement."""
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self._pending_event.clear()
        unique = list(dict.fromkeys(batch))
        sent = packed(unique)
        for channel, payload in sent:
            if channel in _UNPACKED:
                self._own_packed[payload] = None
                if len(self._own_packed) > OWN_PACKED_KEPT:
                    del self._own_packed[next(iter(self._own_packed))]
        try:
            await self._pool().execute(_NOTIFY_SQL, json.dumps(sent, ensure_ascii=False))
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
            self._send_failures.log(logging.WARNING, "Could not send notifications: %r",
                                    error)
            return
        self._send_failures.reset()
        self.notifications_sent += len(sent)
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
        unpacked = _UNPACKED.get(channel)
        if unpacked is None:
            self.wake(channel, str(payload))
            return
        if str(payload) in self._own_packed:  # sent from here: woken when notified
            del self._own_packed[str(payload)]
            return
        try:
            keys = json.loads(str(payload))
        except ValueError:
            keys = None
        if not isinstance(keys, list):
            logger.debug("Ignored a malformed notification on %s: %.100r", channel, payload)
            return
        for key in keys:
            if isinstance(key, str):
                self.wake(unpacked, key)

    async def _read_nodes(self, conn: asyncpg.Connection) -> None:
        """The check of the listener on the system database URL's server, on a Citus
        cluster: read the cluster's other nodes there, and listen on each of them (and on
        no other). It runs whenever that connection connects and with every health check,
        so a node added later is listened on within that interval."""
        assert self._cluster is not None
        self._listen_on(await self._cluster.others(conn))

    def _listen_on(self, hosts: Iterable[Host]) -> None:
        wanted = set(hosts)
        for host in [host for host in self._nodes if host not in wanted]:
            scope = self._node_scopes.pop(host, None)
            if scope is not None:
                scope.cancel()
            self._nodes.pop(host).drop()
        for host in wanted - self._nodes.keys():
            self._nodes[host] = self._node_listener(host)
            self._start_node(host)

    def _node_listener(self, host: Host) -> ServerListener:
        assert self._cluster is not None
        return ServerListener(
            f" to the Citus node {host}", functools.partial(self._cluster.connect, host),
            CHANNELS, self._on_notification, self.wake_all,
            reconnect_max_delay=self.reconnect_max_delay)

    def _start_node(self, host: Host) -> None:
        """Run the node's listener in the listener task's group (once that runs), in a
        cancel scope of its own, so it ends alone when the node leaves the cluster."""
        if self._group is None:
            return
        scope = anyio.CancelScope()
        self._node_scopes[host] = scope
        self._group.start_soon(self._run_node, self._nodes[host], scope,
                               name=f"notification listener {host}")

    @staticmethod
    async def _run_node(listener: ServerListener, scope: anyio.CancelScope) -> None:
        with scope:
            await listener.run()

    async def _run_listener(self) -> None:
        """The listener on the system database URL's server and, on a Citus cluster, one
        on each other node, each in this task's group and each reconnecting by itself."""
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                group.start_soon(self._home.run, name="notification listener")
                for host in self._nodes:
                    self._start_node(host)
        finally:
            self._group = None
            self._node_scopes.clear()

    def _drop_connections(self) -> None:
        self._home.drop()
        for node in self._nodes.values():
            node.drop()

    # ---- Lifecycle ----

    async def start(self, supervise: Supervise) -> None:
        """Connect the listener (if enabled) and start the listener and the notifier, each
        a supervised background task of the owner's, until :meth:`stop`."""
        if not self.use_listen_notify:
            return
        if await self._home.listen_once() and self._nodes:
            # The other nodes of a cluster, all at once; but one unreachable from here must
            # not hold up the start: what has not connected by then connects in the
            # background (waits poll until every node listens).
            with anyio.move_on_after(NODES_PATIENCE):
                await asyncio.gather(*(node.listen_once() for node in self._nodes.values()))
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
        self._drop_connections()
        self.wake_all()

