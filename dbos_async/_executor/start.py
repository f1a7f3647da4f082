"""The start plan: every way a workflow starts decides its start here, the same way.

A direct call, ``start_workflow``, a child start, an enqueue (from a workflow or not), a
client's enqueue, a debounce and a fork each read the caller's context once, at the call
(:func:`read_call`), and then take the same decisions from it: the workflow's ID (given,
``SetWorkflowID``, the child-ID rule, or random), whether a replaying parent recorded this
start already, the instance of a workflow method and the serialized inputs, the deadline,
the parent's checkpoint of the start, and the new row (:func:`plan_start`). What differs
between the ways is only where the row waits (:class:`Placement`) and what runs it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from dbos_async._executor import workflows
from dbos_async._executor.authentication import (
    NO_AUTHENTICATION,
    Authentication,
    authorize,
    current_authentication,
)
from dbos_async._executor.context import (
    WorkflowContext,
    WorkflowIDReusePolicy,
    check_reuse_policy,
    current_workflow,
    next_shard_key,
    take_workflow_id,
    workflow_attributes,
    workflow_timeout,
)
from dbos_async._executor.handles import WorkflowHandle, workflow_handle
from dbos_async._executor.recorded_errors import deserialize_error, recorded_error
from dbos_async._executor.registry import WorkflowInfo, instance_name
from dbos_async._executor.runtime import Runtime
from dbos_async._executor.serialization import Formats
from dbos_async._executor.telemetry import tracing
from dbos_async._sysdb.database import StartResult, StepRecord
from dbos_async._sysdb.shard_keys import bind_shard_keys, validate_shard_key
from dbos_async._sysdb.statements import (
    DELAYED,
    ENQUEUED,
    PENDING,
    NewWorkflow,
    ParentStep,
    Payload,
)
from dbos_async._validation import check_identifier, check_seconds
from dbos_async.errors import (
    DBOSError,
    NondeterminismError,
    QueueDeduplicatedError,
    WorkflowIDInUseError,
    workflow_id_taken,
)


@dataclass(frozen=True)
class CallContext:
    """What the caller's context gives a start, read synchronously at the call: the
    caller's context counts, not the one that awaits the start."""

    workflow_id: str | None = None
    timeout: float | None = None
    parent: WorkflowContext | None = None
    parent_step_id: int | None = None
    attributes: str | None = None
    shard_key: str | None = None
    # The identity the new workflow records and runs under (SetAuthentication).
    authentication: Authentication = NO_AUTHENTICATION
    # "reject": a start that finds its ID in use raises (SetWorkflowID's policy).
    reuse_policy: WorkflowIDReusePolicy | None = None

    @property
    def rejects_reuse(self) -> bool:
        return self.reuse_policy == "reject"

    @property
    def timeout_ms(self) -> int | None:
        return int(self.timeout * 1000) if self.timeout is not None else None


def read_call(*, workflow_id: str | None = None, timeout: float | None = None,
              as_child: bool = True, shard_key: str | None = None,
              take_id: bool = True,
              reuse_policy: WorkflowIDReusePolicy | None = None) -> CallContext:
    """Read the context of a start being called now. A start from a workflow body is its
    child (``as_child``) and takes the body's next step position; ``workflow_id``,
    ``timeout`` and ``shard_key``, when given, win over ``SetWorkflowID``,
    ``SetWorkflowTimeout`` and ``SetShardKey``; ``reuse_policy`` goes with the ID given
    here, else with the ID of ``SetWorkflowID``. Without ``take_id`` the
    ``SetWorkflowID`` of the block is left for a start that names one workflow (a batch's
    rows do not)."""
    validate_shard_key(shard_key)
    check_identifier(workflow_id, "workflow ID", optional=True)
    check_seconds(timeout, "workflow timeout")
    check_reuse_policy(reuse_policy)
    parent = current_workflow() if as_child else None
    with tracing.propagated():
        attributes = workflow_attributes()
    assigned = take_workflow_id() if take_id and workflow_id is None else None
    if assigned is not None:
        workflow_id, reuse_policy = assigned.workflow_id, assigned.reuse_policy
    return CallContext(
        workflow_id=workflow_id,
        reuse_policy=reuse_policy,
        timeout=timeout if timeout is not None else workflow_timeout(),
        parent=parent,
        parent_step_id=parent.allocate_step_id() if parent is not None else None,
        attributes=attributes,
        shard_key=shard_key if shard_key is not None else next_shard_key(),
        authentication=current_authentication(),
    )


def new_workflow_id(call: CallContext) -> str:
    """The ID rule: the given ID, else a child's ``<parent ID>-<step position>`` (so a
    replayed parent finds the same child; prefixed by the parent's key when the child lives
    under another, as the parent's ID is unique only within its key), else a random one."""
    if call.workflow_id is not None:
        return call.workflow_id
    parent = call.parent
    if parent is not None and call.parent_step_id is not None:
        base = f"{parent.workflow_id}-{call.parent_step_id}"
        if parent.shard_key is None or call.shard_key in (None, parent.shard_key):
            return base
        return f"{len(parent.shard_key)}:{parent.shard_key}:{base}"
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Placement:
    """Where an enqueued workflow waits to be claimed, and the options of its enqueue."""

    queue_name: str
    priority: int = 0
    deduplication_id: str | None = None
    partition_key: str | None = None
    delay: float | None = None
    # Debounced: the start moves with every call of a burst, never past this many seconds.
    debounced: bool = False
    max_delay: float | None = None

    def columns(self, created_at_ms: int) -> dict[str, Any]:
        delayed = bool(self.delay) or self.debounced
        until = created_at_ms + int((self.delay or 0) * 1000)
        deadline = (created_at_ms + int(self.max_delay * 1000)
                    if self.max_delay is not None else None)
        return {
            "status": DELAYED if delayed else ENQUEUED,
            "queue_name": self.queue_name,
            "priority": self.priority,
            "deduplication_id": self.deduplication_id,
            "queue_partition_key": self.partition_key,
            "delay_until_epoch_ms": (min(until, deadline) if deadline is not None else until)
            if delayed else None,
            "is_debounced": self.debounced,
            "debounce_deadline_epoch_ms": deadline,
        }


@dataclass(frozen=True)
class StartPlan:
    """A workflow about to be written: its row, and the parent's checkpoint of the start
    (written in the same statement, fenced by the parent's owner)."""

    row: NewWorkflow
    parent_step: ParentStep | None
    # Makes the insert idempotent under retries: a row carrying it is ours.
    creator_xid: str = field(default_factory=lambda: str(uuid.uuid4()))
    # The identity it runs under (the recorded one, its assumed role checked).
    authentication: Authentication = NO_AUTHENTICATION

    @property
    def workflow_id(self) -> str:
        return self.row.workflow_id

    @property
    def shard_key(self) -> str | None:
        return self.row.shard_key


def plan_start(call: CallContext, *, name: str, inputs: Payload, executor_id: str,
               application_version: str | None, now_ms: int,
               placement: Placement | None = None, class_name: str | None = None,
               config_name: str | None = None) -> StartPlan:
    """The row of a new workflow created at ``now_ms``. Started now (no ``placement``), its
    own timeout counts from now; enqueued, from when a claim starts it. A parent's deadline
    bounds both."""
    created_at = now_ms
    authentication = call.authentication
    parent = call.parent
    deadline = parent.deadline_epoch_ms if parent is not None else None
    timeout_ms = call.timeout_ms
    if placement is None and timeout_ms is not None:
        own = created_at + timeout_ms
        deadline = own if deadline is None else min(deadline, own)
    queue_columns: dict[str, Any] = (placement.columns(created_at) if placement is not None
                                     else {"status": PENDING})
    row = NewWorkflow(
        workflow_id=new_workflow_id(call),
        name=name,
        inputs=inputs.text,
        serialization=inputs.serialization,
        executor_id=executor_id,
        application_version=application_version,
        created_at_ms=created_at,
        class_name=class_name,
        config_name=config_name,
        timeout_ms=timeout_ms,
        deadline_epoch_ms=deadline,
        parent_workflow_id=parent.workflow_id if parent is not None else None,
        authenticated_user=authentication.user,
        authenticated_roles=authentication.roles_json,
        assumed_role=authentication.assumed_role,
        attributes=call.attributes,
        shard_key=call.shard_key,
        **queue_columns,
    )
    parent_step = (ParentStep(parent.workflow_id, call.parent_step_id, parent.owner_xid,
                              created_at, parent.shard_key)
                   if parent is not None and call.parent_step_id is not None else None)
    return StartPlan(row, parent_step, authentication=authentication)


@dataclass(frozen=True)
class Arguments:
    """A registered workflow's call arguments: the instance of a workflow method split off
    and named, the rest validated against their annotations and serialized before anything
    is written (a bad argument leaves no row behind). The workflow runs with the validated
    values, the ones a recovery reads back."""

    instance: object | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    config_name: str | None
    inputs: Payload

    @classmethod
    def of(cls, info: WorkflowInfo, args: tuple[Any, ...], kwargs: dict[str, Any],
           formats: Formats) -> Arguments:
        instance: object | None = None
        if info.is_method:
            if not args:
                raise DBOSError(f"Workflow method {info.name} was called without its instance")
            instance, args = args[0], args[1:]
        args, kwargs = info.signature.bind(args, kwargs)
        return cls(instance, args, kwargs,
                   instance_name(instance) if instance is not None else None,
                   info.signature.serialize_inputs(args, kwargs, formats,
                                                   formats.chosen(info.serialization_type)))

    @property
    def call_args(self) -> tuple[Any, ...]:
        return (self.instance, *self.args) if self.instance is not None else self.args


def authorized(call: CallContext, info: WorkflowInfo) -> CallContext:
    """``call`` under the identity ``info`` runs with (its assumed role, the first required
    role the caller holds); raises :class:`NotAuthorizedError` if it holds none."""
    authentication = authorize("workflow", info.name, info.required_roles,
                               call.authentication)
    if authentication is call.authentication:  # no role required: the call as it is
        return call
    return replace(call, authentication=authentication)


def plan_registered(runtime: Runtime, call: CallContext, info: WorkflowInfo,
                    arguments: Arguments, *, placement: Placement | None = None,
                    application_version: str | None = None) -> StartPlan:
    """:func:`plan_start` for a workflow this executor registers, refused (before anything
    is written) if the caller lacks the roles it requires."""
    return plan_start(authorized(call, info), name=info.name, inputs=arguments.inputs,
                      executor_id=runtime.executor_id,
                      application_version=application_version or runtime.application_version,
                      now_ms=runtime.system_database.clock.now_ms(),
                      placement=placement, class_name=info.class_name,
                      config_name=arguments.config_name)


def check_name(started: StartResult, workflow_id: str, name: str) -> None:
    """Raise if the workflow a start found under ``workflow_id`` runs another function."""
    if not started.created and started.row.name != name:
        raise workflow_id_taken(workflow_id, started.row.name, name)


# ---- Starts from a workflow body: checkpointed at the parent's step position ----


def replayed_start(runtime: Runtime, call: CallContext, info: WorkflowInfo
                   ) -> WorkflowHandle[Any] | None:
    """If the parent's replay finds this start recorded, the handle it returned (or the
    error it raised the first time); None for a start that has to happen."""
    parent, step_id = call.parent, call.parent_step_id
    if parent is None or step_id is None:
        return None
    recorded = parent.recorded(step_id, info.name)
    return replayed_child(runtime, parent, step_id, info, recorded) if recorded else None


def replayed_child(runtime: Runtime, parent: WorkflowContext, step_id: int,
                   info: WorkflowInfo, recorded: StepRecord) -> WorkflowHandle[Any]:
    """The handle a recorded child start returns. A child start records no output of its
    own: only the name is checked; the result is the child's, read through its handle."""
    if recorded.function_name != info.name:
        raise NondeterminismError(parent.workflow_id, step_id, recorded.function_name, info.name)
    if recorded.error is not None:  # An enqueue its deduplication ID rejected.
        raise deserialize_error(recorded.error, recorded.serialization, runtime.formats)
    if recorded.child_workflow_id is None:
        raise DBOSError(f"Step {step_id} of {parent.workflow_id} recorded no child workflow")
    return workflow_handle(runtime, recorded.child_workflow_id, signature=info.signature,
                           shard_key=recorded.child_shard_key)


async def record_child_step(
    runtime: Runtime, parent: WorkflowContext, step: ParentStep, info: WorkflowInfo, *,
    error: QueueDeduplicatedError | WorkflowIDInUseError | None = None,
    child: tuple[str, str] | None = None,
    child_shard_key: str | None = None,
) -> WorkflowHandle[Any]:
    """Checkpoint a start from a workflow body that created no child of its own
    (deduplication or the ID's reuse policy rejected it, deduplication returned the holder,
    a debounce joined a burst), so a replay does the same even after that workflow has
    finished; returns the (ID, name) ``child``'s handle, or raises ``error`` (recorded)."""
    child_id = child[0] if child is not None else None
    # A rejection reaches the body in its recorded form, as a replay raises it.
    formats = runtime.formats
    text, recorded = recorded_error(error, formats) if error is not None else (None, None)
    with bind_shard_keys({child_id: child_shard_key} if child_id is not None else {}):
        existing = await runtime.system_database.record_step(
            parent.workflow_id, step.function_id, info.name, parent.owner_xid, output=None,
            error=text, started_at_ms=step.started_at_ms,
            completed_at_ms=runtime.system_database.clock.now_ms(),
            child_workflow_id=child_id, serialization=formats.name,
        )
    if existing is not None:  # Another execution of the parent recorded this step first.
        return replayed_child(runtime, parent, step.function_id, info, existing)
    if recorded is not None:
        raise recorded
    assert child is not None
    return workflow_handle(runtime, child[0], workflow_name=child[1], shard_key=child_shard_key)


async def refused_child(runtime: Runtime, call: CallContext, plan: StartPlan,
                        info: WorkflowInfo, rejected: WorkflowIDInUseError
                        ) -> WorkflowHandle[Any]:
    """A start the reuse policy "reject" refused: from a workflow body, the refusal is
    checkpointed (a replay raises it again) and raised as recorded; elsewhere, raised."""
    if call.parent is None or plan.parent_step is None:
        raise rejected
    return await record_child_step(runtime, call.parent, plan.parent_step, info,
                                   error=rejected)


# ---- Starting now: a direct call, start_workflow, a child start ----


async def start_workflow(runtime: Runtime, info: WorkflowInfo, call: CallContext,
                         args: tuple[Any, ...], kwargs: dict[str, Any]) -> WorkflowHandle[Any]:
    """Start (or find) a workflow and run it here; return its handle."""
    replayed = replayed_start(runtime, call, info)
    if replayed is not None:
        return replayed
    arguments = Arguments.of(info, args, kwargs, runtime.formats)
    plan = plan_registered(runtime, call, info, arguments)
    # From the insert until the launch, the new PENDING row must not look crashed to recovery.
    async with runtime.claim_gate.claiming():
        try:
            started = await runtime.system_database.start_workflow(
                plan.row, plan.creator_xid, plan.parent_step, reject=call.rejects_reuse)
        except WorkflowIDInUseError as rejected:
            return await refused_child(runtime, call, plan, info, rejected)
        if started.created:
            workflows.launch(runtime, info, plan.workflow_id, plan.creator_xid,
                             arguments.call_args, arguments.kwargs, {}, plan.row.deadline_epoch_ms,
                             plan.shard_key, plan.row.attributes, plan.authentication,
                             plan.row.serialization, first_run=True)
        else:
            check_name(started, plan.workflow_id, info.name)
        return workflow_handle(runtime, plan.workflow_id, signature=info.signature,
                               shard_key=plan.shard_key)
