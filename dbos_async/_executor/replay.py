"""The replay check: run recorded workflows' current code against their checkpoints.

Each workflow's body runs as a recovery would run it, but in a runtime with no database:
every call that finds its checkpoint gets the recorded outcome (no step body runs, nothing
is written, no sleep waits), and the first call that does not ends the check there with a
:class:`~dbos_async._executor.context.ReplayStop`. Where it ends says whether the new code
makes the calls the recording holds, in the same order:

- a checkpoint of another name at the call's position: a divergence;
- nothing recorded there: a divergence for a finished workflow (SUCCESS or ERROR), whose
  calls are all recorded; for one still in flight, the end of what was recorded (it
  passes, checked up to its last checkpoint);
- the body returns (or raises) with checkpoints left past its last call: a divergence
  (the new code stops making calls the recording holds);
- the new code needs something no checkpoint holds (a child's outcome the recording does
  not include, a database read): it passes up to there, saying why it stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from dbos_async._executor.authentication import Authentication
from dbos_async._executor.context import (
    ReplayStop,
    WorkflowContext,
    current_workflow,
    running_workflow,
)
from dbos_async._executor.handles import outcome_value
from dbos_async._executor.peer import system_database_for
from dbos_async._executor.registry import Registry
from dbos_async._executor.runtime import Runtime
from dbos_async._executor.transfer import ExportedWorkflow
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.records import Outcome, StepRecord
from dbos_async._sysdb.statements import ERROR, PORTABLE_JSON, SUCCESS
from dbos_async.config import DBOSConfig
from dbos_async.errors import DBOSError

FINISHED = (SUCCESS, ERROR)
"""Statuses whose every call is recorded; the others (in flight, cancelled, dead-lettered)
may continue from their last checkpoint, so the check stops there."""

_NO_DATABASE_URL = "postgresql://replay.invalid/none"
"""The address of the replay runtime's database handle, which is never opened."""


@dataclass(frozen=True)
class Divergence:
    """The first call of the new code that differs from the recording: at ``step_id`` the
    recording holds ``recorded_name`` (None: nothing) and the new code calls ``new_name``
    (None: it makes no more calls)."""

    step_id: int
    recorded_name: str | None
    new_name: str | None

    def __str__(self) -> str:
        recorded = self.recorded_name or "nothing"
        new = self.new_name or "nothing (the workflow ends)"
        return f"step {self.step_id}: recorded {recorded}, new code calls {new}"


@dataclass(frozen=True)
class ReplayResult:
    """The check of one recorded workflow.

    ``passed``: the new code made the recorded calls in order (for a workflow in flight, up
    to its last checkpoint); otherwise ``divergence`` says where it first differs, or
    ``error`` why the check could not run (the function is not registered, its inputs
    cannot be read). ``checked_steps`` is how many positions the new code replayed;
    ``recorded_steps`` how many checkpoints there are; ``stopped`` why a check that passed
    ended before the body returned; ``raised`` the exception the body ended with, if it
    did (a replayed failure, or the new code's own). ``shard_key``: the workflow's (None
    unsharded).
    """

    workflow_id: str
    shard_key: str | None
    workflow_name: str
    status: str
    application_version: str | None
    passed: bool
    checked_steps: int
    recorded_steps: int
    divergence: Divergence | None = None
    error: str | None = None
    stopped: str | None = None
    raised: str | None = None

    def summary(self) -> str:
        """One line for a report."""
        head = f"{self.workflow_id} ({self.workflow_name}, {self.status})"
        if self.error is not None:
            return f"ERROR    {head}: {self.error}"
        ended = f"; the body raised {self.raised}" if self.raised is not None else ""
        if self.divergence is not None:
            return f"DIVERGES {head}: {self.divergence}{ended}"
        detail = f"{self.checked_steps} of {self.recorded_steps} checkpoints replayed"
        if self.stopped is not None:
            detail += f"; {self.stopped}"
        return f"OK       {head}: {detail}{ended}"


class ReplayRuntime(Runtime):
    """The runtime a replay check runs workflow bodies in: it has no database (its handle
    is never opened, and asking for it ends the check), and the only workflow results it
    knows are the recorded outcomes of the checked workflows' children."""

    def __init__(self, config: DBOSConfig, registry: Registry, application_version: str,
                 recorded: Iterable[ExportedWorkflow]) -> None:
        super().__init__(config, registry, system_database_for(config, _NO_DATABASE_URL),
                         application_version)
        self.state = "running"
        # By workflow ID, then shard key (IDs are unique per key only).
        self.outcomes: dict[str, dict[str | None, Outcome]] = {}
        for workflow in recorded:
            self.outcomes.setdefault(workflow.workflow_id, {})[workflow.shard_key] = \
                _outcome_of(workflow)

    @property
    def system_database(self) -> SystemDatabase:
        raise _stop_here("the new code reads or writes the database here")

    def running_result(self, workflow_id: str,
                       shard_key: str | None = None) -> asyncio.Future[Any]:
        """A child's result, from its recorded outcome; the check stops at a child whose
        outcome is not recorded (not included, or not finished)."""
        by_key = self.outcomes.get(workflow_id, {})
        outcome = by_key.get(shard_key)
        if outcome is None and shard_key is None and len(by_key) == 1:
            [outcome] = by_key.values()  # a child recorded without its key: the only one
        if outcome is None or not outcome.terminal:
            raise _stop_here(f"the outcome of workflow {workflow_id!r} is not recorded")
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            result.set_result(outcome_value(workflow_id, outcome,
                                            self.signature_of(outcome.name), self.formats))
        except Exception as error:
            result.set_exception(error)
        return result


def _stop_here(reason: str) -> ReplayStop:
    ctx = current_workflow()
    return ReplayStop(ctx.next_step_id if ctx is not None else 0, None, None, reason)


def _outcome_of(workflow: ExportedWorkflow) -> Outcome:
    """The recorded outcome of an exported workflow (its output, once it finished)."""
    status = workflow.status
    output = workflow.tables["workflow_output"]
    row = output[0] if output else status
    return Outcome(name=status["name"], status=status["status"], output=row["output"],
                   error=row["error"], serialization=status["serialization"])


def _checkpoints(workflow: ExportedWorkflow) -> dict[int, StepRecord]:
    return {int(row["function_id"]): StepRecord(
        function_id=int(row["function_id"]), function_name=row["function_name"],
        output=row["output"], error=row["error"], child_workflow_id=row["child_workflow_id"],
        serialization=row["serialization"], child_shard_key=row["child_shard_key"])
        for row in workflow.tables["operation_outputs"]}


def _inputs(workflow: ExportedWorkflow) -> str | None:
    inputs = workflow.status["inputs"]
    if inputs is None and workflow.tables["workflow_input"]:
        inputs = workflow.tables["workflow_input"][0]["inputs"]
    return inputs if isinstance(inputs, str) else None


async def replay_workflow(runtime: ReplayRuntime, workflow: ExportedWorkflow,
                          time_limit: float) -> ReplayResult:
    """Check one recorded workflow against the code registered in ``runtime``; its body
    gets ``time_limit`` seconds (a body awaiting something no checkpoint resolves)."""
    status = workflow.status
    checkpoints = _checkpoints(workflow)
    result = _Result(workflow, len(checkpoints))
    info = runtime.registry.workflows.get(status["name"])
    if info is None:
        return result(error=f"no workflow named {status['name']!r} is registered")
    serialization = status["serialization"] or PORTABLE_JSON
    try:
        args, kwargs = info.signature.deserialize_inputs(_inputs(workflow), serialization,
                                                         runtime.formats)
        if info.is_method:
            args = (runtime.registry.instance(status["class_name"], status["config_name"]),
                    *args)
    except DBOSError as error:
        return result(error=f"its inputs cannot be read: {error}")
    ctx = WorkflowContext(
        runtime, workflow.workflow_id, "", checkpoints, None, workflow.shard_key,
        Authentication.from_columns(status["authenticated_user"],
                                    status["authenticated_roles"], status["assumed_role"]),
        serialization, replaying=True)
    raised = None
    with anyio.move_on_after(time_limit) as limit:
        try:
            with running_workflow(ctx):
                await info.fn(*args, **kwargs)
        except BaseException as ended:
            stop = _replay_stop(ended)
            if stop is not None:
                return _stopped(result, stop, status["status"], checkpoints)
            if not isinstance(ended, Exception):
                raise
            # The body's own end (a replayed failure too): its calls are compared below.
            raised = f"{type(ended).__name__}: {ended}"
    if limit.cancelled_caught:
        return result(checked=ctx.next_step_id, error=(
            f"its body did not finish in {time_limit:g} s without running anything"))
    left = sorted(step for step in checkpoints if step >= ctx.next_step_id)
    if left:
        return result(checked=ctx.next_step_id, raised=raised, divergence=Divergence(
            left[0], checkpoints[left[0]].function_name, None))
    return result(checked=ctx.next_step_id, raised=raised, passed=True)


def _stopped(result: _Result, stop: ReplayStop, status: str,
             checkpoints: Mapping[int, StepRecord]) -> ReplayResult:
    if stop.new_name is None:  # needs something the recording does not hold
        return result(checked=stop.step_id, passed=True,
                      stopped=f"stopped at step {stop.step_id}: {stop.reason}")
    later = [step for step in checkpoints if step > stop.step_id]
    if stop.recorded_name is not None or status in FINISHED or later:
        return result(checked=stop.step_id,
                      divergence=Divergence(stop.step_id, stop.recorded_name, stop.new_name))
    return result(checked=stop.step_id, passed=True,
                  stopped=f"{status}: checked up to its last checkpoint")


def _replay_stop(raised: BaseException) -> ReplayStop | None:
    """The ReplayStop that ended a body, also from inside a task group's exception group."""
    if isinstance(raised, ReplayStop):
        return raised
    if isinstance(raised, BaseExceptionGroup):
        for inner in raised.exceptions:
            found = _replay_stop(inner)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class _Result:
    """Builds the :class:`ReplayResult` of one workflow."""

    workflow: ExportedWorkflow
    recorded_steps: int

    def __call__(self, *, checked: int = 0, passed: bool = False,
                 divergence: Divergence | None = None, error: str | None = None,
                 stopped: str | None = None, raised: str | None = None) -> ReplayResult:
        status = self.workflow.status
        return ReplayResult(
            workflow_id=self.workflow.workflow_id, shard_key=self.workflow.shard_key,
            workflow_name=status["name"],
            status=status["status"], application_version=status["application_version"],
            passed=passed, checked_steps=checked, recorded_steps=self.recorded_steps,
            divergence=divergence, error=error, stopped=stopped, raised=raised)
