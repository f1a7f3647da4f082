"""What handles, messaging reads and operations need from whoever runs them: the runtime
of a running executor (:class:`~dbos_async._executor.runtime.Runtime`) or a client
(:class:`~dbos_async.DBOSClient`).

Both are peers on the system database; this protocol lets them share one implementation of
every operation instead of each keeping its own copy.
"""

from __future__ import annotations

import asyncio
import functools
import math
from typing import TYPE_CHECKING, Any, Protocol

from dbos_async._sysdb.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from dbos_async._executor.registry import DataSource
    from dbos_async._executor.serialization import Formats, Signature
    from dbos_async._sysdb.application import ApplicationDatabase
    from dbos_async._sysdb.database import SystemDatabase
    from dbos_async._sysdb.notifications import Supervise
    from dbos_async.config import DBOSConfig


class Peer(Protocol):
    """An executor's runtime or a client, connected to a system database."""

    config: DBOSConfig
    # The formats it writes values in and reads them from (serializer, allow_pickle).
    formats: Formats

    @property
    def system_database(self) -> SystemDatabase: ...

    # The application databases whose transactions' outcomes it discards with the
    # workflows (rewind, delete), by data source name.
    application_databases: dict[str, ApplicationDatabase]

    def signature_of(self, workflow_name: str) -> Signature | None:
        """The registered workflow's signature (types its values), or None."""
        ...

    def running_result(self, workflow_id: str,
                       shard_key: str | None = None) -> asyncio.Future[Any] | None:
        """The result of the workflow if it runs in this process."""
        ...

    def interrupt_local(self, waiters: set[str]) -> None:
        """Interrupt the steps and waits of these workflows where they run here."""
        ...


def clock_of(config: DBOSConfig) -> Clock:
    """The clock an executor or client with these settings reads durable time from."""
    return config.clock if config.clock is not None else SYSTEM_CLOCK


def system_database_for(config: DBOSConfig, url: str) -> SystemDatabase:
    """The system database of an executor or client with these settings."""
    from dbos_async._sysdb.database import SystemDatabase

    return SystemDatabase(
        url,
        schema=config.schema_name,
        pool_size=config.pool_size,
        connect_timeout=config.connect_timeout,
        retry_timeout=config.db_retry_timeout,
        startup_wait=config.startup_wait,
        connection_name=config.connection_name,
        application_name=config.application_name,
        sharded=config.sharding,
        idle_transaction_timeout_ms=math.ceil(config.idle_transaction_timeout * 1000),
        observability_query_timeout_ms=math.ceil(config.observability_query_timeout * 1000),
        clock=clock_of(config),
        connect_options=config.connect_options,
    )


def application_database_for(config: DBOSConfig, source: DataSource) -> ApplicationDatabase:
    """The application database of a data source, for an executor or client with these
    settings (it is opened by the caller)."""
    from dbos_async._sysdb.application import ApplicationDatabase

    return ApplicationDatabase(
        source.name, source.url, schema=source.schema, pool_size=source.pool_size,
        connect_timeout=config.connect_timeout, connection_name=config.connection_name,
        idle_transaction_timeout_ms=math.ceil(config.idle_transaction_timeout * 1000))


async def start_notifications(sysdb: SystemDatabase, url: str, config: DBOSConfig,
                              supervise: Supervise) -> None:
    """Start the LISTEN/NOTIFY dispatcher (listener and notifier) of a peer."""
    from dbos_async._sysdb import connection
    from dbos_async._sysdb.citus_nodes import CitusNodes
    from dbos_async._sysdb.notifications import TRIGGER_FED_CHANNELS, NotificationDispatcher

    dispatcher = NotificationDispatcher(
        connect=functools.partial(connection.connect, url, config.connect_timeout,
                                  config.connection_name, sysdb.fence),
        pool=lambda: sysdb.pool,
        use_listen_notify=config.use_listen_notify,
        coalesce_ms=config.notification_coalesce_ms,
        poll_interval=config.notification_poll_interval,
        listening_poll_interval=config.listening_poll_interval,
        max_polling_queries=config.max_polling_queries or max(1, config.pool_size // 2),
        # On Citus a notification reaches only the listeners of the node it was sent on, and
        # a writer may be connected to any node: the listener listens on every node. Should
        # one be missed (a node not yet read, a listener down unnoticed), each waiter also
        # reads again now and then.
        trigger_fed=frozenset() if sysdb.routes_single_tables else TRIGGER_FED_CHANNELS,
        cluster=CitusNodes(url, config.connect_timeout, config.connection_name)
        if sysdb.routes_single_tables else None,
        clock=sysdb.clock,
    )
    sysdb.notifications = dispatcher
    await dispatcher.start(supervise)
