"""The executor's metrics: workflows and steps, queues, group commits, notifications,
background tasks and connection pools.

One store in process, read by two exporters: OpenTelemetry (native instrumentation, as for
spans in ``executor/telemetry/tracing.py``: only the API is used, through the application's
global meter provider) and the Prometheus endpoint (``dbos_async/prometheus.py``, which
reads the store itself, without the SDK). Recording is on once the application sets an SDK
meter provider or creates a Prometheus endpoint of the executor's metrics (:func:`enable`);
until then :func:`current` returns None and every call site skips its one line.

Nothing on the hot path calls an exporter (the SDK's ``add`` or ``record`` costs some
microseconds, and a workflow counts a dozen things and measures four durations): a count is
a dict increment, read by an observable counter when the provider collects or by a scrape;
a duration or size goes into a bucket of a :class:`Distribution`, whose records the
provider receives when it collects and whose totals a scrape renders.

Attributes are bounded, as metrics need: workflow, step and queue names, a status, a
channel, a task's name; never a workflow ID. Their keys are those of the spans.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg
    from opentelemetry.metrics import CallbackOptions, MeterProvider

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.metrics import Observation

    # The API's global provider, None until set (read directly: the public getter looks
    # the environment up while it is None, a microsecond per hook with metrics off), and
    # its stand-in until the application sets a provider: no OpenTelemetry export.
    from opentelemetry.metrics import _internal as otel_global
    from opentelemetry.metrics._internal import _ProxyMeterProvider
except ImportError:  # the `otel` extra is not installed: no OpenTelemetry export
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

Record = Callable[[float, dict[str, str]], None]
"""A histogram's ``record`` (value, attributes), as the OpenTelemetry API's."""


@dataclass(frozen=True)
class Metric:
    """What an exporter names and describes a metric by."""

    name: str
    unit: str
    description: str
    keys: tuple[str, ...]
    """The attribute keys, in the order the values are recorded."""


class Count:
    """A monotonic count per value of one attribute, kept in process."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric
        self._counts: dict[str, int] = {}

    def add(self, value: int, attribute: str) -> None:
        self._counts[attribute] = self._counts.get(attribute, 0) + value

    def totals(self) -> list[tuple[str, int]]:
        """Each attribute value's count since recording began."""
        # list() copies under the GIL: a reader's thread never sees the dict change size.
        return list(self._counts.items())


@dataclass(frozen=True)
class Totals:
    """A distribution's values under one set of attribute values, since recording began."""

    attributes: tuple[str, ...]
    count: int
    sum: float
    buckets: tuple[int, ...]
    """The values per bucket (not cumulative): one per bound, the values up to it and
    above the one before, then those above the last bound."""


class Distribution:
    """A histogram kept in process: bounded memory however long nothing reads it.

    A record goes into a cell per attribute values and bucket (count, sum, min, max).
    Readers fold the cells into the running :class:`Totals` (what a scrape renders) and,
    once :meth:`bind` gave it an SDK histogram, into those not yet replayed. :meth:`replay`
    hands the SDK a cell as its min, its max and the rest at their mean (which lies in the
    bucket), so the SDK's count, sum, min, max and bucket counts come out those of the
    values recorded. The SDK's own work per value is not saved, only moved off the hot path
    to the collection (the reader's thread, or the scrape).
    """

    def __init__(self, metric: Metric, bounds: tuple[float, ...]) -> None:
        self.metric = metric
        self.bounds = bounds
        self._cells: dict[tuple[tuple[str, ...], int], list[float]] = {}
        self._totals: dict[tuple[str, ...], list[float]] = {}
        self._buckets: dict[tuple[str, ...], list[int]] = {}
        self._unreplayed: dict[tuple[tuple[str, ...], int], list[float]] | None = None
        self._record: Record | None = None
        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}
        # Records come from the event loop, the readers from a scrape or a reader's thread.
        self._lock = threading.Lock()

    def record(self, value: float, *attribute: str) -> None:
        """``value`` under the attribute values ``attribute`` (one per key)."""
        key = (attribute, bisect_left(self.bounds, value))
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

    def bind(self, record: Record) -> None:
        """Replay into ``record`` (an SDK histogram's) from now on."""
        with self._lock:
            self._record = record
            self._unreplayed = {}

    def totals(self) -> list[Totals]:
        """Every attribute values' totals since recording began."""
        with self._lock:
            self._fold()
            return [Totals(attribute, int(count), total, tuple(self._buckets[attribute]))
                    for attribute, (count, total) in self._totals.items()]

    def replay(self) -> None:
        """Hand the values recorded since the last replay to the bound SDK histogram."""
        with self._lock:
            self._fold()
            record, cells = self._record, self._unreplayed
            if record is None or cells is None:
                return
            self._unreplayed = {}
        for (attribute, _), (count, total, low, high) in cells.items():
            attributes = self._attributes.get(attribute)
            if attributes is None:
                attributes = self._attributes[attribute] = dict(
                    zip(self.metric.keys, attribute, strict=True))
            record(low, attributes)
            if count > 1:
                record(high, attributes)
            if count > 2:
                rest = int(count) - 2
                middle = min(high, max(low, (total - low - high) / rest))
                for _ in range(rest):
                    record(middle, attributes)

    def _fold(self) -> None:
        """Move the cells recorded since the last read into the totals and, when bound,
        into those to replay (under the lock)."""
        cells, self._cells = self._cells, {}
        unreplayed = self._unreplayed
        for key, cell in cells.items():
            attribute, bucket = key
            count, total = cell[0], cell[1]
            totals = self._totals.get(attribute)
            if totals is None:
                totals = self._totals[attribute] = [0, 0.0]
                self._buckets[attribute] = [0] * (len(self.bounds) + 1)
            totals[0] += count
            totals[1] += total
            self._buckets[attribute][bucket] += int(count)
            if unreplayed is not None:
                kept = unreplayed.get(key)
                if kept is None:
                    unreplayed[key] = cell
                else:
                    _merge(kept, *cell)


def _merge(cell: list[float], count: float, total: float, low: float, high: float) -> None:
    cell[0] += count
    cell[1] += total
    if low < cell[2]:
        cell[2] = low
    if high > cell[3]:
        cell[3] = high


POOL_IN_USE = Metric("dbos.pool.in_use", "{connection}", "Database connections in use, by pool",
                     (POOL,))


class Instruments:
    """The store: every instrument of the executor, as its exporters read them."""

    def __init__(self) -> None:
        def counter(name: str, unit: str, description: str, key: str) -> Count:
            return Count(Metric(name, unit, description, (key,)))

        def histogram(name: str, unit: str, description: str, bounds: tuple[float, ...],
                      *keys: str) -> Distribution:
            return Distribution(Metric(name, unit, description, keys), bounds)

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
        self.counts = (self.workflows_started, self.workflows_completed,
                       self.workflows_failed, self.workflows_cancelled,
                       self.workflows_recovered, self.step_attempts, self.step_retries,
                       self.wakeups, self.task_restarts)
        self.distributions = (self.workflow_duration, self.step_duration,
                              self.claim_latency, self.claims_per_round, self.batch_size)


def pools_in_use() -> dict[str, int]:
    """The connections in use now, by pool name (the gauge :data:`POOL_IN_USE`)."""
    _forget_closed()
    used: dict[str, int] = {}
    for pool, name in list(_pools.items()):
        used[name] = used.get(name, 0) + pool.get_size() - pool.get_idle_size()
    return used


def _export_to(provider: MeterProvider, store: Instruments) -> None:
    """The OpenTelemetry exporter: ``store``'s metrics as instruments of ``provider``'s
    meter, observable counters and a gauge read at each collection, and histograms
    replayed into before the SDK reads them."""
    meter = provider.get_meter(INSTRUMENTATION)

    def observer(count: Count) -> Callable[[CallbackOptions], Iterable[Observation]]:
        key = count.metric.keys[0]
        return lambda _options: [Observation(n, {key: attribute})
                                 for attribute, n in count.totals()]

    for count in store.counts:
        m = count.metric
        meter.create_observable_counter(m.name, [observer(count)], m.unit, m.description)
    for distribution in store.distributions:
        m = distribution.metric
        distribution.bind(meter.create_histogram(
            m.name, m.unit, m.description,
            explicit_bucket_boundaries_advisory=distribution.bounds).record)

    def replay(_options: CallbackOptions) -> Iterable[Observation]:
        for distribution in store.distributions:
            distribution.replay()
        return ()

    def pools(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {POOL: name}) for name, n in pools_in_use().items()]

    # Its first callback replays the histograms: the SDK runs every observable
    # instrument's callbacks before it reads the histograms, at each collection.
    meter.create_observable_up_down_counter(
        POOL_IN_USE.name, [replay, pools], POOL_IN_USE.unit, POOL_IN_USE.description)


_store = Instruments()
_current: Instruments | None = None
"""The store while recording is on."""
_UNSEEN = object()
_DIRECT_GLOBAL = otel_metrics is not None and hasattr(otel_global, "_METER_PROVIDER")
_provider: object = _UNSEEN
"""The API's global meter provider when last looked at (None while unset)."""


def current() -> Instruments | None:
    """The store while recording is on, else None."""
    if otel_metrics is not None and _global_meter_provider() is not _provider:
        _see_meter_provider()
    return _current


def _global_meter_provider() -> object:
    """The API's global meter provider as set (None while unset), read directly where the
    API keeps it there (the versions tested); elsewhere through the public getter, a
    microsecond more per hook."""
    if _DIRECT_GLOBAL:
        return otel_global._METER_PROVIDER
    return otel_metrics.get_meter_provider()


def _see_meter_provider() -> None:
    """Export to the application's meter provider, if it is the SDK's (the getter also
    loads one the environment configures), and record from now on."""
    global _provider, _current
    provider = otel_metrics.get_meter_provider()
    if not isinstance(provider, _ProxyMeterProvider | otel_metrics.NoOpMeterProvider):
        _export_to(provider, _store)
        _current = _store
    _provider = _global_meter_provider()


def enable() -> Instruments:
    """Turn recording on for an exporter that reads the store itself (the Prometheus
    endpoint), with or without a meter provider; it stays on for the process."""
    global _current
    _current = _store
    return _store


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
