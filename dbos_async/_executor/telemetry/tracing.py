"""OpenTelemetry spans of workflows and step attempts, and the trace context they carry.

Native instrumentation, as OpenTelemetry asks of libraries: only the API is used, through
the application's global tracer provider. Without the API installed, or before the
application sets a provider, nothing here does any work.

A workflow's parent span travels with the workflow, in its stored attributes: a start or
enqueue made inside a span records that span's W3C trace context (``traceparent``, and
``tracestate`` when there is one; never baggage) under :data:`CARRIER_KEY`, and whoever runs
the workflow (this process, another executor, a recovery) opens the workflow's span under
it. The key and its shape are the ``dbos`` package's, so traces continue between the two.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from dbos_async._executor.context import added_attributes, workflow_of_step
from dbos_async.errors import RecordedError

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

CARRIER_KEY = "dbos.otelContext"
"""The workflow attribute holding the trace context its span continues."""

_INSTRUMENTATION = "dbos_async"
_propagator = TraceContextTextMapPropagator() if trace is not None else None
_tracer_cache: tuple[TracerProvider, Tracer] | None = None


def current_tracer() -> Tracer | None:
    """The tracer of the application's provider, or None while tracing is off (no API, or
    no provider set: the API's proxy provider)."""
    global _tracer_cache
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return None
    if _tracer_cache is None or _tracer_cache[0] is not provider:
        _tracer_cache = (provider, provider.get_tracer(_INSTRUMENTATION))
    return _tracer_cache[1]


def current_carrier() -> dict[str, str] | None:
    """The W3C trace context of the active span, or None outside spans."""
    if _propagator is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)  # writes nothing without a valid span context
    return carrier or None


def propagated() -> AbstractContextManager[None]:
    """Record the active span's trace context in the attributes of workflows started or
    enqueued in the block."""
    carrier = current_carrier()
    return nullcontext() if carrier is None else added_attributes({CARRIER_KEY: carrier})


def traced_attributes(attributes: dict[str, Any] | None) -> dict[str, Any] | None:
    """``attributes`` with the active span's trace context added (for a client's enqueue,
    which takes its attributes as an argument)."""
    carrier = current_carrier()
    if carrier is None or not isinstance(attributes, dict | None):
        return attributes  # a bad value is refused by the attributes' own check
    return {**(attributes or {}), CARRIER_KEY: carrier}


def _parent(attributes: str | None) -> Context | None:
    """The context recorded in a workflow's attributes (JSON text), if it holds a valid one.
    The attributes are the user's to write: anything malformed is ignored."""
    if _propagator is None or attributes is None or CARRIER_KEY not in attributes:
        return None
    try:
        carrier = json.loads(attributes).get(CARRIER_KEY)
    except (ValueError, AttributeError):
        return None
    if not isinstance(carrier, dict):
        return None
    context = _propagator.extract({k: v for k, v in carrier.items() if isinstance(v, str)})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def start_workflow_span(tracer: Tracer | None, workflow_id: str, name: str,
                        executor_id: str, attributes: str | None) -> Span | None:
    """A workflow's span from ``tracer``, a child of the span recorded at its start (a root
    without one); None while tracing is off (no tracer)."""
    if tracer is None:
        return None
    # Never the context the task inherited (a claim loop's may hold its starter's span).
    return tracer.start_span(name, context=_parent(attributes) or Context(), attributes={
        "dbos.workflow.id": workflow_id,
        "dbos.workflow.name": name,
        "dbos.executor.id": executor_id,
    })


def start_step_span(tracer: Tracer | None, name: str, step_id: int | None, attempt: int,
                    kind: str = "step") -> Span | None:
    """A step attempt's span from ``tracer``, a child of the active span (its workflow's,
    or the calling step's), saying its ``kind`` ("step" or "transaction"); None while
    tracing is off (no tracer)."""
    if tracer is None:
        return None
    attributes: dict[str, str | int] = {"dbos.step.name": name, "dbos.step.attempt": attempt,
                                        "dbos.step.kind": kind}
    workflow = workflow_of_step()
    if workflow is not None:
        attributes["dbos.workflow.id"] = workflow.workflow_id
    if step_id is not None:
        attributes["dbos.step.id"] = step_id
    return tracer.start_span(name, attributes=attributes)


@contextmanager
def active(span: Span) -> Iterator[None]:
    """Make ``span`` the active span in the block (steps and children started there are
    its children); ending it is the caller's."""
    with trace.use_span(span, record_exception=False, set_status_on_exception=False):
        yield


def end_span(span: Span, error: BaseException | None,
             attributes: dict[str, str] | None = None) -> None:
    """End ``span``, recording ``error`` (if any) as an exception event with status ERROR.
    Success leaves the status unset, as instrumentation should."""
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        # A failure reaches here in its recorded form: name it by the type it was raised
        # as, the same on the first run and on replay.
        name = error.name if isinstance(error, RecordedError) else type(error).__name__
        span.record_exception(error, attributes={"exception.type": name})
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{name}: {error}"))
    span.end()
