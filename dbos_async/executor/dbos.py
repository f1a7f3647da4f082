"""The DBOS executor: registration, lifecycle, and the public workflow API."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from dbos_async.config import DBOSConfig
from dbos_async.errors import (
    DBOSError,
    QueueNotFoundError,
    WorkflowNotRegisteredError,
)
from dbos_async.executor import maintenance, messaging, patches, recovery, workflows
from dbos_async.executor.cancellation import CancellationWatcher
from dbos_async.executor.context import (
    WorkflowContext,
    current_workflow,
    take_workflow_id,
    workflow_of_step,
    workflow_timeout,
)
from dbos_async.executor.dispatcher import QueueRuntime
from dbos_async.executor.handles import WorkflowHandle
from dbos_async.executor.operator import Operator
from dbos_async.executor.peer import start_notifications, system_database_for
from dbos_async.executor.queues import LimiterSpec, Queue, internal_queue
from dbos_async.executor.registry import Registry, WorkflowInfo, is_method
from dbos_async.executor.serialization import Signature, to_json
from dbos_async.executor.steps import RetryOn, StepInfo, StepOptions, attempt, run_checkpointed
from dbos_async.executor.tasks import TaskOwner
from dbos_async.sysdb.connection import redact
from dbos_async.sysdb.database import SystemDatabase
from dbos_async.sysdb.statements import STREAM_CLOSED_SERIALIZED

logger = logging.getLogger("dbos_async")

P = ParamSpec("P")
R = TypeVar("R")

AsyncFn = Callable[P, Coroutine[Any, Any, R]]


class DBOS(Operator):
    """One durable-execution executor on one system database.

    Decorate workflows and steps with it, then run it as an async context manager: entering
    connects, migrates, registers the application version and recovers this executor's
    pending workflows; leaving lets running workflows finish (up to the grace period), stops
    every task it started and closes every connection. Several instances can share a process.

    The operator API it shares with :class:`~dbos_async.DBOSClient` (handles, ``send``,
    ``get_event``, listings, cancel, resume, fork, ...) is defined in
    :class:`~dbos_async.executor.operator.Operator`.
    """

    def __init__(self, config: DBOSConfig | None = None, **settings: Any) -> None:
        if config is not None and settings:
            config = config.model_copy(update=settings)
        self.config = config if config is not None else DBOSConfig.load(**settings)
        self._registry = Registry()
        self._running: dict[str, workflows.Execution] = {}
        self._sysdb: SystemDatabase | None = None
        self.tasks = TaskOwner()
        # Listener and notifier: stopped after the workflows, before the pool closes.
        self.background = TaskOwner()
        self.application_version: str | None = self.config.application_version
        self.recovery_errors: list[DBOSError] = []
        self.claim_gate = recovery.ClaimGate()
        # Enqueued workflows a dispatcher here leaves queued for want of their function
        # (one per queue and function name; also logged as a warning).
        self.queue_warnings: list[WorkflowNotRegisteredError] = []
        self._state = "new"
        # Queues declared here, queues to dispatch (None: every declared one), dispatchers.
        self._queues: dict[str, Queue] = {}
        self._listen: set[str] | None = (set(self.config.listen_queues)
                                         if self.config.listen_queues is not None else None)
        self.queue_runtime: QueueRuntime | None = None
        # Interrupts steps and waits of cancelled workflows (one task for all of them).
        self.cancellation = CancellationWatcher(self)

    # ---- Registration ----

    def workflow(
        self, *, name: str | None = None
    ) -> Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
        """Make an ``async def`` function (or method) a durable workflow."""

        def decorate(fn: AsyncFn[P, R]) -> AsyncFn[P, R]:
            _require_async(fn, "@dbos.workflow()")
            method = is_method(fn)
            info = WorkflowInfo(
                name=name or fn.__qualname__,
                fn=fn,
                signature=Signature(fn, skip_first=method),
                is_method=method,
                owner=self,
            )
            self._registry.add_workflow(info)

            @functools.wraps(fn)
            def call(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
                return self._call_workflow(info, args, kwargs)

            call.__dbos_workflow__ = info  # type: ignore[attr-defined]
            return call

        return decorate

    def step(
        self,
        *,
        name: str | None = None,
        retries: int = 0,
        retry_interval: float = 1.0,
        backoff_rate: float = 2.0,
        max_retry_interval: float = 60.0,
        retry_on: RetryOn | None = None,
        timeout: float | None = None,
        cancellable: bool = True,
    ) -> Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
        """Make an ``async def`` function a step: run once per workflow, its result recorded.

        See :class:`~dbos_async.executor.steps.StepOptions` for the retry options.
        """

        def decorate(fn: AsyncFn[P, R]) -> AsyncFn[P, R]:
            _require_async(fn, "@dbos.step()")
            options = StepOptions(
                name=name or fn.__qualname__, retries=retries, retry_interval=retry_interval,
                backoff_rate=backoff_rate, max_retry_interval=max_retry_interval,
                retry_on=retry_on, timeout=timeout, cancellable=cancellable,
            )
            info = StepInfo(fn, options, Signature(fn))

            @functools.wraps(fn)
            def call(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
                ctx = current_workflow()
                if ctx is None:
                    # Outside a workflow, or inside another step: just run it.
                    return attempt(info, args, kwargs)
                # Allocated now, in call order, so concurrent fan-out replays identically.
                step_id = ctx.allocate_step_id()
                return run_checkpointed(ctx, step_id, info, args, kwargs)

            return call

        return decorate

    def register_instance(self, instance: object, name: str) -> None:
        """Register an object whose workflow methods can be recovered under ``name``."""
        self._registry.add_instance(instance, name)
        instance.__dict__["__dbos_instance_name__"] = name

    def instance_name(self, instance: object) -> str:
        name = getattr(instance, "__dbos_instance_name__", None)
        if not isinstance(name, str):
            raise DBOSError(
                f"Workflow methods of {type(instance).__qualname__} need a registered instance: "
                "call dbos.register_instance(obj, name) first"
            )
        return name

    # ---- Queues (see executor/queues.py and executor/dispatcher.py) ----

    def queue(
        self,
        name: str,
        concurrency: int | None = None,
        worker_concurrency: int | None = None,
        limiter: LimiterSpec | None = None,
        *,
        partition_queue: bool = False,
        partition_concurrency: int | None = None,
        partition_worker_concurrency: int | None = None,
        partition_limiter: LimiterSpec | None = None,
        polling_interval: float = 1.0,
    ) -> Queue:
        """Declare a queue with this executor (see :class:`~dbos_async.Queue`)."""
        return Queue(name, concurrency, worker_concurrency, limiter,
                     partition_queue=partition_queue,
                     partition_concurrency=partition_concurrency,
                     partition_worker_concurrency=partition_worker_concurrency,
                     partition_limiter=partition_limiter, polling_interval=polling_interval,
                     dbos=self)

    def register_queue(self, queue: Queue) -> Queue:
        """Declare ``queue`` with this executor: stored in the queues table on enter, and
        dispatched here unless :meth:`listen` chose other queues."""
        if self._state != "new":
            raise DBOSError("Declare queues before entering DBOS")
        existing = self._queues.get(queue.name)
        if existing is not None and existing is not queue:
            raise DBOSError(f"A queue named {queue.name!r} is already declared")
        queue.bind(self)
        self._queues[queue.name] = queue
        return queue

    def listen(self, *queues: str | Queue) -> None:
        """Dequeue only from these queues (declared here, or stored in the queues table by
        another process); call before entering. Repeated calls add queues."""
        if self._state != "new":
            raise DBOSError("Call listen() before entering DBOS")
        names = {q.name if isinstance(q, Queue) else q for q in queues}
        self._listen = (self._listen or set()) | names

    async def get_queue(self, name: str) -> Queue:
        """A queue declared here, or one stored in the queues table (by any process)."""
        self._require_running()
        queue = self._queues.get(name)
        if queue is not None:
            return queue
        records = await self.system_database.list_queues([name])
        if not records:
            raise QueueNotFoundError(name)
        queue = Queue.from_record(records[0])
        queue.bind(self)
        return queue

    async def _start_queues(self) -> None:
        sysdb = self.system_database
        for queue in self._queues.values():
            await sysdb.upsert_queue(queue.record)
        names = set(self._queues) if self._listen is None else set(self._listen)
        records = [self._queues[n].record for n in sorted(names) if n in self._queues]
        missing = sorted(names - set(self._queues))
        if missing:
            stored = {r.name: r for r in await sysdb.list_queues(missing)}
            for name in missing:
                if name not in stored:
                    raise QueueNotFoundError(name)
                records.append(stored[name])
        # Every executor runs resumed workflows (DBOS's internal queue).
        internal = internal_queue().record
        if internal.name not in names:
            records.append(internal)
        self.queue_runtime = QueueRuntime(self, records)
        self.queue_runtime.start()

    async def _stop_queues(self) -> None:
        if self.queue_runtime is not None:
            await self.queue_runtime.stop()

    # ---- Starting and recovering workflows (retrieve_workflow: see Operator) ----

    def start_workflow(
        self, fn: AsyncFn[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, WorkflowHandle[R]]:
        """Start a workflow in the background and return its handle.

        Inside a workflow this is a checkpointed child start, its position fixed at the call.
        """
        info, full_args = self._workflow_info(fn, args)
        request = self._start_request(info, full_args, kwargs)
        return workflows.start(self, request)

    async def recover_pending_workflows(self) -> list[WorkflowHandle[Any]]:
        """Resume this executor's PENDING workflows that are not running here."""
        self._require_running()
        return await recovery.recover_pending(self)

    def _call_workflow(self, info: WorkflowInfo, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Coroutine[Any, Any, Any]:
        request = self._start_request(info, args, kwargs)
        return self._start_and_wait(request)

    async def _start_and_wait(self, request: workflows.StartRequest) -> Any:
        handle = await workflows.start(self, request)
        return await handle.get_result()

    def _start_request(self, info: WorkflowInfo, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> workflows.StartRequest:
        # Read synchronously, at the call: the caller's context, not the awaiting one, counts.
        parent = current_workflow()
        return workflows.StartRequest(
            info=info,
            args=args,
            kwargs=kwargs,
            workflow_id=take_workflow_id(),
            timeout=workflow_timeout(),
            parent=parent,
            parent_step_id=parent.allocate_step_id() if parent is not None else None,
        )

    def _workflow_info(self, fn: Callable[..., Any],
                       args: tuple[Any, ...]) -> tuple[WorkflowInfo, tuple[Any, ...]]:
        if inspect.ismethod(fn):
            args = (fn.__self__, *args)
            fn = fn.__func__
        info = getattr(fn, "__dbos_workflow__", None)
        if not isinstance(info, WorkflowInfo):
            raise DBOSError(
                f"{getattr(fn, '__qualname__', fn)!r} is not a workflow: decorate it with "
                "@dbos.workflow()"
            )
        if info.owner is not self:
            raise DBOSError(f"Workflow {info.name!r} is registered with another DBOS instance")
        return info, args

    # ---- Messages, events, streams and durable sleep (send, get_event: see Operator) ----

    def recv(self, topic: str | None = None,
             timeout: float | None = 60.0) -> Coroutine[Any, Any, Any]:
        """In a workflow: consume the oldest message on ``topic``; None after ``timeout``."""
        ctx = current_workflow()
        if ctx is None:
            raise DBOSError("recv can only be called from a workflow (not a step)")
        step_id = ctx.allocate_step_id()
        timeout_id = ctx.allocate_step_id()
        return messaging.recv(ctx, step_id, timeout_id, topic, timeout)

    def set_event(self, key: str, value: Any) -> Coroutine[Any, Any, None]:
        """Publish ``value`` under ``key`` for the current workflow (from it or a step)."""
        text = to_json(value, f"event {key!r}")
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.set_event(ctx, workflow_of_step(), step_id, key, text)

    def write_stream(self, key: str, value: Any) -> Coroutine[Any, Any, None]:
        """Append ``value`` to the current workflow's stream ``key``."""
        text = to_json(value, f"a value of stream {key!r}")
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.write_stream(ctx, workflow_of_step(), step_id, key, text,
                                      messaging.WRITE_STREAM)

    def close_stream(self, key: str) -> Coroutine[Any, Any, None]:
        """Close the current workflow's stream ``key``: readers stop after its last value."""
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.write_stream(ctx, workflow_of_step(), step_id, key,
                                      STREAM_CLOSED_SERIALIZED,
                                      messaging.CLOSE_STREAM)

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        """Sleep durably: in a workflow the wake-up time is a checkpoint, so a recovered
        workflow sleeps only what remains."""
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.sleep(ctx, step_id, seconds)

    # ---- Maintenance jobs (see executor/maintenance.py) ----

    async def garbage_collect(self, cutoff_epoch_ms: int,
                              batch_size: int | None = None) -> int | None:
        """Run the retention job now: delete terminal workflows finished before the cutoff.
        Returns how many, or None if another executor is running the job."""
        self._require_running()
        return await maintenance.run_retention(
            self, cutoff_epoch_ms, batch_size or self.config.retention_batch_size)

    async def global_timeout(self, cutoff_epoch_ms: int) -> list[str] | None:
        """Run the global timeout now: cancel in-flight workflows created before the
        cutoff. Returns their IDs, or None if another executor is running the job."""
        self._require_running()
        return await maintenance.run_global_timeout(self, cutoff_epoch_ms)

    # ---- Patches (see executor/patches.py) ----

    def patch(self, name: str) -> Coroutine[Any, Any, bool]:
        """In a workflow: True where new executions take the new code path (recorded as a
        ``DBOS.patch-<name>`` checkpoint), False where a replay of an execution recorded
        before the patch must take the old one. See executor/patches.py."""
        ctx = current_workflow()
        if ctx is None:
            raise DBOSError("patch can only be called from a workflow (not a step)")
        return patches.patch(ctx, name)

    def deprecate_patch(self, name: str) -> Coroutine[Any, Any, bool]:
        """In a workflow, once no execution from before patch ``name`` remains: always
        True; consumes the marker's position where an execution recorded it."""
        ctx = current_workflow()
        if ctx is None:
            raise DBOSError("deprecate_patch can only be called from a workflow (not a step)")
        return patches.deprecate_patch(ctx, name)

    # ---- Bookkeeping used by the executor's modules ----

    @property
    def system_database(self) -> SystemDatabase:
        # Workflows finishing during the shutdown grace period still write.
        if self._sysdb is None or self._state not in ("running", "stopping"):
            self._require_running()
        assert self._sysdb is not None
        return self._sysdb

    @property
    def registry(self) -> Registry:
        return self._registry

    def signature_of(self, workflow_name: str) -> Signature | None:
        info = self._registry.workflows.get(workflow_name)
        return info.signature if info is not None else None

    def running_result(self, workflow_id: str) -> asyncio.Future[Any] | None:
        execution = self._running.get(workflow_id)
        return execution.result if execution is not None else None

    def interrupt_local(self, workflow_ids: set[str]) -> None:
        self.cancellation.interrupt(workflow_ids)

    def running_ids(self) -> list[str]:
        return list(self._running)

    def track(self, workflow_id: str, execution: workflows.Execution) -> None:
        self._running[workflow_id] = execution

    def untrack(self, workflow_id: str, execution: workflows.Execution) -> None:
        if self._running.get(workflow_id) is execution:
            del self._running[workflow_id]

    def _require_running(self) -> None:
        if self._state != "running":
            raise DBOSError(
                "DBOS is not running: enter it first with `async with dbos:`"
                if self._state == "new"
                else "DBOS has been shut down"
            )

    # ---- Operator hooks (see executor/operator.py) ----

    def _require_ready(self) -> None:
        self._require_running()

    def _contexts(self) -> tuple[WorkflowContext | None, WorkflowContext | None]:
        return current_workflow(), workflow_of_step()

    def _next_start(self) -> tuple[str | None, float | None]:
        return take_workflow_id(), workflow_timeout()

    # ---- Lifecycle ----

    async def __aenter__(self) -> DBOS:
        if self._state != "new":
            raise DBOSError("A DBOS instance can be entered only once; create a new one")
        url = self.config.system_database_url
        if url is None:
            from dbos_async.sysdb.embedded import start_embedded_server

            url = await start_embedded_server(self.config.data_dir)
        self._sysdb = system_database_for(self.config, url)
        try:
            await self._sysdb.open(run_migrations=self.config.run_migrations)
            await self._start_notifications(url)
            self.cancellation.start(self._sysdb)
            if self.application_version is None:
                self.application_version = self._registry.version_hash()
            await self._sysdb.register_version(self.application_version)
            self._state = "running"
            await self._start_queues()
            await recovery.recover_pending(self)
            maintenance.start(self)
        except BaseException:
            self._state = "closed"
            await self._stop_queues()
            await self._stop_notifications()
            await self._sysdb.close()
            raise
        logger.info(
            "DBOS %s started: executor %s, version %s, system database %s",
            self.config.name, self.config.executor_id, self.application_version, redact(url),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state != "running":
            return
        self._state = "stopping"
        try:
            # Dispatchers first: nothing new starts while running workflows finish.
            await self._stop_queues()
            await self.tasks.close(self.config.shutdown_grace_period)
        finally:
            self._state = "closed"
            await self._stop_notifications()
            if self._sysdb is not None:
                await self._sysdb.close()

    async def _start_notifications(self, url: str) -> None:
        assert self._sysdb is not None
        await start_notifications(self._sysdb, url, self.config, self.background.spawn)

    async def _stop_notifications(self) -> None:
        """Flush notifications and stop the listener, then reap the background tasks."""
        if self._sysdb is not None and self._sysdb.notifications is not None:
            await self._sysdb.notifications.stop()
        await self.background.close(0)


def _require_async(fn: Callable[..., Any], decorator: str) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise DBOSError(f"{decorator} needs an `async def` function; "
                        f"{getattr(fn, '__qualname__', fn)!r} is not one")

