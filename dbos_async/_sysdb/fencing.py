"""Refusing an old primary that came back after a failover.

When a primary dies, its HA manager promotes a standby, which starts a new timeline. If the
old primary comes back writable (not fenced off), it holds what it had when it died: a
workflow finished on the new primary may be ``PENDING`` there, and an executor writing to it
would run again steps already checkpointed on the new one. Fencing the old primary is the HA
manager's job; an executor refuses what it can see:

- each system-database handle remembers the highest timeline of the primaries it used; a new
  connection to a primary on an older timeline is closed and refused with
  :class:`~dbos_async.errors.StaleServerError` (retried: with a multi-host URL the next
  listed server is tried at once);
- a handle's first connection through a multi-host URL probes every listed server: of
  several writable ones, those on an older timeline are refused from the start (and a
  warning says to fence them), and two on the same timeline, which cannot be told apart,
  refuse the entry.

A connection costs one more statement (:data:`SERVER_STATE`); connections are long-lived.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from dbos_async._database_url import Host, parse_database_url
from dbos_async._sysdb.retry import is_transient
from dbos_async._sysdb.statements.servers import SERVER_STATE
from dbos_async.errors import DatabaseUnavailableError, StaleServerError

logger = logging.getLogger("dbos_async")

PROBE_TIMEOUT = 2.0
"""The longest a server listed in a multi-host URL may take to answer the probe at entry."""


@dataclass(frozen=True)
class ServerState:
    """What :data:`SERVER_STATE` read: ``timeline`` is ``None`` on a standby, and on a
    server where the functions it calls are refused (then no fencing applies to it)."""

    writable: bool
    timeline: int | None
    started: datetime | None


async def read_state(conn: asyncpg.Connection) -> ServerState:
    """The state of ``conn``'s server; a connection loss is raised (to try elsewhere)."""
    try:
        row = await conn.fetchrow(SERVER_STATE)
    except asyncpg.PostgresError as error:
        if is_transient(error):
            raise
        # A server that keeps its WAL to itself (some managed services do): no timeline.
        return ServerState(writable=True, timeline=None, started=None)
    assert row is not None
    timeline = int(row["timeline"], 16) if row["timeline"] is not None else None
    return ServerState(not row["in_recovery"], timeline, row["started"])


class TimelineFence:
    """The timelines one system-database handle has seen on its servers: every connection
    of the handle (its pool, its LISTEN connection, its executor-ID lock) is opened through
    :meth:`connect`."""

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        # asyncpg.connect arguments of every connection (the connect_options setting).
        self.options = dict(options or {})
        # The servers the URL lists, in order (asyncpg reports a URL it cannot read).
        try:
            self.servers: tuple[Host, ...] = parse_database_url(url).hosts
        except ValueError:
            self.servers = ()
        self.highest: int | None = None
        self._probed = False
        self._probing = asyncio.Lock()
        # The servers refused so far, and on which timeline: each is warned about once.
        self._refused: dict[str, int] = {}

    async def connect(self, dsn: str | None = None, **options: Any) -> asyncpg.Connection:
        """``asyncpg.connect(dsn, **options)`` to a server this handle may use: one not on
        an older timeline than the newest it has seen (asyncpg's pool calls it so too).

        Raises:
            StaleServerError: every server that answered was refused as older.
            DatabaseUnavailableError: two writable servers on the same timeline (at entry).
        """
        options = {**self.options, **options}
        if len(self.servers) < 2:
            conn: asyncpg.Connection = await asyncpg.connect(dsn, **options)
            where = str(self.servers[0]) if self.servers else "the server of the URL"
            await self._admit(conn, where)
            return conn
        if not self._probed:
            async with self._probing:
                if not self._probed:
                    await self._probe(dsn, options.get("server_settings"))
                    self._probed = True
        return await self._connect_listed(dsn, options)

    async def _connect_listed(self, dsn: str | None,
                              options: dict[str, Any]) -> asyncpg.Connection:
        """The first listed server that accepts the connection (asyncpg's rules, such as
        ``target_session_attrs``) and is not refused, all within the one timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options.pop("timeout", 60.0)
        last: Exception | None = None
        for server in self.servers:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                conn: asyncpg.Connection = await asyncpg.connect(
                    dsn, host=server.address, port=server.port, timeout=remaining, **options)
            except Exception as error:
                if not is_transient(error):
                    raise
                last = error
                continue
            try:
                await self._admit(conn, str(server))
            except StaleServerError as error:
                last = error
                continue
            return conn
        raise last or TimeoutError("no listed server answered within the connect timeout")

    async def _admit(self, conn: asyncpg.Connection, where: str) -> None:
        """Keep ``conn`` unless its server is a primary older than the newest seen."""
        try:
            state = await read_state(conn)
        except BaseException:
            conn.terminate()
            raise
        if state.timeline is None or not state.writable:
            return
        if self.highest is not None and state.timeline < self.highest:
            conn.terminate()
            raise self._refuse(where, state.timeline)
        self.highest = max(self.highest or 0, state.timeline)

    def _refuse(self, where: str, timeline: int) -> StaleServerError:
        assert self.highest is not None
        if self._refused.get(where) != timeline:
            self._refused[where] = timeline
            logger.warning(
                "Refusing the system database server %s: a primary on timeline %d, older than "
                "timeline %d already used; an old primary back after a failover? Fence it off",
                where, timeline, self.highest)
        return StaleServerError(
            f"Refused the system database server {where}: it is a primary on timeline "
            f"{timeline}, older than timeline {self.highest} this process already used on "
            "this database (an old primary back after a failover, with data that may be "
            "stale); fence it off, as the HA manager should have")

    async def _probe(self, dsn: str | None, server_settings: dict[str, str] | None) -> None:
        """At entry: read every listed server; of several writable ones, refuse the older,
        and refuse to enter if the newest cannot be told apart."""
        async def state_of(server: Host) -> ServerState | None:
            # The system database may not exist yet: its server's timeline is the same
            # in the database every server has.
            for database in (None, "postgres"):
                try:
                    conn = await asyncpg.connect(
                        dsn, host=server.address, port=server.port, database=database,
                        timeout=PROBE_TIMEOUT, server_settings=server_settings,
                        **self.options)
                    break
                except asyncpg.InvalidCatalogNameError:
                    continue
                except Exception:
                    return None  # down, a standby (by the URL's target_session_attrs), or
                    # refusing us: it is not used either
            else:
                return None
            try:
                return await read_state(conn)
            except Exception:
                return None
            finally:
                conn.terminate()

        states = await asyncio.gather(*(state_of(s) for s in self.servers))
        primaries = [(str(server), state) for server, state in zip(self.servers, states,
                                                                  strict=True)
                     if state is not None and state.writable and state.timeline is not None]
        self._judge(primaries)

    def _judge(self, primaries: Sequence[tuple[str, ServerState]]) -> None:
        started = {state.started for _, state in primaries}
        if len(started) < 2:
            return  # one primary (perhaps listed twice)
        newest = max(state.timeline or 0 for _, state in primaries)
        self.highest = max(self.highest or 0, newest)
        on_newest = {state.started for _, state in primaries if state.timeline == newest}
        listing = ", ".join(f"{where} on timeline {state.timeline}"
                            for where, state in primaries)
        if len(on_newest) > 1:
            raise DatabaseUnavailableError(
                f"Several writable primaries on the same timeline {newest} ({listing}): "
                "which one holds the system database's latest state cannot be told; refusing "
                "to use either. Fence off all but one")
        logger.warning("Several writable primaries: %s; refusing the older; fence it off",
                       listing)
