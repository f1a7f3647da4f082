"""Queues: declared flow-control limits, and enqueueing workflows onto them.

A :class:`Queue` is a name plus limits (global and per-worker concurrency, a rate limit,
partitions with their own limits). Declared with a DBOS instance (``dbos.queue(...)`` or
``dbos.register_queue(Queue(...))``) it is stored in the ``queues`` table when the instance
starts, so other processes and clients can find it (``await dbos.get_queue(name)``).

``await queue.enqueue(fn, *args, **kwargs)`` writes the workflow ENQUEUED (or DELAYED) and
returns its handle; the dispatchers of the executors listening to the queue run it (see
``dispatcher.py``). Options come from :class:`SetEnqueueOptions` (and ``SetWorkflowID`` /
``SetWorkflowTimeout``). Inside a workflow, an enqueue is a checkpointed child start: the
parent's fence, the ENQUEUED insert and the parent's step row are one statement, so a replay
finds the child instead of enqueueing it again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar

import asyncpg

from dbos_async.errors import ConfigurationError, DBOSError, QueueDeduplicatedError
from dbos_async.executor.context import (
    WorkflowContext,
    current_workflow,
    take_workflow_id,
    workflow_attributes,
    workflow_timeout,
)
from dbos_async.executor.handles import WorkflowHandle
from dbos_async.executor.registry import WorkflowInfo
from dbos_async.executor.serialization import serialize_error
from dbos_async.executor.workflows import check_name, replayed_child, split_instance
from dbos_async.sysdb.database import StartResult, SystemDatabase, now_ms
from dbos_async.sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async.sysdb.statements import (
    DEDUP_INDEX,
    DELAYED,
    ENQUEUED,
    INTERNAL_QUEUE_NAME,
    NewWorkflow,
    ParentStep,
    QueueRecord,
)

if TYPE_CHECKING:
    from dbos_async.executor.dbos import DBOS

logger = logging.getLogger("dbos_async")

P = ParamSpec("P")
R = TypeVar("R")

DELAYED_KEY = "dbos_async:delayed"
"""ENQUEUE_CHANNEL payload announcing a new DELAYED workflow (wakes the promoters)."""

DedupPolicy = Literal["reject", "return_existing"]


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` workflows start in any ``period`` seconds."""

    limit: int
    period: float


LimiterSpec = RateLimit | tuple[int, float] | list[float] | Mapping[str, float]


def _limiter(spec: LimiterSpec | None, what: str, queue: str) -> RateLimit | None:
    if spec is None:
        return None
    if isinstance(spec, RateLimit):
        limiter = spec
    elif isinstance(spec, tuple | list) and len(spec) == 2:
        limiter = RateLimit(spec[0], spec[1])  # type: ignore[arg-type]  # checked below
    elif isinstance(spec, Mapping) and set(spec) == {"limit", "period"}:
        limiter = RateLimit(spec["limit"], spec["period"])  # type: ignore[arg-type]
    else:
        raise ConfigurationError(
            f"Queue {queue!r}: {what} must be RateLimit(limit, period), (limit, period) or "
            f"{{'limit': ..., 'period': ...}}, got {spec!r}"
        )
    if isinstance(limiter.limit, bool) or not isinstance(limiter.limit, int) \
            or limiter.limit < 1:
        raise ConfigurationError(
            f"Queue {queue!r}: {what} limit must be an integer >= 1, got {limiter.limit!r}")
    if not isinstance(limiter.period, int | float) or isinstance(limiter.period, bool) \
            or not math.isfinite(limiter.period) or limiter.period <= 0:
        raise ConfigurationError(
            f"Queue {queue!r}: {what} period must be a positive number of seconds, "
            f"got {limiter.period!r}")
    return RateLimit(limiter.limit, float(limiter.period))


def _positive(value: int | None, what: str, queue: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"Queue {queue!r}: {what} must be an integer >= 1 or None, "
                                 f"got {value!r}")
    return value


class Queue:
    """A durable queue with flow control; see the module docstring and the README.

    - ``concurrency``: at most this many of the queue's workflows run at once, across every
      executor; ``worker_concurrency``: at most this many in each executor.
    - ``limiter``: at most ``limit`` starts per ``period`` seconds, across every executor.
    - ``partition_queue``: every enqueue names a partition key; ``partition_concurrency``,
      ``partition_worker_concurrency`` and ``partition_limiter`` apply to each partition.
    - ``polling_interval``: the longest a dispatcher sleeps between claims when no
      notification wakes it.
    """

    def __init__(
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
        dbos: DBOS | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("A queue needs a non-empty name")
        self.name = name
        self.concurrency = _positive(concurrency, "concurrency", name)
        self.worker_concurrency = _positive(worker_concurrency, "worker_concurrency", name)
        if (self.concurrency is not None and self.worker_concurrency is not None
                and self.worker_concurrency > self.concurrency):
            raise ConfigurationError(
                f"Queue {name!r}: worker_concurrency ({self.worker_concurrency}) exceeds "
                f"concurrency ({self.concurrency})")
        self.limiter = _limiter(limiter, "limiter", name)
        self.partition_queue = bool(partition_queue)
        self.partition_concurrency = _positive(partition_concurrency,
                                               "partition_concurrency", name)
        self.partition_worker_concurrency = _positive(
            partition_worker_concurrency, "partition_worker_concurrency", name)
        self.partition_limiter = _limiter(partition_limiter, "partition_limiter", name)
        if not self.partition_queue and (
                self.partition_concurrency is not None
                or self.partition_worker_concurrency is not None
                or self.partition_limiter is not None):
            raise ConfigurationError(
                f"Queue {name!r}: partition limits need partition_queue=True")
        if (self.partition_concurrency is not None
                and self.partition_worker_concurrency is not None
                and self.partition_worker_concurrency > self.partition_concurrency):
            raise ConfigurationError(
                f"Queue {name!r}: partition_worker_concurrency exceeds partition_concurrency")
        if isinstance(polling_interval, bool) or not isinstance(polling_interval, int | float) \
                or not math.isfinite(polling_interval) or polling_interval <= 0:
            raise ConfigurationError(
                f"Queue {name!r}: polling_interval must be a positive number of seconds, "
                f"got {polling_interval!r}")
        self.polling_interval = float(polling_interval)
        self._dbos: DBOS | None = None
        if dbos is not None:
            dbos.register_queue(self)

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    @property
    def record(self) -> QueueRecord:
        return QueueRecord(
            name=self.name,
            concurrency=self.concurrency,
            worker_concurrency=self.worker_concurrency,
            rate_limit_max=self.limiter.limit if self.limiter else None,
            rate_limit_period_sec=self.limiter.period if self.limiter else None,
            partition_queue=self.partition_queue,
            partition_concurrency=self.partition_concurrency,
            partition_worker_concurrency=self.partition_worker_concurrency,
            partition_rate_limit_max=(self.partition_limiter.limit
                                      if self.partition_limiter else None),
            partition_rate_limit_period_sec=(self.partition_limiter.period
                                             if self.partition_limiter else None),
            polling_interval_sec=self.polling_interval,
        )

    @classmethod
    def from_record(cls, record: QueueRecord) -> Queue:
        """A queue as stored in the ``queues`` table (by this or another process)."""
        limiter = (RateLimit(record.rate_limit_max, record.rate_limit_period_sec)
                   if record.rate_limit_max is not None
                   and record.rate_limit_period_sec is not None else None)
        partition_limiter = (
            RateLimit(record.partition_rate_limit_max, record.partition_rate_limit_period_sec)
            if record.partition_rate_limit_max is not None
            and record.partition_rate_limit_period_sec is not None else None)
        return cls(
            record.name, record.concurrency, record.worker_concurrency, limiter,
            partition_queue=record.partition_queue,
            partition_concurrency=record.partition_concurrency,
            partition_worker_concurrency=record.partition_worker_concurrency,
            partition_limiter=partition_limiter,
            polling_interval=record.polling_interval_sec or 1.0,
        )

    def bind(self, dbos: DBOS) -> None:
        if self._dbos is not None and self._dbos is not dbos:
            raise DBOSError(f"Queue {self.name!r} is registered with another DBOS instance")
        self._dbos = dbos

    @property
    def dbos(self) -> DBOS:
        if self._dbos is None:
            raise DBOSError(
                f"Queue {self.name!r} is not registered with a DBOS instance: create it with "
                "dbos.queue(...) or call dbos.register_queue(queue)")
        return self._dbos

    def enqueue(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, WorkflowHandle[R]]:
        """Enqueue workflow ``fn(*args, **kwargs)`` and return its handle.

        Options: :class:`SetEnqueueOptions`, ``SetWorkflowID``, ``SetWorkflowTimeout``.
        Inside a workflow this is a checkpointed child start, its position fixed at the call.
        """
        dbos = self.dbos
        info, full_args = dbos._workflow_info(fn, args)
        options = _current_options()
        # Read synchronously, at the call: the caller's context counts.
        parent = current_workflow()
        request = _Request(
            queue=self, info=info, args=full_args, kwargs=dict(kwargs), options=options,
            workflow_id=options.workflow_id or take_workflow_id(),
            timeout=options.timeout if options.timeout is not None else workflow_timeout(),
            parent=parent,
            parent_step_id=parent.allocate_step_id() if parent is not None else None,
        )
        return _enqueue(dbos, request)

    def debouncer(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /, *, period: float,
        max_delay: float | None = None,
    ) -> Debouncer[P, R]:
        """A debouncer of ``fn`` on this queue; see :class:`Debouncer`."""
        return Debouncer(self, fn, period, max_delay)


# ---- Enqueue options ----


@dataclass(frozen=True)
class EnqueueOptions:
    workflow_id: str | None = None
    priority: int = 0
    deduplication_id: str | None = None
    deduplication_policy: DedupPolicy = "reject"
    partition_key: str | None = None
    delay: float | None = None
    application_version: str | None = None
    timeout: float | None = None


_DEFAULT_OPTIONS = EnqueueOptions()
_enqueue_options: ContextVar[EnqueueOptions | None] = ContextVar("dbos_enqueue_options",
                                                                 default=None)


def _current_options() -> EnqueueOptions:
    return _enqueue_options.get() or _DEFAULT_OPTIONS


class SetEnqueueOptions:
    """Options for every enqueue in this block (nested blocks override the fields they set).

    - ``workflow_id``: the enqueued workflow's ID (an existing ID returns that workflow);
    - ``priority``: lower runs first (default 0);
    - ``deduplication_id`` with ``deduplication_policy``: while a workflow with this ID is
      enqueued or running on the queue, another enqueue raises
      :class:`~dbos_async.errors.QueueDeduplicatedError` (``"reject"``) or returns the
      existing workflow's handle (``"return_existing"``);
    - ``partition_key``: required on (and only on) a partitioned queue;
    - ``delay``: seconds before the workflow may start (it is DELAYED until then);
    - ``application_version``: only executors of this version run it;
    - ``timeout``: start-to-close timeout in seconds, counted from when it starts.
    """

    _UNSET: Any = object()

    def __init__(
        self,
        *,
        workflow_id: str | None = _UNSET,
        priority: int = _UNSET,
        deduplication_id: str | None = _UNSET,
        deduplication_policy: DedupPolicy = _UNSET,
        partition_key: str | None = _UNSET,
        delay: float | None = _UNSET,
        application_version: str | None = _UNSET,
        timeout: float | None = _UNSET,
    ) -> None:
        given: dict[str, Any] = {k: v for k, v in {
            "workflow_id": workflow_id, "priority": priority,
            "deduplication_id": deduplication_id, "deduplication_policy": deduplication_policy,
            "partition_key": partition_key, "delay": delay,
            "application_version": application_version, "timeout": timeout,
        }.items() if v is not self._UNSET}
        check_options(given)
        self._given = given

    def __enter__(self) -> SetEnqueueOptions:
        self._token = _enqueue_options.set(replace(_current_options(), **self._given))
        return self

    def __exit__(self, *exc: object) -> None:
        _enqueue_options.reset(self._token)


def check_options(given: dict[str, Any]) -> None:
    priority = given.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not 0 <= priority <= 2**31 - 1:
        raise DBOSError(f"priority must be an integer in [0, 2**31-1], got {priority!r}")
    if given.get("deduplication_policy", "reject") not in ("reject", "return_existing"):
        raise DBOSError("deduplication_policy must be 'reject' or 'return_existing', got "
                        f"{given['deduplication_policy']!r}")
    for key in ("delay", "timeout"):
        value = given.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0
                                  or (key == "timeout" and value == 0)):
            raise DBOSError(f"{key} must be a {'positive' if key == 'timeout' else 'non-negative'}"
                            f" number of seconds, got {value!r}")
    for key in ("workflow_id", "deduplication_id", "partition_key"):
        value = given.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise DBOSError(f"{key} must be a non-empty string, got {value!r}")


# ---- Enqueue ----


@dataclass(frozen=True)
class _Request:
    queue: Queue
    info: WorkflowInfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: EnqueueOptions
    workflow_id: str | None
    timeout: float | None
    parent: WorkflowContext | None
    parent_step_id: int | None


def _check_partition(queue: Queue, partition_key: str | None) -> None:
    if queue.partition_queue and partition_key is None:
        raise DBOSError(f"Queue {queue.name!r} is partitioned: enqueue with "
                        "SetEnqueueOptions(partition_key=...)")
    if not queue.partition_queue and partition_key is not None:
        raise DBOSError(f"Queue {queue.name!r} is not partitioned; a partition key was given")


def _new_workflow(dbos: DBOS, request: _Request, workflow_id: str, inputs: str,
                  config_name: str | None, **queue_columns: Any) -> NewWorkflow:
    options, info, parent = request.options, request.info, request.parent
    created_at = now_ms()
    fields: dict[str, Any] = {
        "workflow_id": workflow_id,
        "name": info.name,
        "status": ENQUEUED,
        "inputs": inputs,
        "executor_id": dbos.config.executor_id,
        "application_version": options.application_version or dbos.application_version,
        "created_at_ms": created_at,
        "class_name": info.class_name,
        "config_name": config_name,
        "queue_name": request.queue.name,
        # The deadline is fixed when the workflow starts (by the claim), unless the parent's
        # own deadline bounds it already.
        "timeout_ms": int(request.timeout * 1000) if request.timeout is not None else None,
        "deadline_epoch_ms": parent.deadline_epoch_ms if parent is not None else None,
        "parent_workflow_id": parent.workflow_id if parent is not None else None,
        "priority": options.priority,
        "deduplication_id": options.deduplication_id,
        "queue_partition_key": options.partition_key,
        "attributes": workflow_attributes(),
    }
    if options.delay:
        fields["status"] = DELAYED
        fields["delay_until_epoch_ms"] = created_at + int(options.delay * 1000)
    fields.update(queue_columns)
    return NewWorkflow(**fields)


def _announce(dbos: DBOS, new: NewWorkflow) -> None:
    """Wake dispatchers (or promoters, for a DELAYED workflow) here and elsewhere."""
    key = new.queue_name if new.status == ENQUEUED else DELAYED_KEY
    dbos.system_database.notify(ENQUEUE_CHANNEL, key or "")


async def _enqueue(dbos: DBOS, request: _Request) -> WorkflowHandle[Any]:
    dbos._require_running()
    queue, info, parent, options = request.queue, request.info, request.parent, request.options
    if parent is not None and request.parent_step_id is not None:
        recorded = parent.checkpoints.get(request.parent_step_id)
        if recorded is not None:
            return replayed_child(dbos, parent, request.parent_step_id, info, recorded)
    _check_partition(queue, options.partition_key)
    instance, args = split_instance(info, request.args)
    config_name = dbos.instance_name(instance) if instance is not None else None
    # Serialized before anything is written, so a bad argument leaves no row behind.
    inputs = info.signature.serialize_inputs(args, request.kwargs)
    if request.workflow_id is not None:
        workflow_id = request.workflow_id
    elif parent is not None and request.parent_step_id is not None:
        workflow_id = f"{parent.workflow_id}-{request.parent_step_id}"
    else:
        workflow_id = str(uuid.uuid4())
    new = _new_workflow(dbos, request, workflow_id, inputs, config_name)
    parent_step = (
        ParentStep(parent.workflow_id, request.parent_step_id, parent.owner_xid,
                   new.created_at_ms)
        if parent is not None and request.parent_step_id is not None else None
    )
    sysdb = dbos.system_database
    try:
        started = await start_deduplicated(
            sysdb, lambda: sysdb.start_workflow(new, str(uuid.uuid4()), parent_step),
            queue.name, options.deduplication_id, options.deduplication_policy)
    except QueueDeduplicatedError as rejected:
        if parent is not None and parent_step is not None:
            await _record_child_step(dbos, parent, parent_step, info, error=rejected)
        raise
    if isinstance(started, tuple):  # "return_existing": the holder's handle
        if parent is not None and parent_step is not None:
            return await _record_child_step(dbos, parent, parent_step, info, child=started)
        return WorkflowHandle(dbos, started[0], dbos.running_result(started[0]),
                              dbos.signature_of(started[1]))
    check_name(started, workflow_id, info.name)
    if started.created:
        _announce(dbos, new)
    return WorkflowHandle(dbos, workflow_id, dbos.running_result(workflow_id),
                          info.signature)


async def _record_child_step(
    dbos: DBOS, parent: WorkflowContext, step: ParentStep, info: WorkflowInfo, *,
    error: QueueDeduplicatedError | None = None, child: tuple[str, str] | None = None,
) -> WorkflowHandle[Any]:
    """Checkpoint an enqueue of a workflow that started no child of its own (deduplication
    rejected it or returned the holder; a debounce joined a burst), so a replay does the
    same even after that workflow has finished; returns the (ID, name) ``child``'s handle,
    or raises ``error``."""
    existing = await dbos.system_database.record_step(
        parent.workflow_id, step.function_id, info.name, parent.owner_xid, output=None,
        error=serialize_error(error) if error is not None else None,
        started_at_ms=step.started_at_ms, completed_at_ms=now_ms(),
        child_workflow_id=child[0] if child is not None else None,
    )
    if existing is not None:  # Another execution of the parent recorded this step first.
        return replayed_child(dbos, parent, step.function_id, info, existing)
    if error is not None:
        raise error
    assert child is not None
    child_id, child_name = child
    return WorkflowHandle(dbos, child_id, dbos.running_result(child_id),
                          dbos.signature_of(child_name))


async def start_deduplicated(
    sysdb: SystemDatabase, start: Callable[[], Awaitable[StartResult]], queue_name: str,
    deduplication_id: str | None, policy: DedupPolicy,
) -> StartResult | tuple[str, str]:
    """Run ``start`` (an enqueue's insert) under the deduplication policy, for executors
    and clients alike: if an active workflow of the queue holds ``deduplication_id``,
    raise :class:`QueueDeduplicatedError` naming it (``"reject"``) or return its (ID,
    name) (``"return_existing"``); a holder that finished in between is enqueued afresh."""
    for _ in range(10):
        try:
            return await start()
        except asyncpg.UniqueViolationError as error:
            if error.constraint_name != DEDUP_INDEX or deduplication_id is None:
                raise
            holder = await sysdb.find_deduplicated(queue_name, deduplication_id)
            if policy == "reject":
                raise QueueDeduplicatedError(queue_name, deduplication_id,
                                             holder[0] if holder else None) from None
            if holder is not None:
                return holder
    raise QueueDeduplicatedError(queue_name, deduplication_id or "")


class Debouncer(Generic[P, R]):
    """Collapse bursts of enqueues of one workflow into one run with the latest arguments.

    ``await debouncer.debounce(key, *args, **kwargs)``: if a workflow debounced under ``key``
    on this queue has not started yet, it gets these arguments and its start moves to
    ``period`` seconds from now, but never past ``max_delay`` seconds after the first call
    of the burst; otherwise a new workflow is enqueued to start in ``period`` seconds.
    Returns the handle of the workflow that will run. From a workflow body the handle is
    checkpointed, so a replay returns it without debouncing again.
    """

    def __init__(self, queue: Queue, fn: Callable[P, Coroutine[Any, Any, R]], period: float,
                 max_delay: float | None) -> None:
        check_options({"delay": period})
        if not period > 0:
            raise DBOSError(f"A debounce period must be positive, got {period!r}")
        if max_delay is not None:
            check_options({"delay": max_delay})
        self.queue = queue
        self.fn = fn
        self.period = float(period)
        self.max_delay = float(max_delay) if max_delay is not None else None

    def debounce(self, key: str, /, *args: P.args,
                 **kwargs: P.kwargs) -> Coroutine[Any, Any, WorkflowHandle[R]]:
        if not isinstance(key, str) or not key:
            raise DBOSError("A debounce key must be a non-empty string")
        dbos = self.queue.dbos
        info, full_args = dbos._workflow_info(self.fn, args)
        options = _current_options()
        request = _Request(
            queue=self.queue, info=info, args=full_args, kwargs=dict(kwargs),
            options=replace(options, deduplication_id=key, delay=None),
            workflow_id=options.workflow_id or take_workflow_id(),
            timeout=options.timeout if options.timeout is not None else workflow_timeout(),
            parent=None, parent_step_id=None,
        )
        parent = current_workflow()
        if parent is None:
            return self._debounce(dbos, request, key)
        # Its position is fixed at the call, as for any step.
        return self._debounce_in(parent, parent.allocate_step_id(), dbos, request, key)

    async def _debounce_in(self, parent: WorkflowContext, step_id: int, dbos: DBOS,
                           request: _Request, key: str) -> WorkflowHandle[Any]:
        """A debounce from a workflow body, checkpointed as the handle it returned (at least
        once: a crash before the checkpoint debounces again on replay)."""
        recorded = parent.checkpoints.get(step_id)
        if recorded is not None:
            return replayed_child(dbos, parent, step_id, request.info, recorded)
        step = ParentStep(parent.workflow_id, step_id, parent.owner_xid, now_ms())
        handle = await self._debounce(dbos, request, key)
        return await _record_child_step(dbos, parent, step, request.info,
                                        child=(handle.workflow_id, request.info.name))

    async def _debounce(self, dbos: DBOS, request: _Request, key: str) -> WorkflowHandle[Any]:
        dbos._require_running()
        queue, info = self.queue, request.info
        _check_partition(queue, request.options.partition_key)
        instance, args = split_instance(info, request.args)
        config_name = dbos.instance_name(instance) if instance is not None else None
        inputs = info.signature.serialize_inputs(args, request.kwargs)
        sysdb = dbos.system_database
        for _ in range(50):
            now = now_ms()
            until = now + int(self.period * 1000)
            bounced = await sysdb.debounce_existing(queue.name, key, info.name, inputs, until)
            if bounced is not None:
                # Its start moved: wake the promoters.
                sysdb.notify(ENQUEUE_CHANNEL, DELAYED_KEY)
                return WorkflowHandle(dbos, bounced, None, info.signature)
            deadline = now + int(self.max_delay * 1000) if self.max_delay is not None else None
            new = _new_workflow(
                dbos, request, request.workflow_id or str(uuid.uuid4()), inputs, config_name,
                status=DELAYED, is_debounced=True, debounce_deadline_epoch_ms=deadline,
                delay_until_epoch_ms=min(until, deadline) if deadline is not None else until,
            )
            try:
                started = await sysdb.start_workflow(new, str(uuid.uuid4()))
            except asyncpg.UniqueViolationError as error:
                if error.constraint_name != DEDUP_INDEX:
                    raise
                # A concurrent call started the burst first: join it.
                await asyncio.sleep(0.001)
                continue
            _announce(dbos, new)
            return WorkflowHandle(dbos, started.row.workflow_id, None, info.signature)
        raise QueueDeduplicatedError(queue.name, key)


def internal_queue() -> Queue:
    return Queue(INTERNAL_QUEUE_NAME)
