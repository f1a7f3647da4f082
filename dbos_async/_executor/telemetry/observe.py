"""What a workflow run and a step attempt report: their log records, spans and metrics.

Two hooks, one around each: :func:`workflow_run` around a workflow body's execution (with
its outcome recorded), :func:`step_attempt` around each attempt of a step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dbos_async import _metrics as metrics
from dbos_async._executor.context import Telemetry, WorkflowContext, workflow_of_step
from dbos_async._executor.telemetry import logs, tracing
from dbos_async.errors import WorkflowCancelledError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

_UNTRACED: AbstractContextManager[None] = nullcontext()


def current_telemetry() -> Telemetry:
    """The providers' instruments and tracer as they stand now."""
    return Telemetry(metrics.current(), tracing.current_tracer())


def _telemetry_of_run() -> Telemetry:
    """The telemetry of the workflow whose step runs here, or the current one outside
    workflows."""
    ctx = workflow_of_step()
    if ctx is not None and ctx.telemetry is not None:
        return ctx.telemetry
    return current_telemetry()


class workflow_run:
    """Log the run's start and finish, count and time it, and trace it as a span
    (continuing the trace recorded in its ``attributes``); the block settles ``outcome``,
    the run's result or error. A plain class, cheaper to enter than a generator's context
    manager: it wraps every workflow run. The run reports to its context's telemetry, read
    now if its launch did not (its start, end and steps report to the same)."""

    __slots__ = ("_active", "_attributes", "_ctx", "_instruments", "_later", "_name",
                 "_outcome", "_span", "_started")

    def __init__(self, ctx: WorkflowContext, name: str, outcome: asyncio.Future[Any],
                 attributes: str | None) -> None:
        self._ctx = ctx
        self._name = name
        self._outcome = outcome
        self._attributes = attributes
        self._later = False

    def __enter__(self) -> None:
        ctx, name = self._ctx, self._name
        self._started = time.monotonic()
        logs.workflow_started(ctx.workflow_id, name, len(ctx.checkpoints))
        telemetry = ctx.telemetry
        if telemetry is None:
            telemetry = ctx.telemetry = current_telemetry()
        self._instruments = telemetry.instruments
        metrics.workflow_started(telemetry.instruments, name)
        span = self._span = tracing.start_workflow_span(
            telemetry.tracer, ctx.workflow_id, name, ctx.runtime.executor_id,
            self._attributes)
        self._active = tracing.active(span) if span is not None else _UNTRACED
        self._active.__enter__()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            self._active.__exit__(kind, error, traceback)
        finally:
            interrupted = kind is not None and issubclass(kind, asyncio.CancelledError)
            if interrupted or not self._later:
                self._finished(interrupted)

    def report_later(self) -> None:
        """Leaving the block does not report the run's end: its outcome is still being
        recorded, and :meth:`report` reports it once settled."""
        self._later = True

    def report(self) -> None:
        """Report the end of a run whose block was left with :meth:`report_later`."""
        self._finished(False)

    def _finished(self, interrupted: bool) -> None:
        status, error = (logs.PENDING, None) if interrupted else _settled(self._outcome)
        seconds = time.monotonic() - self._started
        logs.workflow_finished(self._ctx.workflow_id, self._name, status, seconds * 1000,
                               error)
        metrics.workflow_finished(self._instruments, self._name, status, seconds)
        span = self._span
        if span is not None:
            tracing.end_span(span, error if status == logs.ERROR else None,
                             {"dbos.workflow.status": status})


def _settled(outcome: asyncio.Future[Any]) -> tuple[str, BaseException | None]:
    if not outcome.done() or outcome.cancelled():
        return logs.PENDING, None
    error = outcome.exception()
    if error is None:
        return logs.SUCCESS, None
    return (logs.CANCELLED if isinstance(error, WorkflowCancelledError) else logs.ERROR), error


def step_attempt(name: str, step_id: int | None, attempt: int,
                 kind: str = "step") -> AbstractContextManager[None]:
    """Trace attempt ``attempt`` (from 1) of a step (of ``kind``: "step" or "transaction")
    as a span of its own, a child of the active span, and measure it; nothing while
    tracing and metrics are off. A step of a workflow reports to its run's telemetry."""
    instruments, tracer = _telemetry_of_run()
    span = tracing.start_step_span(tracer, name, step_id, attempt, kind)
    if span is not None:
        return _traced_attempt(instruments, span, name, attempt)
    return _UNTRACED if instruments is None else _MeasuredAttempt(instruments, name, attempt)


class _MeasuredAttempt:
    """A step attempt measured but not traced: a plain class, cheaper to enter and leave
    than a generator's context manager (it wraps every step while metrics are on)."""

    __slots__ = ("_attempt", "_instruments", "_name", "_started")

    def __init__(self, instruments: metrics.Instruments, name: str, attempt: int) -> None:
        self._instruments = instruments
        self._name = name
        self._attempt = attempt
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.monotonic()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None or issubclass(kind, Exception):  # cancelled: no verdict on the step
            metrics.step_finished(self._instruments, self._name, self._attempt,
                                  logs.SUCCESS if kind is None else logs.ERROR,
                                  time.monotonic() - self._started)


@contextmanager
def _traced_attempt(instruments: metrics.Instruments | None, span: Span, name: str,
                    attempt: int) -> Iterator[None]:
    started = time.monotonic()
    try:
        with tracing.active(span):
            yield
    except Exception as error:
        metrics.step_finished(instruments, name, attempt, logs.ERROR,
                              time.monotonic() - started)
        tracing.end_span(span, error)
        raise
    except BaseException:  # cancelled: no verdict on the step
        tracing.end_span(span, None)
        raise
    metrics.step_finished(instruments, name, attempt, logs.SUCCESS,
                          time.monotonic() - started)
    tracing.end_span(span, None)
