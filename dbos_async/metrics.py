"""OpenTelemetry metrics of the executor: workflows and steps, queues, group commits,
notifications, background tasks and connection pools.

Native instrumentation, as for spans (``executor/telemetry/tracing.py``): only the API is used,
through the application's global meter provider. Without the API installed, or before the
application sets a provider, :func:`current` returns None and every call site skips its
one line. With a provider, a count is a dict increment, read by an observable counter when
the provider collects (an SDK ``add`` costs some microseconds, and a workflow counts a
dozen things); a duration or size is a histogram record.

Attributes are bounded, as metrics need: workflow, step and queue names, a status, a
channel, a task's name; never a workflow ID. Their keys are those of the spans.
"""

from __future__ import annotations

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


class Instruments:
    """The instruments of one meter provider."""

    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(INSTRUMENTATION)
        histogram = meter.create_histogram

        def counter(name: str, unit: str, description: str, key: str) -> Count:
            return Count(meter, name, unit, description, key)

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
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.step_attempts = counter(
            "dbos.step.attempts", "{attempt}", "Step attempts, the first and each retry",
            STEP_NAME)
        self.step_retries = counter(
            "dbos.step.retries", "{attempt}", "Step attempts after the first", STEP_NAME)
        self.step_duration = histogram(
            "dbos.step.duration", "s", "Run time of a step attempt, by outcome",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.claim_latency = histogram(
            "dbos.queue.claim_latency", "s",
            "How long a queued workflow waited, from its enqueue to its start",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.claims_per_round = histogram(
            "dbos.queue.claims_per_round", "{workflow}",
            "Workflows started by one claim round of a queue",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS)
        self.batch_size = histogram(
            "dbos.group_commit.batch_size", "{write}",
            "Writes committed together by one group commit",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS)
        self.wakeups = counter(
            "dbos.notification.wakeups", "{wakeup}",
            "Waiters woken by a notification (a message, an event, an enqueue, ...)", CHANNEL)
        self.task_restarts = counter(
            "dbos.task.restarts", "{restart}", "Background task restarts after a failure",
            TASK_NAME)
        meter.create_observable_up_down_counter(
            "dbos.pool.in_use", [_pool_usage], "{connection}",
            "Database connections in use, by pool")


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


def workflow_started(name: str) -> None:
    if (m := current()) is not None:
        m.workflows_started.add(1, name)


def workflow_finished(name: str, status: str, seconds: float) -> None:
    """A run's end: ``status`` SUCCESS, ERROR or CANCELLED (a run interrupted by shutdown
    is PENDING and counts as none of them, but its run time is recorded)."""
    if (m := current()) is None:
        return
    if status == "SUCCESS":
        m.workflows_completed.add(1, name)
    elif status == "ERROR":
        m.workflows_failed.add(1, name)
    elif status == "CANCELLED":
        m.workflows_cancelled.add(1, name)
    m.workflow_duration.record(seconds, {WORKFLOW_NAME: name, WORKFLOW_STATUS: status})


def workflows_recovered(names: Iterable[str]) -> None:
    if (m := current()) is not None:
        for name in names:
            m.workflows_recovered.add(1, name)


def step_finished(name: str, attempt: int, status: str, seconds: float) -> None:
    """Attempt ``attempt`` (from 1) of a step ended: SUCCESS or ERROR."""
    if (m := current()) is None:
        return
    m.step_attempts.add(1, name)
    if attempt > 1:
        m.step_retries.add(1, name)
    m.step_duration.record(seconds, {STEP_NAME: name, STEP_STATUS: status})


def queue_waits(queue: str, waited_ms: Iterable[int | None]) -> None:
    """A claim of ``queue`` started workflows that waited ``waited_ms`` each."""
    if (m := current()) is not None:
        attributes = {QUEUE_NAME: queue}
        for waited in waited_ms:
            if waited is not None:
                m.claim_latency.record(max(0, waited) / 1000, attributes)


def claim_round(queue: str, started: int) -> None:
    if (m := current()) is not None:
        m.claims_per_round.record(started, {QUEUE_NAME: queue})


def batch_committed(size: int) -> None:
    if (m := current()) is not None:
        m.batch_size.record(size)


def woken(channel: str, waiters: int) -> None:
    if waiters and (m := current()) is not None:
        m.wakeups.add(waiters, channel)


def task_restarted(task: str) -> None:
    if (m := current()) is not None:
        m.task_restarts.add(1, task)
