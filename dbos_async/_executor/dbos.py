"""The DBOS executor's public facade: registration, the lifecycle, and the public API.

``DBOS`` keeps what outlives one run (settings, registered workflows and steps, declared
queues); each ``async with dbos:`` builds a fresh :class:`~dbos_async._executor.runtime.Runtime`
(see ``lifecycle.py``) that the executor's modules run on, and leaving closes it. The same
instance can then be entered again, on the same or another system database.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from dbos_async._executor import (
    lifecycle,
    messaging,
    patches,
    recovery,
    replay,
    start,
    steps,
    transactions,
)
from dbos_async._executor.authentication import RequiredRoles, required_roles_of
from dbos_async._executor.context import WorkflowContext, current_workflow, workflow_of_step
from dbos_async._executor.handles import WorkflowHandle
from dbos_async._executor.management import maintenance
from dbos_async._executor.operator import Operator
from dbos_async._executor.peer import Peer, clock_of
from dbos_async._executor.queues import batch
from dbos_async._executor.queues.batch import EnqueueRequest, EnqueueResult
from dbos_async._executor.queues.declaration import Queue, queue_settings
from dbos_async._executor.registry import (
    DataSource,
    Registry,
    WorkflowInfo,
    application_version,
    is_method,
    workflow_info_of,
)
from dbos_async._executor.replay import ReplayResult
from dbos_async._executor.runtime import NOT_RUNNING, Runtime
from dbos_async._executor.schedules import definition
from dbos_async._executor.schedules.operator import ScheduledWorkflow, check_scheduled_signature
from dbos_async._executor.serialization import (
    SerializationType,
    Signature,
    check_serialization_type,
)
from dbos_async._executor.steps import RetryOn, StepInfo, StepOptions
from dbos_async._executor.tasks import ExecutorHealth
from dbos_async._executor.transactions import TransactionInfo, TransactionOptions
from dbos_async._executor.transfer import ExportedWorkflow
from dbos_async._sysdb.application import IsolationLevel
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._validation import check_identifier, check_seconds
from dbos_async.config import DBOSConfig
from dbos_async.errors import (
    DBOSError,
    InvalidArgumentError,
    QueueNotFoundError,
    ScheduleError,
    WorkflowNotRegisteredError,
)

logger = logging.getLogger("dbos_async")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

AsyncFn = Callable[P, Coroutine[Any, Any, R]]


class DBOS(Operator):
    """One durable-execution executor on one system database.

    Decorate workflows and steps with it, then run it as an async context manager: entering
    connects, migrates, registers the application version and recovers this executor's
    pending workflows; leaving lets running workflows finish (up to the grace period), stops
    every task it started and closes every connection. It can be entered again afterwards
    (see :meth:`configure`). Several instances can share a process.

    The operator API it shares with :class:`~dbos_async.DBOSClient` (handles, ``send``,
    ``get_event``, listings, cancel, resume, fork, ...) is defined in
    :class:`~dbos_async._executor.operator.Operator`.
    """

    def __init__(self, config: DBOSConfig | None = None, **settings: Any) -> None:
        if config is not None:
            self.config = config.updated(**settings) if settings else config
        else:
            self.config = DBOSConfig.load(**settings)
        self._registry = Registry()
        # Queues declared here, and the queues to claim from (None: every declared one).
        self._queues: dict[str, Queue] = {}
        self._listen: set[str] | None = (set(self.config.listen_queues)
                                         if self.config.listen_queues is not None else None)
        # The runtime of the current entry, or of the last one once it is closed.
        self._runtime: Runtime | None = None
        self._entering = False

    def configure(self, **settings: Any) -> None:
        """Change settings (``system_database_url``, ``executor_id``, ...) for the next
        entry; refused while entered."""
        self._require_outside("Call configure()")
        self.config = self.config.updated(**settings)

    # ---- Registration ----

    @overload
    def workflow(self, fn: AsyncFn[P, R], /) -> AsyncFn[P, R]: ...

    @overload
    def workflow(
        self, fn: None = None, /, *, name: str | None = None,
        required_roles: Sequence[str] | None = None,
        max_recovery_attempts: int | None = None,
        serialization_type: SerializationType = None,
    ) -> Callable[[AsyncFn[P, R]], AsyncFn[P, R]]: ...

    def workflow(
        self, fn: AsyncFn[P, R] | None = None, /, *, name: str | None = None,
        required_roles: Sequence[str] | None = None,
        max_recovery_attempts: int | None = None,
        serialization_type: SerializationType = None,
    ) -> AsyncFn[P, R] | Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
        """Make an ``async def`` function (or method) a durable workflow: ``@dbos.workflow``
        or ``@dbos.workflow(...)``.

        Args:
            fn: the function, when the decorator is used without parentheses.
            name: the name it is recorded and recovered under (default: its qualified name).
            required_roles: only an identity (``SetAuthentication``) holding one of these
                roles may start it.
            max_recovery_attempts: recoveries it gets before recovery dead-letters it
                (``MAX_RECOVERY_ATTEMPTS_EXCEEDED``), as the ``dbos`` package's option
                does (default: the ``max_recovery_attempts`` setting).
            serialization_type: the format its inputs and result are stored in:
                ``"portable"`` (portable JSON), ``"native"`` (Python pickle, with
                ``allow_pickle``) or None (the configured serializer).

        Returns:
            The workflow: calling it runs it durably and returns its result.

        Raises:
            DBOSError: the function is not an ``async def``, or an option was passed by
                position.
            InvalidArgumentError: ``max_recovery_attempts`` is not an integer >= 0, or an
                unknown ``serialization_type``.
        """
        if max_recovery_attempts is not None and (
                isinstance(max_recovery_attempts, bool)
                or not isinstance(max_recovery_attempts, int) or max_recovery_attempts < 0):
            raise InvalidArgumentError("max_recovery_attempts",
                                       f"expected an integer >= 0, got "
                                       f"{max_recovery_attempts!r}")
        chosen_format = check_serialization_type(serialization_type)

        def decorate(fn: AsyncFn[P, R]) -> AsyncFn[P, R]:
            _require_async(fn, "@dbos.workflow")
            method = is_method(fn)
            workflow_name = name or fn.__qualname__
            info = WorkflowInfo(
                name=workflow_name,
                fn=fn,
                signature=Signature(fn, skip_first=method),
                is_method=method,
                owner=self,
                roles=RequiredRoles.of(required_roles, f"Workflow {workflow_name!r}"),
                max_recovery_attempts=max_recovery_attempts,
                serialization_type=chosen_format,
            )
            self._registry.add_workflow(info)

            @functools.wraps(fn)
            def call(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
                return self._start_and_wait(info, start.read_call(), args, kwargs)

            call.__dbos_workflow__ = info  # type: ignore[attr-defined]
            return call

        return _bare_or_called(fn, decorate, "@dbos.workflow")

    @overload
    def step(self, fn: AsyncFn[P, R], /) -> AsyncFn[P, R]: ...

    @overload
    def step(
        self, fn: None = None, /, *, name: str | None = None, retries: int = 0,
        retry_interval: float = 1.0, backoff_rate: float = 2.0,
        max_retry_interval: float = 60.0, retry_on: RetryOn | None = None,
        timeout: float | None = None, cancellable: bool = True,
        required_roles: Sequence[str] | None = None,
    ) -> Callable[[AsyncFn[P, R]], AsyncFn[P, R]]: ...

    def step(
        self,
        fn: AsyncFn[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        retries: int = 0,
        retry_interval: float = 1.0,
        backoff_rate: float = 2.0,
        max_retry_interval: float = 60.0,
        retry_on: RetryOn | None = None,
        timeout: float | None = None,
        cancellable: bool = True,
        required_roles: Sequence[str] | None = None,
    ) -> AsyncFn[P, R] | Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
        """Make an ``async def`` function a step, run once per workflow with its result
        recorded: ``@dbos.step`` or ``@dbos.step(...)``.

        Args:
            fn: the function, when the decorator is used without parentheses.
            name: the name its checkpoints record (default: its qualified name).
            retries: the number of attempts after the first.
            retry_interval: the seconds before the first retry.
            backoff_rate: what each later wait is multiplied by.
            max_retry_interval: the longest wait between two attempts, in seconds.
            retry_on: which errors are retried: exception types or a predicate (every
                ``Exception`` by default).
            timeout: the seconds one attempt may take.
            cancellable: a cancellable step is interrupted when its workflow is
                cancelled; otherwise it runs to the end and its result is discarded.
            required_roles: only an identity holding one of these roles may call it.

        Raises:
            DBOSError: the function is not an ``async def``, or an option was passed by
                position.
        """

        def decorate(fn: AsyncFn[P, R]) -> AsyncFn[P, R]:
            _require_async(fn, "@dbos.step")
            options = StepOptions(
                name=name or fn.__qualname__, retries=retries, retry_interval=retry_interval,
                backoff_rate=backoff_rate, max_retry_interval=max_retry_interval,
                retry_on=retry_on, timeout=timeout, cancellable=cancellable,
            )
            info = StepInfo(fn, options, Signature(fn),
                            RequiredRoles.of(required_roles, f"Step {options.name!r}"))

            @functools.wraps(fn)
            def call(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
                return steps.call(info, args, kwargs)

            call.__dbos_step__ = info  # type: ignore[attr-defined]
            return call

        return _bare_or_called(fn, decorate, "@dbos.step")

    @overload
    def run_step(self, dbos_step_options: StepOptions | None,
                 func: Callable[P, Coroutine[Any, Any, R]], /,
                 *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]: ...

    @overload
    def run_step(self, dbos_step_options: StepOptions | None, func: Callable[P, R], /,
                 *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]: ...

    def run_step(self, dbos_step_options: StepOptions | None, func: Callable[P, Any], /,
                 *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, Any]:
        """Run ``func(*args, **kwargs)`` as a step without decorating it (a library's
        function, a lambda): in a workflow its outcome is checkpointed like a
        ``@dbos.step``'s, so a replay returns the recorded value instead of calling it.

        Args:
            dbos_step_options: its name and retry policy (None: named after the function,
                no retries).
            func: an ``async def`` function, or a plain one (called on the event loop, so
                it should not block).
            *args: the function's positional arguments.
            **kwargs: the function's keyword arguments.

        Returns:
            The function's result (recorded, in a workflow).

        Raises:
            InvalidArgumentError: ``func`` is not callable or the options are not a
                :class:`StepOptions`.
        """
        if not callable(func):
            raise InvalidArgumentError("run_step function", f"{func!r} is not callable")
        if dbos_step_options is not None and not isinstance(dbos_step_options, StepOptions):
            raise InvalidArgumentError(
                "run_step options",
                f"expected StepOptions or None, got {type(dbos_step_options).__name__}")
        options = dbos_step_options or StepOptions(
            name=getattr(func, "__qualname__", None) or type(func).__qualname__)
        info = StepInfo(_as_coroutine_function(func), options, _signature_of(func))
        return steps.call(info, args, kwargs)

    def default_required_roles(self, roles: Sequence[str]) -> Callable[[type[T]], type[T]]:
        """A class decorator (the ``dbos`` package's): the workflow and step methods of the
        class whose decorator gives no ``required_roles`` require one of ``roles``. A
        method's own ``required_roles`` wins, even an empty list (anyone may call it).

        Args:
            roles: the roles one of which a caller must hold.

        Returns:
            The decorator, which returns the class unchanged otherwise.

        Raises:
            DBOSError: a role list given as a string, or an empty role name; the decorator
                raises it on something that is not a class.
        """
        checked = required_roles_of(roles, "default_required_roles")

        def decorate(cls: type[T]) -> type[T]:
            if not isinstance(cls, type):
                raise DBOSError("@dbos.default_required_roles(...) decorates a class, "
                                f"not {cls!r}")
            for value in vars(cls).values():
                fn = value.__func__ if isinstance(value, staticmethod | classmethod) else value
                for attribute in ("__dbos_workflow__", "__dbos_step__"):
                    info = getattr(fn, attribute, None)
                    if isinstance(info, WorkflowInfo | StepInfo) and not info.roles.given:
                        info.roles.roles = checked
            return cls

        return decorate

    def transaction(
        self,
        *,
        name: str | None = None,
        isolation: IsolationLevel = "SERIALIZABLE",
        read_only: bool = False,
        data_source: str | None = None,
        max_retries: int = 10,
    ) -> Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
        """Make an ``async def`` function a transaction: a step whose SQL (run on
        :func:`~dbos_async.transaction_connection`) commits together with its checkpoint,
        so its database effects happen exactly once per workflow.

        Args:
            name: the step's name (default: the function's qualified name).
            isolation: ``"SERIALIZABLE"`` (default), ``"REPEATABLE READ"`` or
                ``"READ COMMITTED"``.
            read_only: run it in a read-only transaction (its checkpoint is written after).
            data_source: the application database (registered with :meth:`data_source`)
                to run on; None: the system database.
            max_retries: how many times a serialization failure or a deadlock is retried,
                each time in a new transaction, before it is raised.

        Returns:
            The decorator. Called outside a workflow (or inside a step), the function runs
            as a plain transaction, recording nothing.

        Raises:
            DBOSError: the function is not ``async def``, or an option is invalid.
        """

        def decorate(fn: AsyncFn[P, R]) -> AsyncFn[P, R]:
            _require_async(fn, "@dbos.transaction()")
            options = TransactionOptions(
                name=name or fn.__qualname__, isolation=isolation, read_only=read_only,
                data_source=data_source, max_retries=max_retries)
            info = TransactionInfo(fn, options, Signature(fn))
            self._registry.transactions.add(options.name)
            if data_source is not None:
                self._registry.transaction_sources[options.name] = data_source

            @functools.wraps(fn)
            def call(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
                return transactions.call(info, self, args, kwargs)

            return call

        return decorate

    def data_source(self, name: str, url: str, *, schema: str = "dbos",
                    pool_size: int = 10) -> None:
        """Register an application database for transactions (``data_source=name``): it
        is opened with its own pool at every entry, and its ``datasource_outputs`` table
        (the one the ``dbos`` package's datasources use) is created in ``schema`` if
        missing.

        Args:
            name: the name transactions give it.
            url: its PostgreSQL URL.
            schema: the schema of its ``datasource_outputs`` table.
            pool_size: the most connections its pool opens.

        Raises:
            DBOSError: called while entered, a name registered twice, or a bad option.
        """
        self._require_outside("Register data sources")
        self._registry.add_data_source(DataSource(name, url, schema, pool_size))

    def scheduled(self, cron: str, *, timezone: str | None = None,
                  queue: str | Queue | None = None, automatic_backfill: bool = False,
                  shard_key: str | None = None
                  ) -> Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
        """Run a workflow ``(scheduled_time, context)`` at each time of ``cron``: stored at
        every entry as the schedule named after the workflow (its context None), and
        fired like any schedule. Apply it above ``@dbos.workflow``."""
        if callable(cron):
            raise DBOSError("@dbos.scheduled needs a cron expression: write "
                            "@dbos.scheduled('*/5 * * * *') above @dbos.workflow")
        self._require_outside("Declare schedules")

        def decorate(fn: AsyncFn[P, R]) -> AsyncFn[P, R]:
            name, class_name = self._scheduled_workflow(fn)
            queue_name = queue.name if isinstance(queue, Queue) else queue
            self._registry.schedules.append(definition.new_record(
                name, name, class_name, cron, None, timezone, queue_name,
                automatic_backfill, shard_key))
            return fn

        return decorate

    def register_instance(self, instance: object, name: str) -> None:
        """Register an object whose workflow methods can be recovered under ``name``."""
        self._registry.add_instance(instance, name)

    # ---- Queues (see executor/queues/) ----

    @queue_settings(Queue)
    def queue(self, *settings: Any, **named: Any) -> Queue:
        """Declare a queue with this executor: ``dbos.queue(name, ...)`` takes the
        arguments of :class:`~dbos_async.Queue`."""
        return self.register_queue(Queue(*settings, **named))

    def register_queue(self, queue: Queue) -> Queue:
        """Declare ``queue`` with this executor: stored in the queues table on enter, and
        claimed from here unless :meth:`listen` chose other queues."""
        self._require_outside("Declare queues")
        existing = self._queues.get(queue.name)
        if existing is not None and existing is not queue:
            raise DBOSError(f"A queue named {queue.name!r} is already declared")
        queue._bind(self)
        self._queues[queue.name] = queue
        return queue

    def listen(self, *queues: str | Queue) -> None:
        """Dequeue only from these queues (declared here, or stored in the queues table by
        another process); call before entering. Repeated calls add queues."""
        self._require_outside("Call listen()")
        names = {q.name if isinstance(q, Queue) else q for q in queues}
        for name in names:
            check_identifier(name, "queue name")
        self._listen = (self._listen or set()) | names

    async def get_queue(self, name: str) -> Queue:
        """A queue declared here, or one stored in the queues table (by any process)."""
        self._operating()
        queue = self._queues.get(name)
        if queue is not None:
            return queue
        stored = await self.get_queue_definition(name)
        if stored is None:
            raise QueueNotFoundError(name)
        stored._bind(self)
        return stored

    def enqueue_many(
        self, queue: Queue | str, requests: Sequence[EnqueueRequest]
    ) -> Coroutine[Any, Any, list[EnqueueResult]]:
        """Enqueue every row of ``requests`` on ``queue`` (declared here, or stored in the
        queues table) in one statement per shard key (a large batch in several, in one
        transaction, the event loop let run between chunks): all rows are written, or, for
        a bad batch (empty, a malformed row, a workflow ID twice, an ID another workflow
        name uses), none. Returns one :class:`EnqueueResult` per row, in order:
        ``"enqueued"``, ``"existing"`` (its workflow ID was taken: that workflow's handle) or
        ``"deduplicated"`` (an active workflow of the queue holds its deduplication ID: the
        holder's handle; the row is not written). In a workflow body the batch is one
        checkpoint, its position fixed at the call: the rows are its children, and a replay
        returns the recorded results."""
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return self._enqueue_many(queue, requests, ctx, step_id)

    async def _enqueue_many(self, queue: Queue | str, requests: Sequence[EnqueueRequest],
                            ctx: WorkflowContext | None, step_id: int | None
                            ) -> list[EnqueueResult]:
        runtime = ctx.runtime if ctx is not None else self._operating()
        target = queue if isinstance(queue, Queue) else await self.get_queue(queue)
        return await batch.enqueue_registered(runtime, target, requests, self._workflow_of,
                                              ctx, step_id)

    def _workflow_of(self, workflow: Callable[..., Any] | str,
                     args: tuple[Any, ...]) -> tuple[WorkflowInfo, tuple[Any, ...]]:
        """A workflow given as a registered function or by its registered name."""
        if isinstance(workflow, str):
            info = self._registry.workflows.get(workflow)
            if info is None:
                raise DBOSError(f"No workflow named {workflow!r} is registered")
            return info, args
        return workflow_info_of(workflow, args, self)

    # ---- Starting and recovering workflows (retrieve_workflow: see Operator) ----

    def start_workflow(
        self, fn: AsyncFn[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, WorkflowHandle[R]]:
        """Start a workflow in the background and return its handle.

        Inside a workflow this is a checkpointed child start, its position fixed at the call.
        """
        info, full_args = workflow_info_of(fn, args, self)
        return self._start(info, start.read_call(), full_args, kwargs)

    async def _start(self, info: WorkflowInfo, call: start.CallContext, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> WorkflowHandle[Any]:
        return await start.start_workflow(self._current_runtime, info, call, args, kwargs)

    async def _start_and_wait(self, info: WorkflowInfo, call: start.CallContext,
                              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        handle = await self._start(info, call, args, kwargs)
        return await handle.get_result()

    async def recover_pending_workflows(self) -> list[WorkflowHandle[Any]]:
        """Resume this executor's PENDING workflows that are not running here."""
        return await recovery.recover_pending(self._operating())

    async def replay_workflows(self, workflows: Iterable[ExportedWorkflow], *,
                               children: Iterable[ExportedWorkflow] = (),
                               time_limit: float = 10.0) -> list[ReplayResult]:
        """Check that this application's code, as it is now, replays recorded workflows:
        run each body against its checkpoints, running no step and writing nothing, and
        report whether it makes the recorded calls in the same order (see
        dbos_async/_executor/replay.py). Needs no entry and no database.

        Args:
            workflows: the recorded workflows, e.g. from ``export_workflows`` or the lines
                of an export file (``ExportedWorkflow.from_json``).
            children: more recorded workflows whose outcomes the checked ones' children
                may need (the checked ones count too); a child whose outcome is recorded
                in neither ends its parent's check where the parent awaits it.
            time_limit: seconds each body gets (one awaiting something unrecorded).

        Returns:
            One :class:`ReplayResult` per workflow, in order.

        Raises:
            DBOSError: ``time_limit`` is not a positive number of seconds.
        """
        check_seconds(time_limit, "replay time_limit", optional=False, positive=True)
        checked = list(workflows)
        runtime = replay.ReplayRuntime(self.config, self._registry, self.application_version,
                                       (*children, *checked))
        return [await replay.replay_workflow(runtime, w, time_limit) for w in checked]

    # ---- Messages, events, streams and durable sleep (send, get_event: see Operator) ----

    def recv(self, topic: str | None = None,
             timeout: float | None = 60.0) -> Coroutine[Any, Any, Any]:
        """In a workflow: consume the oldest message on ``topic``; None after ``timeout``."""
        ctx = current_workflow()
        if ctx is None:
            raise DBOSError("recv can only be called from a workflow (not a step)")
        check_identifier(topic, "topic", optional=True, empty_ok=True)
        check_seconds(timeout, "recv timeout")
        step_id = ctx.allocate_step_id()
        timeout_id = ctx.allocate_step_id()
        return messaging.recv(ctx, step_id, timeout_id, topic, timeout)

    def set_event(self, key: str, value: Any, *,
                  serialization_type: SerializationType = None) -> Coroutine[Any, Any, None]:
        """Publish ``value`` under ``key`` for the current workflow (from it or a step).

        Args:
            key: the event's key.
            value: its new value.
            serialization_type: ``"portable"``, ``"native"`` (with ``allow_pickle``) or a
                ``WorkflowSerializationFormat``; None: the configured format.

        Raises:
            InvalidArgumentError: a bad key or an unknown ``serialization_type``.
        """
        check_identifier(key, "event key", empty_ok=True)
        formats = self._current_runtime.formats
        text = formats.encode_as(formats.chosen(serialization_type), value, f"event {key!r}")
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.set_event(ctx, workflow_of_step(), step_id, key, text)

    def write_stream(self, key: str, value: Any, *,
                     serialization_type: SerializationType = None
                     ) -> Coroutine[Any, Any, None]:
        """Append ``value`` to the current workflow's stream ``key``.

        Args:
            key: the stream's key.
            value: the value appended.
            serialization_type: ``"portable"``, ``"native"`` (with ``allow_pickle``) or a
                ``WorkflowSerializationFormat``; None: the configured format.

        Raises:
            InvalidArgumentError: a bad key or an unknown ``serialization_type``.
        """
        check_identifier(key, "stream key", empty_ok=True)
        formats = self._current_runtime.formats
        text = formats.encode_as(formats.chosen(serialization_type), value,
                                 f"a value of stream {key!r}")
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.write_stream(ctx, workflow_of_step(), step_id, key, text,
                                      messaging.WRITE_STREAM)

    def close_stream(self, key: str) -> Coroutine[Any, Any, None]:
        """Close the current workflow's stream ``key``: readers stop after its last value."""
        check_identifier(key, "stream key", empty_ok=True)
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.write_stream(ctx, workflow_of_step(), step_id, key,
                                      messaging.CLOSED_MARKER, messaging.CLOSE_STREAM)

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        """Sleep durably: in a workflow the wake-up time is a checkpoint, so a recovered
        workflow sleeps only what remains."""
        check_seconds(seconds, "sleep duration", optional=False)
        ctx = current_workflow()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.sleep(clock_of(self.config), ctx, step_id, seconds)

    # ---- Maintenance jobs (see executor/management/maintenance.py) ----

    async def garbage_collect(self, cutoff_epoch_ms: int | None = None,
                              batch_size: int | None = None, *,
                              rows_threshold: int | None = None) -> int | None:
        """Run the retention job now: delete terminal workflows finished before
        ``cutoff_epoch_ms``, and those created before the ``rows_threshold`` newest
        workflows of this application (and unclaimed ones), as the ``dbos`` package's
        ``garbage_collect`` does; with ``cutoff_epoch_ms``, the queues' depth samples
        before it too.

        Args:
            cutoff_epoch_ms: The age bound (epoch milliseconds); None: none.
            batch_size: Workflows deleted per statement (default ``retention_batch_size``).
            rows_threshold: How many newest workflows to keep; None: no row bound.

        Returns:
            How many were deleted, or None if another executor is running the job.

        Raises:
            DBOSError: Neither bound was given, or one is not a non-negative integer.
        """
        for name, value, low in (("cutoff_epoch_ms", cutoff_epoch_ms, 0),
                                 ("batch_size", batch_size, 1),
                                 ("rows_threshold", rows_threshold, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < low):
                raise DBOSError(f"{name} must be an integer >= {low}, got {value!r}")
        if cutoff_epoch_ms is None and rows_threshold is None:
            raise DBOSError("garbage_collect needs cutoff_epoch_ms, rows_threshold or both")
        return await maintenance.run_retention(
            self._operating(), cutoff_epoch_ms, batch_size or self.config.retention_batch_size,
            rows_threshold)

    async def global_timeout(self, cutoff_epoch_ms: int) -> list[str] | None:
        """Run the global timeout now: cancel in-flight workflows created before the
        cutoff. Returns their IDs, or None if another executor is running the job."""
        return await maintenance.run_global_timeout(self._operating(), cutoff_epoch_ms)

    # ---- Patches (see executor/patches.py) ----

    def patch(self, name: str) -> Coroutine[Any, Any, bool]:
        """In a workflow: True where new executions take the new code path (recorded as a
        ``DBOS.patch-<name>`` checkpoint), False where a replay of an execution recorded
        before the patch must take the old one. See executor/patches.py."""
        ctx = current_workflow()
        if ctx is None:
            raise DBOSError("patch can only be called from a workflow (not a step)")
        check_identifier(name, "patch name")
        return patches.patch(ctx, name)

    def deprecate_patch(self, name: str) -> Coroutine[Any, Any, bool]:
        """In a workflow, once no execution from before patch ``name`` remains: always
        True; consumes the marker's position where an execution recorded it."""
        ctx = current_workflow()
        if ctx is None:
            raise DBOSError("deprecate_patch can only be called from a workflow (not a step)")
        check_identifier(name, "patch name")
        return patches.deprecate_patch(ctx, name)

    # ---- What the current entry has ----

    @property
    def _current_runtime(self) -> Runtime:
        """The runtime of the current entry (also while running workflows finish in the
        shutdown grace period); raises :class:`DBOSError` outside ``async with dbos:``.
        In a workflow body under a replay check, the check's runtime."""
        replaying = self._replaying()
        if replaying is not None:
            return replaying
        runtime = self._runtime
        if runtime is None:
            raise DBOSError(NOT_RUNNING)
        if runtime.state == "closed":
            runtime.require_running()
        return runtime

    def _operating(self) -> Runtime:
        """The runtime, if it is running (not starting or shutting down)."""
        runtime = self._replaying() or self._runtime
        if runtime is None:
            raise DBOSError(NOT_RUNNING)
        runtime.require_running()
        return runtime

    def _replaying(self) -> Runtime | None:
        """The runtime of the replay check of this application running the calling
        workflow body, if it is one (see :meth:`replay_workflows`)."""
        ctx = current_workflow()
        if ctx is not None and ctx.replaying and ctx.runtime.registry is self._registry:
            return ctx.runtime
        return None

    @property
    def _system_database(self) -> SystemDatabase:
        """The system database of the current entry, for the package's own tools and tests."""
        return self._current_runtime.system_database

    @property
    def system_database_url(self) -> str:
        """The URL of the system database this entry uses.

        Where no URL was configured it is the embedded server's, which is only known once
        entered: a client or a tool of the same application connects with it.

        Returns:
            The URL, password included, as the executor connects with it.

        Raises:
            DBOSError: Outside ``async with dbos:``.
        """
        return self._current_runtime.system_database.url

    @property
    def application_version(self) -> str:
        """The version this executor runs as (while entered: the one registered; else the
        one the next entry registers: the configured one, ``PATCHING_ENABLED`` in patching
        mode, or the hash of the registered workflows' source)."""
        if self._runtime is not None and self._runtime.state != "closed":
            return self._runtime.application_version
        return application_version(self.config, self._registry)

    @property
    def executor_id(self) -> str | None:
        """The executor ID this executor runs as: while entered (and after), the one it
        claimed (the configured one, else ``<id>-2``, ...; unset: ``local``, ``local-2``,
        ...); before the first entry, the configured one (None: to be claimed)."""
        runtime = self._runtime
        if runtime is not None and runtime.executor_lock is not None:
            return runtime.executor_id
        return self.config.executor_id

    @property
    def recovery_errors(self) -> list[DBOSError]:
        """Workflows the last recovery could not resume here (left PENDING)."""
        return self._runtime.recovery_errors if self._runtime is not None else []

    @property
    def queue_warnings(self) -> list[WorkflowNotRegisteredError]:
        """Enqueued workflows a claim loop here leaves queued for want of their function."""
        return self._runtime.queue_warnings if self._runtime is not None else []

    def health(self) -> ExecutorHealth:
        """Whether this executor runs and which of its background tasks are down: each
        one restarts with backoff on any failure, and is reported here meanwhile with its
        last error. Outside ``async with dbos:`` the state is ``"closed"`` (not healthy)."""
        if self._runtime is None:
            return ExecutorHealth("closed", self.config.executor_id, ())
        return self._runtime.health()

    # ---- Operator hooks (see executor/operator.py) ----

    def _peer(self, during_shutdown: bool = False) -> Peer:
        return self._current_runtime if during_shutdown else self._operating()

    def transaction_names(self) -> frozenset[str]:
        """The names of the registered transactions (their steps are checkpointed apart)."""
        return frozenset(self._registry.transactions)

    def _contexts(self) -> tuple[WorkflowContext | None, WorkflowContext | None]:
        return current_workflow(), workflow_of_step()

    def _fork_call(self, workflow_id: str | None, timeout: float | None) -> start.CallContext:
        return start.read_call(workflow_id=workflow_id, timeout=timeout, as_child=False)

    def _firing_executor_id(self) -> str:
        return self._operating().executor_id

    def _scheduled_workflow(self, workflow: ScheduledWorkflow) -> tuple[str, str | None]:
        if isinstance(workflow, str):
            info = self._registry.workflows.get(workflow)
            if info is None:
                raise ScheduleError(f"No workflow named {workflow!r} is registered")
        else:
            try:
                info, _ = workflow_info_of(workflow, (), self)
            except DBOSError as error:
                raise ScheduleError(str(error)) from None
        check_scheduled_signature(info)
        return info.name, info.class_name

    # ---- Lifecycle ----

    def _require_outside(self, what: str) -> None:
        if self._entering or (self._runtime is not None and self._runtime.state != "closed"):
            raise DBOSError(f"{what} before entering DBOS (or after leaving it)")

    async def __aenter__(self) -> DBOS:
        if self._entering or (self._runtime is not None and self._runtime.state != "closed"):
            raise DBOSError("This DBOS instance is already entered; leave it before entering "
                            "it again")
        self._entering = True
        try:
            self._runtime = await lifecycle.new_runtime(self.config, self._registry)
            await lifecycle.start_runtime(self._runtime, self._queues, self._listen)
        except BaseException:
            self._runtime = None  # closed by start_runtime: as if never entered
            raise
        finally:
            self._entering = False
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        runtime = self._runtime
        if runtime is not None and runtime.state == "running":
            await lifecycle.close_runtime(runtime, self.config.shutdown_grace_period)


def _bare_or_called(fn: AsyncFn[P, R] | None,
                    decorate: Callable[[AsyncFn[P, R]], AsyncFn[P, R]],
                    decorator: str) -> AsyncFn[P, R] | Callable[[AsyncFn[P, R]], AsyncFn[P, R]]:
    """A decorator used bare (``@dbos.step``: ``fn`` is the function) or called with its
    options (``@dbos.step(retries=3)``: ``fn`` is None)."""
    if fn is None:
        return decorate
    if not callable(fn):
        raise DBOSError(f"{decorator} takes its options by keyword, e.g. "
                        f"{decorator}(name=...); got {fn!r} by position")
    return decorate(fn)


def _as_coroutine_function(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """``fn`` as an ``async def``: a plain function is called on the event loop (and a
    result it returns that is awaitable, e.g. from a ``functools.partial`` of an
    ``async def``, awaited)."""
    if inspect.iscoroutinefunction(fn):
        return fn

    async def run(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    return run


def _any_arguments(*args: Any, **kwargs: Any) -> Any:
    """The signature of a function Python cannot inspect (``str``, some builtins)."""


def _signature_of(fn: Callable[..., Any]) -> Signature:
    try:
        return Signature(fn)
    except (TypeError, ValueError):
        return Signature(_any_arguments)


def _require_async(fn: Callable[..., Any], decorator: str) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise DBOSError(f"{decorator} needs an `async def` function; "
                        f"{getattr(fn, '__qualname__', fn)!r} is not one")
