"""Queues: a name and its flow-control limits, declared with an executor.

A :class:`Queue` is a name plus limits (global and per-worker concurrency, a rate limit,
partitions with their own limits). Declared with a DBOS instance (``dbos.queue(...)`` or
``dbos.register_queue(Queue(...))``) it is stored in the ``queues`` table when the instance
starts, so other processes and clients can find it (``await dbos.get_queue(name)``).

``await queue.enqueue(fn, *args, **kwargs)`` writes the workflow ENQUEUED (or DELAYED) and
returns its handle (see ``enqueue.py``); the claim loops of the executors listening to the
queue run it (see ``claim_loop.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from dbos_async._executor.handles import WorkflowHandle
from dbos_async._executor.queues.debounce import Debouncer
from dbos_async._executor.queues.enqueue import enqueue
from dbos_async._executor.queues.options import EnqueueOptions, current_options
from dbos_async._executor.registry import WorkflowInfo, workflow_info_of
from dbos_async._executor.runtime import RuntimeSource
from dbos_async._executor.start import CallContext, read_call
from dbos_async._sysdb.statements import INTERNAL_QUEUE_NAME, QueueRecord
from dbos_async._validation import check_identifier, check_seconds, reported_as
from dbos_async.errors import ConfigurationError, DBOSError

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")
T = TypeVar("T")


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
    with reported_as(ConfigurationError):
        check_seconds(limiter.period, f"{what} period of queue {queue!r}", optional=False,
                      positive=True)
    return RateLimit(limiter.limit, float(limiter.period))


def _positive(value: int | None, what: str, queue: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"Queue {queue!r}: {what} must be an integer >= 1 or None, "
                                 f"got {value!r}")
    return value


class Queue:
    """A durable queue with flow control; see the module docstring and docs/guides/queues.md.

    - ``concurrency``: at most this many of the queue's workflows run at once, across every
      executor; ``worker_concurrency``: at most this many in each executor.
    - ``limiter``: at most ``limit`` starts per ``period`` seconds, across every executor.
    - ``partition_queue``: every enqueue names a partition key; ``partition_concurrency``,
      ``partition_worker_concurrency`` and ``partition_limiter`` apply to each partition.
    - ``polling_interval``: the longest a claim loop sleeps between claims when no
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
    ) -> None:
        with reported_as(ConfigurationError):
            check_identifier(name, "queue name")
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
        with reported_as(ConfigurationError):
            check_seconds(polling_interval, f"polling_interval of queue {name!r}",
                          optional=False, positive=True)
        self.polling_interval = float(polling_interval)
        self._owner: RuntimeSource | None = None

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    @property
    def _record(self) -> QueueRecord:
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
    def _from_record(cls, record: QueueRecord) -> Queue:
        """A queue as stored in the ``queues`` table (by this or another process)."""
        return cls(record.name, **_settings_of(record))

    @classmethod
    def _changed(cls, record: QueueRecord, changes: dict[str, Any]) -> Queue:
        """The stored queue ``record`` with the settings in ``changes`` (named as the
        arguments of :class:`Queue`) replaced, checked as a new declaration is."""
        return cls(record.name, **{**_settings_of(record), **changes})

    def _bind(self, owner: RuntimeSource) -> None:
        if self._owner is not None and self._owner is not owner:
            raise DBOSError(f"Queue {self.name!r} is registered with another DBOS instance")
        self._owner = owner

    @property
    def owner(self) -> RuntimeSource:
        """The DBOS instance the queue is declared with."""
        if self._owner is None:
            raise DBOSError(
                f"Queue {self.name!r} is not registered with a DBOS instance: create it with "
                "dbos.queue(...) or call dbos.register_queue(queue)")
        return self._owner

    def enqueue(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, WorkflowHandle[R]]:
        """Enqueue workflow ``fn(*args, **kwargs)`` and return its handle.

        Options: :class:`SetEnqueueOptions`, ``SetWorkflowID``, ``SetWorkflowTimeout``.
        Inside a workflow this is a checkpointed child start, its position fixed at the call.
        """
        owner = self.owner
        info, full_args = workflow_info_of(fn, args, owner)
        options = current_options()
        call = read_call(workflow_id=options.workflow_id, timeout=options.timeout)
        return self._enqueue(owner, info, call, options, full_args, dict(kwargs))

    async def _enqueue(self, owner: RuntimeSource, info: WorkflowInfo, call: CallContext,
                       options: EnqueueOptions, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> WorkflowHandle[Any]:
        return await enqueue(owner._current_runtime, self, info, call, options, args, kwargs)

    def debouncer(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /, *, period: float,
        max_delay: float | None = None,
    ) -> Debouncer[P, R]:
        """A debouncer of ``fn`` on this queue; see :class:`Debouncer`."""
        return Debouncer(self, fn, period, max_delay)


def _settings_of(record: QueueRecord) -> dict[str, Any]:
    """A stored queue's settings, as the keyword arguments of :class:`Queue`."""
    return {
        "concurrency": record.concurrency,
        "worker_concurrency": record.worker_concurrency,
        "limiter": (RateLimit(record.rate_limit_max, record.rate_limit_period_sec)
                    if record.rate_limit_max is not None
                    and record.rate_limit_period_sec is not None else None),
        "partition_queue": record.partition_queue,
        "partition_concurrency": record.partition_concurrency,
        "partition_worker_concurrency": record.partition_worker_concurrency,
        "partition_limiter": (
            RateLimit(record.partition_rate_limit_max, record.partition_rate_limit_period_sec)
            if record.partition_rate_limit_max is not None
            and record.partition_rate_limit_period_sec is not None else None),
        "polling_interval": record.polling_interval_sec or 1.0,
    }


def queue_settings(queue: Callable[P, Any]) -> Callable[
        [Callable[Concatenate[S, ...], T]], Callable[Concatenate[S, P], T]]:
    """Give a method that forwards its arguments to :class:`Queue` the queue's own
    signature, so the settings are written (and documented) once, in ``Queue``."""

    def typed(method: Callable[Concatenate[S, ...], T]) -> Callable[Concatenate[S, P], T]:
        return method

    return typed


def internal_queue() -> Queue:
    return Queue(INTERNAL_QUEUE_NAME)
