"""The async client: operate workflows from a process that is not an executor.

A :class:`DBOSClient` is a peer of the executor on the same system database. It runs no
workflow and never migrates (it verifies the schema); it keeps a pool and, for its waits, the
same LISTEN/NOTIFY dispatcher an executor has. Every operation is the executor's own code
(:mod:`dbos_async._executor.management.control`, :mod:`dbos_async._executor.messaging`,
the start plan of :mod:`dbos_async._executor.start`), run through the
:class:`~dbos_async._executor.peer.Peer` protocol.

``enqueue`` and ``send`` can join a transaction the caller holds on an asyncpg connection
(a transactional outbox): nothing is enqueued or sent unless the caller commits.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
import asyncpg

from dbos_async._database_url import redact
from dbos_async._executor import messaging
from dbos_async._executor.authentication import Authentication
from dbos_async._executor.context import WorkflowIDReusePolicy, attributes_json, check_reuse_policy
from dbos_async._executor.handles import WorkflowHandle, workflow_handle
from dbos_async._executor.messaging import SendMessage
from dbos_async._executor.operator import Operator
from dbos_async._executor.peer import (
    Peer,
    application_database_for,
    start_notifications,
    system_database_for,
)
from dbos_async._executor.queues.batch import (
    EnqueueRequest,
    EnqueueResult,
    Planned,
    enqueue_batch,
    planned_rows,
)
from dbos_async._executor.queues.debounce import check_window, debounce_start
from dbos_async._executor.queues.declaration import Queue, queue_settings
from dbos_async._executor.queues.enqueue import (
    announce,
    announcement_key,
    start_deduplicated,
)
from dbos_async._executor.queues.options import DeduplicationPolicy, check_options
from dbos_async._executor.registry import DataSource, add_data_source
from dbos_async._executor.serialization import Formats, SerializationType, Signature
from dbos_async._executor.start import (
    CallContext,
    Placement,
    StartPlan,
    check_name,
    plan_start,
)
from dbos_async._executor.tasks import TaskOwner
from dbos_async._executor.telemetry.tracing import traced_attributes
from dbos_async._sysdb.application import ApplicationDatabase
from dbos_async._sysdb.database import StartResult, SystemDatabase
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async._sysdb.shard_keys import bind_shard_keys, validate_shard_key
from dbos_async._sysdb.statements import OutgoingMessage, Payload
from dbos_async._validation import check_identifier
from dbos_async.config import DEFAULT_EXECUTOR_ID, DBOSConfig
from dbos_async.errors import ConfigurationError, DBOSError, InvalidArgumentError

logger = logging.getLogger("dbos_async")


class DBOSClient(Operator):
    """A client of the workflows in a system database, for processes that run none.

    ``async with DBOSClient(system_database_url=...) as client:`` connects, verifies the
    schema (it never migrates) and starts its notification listener; leaving closes them.
    Settings not given come from the configuration file and the environment like an
    executor's (``config_file=``, ``DBOS_<NAME>``).
    ``application_name`` (or ``DBOS_APPLICATION_NAME``) is the application the client acts
    for when several share the system database: it owns what the client enqueues, queues
    and versions it registers, and scopes listings and versions; it also names the client's
    connections.

    Besides ``enqueue``, ``enqueue_many``, ``send(connection=...)``,
    ``send_bulk(connection=...)`` and ``register_queue``, it has the
    operator API of :class:`~dbos_async.DBOS` (defined once, in
    :class:`~dbos_async._executor.operator.Operator`); the values it reads are plain JSON
    (or what its ``serializer`` decodes). ``serializer`` and ``allow_pickle`` are those of
    an executor: the format it writes in, and whether it reads ``py_pickle``. Application
    databases registered with :meth:`data_source` are covered by its rewinds, deletes,
    exports and imports as by an executor's.
    """

    config: DBOSConfig
    """Its settings: those given, then the configuration file's and the environment's."""
    application_name: str | None
    """The application it acts for (None: every application's workflows)."""

    def __init__(self, system_database_url: str | None = None, *, schema_name: str = "dbos",
                 application_name: str | None = None, **settings: Any) -> None:
        application_name = (application_name
                            or DBOSConfig.load(settings.get("config_file")).application_name)
        self.config = DBOSConfig.load(
            system_database_url=system_database_url, schema_name=schema_name,
            connection_name=(settings.pop("connection_name", None) or application_name
                             or "dbos_async_client"),
            run_migrations=False, application_name=application_name, **settings)
        self.application_name = self.config.application_name
        self._sysdb: SystemDatabase | None = None
        self._data_sources: dict[str, DataSource] = {}
        self._as_peer = _ClientPeer(self)
        self._background = TaskOwner("client")
        self._state = "new"

    # ---- Lifecycle ----

    def data_source(self, name: str, url: str, *, schema: str = "dbos",
                    pool_size: int = 2) -> None:
        """Register an application database the executors' transactions record their
        outcomes in (``@dbos.transaction(data_source=name)``), so that this client's
        rewinds, deletes, exports and imports cover those records as an executor's do:
        without it, a transaction from a rewind's cut on would replay its recorded outcome
        instead of running again. Opened at entry, never migrated (an executor creates its
        ``datasource_outputs`` table).

        Args:
            name: the data source's name, as the executors register it.
            url: its PostgreSQL URL.
            schema: the schema of its ``datasource_outputs`` table.
            pool_size: the most connections its pool opens.

        Raises:
            DBOSError: called once entered, a name registered twice, or a bad option.
        """
        if self._state != "new":
            raise DBOSError("Register data sources before entering the DBOSClient")
        add_data_source(self._data_sources, DataSource(name, url, schema, pool_size))

    async def __aenter__(self) -> DBOSClient:
        if self._state != "new":
            raise DBOSError("A DBOSClient can be entered only once; create a new one")
        url = self.config.system_database_url
        if url is None:
            raise ConfigurationError("DBOSClient needs a system_database_url (or "
                                     "DBOS_SYSTEM_DATABASE_URL)")
        sysdb = system_database_for(self.config, url)
        self._sysdb = sysdb
        try:
            await sysdb.open(run_migrations=False)
            for source in self._data_sources.values():
                database = application_database_for(self.config, source)
                await database.open(run_migrations=False)
                self._as_peer.application_databases[source.name] = database
            await start_notifications(sysdb, url, self.config, self._background.supervise)
        except BaseException:
            self._state = "closed"
            await self._close()
            raise
        self._state = "running"
        logger.debug("DBOSClient connected to %s", redact(url))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._state == "running":
            self._state = "closed"
            await self._close()

    async def _close(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._sysdb is not None and self._sysdb.notifications is not None:
                await self._sysdb.notifications.stop()
            await self._background.close(0)
            for database in self._as_peer.application_databases.values():
                await database.close()
            if self._sysdb is not None:
                await self._sysdb.close()

    # ---- Operator hooks (see executor/operator.py) ----

    def _firing_executor_id(self) -> str:
        return self.config.executor_id or DEFAULT_EXECUTOR_ID

    def _peer(self, during_shutdown: bool = False) -> Peer:
        return self._as_peer

    async def _handle(self, workflow_id: str,
                      shard_key: str | None = None) -> WorkflowHandle[Any]:
        # Plain JSON: no signature to look up.
        return workflow_handle(self._as_peer, workflow_id, shard_key=shard_key)

    # ---- Enqueue and send ----

    async def enqueue(
        self,
        queue_name: str,
        workflow_name: str,
        *args: Any,
        workflow_id: str | None = None,
        priority: int = 0,
        deduplication_id: str | None = None,
        deduplication_policy: DeduplicationPolicy = "reject",
        partition_key: str | None = None,
        delay: float | None = None,
        application_version: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the workflow's, not this call's)
        class_name: str | None = None,
        config_name: str | None = None,
        authenticated_user: str | None = None,
        authenticated_roles: Sequence[str] | None = None,
        attributes: dict[str, Any] | None = None,
        connection: asyncpg.Connection | None = None,
        shard_key: str | None = None,
        app_version: str | None = None,
        workflow_id_reuse_policy: WorkflowIDReusePolicy | None = None,
        serialization_type: SerializationType = None,
        **kwargs: Any,
    ) -> WorkflowHandle[Any]:
        """Enqueue workflow ``workflow_name`` on ``queue_name`` with these arguments (stored
        as portable JSON, or with the client's ``serializer``), for any executor that
        registers it. Like the SQL function
        ``enqueue_workflow``: an existing ``workflow_id`` returns that workflow; a
        ``deduplication_id`` held by an active workflow of the queue raises
        :class:`QueueDeduplicatedError` (``deduplication_policy="reject"``) or returns that
        workflow's handle (``"return_existing"``), as ``SetEnqueueOptions`` does.
        ``application_version=None`` leaves it unversioned (run by an executor of the latest
        version). ``attributes`` (a JSON-serializable dict) are stored with the workflow.
        ``shard_key`` is the workflow's key on a sharded database (required there).
        ``authenticated_user`` and ``authenticated_roles`` are recorded as the identity it
        runs under; the executor that dequeues it checks them against the workflow's
        ``required_roles``.
        ``app_version`` is the deprecated name of ``application_version``.
        ``workflow_id_reuse_policy="reject"`` raises :class:`WorkflowIDInUseError` if
        ``workflow_id`` is in use (by default that workflow's handle is returned).
        ``serialization_type`` stores the arguments (and so the result) as ``"portable"``
        JSON or ``"native"`` pickle (with ``allow_pickle``) whatever the client's
        ``serializer``.

        With ``connection``, the insert runs on that connection, inside the transaction the
        caller holds (in a savepoint, so a duplicate does not abort it): it exists only if
        the caller commits, and the claim loops' wake-up (``pg_notify``) is delivered at
        that commit."""
        check_identifier(queue_name, "queue_name")
        check_identifier(workflow_name, "workflow_name")
        for argument, value in {"class_name": class_name, "config_name": config_name,
                                "authenticated_user": authenticated_user}.items():
            check_identifier(value, argument, optional=True)
        if app_version is not None:
            warnings.warn("DBOSClient.enqueue(app_version=...) is deprecated; use "
                          "application_version=...", DeprecationWarning, stacklevel=2)
            if application_version is not None and application_version != app_version:
                raise DBOSError("Give application_version or its deprecated name "
                                "app_version, not both")
            application_version = app_version
        validate_shard_key(shard_key)
        check_options({"priority": priority, "delay": delay, "timeout": timeout,
                        "workflow_id": workflow_id, "deduplication_id": deduplication_id,
                        "deduplication_policy": deduplication_policy,
                        "partition_key": partition_key,
                        "application_version": application_version})
        plan = self._plan(
            CallContext(workflow_id=workflow_id, timeout=timeout,
                        reuse_policy=check_reuse_policy(workflow_id_reuse_policy),
                        attributes=attributes_json(traced_attributes(attributes)),
                        shard_key=shard_key,
                        authentication=Authentication.of(authenticated_user,
                                                         authenticated_roles)),
            workflow_name, args, kwargs, application_version,
            Placement(queue_name, priority=priority, deduplication_id=deduplication_id,
                      partition_key=partition_key, delay=delay),
            class_name=class_name, config_name=config_name,
            serialization=self._as_peer.formats.chosen(serialization_type))
        sysdb = self._as_peer.system_database

        def start() -> Awaitable[StartResult]:
            if connection is None:
                return sysdb.start_workflow(plan.row, plan.creator_xid)
            return sysdb.start_workflow_on(
                connection, plan.row, plan.creator_xid,
                announce=(ENQUEUE_CHANNEL, announcement_key(plan.row)))

        started = await start_deduplicated(sysdb, start, queue_name, deduplication_id,
                                           deduplication_policy, shard_key)
        if isinstance(started, tuple):  # "return_existing": the holder's handle
            return workflow_handle(self._as_peer, started[0], shard_key=shard_key)
        if workflow_id_reuse_policy == "reject":
            started.refuse_reuse()
        check_name(started, plan.workflow_id, workflow_name)
        if started.created and connection is None:
            announce(sysdb, plan.row)
        return workflow_handle(self._as_peer, plan.workflow_id, shard_key=shard_key)

    def _plan(self, call: CallContext, workflow_name: str, args: Sequence[Any],
              kwargs: Mapping[str, Any], application_version: str | None,
              placement: Placement, serialization: str | None = None,
              **columns: str | None) -> StartPlan:
        """The start plan of an enqueue by name: the arguments in format ``serialization``
        (None: the client's, portable JSON by default)."""
        peer = self._as_peer
        inputs = peer.formats.encode_inputs(tuple(args), dict(kwargs), workflow_name,
                                            serialization)
        return plan_start(call, name=workflow_name, inputs=inputs,
                          executor_id=self.config.executor_id or DEFAULT_EXECUTOR_ID,
                          application_version=application_version,
                          now_ms=peer.system_database.clock.now_ms(), placement=placement,
                          **columns)

    async def enqueue_many(self, queue_name: str,
                           requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Enqueue every row of ``requests`` (each naming its workflow) on ``queue_name``
        as ``DBOS.enqueue_many`` does: all rows or none, in one statement per shard key
        (a large batch in several, in one transaction, the event loop let run between
        them).

        Args:
            queue_name: the queue the rows go on.
            requests: the rows, each an :class:`EnqueueRequest` naming its workflow.

        Returns:
            One :class:`EnqueueResult` per row, in order.

        Raises:
            DBOSError: for a bad batch (see ``DBOS.enqueue_many``); nothing is written.
        """
        if not isinstance(queue_name, str) or not queue_name:
            raise DBOSError("queue_name must be a non-empty string")

        def plan(index: int, r: EnqueueRequest) -> Planned:
            if not isinstance(r.workflow, str) or not r.workflow:
                raise DBOSError(f"A client names its workflow (a non-empty string), got "
                                f"{r.workflow!r}")
            return (self._plan(r.call(CallContext()), r.workflow, r.args, r.kwargs,
                               r.application_version, r.placement(queue_name)), None)

        return await enqueue_batch(self._as_peer, await planned_rows(requests, plan))

    def send(self, destination_id: str, message: Any, topic: str | None = None,
             idempotency_key: str | None = None, *, shard_key: str | None = None,
             send_to_forks: bool = False, serialization_type: SerializationType = None,
             connection: asyncpg.Connection | None = None) -> Coroutine[Any, Any, None]:
        """Send ``message`` to workflow ``destination_id`` (see ``DBOS.send``, also for
        ``send_to_forks`` and ``serialization_type``). With ``connection``, the message is
        inserted in the caller's transaction (in a savepoint): it is delivered only if the
        caller commits, and the receiver is woken at that commit."""
        if connection is None:
            return super().send(destination_id, message, topic, idempotency_key,
                                shard_key=shard_key, send_to_forks=send_to_forks,
                                serialization_type=serialization_type)
        _no_forks_in_transaction(send_to_forks)
        formats = self._as_peer.formats
        text = formats.encode_as(formats.chosen(serialization_type), message, "a message")
        return self._send_in_transaction(connection, destination_id, text, topic,
                                         idempotency_key, shard_key)

    def send_bulk(self, messages: Sequence[SendMessage], *, send_to_forks: bool = False,
                  serialization_type: SerializationType = None,
                  connection: asyncpg.Connection | None = None) -> Coroutine[Any, Any, None]:
        """Send a batch (see ``DBOS.send_bulk``). With ``connection``, the batch is inserted
        in the caller's transaction (in a savepoint): delivered only if the caller commits,
        its receivers woken at that commit."""
        if connection is None:
            return super().send_bulk(messages, send_to_forks=send_to_forks,
                                     serialization_type=serialization_type)
        _no_forks_in_transaction(send_to_forks)
        return self._send_bulk_in_transaction(
            connection, messaging.outgoing(messages, self._as_peer.formats, serialization_type))

    async def _send_bulk_in_transaction(self, conn: asyncpg.Connection,
                                        batch: list[OutgoingMessage]) -> None:
        async with conn.transaction():
            await self._as_peer.system_database.send_many_on(conn, batch)

    async def _send_in_transaction(self, conn: asyncpg.Connection, destination_id: str,
                                   message: Payload, topic: str | None,
                                   idempotency_key: str | None,
                                   shard_key: str | None) -> None:
        stored_topic, message_uuid = messaging.message_address(destination_id, topic,
                                                               idempotency_key)
        with bind_shard_keys({destination_id: shard_key}):
            async with conn.transaction():
                await self._as_peer.system_database.send_on(conn, destination_id, message_uuid,
                                                   stored_topic, message)

    # ---- Queues ----

    @queue_settings(Queue)
    async def register_queue(self, *settings: Any, **named: Any) -> None:
        """Store (upsert) a queue's settings in the ``queues`` table, where executors that
        listen to it by name find them: ``register_queue(name, ...)`` takes the arguments
        of :class:`~dbos_async.Queue`, checked as ``Queue`` checks them."""
        await self._as_peer.system_database.upsert_queue(Queue(*settings, **named)._record)


class _ClientPeer(Peer):
    """A client as the peer the shared operations run through (the
    :class:`~dbos_async._executor.peer.Peer` protocol), kept off the client's public API."""

    def __init__(self, client: DBOSClient) -> None:
        self._client = client
        self.config = client.config
        self.formats = Formats.of(client.config)
        # Those registered with DBOSClient.data_source(), once entered.
        self.application_databases: dict[str, ApplicationDatabase] = {}

    @property
    def system_database(self) -> SystemDatabase:
        """The connected system database.

        Raises:
            DBOSError: the client is not entered, or has been closed.
        """
        client = self._client
        if client._state != "running" or client._sysdb is None:
            raise DBOSError("DBOSClient is not connected: use `async with DBOSClient(...)`"
                            if client._state == "new" else "DBOSClient has been closed")
        return client._sysdb

    def signature_of(self, workflow_name: str) -> Signature | None:
        """None: a client has no workflow code, so values stay plain JSON."""
        return None

    def running_result(self, workflow_id: str,
                       shard_key: str | None = None) -> asyncio.Future[Any] | None:
        """None: no workflow runs in a client, so its results come from the database."""
        return None

    def interrupt_local(self, waiters: set[str]) -> None:
        """Nothing to interrupt: a client runs no workflow whose waits a cancel ends."""
        return None


def _no_forks_in_transaction(send_to_forks: bool) -> None:
    """A send in the caller's transaction goes to its destinations only."""
    if send_to_forks:
        raise InvalidArgumentError("send_to_forks", "is not supported with connection=; "
                                   "send to the forks after the transaction commits")


class DebouncerClient:
    """A debouncer run from a client (the ``dbos`` package's ``DebouncerClient``): collapse
    bursts of enqueues of the workflow named ``workflow_name`` on ``queue_name`` into one
    run with the latest arguments, as an executor's ``queue.debouncer(...)`` does; a burst
    may mix calls from clients and executors (both debounce under the key given).

    ``await debouncer.debounce(key, *args, **kwargs)``: if a workflow debounced under
    ``key`` on the queue has not started yet, it gets these arguments and its start moves
    to ``period`` seconds from now, never past ``max_delay`` seconds after the burst's first
    call; otherwise a new one is enqueued to start in ``period`` seconds.
    """

    def __init__(self, client: DBOSClient, queue_name: str, workflow_name: str, *,
                 period: float, max_delay: float | None = None,
                 shard_key: str | None = None,
                 application_version: str | None = None) -> None:
        """Args:
            client: the client whose system database it enqueues on.
            queue_name: the queue the workflow runs from.
            workflow_name: the registered name of the workflow.
            period: seconds of quiet after the last call before the workflow starts.
            max_delay: the most seconds after a burst's first call it may start (None: no
                bound).
            shard_key: the key the workflows live under (a sharded database).
            application_version: the version whose executors may run them (None: the
                latest).

        Raises:
            DBOSError: a period that is not positive, or a bad delay, name or key.
        """
        check_window(period, max_delay)
        check_identifier(queue_name, "queue name")
        check_identifier(workflow_name, "workflow name")
        check_identifier(application_version, "application_version", optional=True)
        validate_shard_key(shard_key)
        self.client = client
        self.queue_name = queue_name
        self.workflow_name = workflow_name
        self.period = float(period)
        self.max_delay = float(max_delay) if max_delay is not None else None
        self.shard_key = shard_key
        self.application_version = application_version

    async def debounce(self, key: str, /, *args: Any, **kwargs: Any) -> WorkflowHandle[Any]:
        """Join (or start) the burst debounced under ``key`` with these arguments.

        Args:
            key: the burst's key on the queue.
            *args: the workflow's positional arguments (the latest call's win).
            **kwargs: its keyword arguments.

        Returns:
            The handle of the one workflow that will run.

        Raises:
            InvalidArgumentError: a bad key.
            QueueDeduplicatedError: the key stayed held by a workflow that had started.
        """
        check_identifier(key, "debounce key")
        client = self.client
        placement = Placement(self.queue_name, deduplication_id=key, delay=self.period,
                              debounced=True, max_delay=self.max_delay)
        peer = client._peer()
        inputs = peer.formats.encode_inputs(tuple(args), dict(kwargs), self.workflow_name)

        def plan() -> StartPlan:
            return client._plan(CallContext(shard_key=self.shard_key), self.workflow_name,
                                args, kwargs, self.application_version, placement)

        workflow_id, shard_key = await debounce_start(
            peer.system_database, self.queue_name, key, self.workflow_name, inputs,
            self.period, self.shard_key, plan)
        return workflow_handle(peer, workflow_id, shard_key=shard_key)
