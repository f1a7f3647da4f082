"""Steps: retried attempts, and the checkpoint that makes a completed step run only once."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio

from dbos_async._executor.authentication import (
    Authentication,
    RequiredRoles,
    authorize,
    current_authentication,
    running_as,
)
from dbos_async._executor.context import (
    WorkflowContext,
    current_workflow,
    running_step,
    workflow_of_step,
)
from dbos_async._executor.recorded_errors import deserialize_error, recorded_error
from dbos_async._executor.serialization import Signature
from dbos_async._executor.telemetry import logs, observe
from dbos_async._sysdb.clock import SYSTEM_CLOCK, Clock, after
from dbos_async._sysdb.database import StepRecord
from dbos_async._sysdb.statements import Payload
from dbos_async._validation import check_identifier, check_seconds
from dbos_async.errors import (
    DBOSError,
    NondeterminismError,
    StepRetriesExceededError,
    WorkflowCancelledError,
)

RetryOn = (
    type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
)


@dataclass(frozen=True)
class StepOptions:
    """How a step is attempted.

    ``retries`` is the number of attempts after the first; the wait between attempts starts at
    ``retry_interval`` seconds and grows by ``backoff_rate`` up to ``max_retry_interval``.
    ``retry_on`` chooses which errors are retried (exception types or a predicate; every
    ``Exception`` by default). ``timeout`` bounds each attempt, in seconds. A
    ``cancellable`` step is interrupted when its workflow is cancelled; otherwise it runs to
    the end and its result is discarded at the checkpoint.
    """

    name: str
    retries: int = 0
    retry_interval: float = 1.0
    backoff_rate: float = 2.0
    max_retry_interval: float = 60.0
    retry_on: RetryOn | None = None
    timeout: float | None = None
    cancellable: bool = True

    def __post_init__(self) -> None:
        check_identifier(self.name, "step name")
        check_seconds(self.retry_interval, f"retry_interval of step {self.name!r}",
                      optional=False)
        check_seconds(self.max_retry_interval, f"max_retry_interval of step {self.name!r}",
                      optional=False)
        check_seconds(self.timeout, f"timeout of step {self.name!r}", positive=True)
        if self.retries < 0:
            raise DBOSError(f"Step {self.name!r}: retries must be >= 0, got {self.retries}")
        if self.backoff_rate < 1:
            raise DBOSError(f"Step {self.name!r}: backoff_rate must be >= 1")

    def should_retry(self, error: Exception) -> bool:
        if self.retry_on is None:
            return True
        if isinstance(self.retry_on, type | tuple):
            return isinstance(error, self.retry_on)
        return bool(self.retry_on(error))


@dataclass(frozen=True)
class StepInfo:
    fn: Callable[..., Coroutine[Any, Any, Any]]
    options: StepOptions
    signature: Signature
    # Roles one of which the identity calling it must hold (see RequiredRoles).
    roles: RequiredRoles = field(default_factory=RequiredRoles)

    @property
    def required_roles(self) -> tuple[str, ...] | None:
        return self.roles.roles


def call(info: StepInfo, args: tuple[Any, ...], kwargs: dict[str, Any]
         ) -> Coroutine[Any, Any, Any]:
    """A call of a step: checkpointed in a workflow body, else a plain call with its
    retries. A caller without a required role is refused at the call, before its position
    is taken; an authorized one runs it under the role it holds. Its arguments are
    validated against their annotations at the call, as a workflow's are."""
    args, kwargs = info.signature.bind(args, kwargs)
    authentication = current_authentication()
    required = info.required_roles
    if required is not None:
        authentication = authorize("step", info.options.name, required, authentication)
    ctx = current_workflow()
    if ctx is None:
        # Outside a workflow, or inside another step: just run it (its backoff on the
        # workflow's clock, if any).
        outer = workflow_of_step()
        run = attempt(info, args, kwargs, outer.runtime.system_database.clock
                      if outer is not None else SYSTEM_CLOCK)
    else:
        # Allocated now, in call order, so concurrent fan-out replays identically.
        run = run_checkpointed(ctx, ctx.allocate_step_id(), info, args, kwargs)
    return run if required is None else _running_as(authentication, run)


async def _running_as(authentication: Authentication, run: Coroutine[Any, Any, Any]) -> Any:
    with running_as(authentication):
        return await run


async def attempt(info: StepInfo, args: tuple[Any, ...], kwargs: dict[str, Any],
                  clock: Clock, step_id: int | None = None) -> Any:
    """Run the step under its retry policy, waiting out its backoff on ``clock``, marked as
    inside step ``step_id`` (None: a step called outside a workflow, or inside another
    step)."""
    options = info.options
    errors: list[BaseException] = []
    delay = options.retry_interval
    with running_step(step_id) as step:
        for attempt_number in range(options.retries + 1):
            step.attempt = attempt_number + 1
            try:
                with observe.step_attempt(options.name, step_id, attempt_number + 1):
                    if options.timeout is None:
                        return await info.fn(*args, **kwargs)
                    # Real time: it bounds the body's own work, not a durable wait.
                    with anyio.fail_after(options.timeout):
                        return await info.fn(*args, **kwargs)
            except Exception as error:
                if not options.should_retry(error):
                    raise
                errors.append(error)
                if attempt_number == options.retries:
                    break
                logs.step_retrying(options.name, step_id, attempt_number + 1,
                                   options.retries + 1, delay, error)
                await clock.sleep_until(after(clock, delay))
                delay = min(delay * options.backoff_rate, options.max_retry_interval)
    if options.retries == 0:
        raise errors[-1]
    raise StepRetriesExceededError(options.name, len(errors), errors) from errors[-1]


def replay(ctx: WorkflowContext, step_id: int, name: str, record: StepRecord,
           signature: Signature | None = None) -> Any:
    """The recorded outcome of a step, as the live call returned or raised it.

    With a signature the output is coerced to its return annotation; without, it is plain JSON.
    """
    formats = ctx.runtime.formats
    if record.function_name != name:
        raise NondeterminismError(ctx.workflow_id, step_id, record.function_name, name)
    if record.error is not None:
        raise deserialize_error(record.error, record.serialization, formats)
    if signature is None:
        return formats.decode(record.output, record.serialization, f"the output of {name}")
    return signature.deserialize_result(record.output, record.serialization, formats)


def recorded_read(ctx: WorkflowContext, step_id: int, name: str) -> tuple[bool, Any]:
    """Whether a read of the workflow (a receive, an event, a status, a stream value) is
    recorded at ``step_id``, and its value (decoded); a recorded failure is raised."""
    record = ctx.recorded(step_id, name)
    if record is None:
        return False, None
    return True, replay(ctx, step_id, name, record)


async def record_read(ctx: WorkflowContext, step_id: int, name: str, output: Payload) -> Any:
    """Record a read's result (``output``, as stored, in its own format) as its checkpoint;
    a record already there wins."""
    started = ctx.runtime.system_database.clock.now_ms()
    existing = await ctx.runtime.system_database.record_step(
        ctx.workflow_id, step_id, name, ctx.owner_xid, output=output.text, error=None,
        started_at_ms=started, completed_at_ms=started, serialization=output.serialization,
    )
    if existing is not None:
        return replay(ctx, step_id, name, existing)
    return ctx.runtime.formats.decode(output.text, output.serialization,
                                      f"the output of {name}")


async def record_failure(ctx: WorkflowContext, step_id: int, name: str,
                              error: Exception) -> BaseException:
    """Record ``error`` as the outcome of a checkpoint (a send to no one, a read that timed
    out), so a replay raises it too; returns the error to raise (in its recorded form,
    caused by ``error``)."""
    started = ctx.runtime.system_database.clock.now_ms()
    formats = ctx.runtime.formats
    text, failure = recorded_error(error, formats)
    existing = await ctx.runtime.system_database.record_step(
        ctx.workflow_id, step_id, name, ctx.owner_xid, output=None, error=text,
        started_at_ms=started, completed_at_ms=started, serialization=formats.name)
    if existing is not None:
        replay(ctx, step_id, name, existing)  # an earlier outcome: raised if a failure
    return failure


async def run_checkpointed(
    ctx: WorkflowContext, step_id: int, info: StepInfo, args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run a step of ``ctx``'s workflow once: replay it if recorded, else run and record it."""
    name = info.options.name
    recorded = ctx.recorded(step_id, name)
    if recorded is not None:
        return replay(ctx, step_id, name, recorded, info.signature)
    sysdb = ctx.runtime.system_database
    started = sysdb.clock.now_ms()
    try:
        with ctx.runtime.cancellation.region(ctx, info.options.cancellable):
            value = await attempt(info, args, kwargs, sysdb.clock, step_id)
    except Exception as error:
        if ctx.cancelled:
            # Interrupted (or cancelled meanwhile): nothing to record, the workflow stops.
            if isinstance(error, WorkflowCancelledError):
                raise
            raise WorkflowCancelledError(ctx.workflow_id) from error
        return await record_failed_step(ctx, step_id, name, started, error, info.signature)
    return await record_step_output(ctx, step_id, name, started, value, info.signature)


async def record_failed_step(ctx: WorkflowContext, step_id: int, name: str, started: int,
                             error: Exception, signature: Signature) -> Any:
    """Record ``error`` as the outcome of step ``step_id`` and raise it as a replay will (in
    its recorded form); an outcome recorded first is replayed instead."""
    formats = ctx.runtime.formats
    text, failure = recorded_error(error, formats)
    sysdb = ctx.runtime.system_database
    existing = await sysdb.record_step(
        ctx.workflow_id, step_id, name, ctx.owner_xid, output=None,
        error=text, started_at_ms=started, completed_at_ms=sysdb.clock.now_ms(),
        serialization=formats.name,
    )
    if existing is not None:
        return replay(ctx, step_id, name, existing, signature)
    raise failure from failure.__cause__  # the original, or a replayed error's own


async def record_step_output(ctx: WorkflowContext, step_id: int, name: str, started: int,
                             value: Any, signature: Signature) -> Any:
    """Record ``value`` as the output of step ``step_id`` and return it; an outcome
    recorded first is replayed instead. A value that cannot be serialized fails here,
    before anything is written."""
    output = signature.serialize_result(value, ctx.runtime.formats)
    sysdb = ctx.runtime.system_database
    existing = await sysdb.record_step(
        ctx.workflow_id, step_id, name, ctx.owner_xid, output=output.text, error=None,
        started_at_ms=started, completed_at_ms=sysdb.clock.now_ms(),
        serialization=output.serialization,
    )
    if existing is not None:
        return replay(ctx, step_id, name, existing, signature)
    return value
