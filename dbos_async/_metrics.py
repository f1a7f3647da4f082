"""OpenTelemetry metrics of the executor: workflows and steps, queues, group commits,
notifications, background tasks and connection pools.

Native instrumentation, as for spans (``executor/telemetry/tracing.py``): only the API is used,
through the application's global meter provider. Without the API installed, or before the
application sets a provider, :func:`current` returns None and every call site skips its
one line. With a provider, nothing on the hot path calls the SDK (its ``add`` or ``record``
costs some microseconds, and a workflow counts a dozen things and measures four durations):
a count is a dict increment, read by an observable counter when the provider collects; a
duration or size goes into a bucket of a :class:`Distribution` in process, whose records
the provider receives when it collects.

Attributes are bounded, as metrics need: workflow, step and queue names, a status, a
channel, a task's name; never a workflow ID. Their keys are those of the spans.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg
    from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.metrics import Observation

    # The API's stand-in until the application sets a provider: metrics are off.
    from opentelemetry.metrics._internal import _ProxyMeterProvider
except ImportError:  # the `otel` extra is not installed: metrics are off
    otel_metrics = None  # type: ignore[assignment]

INSTRUMENTATION = "dbos_async"

WORKFLOW_NAME = "dbos.workflow.name"
WORKFLOW_STATUS = "dbos.workflow.status"
STEP_NAME = "dbos.step.name"
STEP_STATUS = "dbos.step.status"
QUEUE_NAME = "dbos.queue.name"
CHANNEL = "dbos.notification.channel"
TASK_NAME = "dbos.task.name"
POOL = "dbos.pool.name"

# Bucket bounds in seconds: from a millisecond step to a day-long workflow.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 86400.0)
COUNT_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)

_pools: dict[asyncpg.Pool, str] = {}
"""The pools reported, until they close (asyncpg's pools take no weak reference)."""


class Count:
    """A monotonic count per value of one attribute, kept in process and reported by an
    observable counter."""

    def __init__(self, meter: Meter, name: str, unit: str, description: str,
                 key: str) -> None:
        self._key = key
        self._counts: dict[str, int] = {}
        meter.create_observable_counter(name, [self._observe], unit, description)

    def add(self, value: int, attribute: str) -> None:
        self._counts[attribute] = self._counts.get(attribute, 0) + value

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        # list() copies under the GIL: the reader's thread never sees the dict change size.
        return [Observation(count, {self._key: attribute})
                for attribute, count in list(self._counts.items())]


class Distribution:
    """A histogram kept in process and handed to the SDK's histogram when the provider
    collects, in as many records as it holds values.

    Per attribute values and bucket (the advisory bounds, the SDK's unless a view changes
    them) it keeps the count, sum, min and max: bounded memory however long the provider
    goes without collecting. It replays a bucket as its min, its max and the rest at their
    mean (which lies in the bucket), so the SDK's count, sum, min, max and bucket counts
    come out those of the values recorded. The SDK's own work per value is not saved, only
    moved off the hot path to the collection (the reader's thread, or the scrape).
    """

    def __init__(self, meter: Meter, name: str, unit: str, description: str,
                 bounds: tuple[float, ...], keys: tuple[str, ...]) -> None:
        self._histogram = meter.create_histogram(
            name, unit, description, explicit_bucket_boundaries_advisory=bounds)
        self._bounds = bounds
        self._keys = keys
        self._cells: dict[tuple[tuple[str, ...], int], list[float]] = {}
        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}
        # Records come from the event loop, the collection from the reader's thread.
        self._lock = threading.Lock()

    def record(self, value: float, *attribute: str) -> None:
        """``value`` under the attribute values ``attribute`` (one per key)."""
        key = (attribute, bisect_left(self._bounds, value))
        with self._lock:
            cell = self._cells.get(key)
            if cell is None:
                self._cells[key] = [1, value, value, value]
                return
            cell[0] += 1
            cell[1] += value
            if value < cell[2]:
                cell[2] = value
            elif value > cell[3]:
                cell[3] = value

    def replay(self) -> None:
        """Hand the values recorded since the last replay to the SDK's histogram."""
        with self._lock:
            cells, self._cells = self._cells, {}
        record = self._histogram.record
        for (attribute, _), (count, total, low, high) in cells.items():
            attributes = self._attributes.get(attribute)
            if attributes is None:
                attributes = self._attributes[attribute] = dict(zip(self._keys, attribute,
                                                                    strict=True))
            record(low, attributes)
            if count > 1:
                record(high, attributes)
            if count > 2:
                rest = int(count) - 2
                middle = min(high, max(low, (total - low - high) / rest))
                for _ in range(rest):
                    record(middle, attributes)


class Instruments:
    """The instruments of one meter provider."""

    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(INSTRUMENTATION)

        def counter(name: str, unit: str, description: str, key: str) -> Count:
            return Count(meter, name, unit, description, key)

        def histogram(name: str, unit: str, description: str, bounds: tuple[float, ...],
                      *keys: str) -> Distribution:
            return Distribution(meter, name, unit, description, bounds, keys)

        self.workflows_started = counter(
            "dbos.workflow.started", "{workflow}", "Workflow runs started (first runs, "
            "resumptions and recoveries)", WORKFLOW_NAME)
        self.workflows_completed = counter(
            "dbos.workflow.completed", "{workflow}", "Workflow runs that succeeded",
            WORKFLOW_NAME)
        self.workflows_failed = counter(
            "dbos.workflow.failed", "{workflow}", "Workflow runs that ended in an error",
            WORKFLOW_NAME)
        self.workflows_cancelled = counter(
            "dbos.workflow.cancelled", "{workflow}", "Workflow runs stopped by a cancel",
            WORKFLOW_NAME)
        self.workflows_recovered = counter(
            "dbos.workflow.recovered", "{workflow}",
            "Workflows taken over by recovery (of this executor or a dead one)", WORKFLOW_NAME)
        self.workflow_duration = histogram(
            "dbos.workflow.duration", "s", "Run time of a workflow run, by outcome",
            DURATION_BUCKETS, WORKFLOW_NAME, WORKFLOW_STATUS)
        self.step_attempts = counter(
            "dbos.step.attempts", "{attempt}", "Step attempts, the first and each retry",
            STEP_NAME)
        self.step_retries = counter(
            "dbos.step.retries", "{attempt}", "Step attempts after the first", STEP_NAME)
        self.step_duration = histogram(
            "dbos.step.duration", "s", "Run time of a step attempt, by outcome",
            DURATION_BUCKETS, STEP_NAME, STEP_STATUS)
        self.claim_latency = histogram(
            "dbos.queue.claim_latency", "s",
            "How long a queued workflow waited, from its enqueue to its start",
            DURATION_BUCKETS, QUEUE_NAME)
        self.claims_per_round = histogram(
            "dbos.queue.claims_per_round", "{workflow}",
            "Workflows started by one claim round of a queue", COUNT_BUCKETS, QUEUE_NAME)
        self.batch_size = histogram(
            "dbos.group_commit.batch_size", "{write}",
            "Writes committed together by one group commit", COUNT_BUCKETS)
        self.wakeups = counter(
            "dbos.notification.wakeups", "{wakeup}",
            "Waiters woken by a notification (a message, an event, an enqueue, ...)", CHANNEL)
        self.task_restarts = counter(
            "dbos.task.restarts", "{restart}", "Background task restarts after a failure",
            TASK_NAME)
        self._distributions = (self.workflow_duration, self.step_duration,
                               self.claim_latency, self.claims_per_round, self.batch_size)
        # Its first callback replays the histograms: the SDK runs every observable
        # instrument's callbacks before it reads the histograms, at each collection.
        meter.create_observable_up_down_counter(
            "dbos.pool.in_use", [self._replay, _pool_usage], "{connection}",
            "Database connections in use, by pool")

    def _replay(self, _options: CallbackOptions) -> Iterable[Observation]:
        for distribution in self._distributions:
            distribution.replay()
        return ()


def _pool_usage(_options: CallbackOptions) -> Iterable[Observation]:
    _forget_closed()
    used: dict[str, int] = {}
    for pool, name in list(_pools.items()):
        used[name] = used.get(name, 0) + pool.get_size() - pool.get_idle_size()
    return [Observation(count, {POOL: name}) for name, count in used.items()]


_state: tuple[Any, Instruments | None] = (None, None)


def current() -> Instruments | None:
    """The instruments of the application's meter provider; None while metrics are off."""
    global _state
    if otel_metrics is None:
        return None
    provider = otel_metrics.get_meter_provider()
    if provider is not _state[0]:
        off = isinstance(provider, _ProxyMeterProvider | otel_metrics.NoOpMeterProvider)
        _state = (provider, None if off else Instruments(provider))
    return _state[1]


def watch_pool(pool: asyncpg.Pool, name: str) -> None:
    """Report ``pool``'s connections in use (as ``name``) until it closes."""
    _forget_closed()
    _pools[pool] = name


def _forget_closed() -> None:
    for pool in [p for p in _pools if p.is_closing()]:
        del _pools[pool]


# ---- The call sites' one-liners (each a no-op while metrics are off) ----


def workflow_started(m: Instruments | None, name: str) -> None:
    """A run's start, counted by the instruments of its run (``m``, None while metrics
    are off)."""
    if m is not None:
        m.workflows_started.add(1, name)


def workflow_finished(m: Instruments | None, name: str, status: str, seconds: float) -> None:
    """A run's end, counted by the instruments of its run (``m``): ``status`` SUCCESS,
    ERROR or CANCELLED (a run interrupted by shutdown is PENDING and counts as none of
    them, but its run time is recorded)."""
    if m is None:
        return
    if status == "SUCCESS":
        m.workflows_completed.add(1, name)
    elif status == "ERROR":
        m.workflows_failed.add(1, name)
    elif status == "CANCELLED":
        m.workflows_cancelled.add(1, name)
    m.workflow_duration.record(seconds, name, status)


def workflows_recovered(names: Iterable[str]) -> None:
    if (m := current()) is not None:
        for name in names:
            m.workflows_recovered.add(1, name)


def step_finished(m: Instruments | None, name: str, attempt: int, status: str,
                  seconds: float) -> None:
    """Attempt ``attempt`` (from 1) of a step ended: SUCCESS or ERROR (counted by ``m``,
    the instruments of its run)."""
    if m is None:
        return
    m.step_attempts.add(1, name)
    if attempt > 1:
        m.step_retries.add(1, name)
    m.step_duration.record(seconds, name, status)


def queue_waits(m: Instruments | None, queue: str, waited_ms: Iterable[int | None]) -> None:
    """A claim of ``queue`` started workflows that waited ``waited_ms`` each (counted by
    ``m``, the instruments of the claim round)."""
    if m is not None:
        for waited in waited_ms:
            if waited is not None:
                m.claim_latency.record(max(0, waited) / 1000, queue)


def claim_round(queue: str, started: int) -> None:
    if (m := current()) is not None:
        m.claims_per_round.record(started, queue)


def batch_committed(size: int) -> None:
    if (m := current()) is not None:
        m.batch_size.record(size)


def woken(channel: str, waiters: int) -> None:
    if waiters and (m := current()) is not None:
        m.wakeups.add(waiters, channel)


def task_restarted(task: str) -> None:
    if (m := current()) is not None:
        m.task_restarts.add(1, task)
