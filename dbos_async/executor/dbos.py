"""The DBOS executor: registration, lifecycle, and the public workflow API."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from dbos_async.config import DBOSConfig
from dbos_async.errors import DBOSError, NonExistentWorkflowError
from dbos_async.executor import messaging, recovery, workflows
from dbos_async.executor.context import (
    current_workflow,
    take_workflow_id,
    workflow_of_step,
    workflow_timeout,
)
from dbos_async.executor.handles import WorkflowHandle, WorkflowStatus
from dbos_async.executor.registry import Registry, WorkflowInfo, is_method
from dbos_async.executor.serialization import Signature, to_json
from dbos_async.executor.steps import RetryOn, StepInfo, StepOptions, attempt, run_checkpointed
from dbos_async.executor.tasks import TaskOwner
from dbos_async.sysdb import connection
from dbos_async.sysdb.connection import redact
from dbos_async.sysdb.database import SystemDatabase
from dbos_async.sysdb.notifications import NotificationDispatcher

logger = logging.getLogger("dbos_async")

P = ParamSpec("P")
R = TypeVar("R")

AsyncFn = Callable[P, Coroutine[Any, Any, R]]


class DBOS:
    """One durable-execution executor on one system database.

    Decorate workflows and steps with it, then run it as an async context manager: entering
    connects, migrates, registers the application version and recovers this executor's
    pending workflows; leaving lets running workflows finish (up to the grace period), stops
    every task it started and closes every connection. Several instances can share a process.
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
        self._state = "new"

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
    ) -> Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
        """Make an ``async def`` function a step: run once per workflow, its result recorded.

        See :class:`~dbos_async.executor.steps.StepOptions` for the retry options.
        """

        def decorate(fn: AsyncFn[P, R]) -> AsyncFn[P, R]:
            _require_async(fn, "@dbos.step()")
            options = StepOptions(
                name=name or fn.__qualname__, retries=retries, retry_interval=retry_interval,
                backoff_rate=backoff_rate, max_retry_interval=max_retry_interval,
                retry_on=retry_on, timeout=timeout,
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

    # ---- Starting and retrieving workflows ----

    def start_workflow(
        self, fn: AsyncFn[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, WorkflowHandle[R]]:
        """Start a workflow in the background and return its handle.

        Inside a workflow this is a checkpointed child start, its position fixed at the call.
        """
        info, full_args = self._workflow_info(fn, args)
        request = self._start_request(info, full_args, kwargs)
        return workflows.start(self, request)

    async def retrieve_workflow(self, workflow_id: str) -> WorkflowHandle[Any]:
        """A handle on an existing workflow, started by any executor."""
        self._require_running()
        row = await self.system_database.get_workflow(workflow_id)
        if row is None:
            raise NonExistentWorkflowError(workflow_id)
        return WorkflowHandle(self, workflow_id, self.running_result(workflow_id),
                              self.signature_of(row["name"]))

    async def get_workflow_status(self, workflow_id: str) -> WorkflowStatus | None:
        self._require_running()
        row = await self.system_database.get_workflow(workflow_id)
        return WorkflowStatus.from_record(row) if row is not None else None

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

    # ---- Messages, events, streams and durable sleep ----

    def send(self, destination_id: str, message: Any, topic: str | None = None,
             idempotency_key: str | None = None) -> Coroutine[Any, Any, None]:
        """Send ``message`` to workflow ``destination_id`` under ``topic``.

        In a workflow the send is a checkpoint (exactly once); in a step it is not recorded
        but lands only while the workflow is still owned by this execution; elsewhere it is a
        plain insert. With ``idempotency_key`` a repeated send delivers once.
        """
        text = to_json(message, "a message")
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.send(self, ctx, workflow_of_step(), step_id, destination_id, text,
                              topic, idempotency_key)

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

    def get_event(self, workflow_id: str, key: str,
                  timeout: float | None = 60.0) -> Coroutine[Any, Any, Any]:
        """Wait up to ``timeout`` seconds for event ``key`` of ``workflow_id``; None if unset."""
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        timeout_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.get_event(self, ctx, step_id, timeout_id, workflow_id, key, timeout)

    async def get_all_events(self, workflow_id: str) -> dict[str, Any]:
        """Every event of ``workflow_id`` with its latest value (a read, not a checkpoint)."""
        self._require_running()
        return await messaging.get_all_events(self, workflow_id)

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
                                      messaging.STREAM_CLOSED_SERIALIZED,
                                      messaging.CLOSE_STREAM)

    def read_stream(self, workflow_id: str, key: str, offset: int = 0) -> AsyncIterator[Any]:
        """The values of stream ``key`` of ``workflow_id`` from ``offset``, as they come.

        Ends at the close marker, or when the workflow is finished and nothing more is there.
        """
        return messaging.read_stream(self, workflow_id, key, offset)

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        """Sleep durably: in a workflow the wake-up time is a checkpoint, so a recovered
        workflow sleeps only what remains."""
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.sleep(ctx, step_id, seconds)

    async def wait_first(self, handles: Sequence[WorkflowHandle[Any]]) -> WorkflowHandle[Any]:
        """The first of ``handles`` whose workflow finishes (successfully or not)."""
        return await messaging.wait_first(handles)

    async def wait_all(self, handles: Sequence[WorkflowHandle[Any]]) -> list[Any]:
        """The results of all ``handles``, in order; raises the first error met."""
        return await messaging.wait_all(handles)

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

    # ---- Lifecycle ----

    async def __aenter__(self) -> DBOS:
        if self._state != "new":
            raise DBOSError("A DBOS instance can be entered only once; create a new one")
        url = self.config.system_database_url
        if url is None:
            from dbos_async.sysdb.embedded import start_embedded_server

            url = await start_embedded_server(self.config.data_dir)
        self._sysdb = SystemDatabase(
            url,
            schema=self.config.schema_name,
            pool_size=self.config.pool_size,
            connect_timeout=self.config.connect_timeout,
            retry_timeout=self.config.db_retry_timeout,
            connection_name=self.config.connection_name,
        )
        try:
            await self._sysdb.open(run_migrations=self.config.run_migrations)
            await self._start_notifications(url)
            if self.application_version is None:
                self.application_version = self._registry.version_hash()
            await self._sysdb.register_version(self.application_version)
            self._state = "running"
            await recovery.recover_pending(self)
        except BaseException:
            self._state = "closed"
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
            await self.tasks.close(self.config.shutdown_grace_period)
        finally:
            self._state = "closed"
            await self._stop_notifications()
            if self._sysdb is not None:
                await self._sysdb.close()

    async def _start_notifications(self, url: str) -> None:
        sysdb = self._sysdb
        assert sysdb is not None
        config = self.config
        dispatcher = NotificationDispatcher(
            connect=functools.partial(connection.connect, url, config.connect_timeout,
                                      config.connection_name),
            pool=lambda: sysdb.pool,
            use_listen_notify=config.use_listen_notify,
            coalesce_ms=config.notification_coalesce_ms,
            poll_interval=config.notification_poll_interval,
            max_polling_queries=config.max_polling_queries or max(1, config.pool_size // 2),
        )
        sysdb.notifications = dispatcher
        await dispatcher.start(self.background.spawn)

    async def _stop_notifications(self) -> None:
        """Flush notifications and stop the listener, then reap the background tasks."""
        if self._sysdb is not None and self._sysdb.notifications is not None:
            await self._sysdb.notifications.stop()
        await self.background.close(0)


def _require_async(fn: Callable[..., Any], decorator: str) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise DBOSError(f"{decorator} needs an `async def` function; "
                        f"{getattr(fn, '__qualname__', fn)!r} is not one")

