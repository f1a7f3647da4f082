"""The runtime: what one entry of an executor (``async with dbos:``) has while it runs.

:class:`~dbos_async.DBOS` builds a fresh :class:`Runtime` on every entry and hands it down;
the executor's modules take it (or a narrower part of it), never the public facade. After
the exit it is closed for good, and the next entry builds another.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from dbos_async._executor.backoff import IdleBackoff
from dbos_async._executor.cancellation import CancellationWatcher
from dbos_async._executor.claim_gate import ClaimGate
from dbos_async._executor.registry import Registry
from dbos_async._executor.serialization import Formats, Signature
from dbos_async._executor.tasks import ExecutorHealth, TaskOwner
from dbos_async._sysdb.application import ApplicationDatabase
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.executor_ids import ExecutorIdLock
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL, WORKFLOW_COMPLETION_CHANNEL, keyed
from dbos_async._sysdb.records import VersionBacklog
from dbos_async._sysdb.shard_keys import WorkflowAddress
from dbos_async._sysdb.statements import QueueRecord
from dbos_async.config import DBOSConfig
from dbos_async.errors import DBOSError, WorkflowNotRegisteredError

State = Literal["starting", "running", "stopping", "closed"]

EXECUTOR_BUSY_KEY = "dbos_async:busy"
"""ENQUEUE_CHANNEL payload: an executor that ran no workflow started one (it wakes the
failover watchers, whose scans may have backed off, so its work is watched at once)."""

BUSY_NOTICE_INTERVAL = 2.5
"""Seconds between two announcements of :data:`EXECUTOR_BUSY_KEY` by one executor at most:
a watcher reset by the last one has not backed off beyond a few seconds since."""

NOT_RUNNING = "DBOS is not running: enter it first with `async with dbos:`"
SHUT_DOWN = "DBOS has been shut down; enter it again with `async with dbos:`"


@dataclass
class ClaimLoopState:
    """What the claim loop of one queue has done (for diagnostics)."""

    queue: QueueRecord
    rounds: int = 0
    # Function names found enqueued here but not registered (each warned about once).
    unregistered: set[str] = field(default_factory=set)


class RuntimeSource(Protocol):
    """What builds a runtime on every entry (the :class:`~dbos_async.DBOS` facade):
    queues and debouncers declared with it find the current runtime through it."""

    @property
    def _current_runtime(self) -> Runtime:
        """The runtime of the current entry; raises :class:`DBOSError` outside one."""
        ...


class Runtime:
    """The system database, settings, registry, running workflows and task owners of one
    running executor. It is a :class:`~dbos_async._executor.peer.Peer` of the system
    database, so handles and operations run on it as they run on a client."""

    def __init__(self, config: DBOSConfig, registry: Registry, sysdb: SystemDatabase,
                 application_version: str) -> None:
        self.config = config
        self.formats = Formats.of(config)
        self.registry = registry
        self._sysdb = sysdb
        self.application_version = application_version
        self.state: State = "starting"
        # (Workflow ID, shard key) -> the result of its execution running here.
        self._running: dict[tuple[str, str | None], asyncio.Future[Any]] = {}
        self._busy_announced: float | None = None  # monotonic seconds
        # Owners, closed in this order: claim loops, then workflows (with the grace period),
        # then the background tasks (listener, notifier, watcher, maintenance).
        self.queue_tasks = TaskOwner("queues")
        self.workflows = TaskOwner("workflows")
        self.background = TaskOwner("background")
        self.claim_gate = ClaimGate()
        # The queues this executor claims from, by name.
        self.claim_loops: dict[str, ClaimLoopState] = {}
        # Interrupts steps and waits of cancelled workflows (one task for all of them).
        self.cancellation = CancellationWatcher(
            IdleBackoff(config.cancellation_poll_interval, config.idle_poll_max_interval))
        # The intervals of the queue watcher's and the failover watcher's polls (None until
        # they start; see dbos_async/_executor/backoff.py).
        self.queue_poll: IdleBackoff | None = None
        self.failover_poll: IdleBackoff | None = None
        # The lock on the executor ID claimed at entry (None until then).
        self.executor_lock: ExecutorIdLock | None = None
        # Rounds of the failover watcher so far (see dbos_async/_executor/failover.py).
        self.failover_scans = 0
        self.recovery_errors: list[DBOSError] = []
        # Enqueued workflows a claim loop here leaves queued for want of their function
        # (one per queue and function name; also logged as a warning).
        self.queue_warnings: list[WorkflowNotRegisteredError] = []
        # The PENDING and ENQUEUED work of other application versions, as last counted
        # (see dbos_async/_executor/versions.py).
        self.waiting_versions: tuple[VersionBacklog, ...] = ()
        # The application databases of the registered data sources, by name (opened at
        # entry, see lifecycle.py).
        self.application_databases: dict[str, ApplicationDatabase] = {}

    @property
    def executor_id(self) -> str:
        """The ID this entry claimed (the one configured, or a numbered variant of it)."""
        if self.executor_lock is None:
            raise DBOSError("The executor has not claimed its executor ID yet")
        return self.executor_lock.executor_id

    def health(self) -> ExecutorHealth:
        """The state of this entry and of each of its background tasks."""
        executor_id = self.executor_lock.executor_id if self.executor_lock is not None \
            else self.config.executor_id
        tasks = (*self.background.health(), *self.queue_tasks.health())
        notifications = self._sysdb.notifications
        listener = None if notifications is None else notifications.not_listening()
        return ExecutorHealth(self.state, executor_id, tasks, self._sysdb.health(), listener,
                              self.waiting_versions)

    def require_running(self) -> None:
        if self.state != "running":
            raise DBOSError(NOT_RUNNING if self.state == "starting" else SHUT_DOWN)

    # ---- The Peer protocol ----

    @property
    def system_database(self) -> SystemDatabase:
        # Start-up, and workflows finishing during the shutdown grace period, still write.
        if self.state == "closed":
            raise DBOSError(SHUT_DOWN)
        return self._sysdb

    def signature_of(self, workflow_name: str) -> Signature | None:
        info = self.registry.workflows.get(workflow_name)
        return info.signature if info is not None else None

    def running_result(self, workflow_id: str,
                       shard_key: str | None = None) -> asyncio.Future[Any] | None:
        return self._running.get((workflow_id, shard_key))

    def interrupt_local(self, waiters: set[str]) -> None:
        self.cancellation.interrupt(waiters)

    # ---- Workflows running here ----

    def running(self) -> list[WorkflowAddress]:
        """The (workflow ID, shard key) of every execution running here."""
        return [WorkflowAddress(*address) for address in self._running]

    def track(self, workflow_id: str, shard_key: str | None,
              result: asyncio.Future[Any]) -> None:
        if not self._running:
            self._announce_busy()
        self._running[(workflow_id, shard_key)] = result

    def _announce_busy(self) -> None:
        """Running nothing, this executor starts a workflow: tell the failover watchers
        elsewhere, at most every ``BUSY_NOTICE_INTERVAL`` (so an executor alternating
        between one workflow and none does not notify for each)."""
        now = time.monotonic()
        if self._busy_announced is None or now - self._busy_announced >= BUSY_NOTICE_INTERVAL:
            self._busy_announced = now
            self._sysdb.notify(ENQUEUE_CHANNEL, EXECUTOR_BUSY_KEY)

    def untrack(self, workflow_id: str, shard_key: str | None,
                result: asyncio.Future[Any]) -> None:
        if self._running.get((workflow_id, shard_key)) is result:
            del self._running[(workflow_id, shard_key)]

    def notify_completion(self, workflow_id: str, shard_key: str | None = None) -> None:
        """Announce that ``workflow_id`` reached a terminal status (after that committed)."""
        self._sysdb.notify(WORKFLOW_COMPLETION_CHANNEL, keyed(workflow_id, shard_key))
