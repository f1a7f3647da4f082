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
from dbos_async.errors import DBOSError, NonExistentWorkflowError
from dbos_async.executor import recovery, workflows
from dbos_async.executor.context import current_workflow, take_workflow_id, workflow_timeout
from dbos_async.executor.handles import WorkflowHandle, WorkflowStatus
from dbos_async.executor.registry import Registry, WorkflowInfo, is_method
from dbos_async.executor.serialization import Signature
from dbos_async.executor.steps import RetryOn, StepInfo, StepOptions, attempt, run_checkpointed
from dbos_async.executor.tasks import TaskOwner
from dbos_async.sysdb.connection import redact
from dbos_async.sysdb.database import SystemDatabase

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
            if self.application_version is None:
                self.application_version = self._registry.version_hash()
            await self._sysdb.register_version(self.application_version)
            self._state = "running"
            await recovery.recover_pending(self)
        except BaseException:
            self._state = "closed"
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
            if self._sysdb is not None:
                await self._sysdb.close()


def _require_async(fn: Callable[..., Any], decorator: str) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise DBOSError(f"{decorator} needs an `async def` function; "
                        f"{getattr(fn, '__qualname__', fn)!r} is not one")

