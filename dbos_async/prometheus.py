"""A Prometheus ``/metrics`` endpoint, for users without an OpenTelemetry collector.

:class:`PrometheusMetrics` renders, in Prometheus's text format:

- the executor's metrics (``dbos_async/_metrics.py``), read from the process's store at
  each scrape, without OpenTelemetry's SDK (creating the endpoint turns their recording
  on); names as Prometheus spells the OpenTelemetry ones (``dbos.workflow.started``
  becomes ``dbos_workflow_started_total``, ``dbos.step.duration`` in seconds
  ``dbos_step_duration_seconds``, attribute ``dbos.workflow.name`` label
  ``dbos_workflow_name``);
- optionally, the application's own OpenTelemetry metrics, through
  :attr:`PrometheusMetrics.reader` given to its meter provider;
- optionally, the system database's aggregates through an operator (a
  :class:`~dbos_async.DBOS` or :class:`~dbos_async.DBOSClient`): each queue's backlog by
  status and its oldest waiting workflow's age, and the workflows created in a recent
  window by name and status with their run-time quantiles. Every executor reads the same
  rows, so one scrape target of these is enough.

The instance is an ASGI app (``app.add_route("/metrics", prometheus)`` in FastAPI or
Starlette); :func:`dbos_async.aiohttp.metrics_handler` serves it in aiohttp, and the
console serves the aggregates at ``/metrics``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from dbos_async import _metrics
from dbos_async._extras import needs_extra
from dbos_async.errors import InvalidArgumentError, MissingExtraError

with needs_extra("prometheus", __name__):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )

from dbos_async._executor.operator import Operator

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

__all__ = ["CONTENT_TYPE", "PrometheusMetrics", "prometheus_name"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The content type of Prometheus's text format, version 0.0.4 (what it renders)."""

_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes"}
_QUANTILES = (("0.5", "p50_ms"), ("0.95", "p95_ms"), ("0.99", "p99_ms"))


def prometheus_name(name: str) -> str:
    """An OpenTelemetry name or attribute key as Prometheus spells it."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


class PrometheusMetrics:
    """The executor's metrics and the database's aggregates in Prometheus's text format.
    An ASGI app serving them (``app.add_route("/metrics", prometheus)``).

    Create it before the executor runs workflows: the executor's metrics are recorded
    from then on (for every endpoint in the process, which all render the same counts).

    Args:
        aggregates: the operator (a DBOS or DBOSClient, or a function returning one) whose
            system database's aggregates to add; None leaves them out.
        window_seconds: how far back the workflow aggregates count (default an hour).
        executor: whether to render this process's executor metrics (and so record them);
            False serves only the aggregates (and the reader's metrics), as the console
            does.

    Raises:
        InvalidArgumentError: a window that is not a positive number of seconds,
            ``aggregates`` neither an operator nor a function, or ``executor`` not a bool.
        MissingExtraError: the ``prometheus`` extra is not installed.
    """

    def __init__(self, *, aggregates: Operator | Callable[[], Operator] | None = None,
                 window_seconds: float = 3600.0, executor: bool = True) -> None:
        if (not isinstance(window_seconds, int | float) or isinstance(window_seconds, bool)
                or not math.isfinite(window_seconds) or window_seconds <= 0):
            raise InvalidArgumentError("window_seconds",
                                       f"must be a positive number, not {window_seconds!r}")
        if aggregates is not None and not (isinstance(aggregates, Operator)
                                           or callable(aggregates)):
            raise InvalidArgumentError(
                "aggregates", f"must be a DBOS, a DBOSClient or a function returning one, "
                              f"not {type(aggregates).__name__}")
        if not isinstance(executor, bool):
            raise InvalidArgumentError("executor",
                                       f"must be True or False, not {executor!r}")
        self._aggregates = aggregates
        self._window_ms = int(window_seconds * 1000)
        self._reader: InMemoryMetricReader | None = None
        self._store = _metrics.enable() if executor else None

    content_type = CONTENT_TYPE

    @property
    def reader(self) -> InMemoryMetricReader:
        """A metric reader for the application's own OpenTelemetry metrics: given to its
        meter provider (``MeterProvider(metric_readers=[prometheus.reader])``), what that
        collects is rendered at each scrape beside the executor's metrics.

        The executor's metrics need no reader: they are read from the store, and the
        provider's copy of them is left out of the scrape (nothing appears twice). A
        provider given this reader still receives them at each scrape, at the SDK's cost
        per histogram value; without metrics of its own, the application gives none.

        Raises:
            MissingExtraError: the ``otel`` extra (the OpenTelemetry SDK) is not installed.
        """
        if self._reader is None:
            try:
                from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            except ModuleNotFoundError as error:
                raise MissingExtraError(__name__, "otel", "opentelemetry") from error
            self._reader = InMemoryMetricReader()
        return self._reader

    async def render(self) -> bytes:
        """The metrics in Prometheus's text format (:data:`CONTENT_TYPE`).

        Returns:
            The exposition, UTF-8 text.

        Raises:
            QueryTimeoutError: an aggregate read ran over the observability query timeout.
        """
        families = [*_executor_families(self._store), *self._reader_families()]
        if self._aggregates is not None:
            operator = (self._aggregates if isinstance(self._aggregates, Operator)
                        else self._aggregates())
            families += await database_families(operator, self._window_ms)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))
        return generate_latest(registry)

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any],
                       send: Callable[[dict[str, Any]], Any]) -> None:
        """Serve :meth:`render` as an ASGI app (GET and HEAD)."""
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b"Method Not Allowed\n", "text/plain; charset=utf-8",
                           [(b"allow", b"GET, HEAD")])
            return
        body = await self.render()
        await _respond(send, 200, b"" if scope["method"] == "HEAD" else body, CONTENT_TYPE)

    def _reader_families(self) -> list[Metric]:
        if self._reader is None:
            return []
        data = self._reader.get_metrics_data()
        if data is None:  # the reader is not (yet) a meter provider's
            return []
        return [family for resource in data.resource_metrics
                for scope in resource.scope_metrics
                if scope.scope.name != _metrics.INSTRUMENTATION  # rendered from the store
                for metric in scope.metrics
                for family in _family(metric)]


def _executor_families(store: _metrics.Instruments | None) -> list[Metric]:
    """The executor's metrics, from the process's store (none while ``store`` is None):
    its counters, histograms and the pools' connections in use; a metric nothing was
    recorded for is left out."""
    if store is None:
        return []
    families: list[Metric] = []
    for count in store.counts:
        totals = count.totals()
        if totals:
            m = count.metric
            counter = CounterMetricFamily(_family_name(m.name, m.unit), m.description,
                                          labels=[prometheus_name(m.keys[0])])
            for attribute, n in totals:
                counter.add_metric([attribute], n)
            families.append(counter)
    for distribution in store.distributions:
        points = distribution.totals()
        if points:
            families.append(_histogram(distribution, points))
    in_use = _metrics.pools_in_use()
    if in_use:
        m = _metrics.POOL_IN_USE
        gauge = GaugeMetricFamily(_family_name(m.name, m.unit), m.description,
                                  labels=[prometheus_name(m.keys[0])])
        for name, n in in_use.items():
            gauge.add_metric([name], n)
        families.append(gauge)
    return families


def _histogram(distribution: _metrics.Distribution,
               points: list[_metrics.Totals]) -> HistogramMetricFamily:
    m = distribution.metric
    order = sorted(range(len(m.keys)), key=lambda i: m.keys[i])  # labels sorted by key
    family = HistogramMetricFamily(_family_name(m.name, m.unit), m.description,
                                   labels=[prometheus_name(m.keys[i]) for i in order])
    for point in points:
        family.add_metric([point.attributes[i] for i in order],
                          _buckets(distribution.bounds, point.buckets, point.count), point.sum)
    return family


def _buckets(bounds: Iterable[float], counts: Iterable[int],
             total: int) -> list[tuple[str, float]]:
    """Prometheus's cumulative buckets (``le``, values up to it) from the values per
    bucket, ending with ``+Inf``, all ``total`` of them."""
    cumulative, buckets = 0, []
    for bound, count in zip(bounds, counts, strict=False):
        cumulative += count
        buckets.append((repr(float(bound)), float(cumulative)))
    buckets.append(("+Inf", float(total)))
    return buckets


class _Families:
    """A collector of families built beforehand (the aggregates are read asynchronously,
    a collector's ``collect`` is not)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


async def _respond(send: Callable[[dict[str, Any]], Any], status: int, body: bytes,
                   content_type: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _family_name(name: str, unit: str) -> str:
    """A metric's Prometheus name: its name as Prometheus spells it, with its unit's."""
    spelled = prometheus_name(name)
    suffix = _UNIT_SUFFIXES.get(unit)
    return f"{spelled}_{suffix}" if suffix and not spelled.endswith(f"_{suffix}") else spelled


def _family(metric: Any) -> list[Metric]:
    """One OpenTelemetry metric as a Prometheus family (none for a kind it has no match
    for)."""
    from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum

    name = _family_name(metric.name, metric.unit or "")
    points = list(metric.data.data_points)
    keys = sorted({k for p in points for k in (p.attributes or {})})
    labels = [prometheus_name(k) for k in keys]

    def values(point: Any) -> list[str]:
        attributes = point.attributes or {}
        return [str(attributes.get(k, "")) for k in keys]

    data = metric.data
    family: Metric
    if isinstance(data, Histogram):
        family = HistogramMetricFamily(name, metric.description or "", labels=labels)
        for p in points:
            family.add_metric(values(p), _buckets(p.explicit_bounds, p.bucket_counts,
                                                  p.count), p.sum)
    elif isinstance(data, Sum) and data.is_monotonic:
        family = CounterMetricFamily(name, metric.description or "", labels=labels)
        for p in points:
            family.add_metric(values(p), p.value)
    elif isinstance(data, Sum | Gauge):
        family = GaugeMetricFamily(name, metric.description or "", labels=labels)
        for p in points:
            family.add_metric(values(p), p.value)
    else:
        return []
    return [family]


async def database_families(operator: Operator, window_ms: int) -> list[Metric]:
    """The aggregates of the system database as gauges: each queue's workflows by status
    and its oldest waiting one's age; the workflows created in the last ``window_ms`` by
    name and status, and their run-time quantiles by name."""
    queue_label, status_label = "dbos_queue_name", "dbos_workflow_status"
    depth = GaugeMetricFamily("dbos_queue_workflows",
                              "Workflows on a queue now, by status",
                              labels=[queue_label, status_label])
    oldest = GaugeMetricFamily("dbos_queue_oldest_waiting_seconds",
                               "How long a queue's oldest waiting workflow has waited",
                               labels=[queue_label])
    for q in await operator.get_queue_metrics():
        for status, count in (("DELAYED", q.delayed), ("ENQUEUED", q.enqueued),
                              ("PENDING", q.pending)):
            depth.add_metric([q.queue_name, status], count)
        if q.oldest_waiting_ms is not None:
            oldest.add_metric([q.queue_name], q.oldest_waiting_ms / 1000)
    name_label = "dbos_workflow_name"
    created = GaugeMetricFamily(
        "dbos_recent_workflows",
        f"Workflows created in the last {window_ms / 1000:g} s, by name and status",
        labels=[name_label, status_label])
    for a in await operator.get_workflow_aggregates(
            group_by=("status", "name"), start_time=_since(window_ms)):
        created.add_metric([a.name or "", a.status or ""], a.count)
    run = GaugeMetricFamily(
        "dbos_recent_workflow_run_seconds",
        f"Run-time quantiles of the workflows created in the last {window_ms / 1000:g} s "
        "that finished", labels=[name_label, "quantile"])
    for a in await operator.get_workflow_aggregates(
            group_by=("name",), start_time=_since(window_ms)):
        for quantile, field in _QUANTILES:
            value = getattr(a, field)
            if value is not None:
                run.add_metric([a.name or "", quantile], value / 1000)
    return [depth, oldest, created, run]


def _since(window_ms: int) -> int:
    return int(time.time() * 1000) - window_ms
