"""The LISTEN connections of a notification dispatcher: one per server whose notifications
it must hear.

A NOTIFY reaches only the sessions of the server it is sent on. On plain PostgreSQL that is
the one server of the system database, so a dispatcher has one listener. On a Citus cluster
every node is a server of its own, and a writer (an executor, a client) sends its
notifications on the node it is connected to, whichever that is; so the dispatcher also
listens on every other node of the cluster (see :class:`ClusterNodes`), and a notification
sent on any node reaches waiters in every process.

Each :class:`ServerListener` lives on its own: it connects and LISTENs on every channel,
notices a dropped connection at once and a silently dead one by a periodic check, and
reconnects with backoff; one node being lost never stops the others. Whenever one connects
or is lost, notifications from its server may have been missed, so its dispatcher is told
(it wakes every waiter, each of which reads the database again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import asyncpg

from dbos_async._database_url import Host
from dbos_async._sysdb.repeats import Repeats

logger = logging.getLogger("dbos_async")

HEALTH_CHECK_INTERVAL = 30.0
"""Seconds between checks that an idle listener connection still answers (and, on a Citus
cluster, between reads of its nodes). A dropped connection is noticed at once without one;
a silently dead one costs at most this long of notifications from other processes, which
every poll covers within its backed-off interval anyway. Long, so that an idle executor
stays quiet."""

CHECK_TIMEOUT = 5.0
"""The longest a check may take before the connection is taken for dead."""

FIRST_RECONNECT_DELAY = 0.05
"""The delay before the second attempt to connect; it doubles up to the dispatcher's
``reconnect_max_delay``."""

Connect = Callable[[], Awaitable[asyncpg.Connection]]
Check = Callable[[asyncpg.Connection], Awaitable[None]]
"""Statements run on a listener's connection (every :data:`HEALTH_CHECK_INTERVAL`, or once
it listens); raising means the connection is lost."""
OnNotification = Callable[[object, int, str, object], None]


async def still_answers(conn: asyncpg.Connection) -> None:
    """The plain check: the server answers."""
    await conn.fetchval("SELECT 1")


class ClusterNodes(Protocol):
    """How a dispatcher reaches the other nodes of the Citus cluster its system database
    is on (see ``dbos_async._sysdb.citus_nodes.CitusNodes``)."""

    async def others(self, conn: asyncpg.Connection) -> Sequence[Host]:
        """The active primary nodes of the cluster other than ``conn``'s own, as ``conn``'s
        node knows them."""
        ...

    async def connect(self, node: Host) -> asyncpg.Connection:
        """A connection to the system database on ``node``."""
        ...


class ServerListener:
    """The LISTEN connection to one server: connected, watched and reconnected by
    :meth:`run`."""

    def __init__(self, where: str, connect: Connect, channels: Sequence[str],
                 on_notification: OnNotification, on_change: Callable[[], None], *,
                 reconnect_max_delay: float, check: Check = still_answers,
                 on_connect: Check | None = None) -> None:
        self.where = where
        """Which server, for messages: empty for the system database URL's own."""
        self._connect = connect
        self._channels = tuple(channels)
        self._on_notification = on_notification
        self._on_change = on_change
        self._reconnect_max_delay = reconnect_max_delay
        self._check = check
        self._on_connect = on_connect
        self._connection: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self.reconnects = 0
        """How many times it connected again after losing its connection or failing to
        connect at first."""
        self.error: str | None = None
        """Why its latest attempt to connect or LISTEN failed (None once one succeeded)."""
        # The failures of the reconnect loop, logged without a flood.
        self._repeats = Repeats(logger)

    @property
    def listening(self) -> bool:
        return self._connection is not None and not self._connection.is_closed()

    @property
    def pid(self) -> int | None:
        """The server process ID of its connection, while connected."""
        conn = self._connection
        return conn.get_server_pid() if conn is not None and not conn.is_closed() else None

    async def listen_once(self) -> bool:
        """Open the connection, LISTEN on every channel and run ``on_connect``; False if
        any of it failed (then nothing is left open)."""
        try:
            conn = await self._connect()
        except Exception as error:  # any failure means: retry later
            self._repeats.log(logging.WARNING,
                              "The notification listener could not connect%s: %r",
                              self.where, error)
            self.error = f"{type(error).__name__}: {error}"
            return False
        try:
            for channel in self._channels:
                await conn.add_listener(channel, self._on_notification)
            conn.add_termination_listener(self._on_termination)
            if self._on_connect is not None:
                async with asyncio.timeout(CHECK_TIMEOUT):
                    await self._on_connect(conn)
        except Exception as error:
            self._repeats.log(logging.WARNING,
                              "The notification listener could not LISTEN%s: %r",
                              self.where, error)
            self.error = f"{type(error).__name__}: {error}"
            conn.terminate()
            return False
        except BaseException:  # cancelled meanwhile: nothing is left open
            conn.terminate()
            raise
        self.error = None
        self._repeats.reset()
        self._lost.clear()
        self._connection = conn
        return True

    def _on_termination(self, _conn: object) -> None:
        self._lost.set()

    def drop(self) -> None:
        """Close the connection (if open) at once."""
        conn, self._connection = self._connection, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def run(self) -> None:
        """Keep the connection listening until cancelled: connect (with backoff) whenever
        it is not, and tell the dispatcher each time it connects or is lost."""
        delay = FIRST_RECONNECT_DELAY
        try:
            while True:
                if self._connection is None:
                    if not await self.listen_once():
                        # Reconnect backoff is real time (a server returns in real
                        # seconds), never the clock of durable timers.
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, self._reconnect_max_delay)
                        continue
                    delay = FIRST_RECONNECT_DELAY
                    self.reconnects += 1
                    # Notifications may have been missed while disconnected.
                    self._on_change()
                await self._watch()
                logger.warning("The notification listener lost its connection%s; reconnecting",
                               self.where)
                self.drop()
                # Every waiter reads again now, and polls until the listener is back.
                self._on_change()
        finally:
            self.drop()

    async def _watch(self) -> None:
        """Return when the connection is lost."""
        conn = self._connection
        assert conn is not None
        while True:
            try:
                async with asyncio.timeout(HEALTH_CHECK_INTERVAL):
                    await self._lost.wait()
                return
            except TimeoutError:
                pass
            # A check catches a silently dead connection.
            try:
                async with asyncio.timeout(CHECK_TIMEOUT):
                    await self._check(conn)
            except Exception:
                return
