"""Context variables: the running workflow, and options set for the next start.

A workflow's context object is shared by every task its body spawns (``asyncio.gather``,
``TaskGroup``), so step IDs come from one counter, allocated when a step is called.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from dbos_async import _metrics as metrics
from dbos_async._executor.authentication import NO_AUTHENTICATION, Authentication, running_as
from dbos_async._sysdb.database import StepRecord
from dbos_async._sysdb.shard_keys import routed_as_stored
from dbos_async._validation import check_identifier, check_jsonb, check_seconds
from dbos_async.errors import DBOSError, InvalidArgumentError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from dbos_async._executor.runtime import Runtime


class Telemetry(NamedTuple):
    """What a workflow run reports to: the instruments of the application's meter provider
    and the tracer of its tracer provider (each None while off). Read once for a run (for
    a claim round's runs, once for the round) and kept in its context: its start, its end
    and its steps report to the same ones, and the providers are not looked up again for
    each (an unset provider is looked up in the environment)."""

    instruments: metrics.Instruments | None
    tracer: Tracer | None


@dataclass
class WorkflowContext:
    """One execution of one workflow, in the runtime that runs it."""

    runtime: Runtime
    workflow_id: str
    owner_xid: str
    checkpoints: dict[int, StepRecord]
    deadline_epoch_ms: int | None
    # The workflow's shard key (None on an unsharded database).
    shard_key: str | None = None
    # Who it runs for (recorded on its row): its body's and steps' identity, its children's.
    authentication: Authentication = NO_AUTHENTICATION
    # The format its row's inputs are in: its result and error are written in it too.
    serialization: str | None = None
    next_step_id: int = field(default=0)
    # Set by the cancellation watcher: no new step or wait of this execution starts.
    cancelled: bool = field(default=False)
    # A replay check (dbos_async/_executor/replay.py): nothing runs or is written; the first
    # call that finds no checkpoint of its name at its position ends it (ReplayStop).
    replaying: bool = field(default=False)
    # Whether this execution created the workflow (no earlier one can have run any of it):
    # its transactions need not look for outcomes an earlier one recorded.
    first_run: bool = field(default=False)
    # What the run and its steps report to (read at its launch, or when its run begins).
    telemetry: Telemetry | None = field(default=None)

    def routed(self) -> AbstractContextManager[None]:
        """Route the statements of this execution by its own key, whatever its starter had
        bound (workflow IDs repeat across keys)."""
        return routed_as_stored(self.workflow_id, self.shard_key)

    def allocate_step_id(self) -> int:
        step_id = self.next_step_id
        self.next_step_id += 1
        return step_id

    def recorded(self, step_id: int, name: str) -> StepRecord | None:
        """The checkpoint at ``step_id`` of the call ``name`` is about to make, if any.

        In a replay check a position with nothing recorded, or a checkpoint of another
        name, ends the check there: it raises :class:`ReplayStop`, before anything runs.
        """
        record = self.checkpoints.get(step_id)
        if self.replaying and (record is None or record.function_name != name):
            raise ReplayStop(step_id, record.function_name if record else None, name)
        return record


class ReplayStop(BaseException):
    """Where a replay check ends: at ``step_id`` the new code calls ``new_name`` where
    ``recorded_name`` is recorded (None: nothing is recorded there; a ``new_name`` of None:
    the new code needs what the recording does not hold, e.g. a child's outcome).

    A BaseException, so that a workflow body's ``except Exception`` does not swallow it.
    """

    def __init__(self, step_id: int, recorded_name: str | None, new_name: str | None,
                 reason: str | None = None) -> None:
        super().__init__(step_id, recorded_name, new_name, reason)
        self.step_id = step_id
        self.recorded_name = recorded_name
        self.new_name = new_name
        self.reason = reason


@dataclass
class StepContext:
    """The step running here: its position in its workflow (None for a step called outside
    a workflow) and the attempt under way (1 for the first, counting its retries). Entered,
    it is the current step in the block (a class, not a generator: it is entered at every
    step)."""

    step_id: int | None
    attempt: int = 1
    _token: Token[StepContext | None] | None = field(default=None, repr=False)

    def __enter__(self) -> StepContext:
        self._token = _step.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _step.reset(self._token)


WorkflowIDReusePolicy = Literal["return-existing", "reject"]
"""What a start does when its workflow ID is in use: return that workflow (the default),
or raise :class:`~dbos_async.WorkflowIDInUseError`."""

REUSE_POLICIES: tuple[WorkflowIDReusePolicy, ...] = ("return-existing", "reject")


def check_reuse_policy(policy: object) -> WorkflowIDReusePolicy | None:
    """``policy`` if it is None or one of :data:`REUSE_POLICIES`; raises otherwise."""
    if policy is not None and policy not in REUSE_POLICIES:
        raise InvalidArgumentError("workflow_id_reuse_policy",
                                   f"must be one of {', '.join(map(repr, REUSE_POLICIES))} "
                                   f"(or None), got {policy!r}")
    return policy


@dataclass(frozen=True)
class AssignedWorkflowID:
    """The ID :class:`SetWorkflowID` gives the next start, and its reuse policy."""

    workflow_id: str
    reuse_policy: WorkflowIDReusePolicy | None = None


_workflow: ContextVar[WorkflowContext | None] = ContextVar("dbos_workflow", default=None)
_step: ContextVar[StepContext | None] = ContextVar("dbos_step", default=None)
_next_workflow_id: ContextVar[AssignedWorkflowID | None] = ContextVar(
    "dbos_next_workflow_id", default=None)
_timeout: ContextVar[float | None] = ContextVar("dbos_workflow_timeout", default=None)
_attributes: ContextVar[str | None] = ContextVar("dbos_workflow_attributes", default=None)
# Integrations' own keys, kept apart from the user's so SetWorkflowAttributes inside their
# block does not drop them.
_added_attributes: ContextVar[dict[str, Any] | None] = ContextVar(
    "dbos_added_workflow_attributes", default=None)
_shard_key: ContextVar[str | None] = ContextVar("dbos_next_shard_key", default=None)
# What a workflow's body does not inherit from its starter's context.
_NOT_INHERITED: tuple[ContextVar[Any], ...] = (_step, _attributes, _added_attributes,
                                               _shard_key)


def current_workflow() -> WorkflowContext | None:
    """The workflow whose body is running here, or None outside workflows and inside steps."""
    if _step.get() is not None:
        return None
    return _workflow.get()


def workflow_of_step() -> WorkflowContext | None:
    """Inside a step of a workflow, that workflow's context; else None."""
    return _workflow.get() if _step.get() is not None else None


class running_workflow:
    """Mark the block as the body of ``ctx``'s workflow, run under its identity. A plain
    class, cheaper to enter than a generator's context manager: it wraps every workflow
    body."""

    __slots__ = ("_cleared", "_ctx", "_identity", "_token")

    def __init__(self, ctx: WorkflowContext) -> None:
        self._ctx = ctx
        self._identity = running_as(ctx.authentication)

    def __enter__(self) -> None:
        self._token = _workflow.set(self._ctx)
        # Attributes and shard keys are not inherited by the workflow's children. Only
        # those set are cleared: a set allocates (a token, a new context), and a run
        # usually starts with none.
        cleared: tuple[tuple[ContextVar[Any], Token[Any]], ...] = ()
        for var in _NOT_INHERITED:
            if var.get() is not None:
                cleared += ((var, var.set(None)),)
        self._cleared = cleared
        self._identity.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._identity.__exit__()
        for var, token in reversed(self._cleared):
            var.reset(token)
        _workflow.reset(self._token)


def running_step(step_id: int | None) -> StepContext:
    """Mark the block as step ``step_id`` of the current workflow. A step called inside
    another step runs as part of it, so it keeps the enclosing step's position."""
    outer = _step.get()
    if step_id is None and outer is not None:
        step_id = outer.step_id
    return StepContext(step_id)


# ---- Public accessors: what the running code can learn of its workflow and step ----


def current_workflow_id() -> str | None:
    """The ID of the workflow running this code (its body, or one of its steps); None
    outside workflows. Like the ``dbos`` package's ``DBOS.workflow_id``."""
    ctx = _workflow.get()
    return ctx.workflow_id if ctx is not None else None


def current_step_id() -> int | None:
    """Inside a step of a workflow, the step's position in it (its ``function_id``, what
    ``list_workflow_steps`` shows); None in a workflow body outside steps, in a step called
    outside a workflow, and outside workflows. Like ``DBOS.step_id``."""
    step = _step.get()
    return step.step_id if step is not None else None


def current_step_attempt() -> int | None:
    """Inside a step, the attempt under way: 1 for the first, 2 for the first retry, ...
    (also in a step called outside a workflow, which retries too); None outside steps.
    ``DBOS.step_status.current_attempt`` plus one (that count starts at 0)."""
    step = _step.get()
    return step.attempt if step is not None else None


def current_shard_key() -> str | None:
    """The shard key of the workflow running this code (its body or a step) on a sharded
    system database; None on an unsharded one and outside workflows. Like
    ``DBOS.shard_key``."""
    ctx = _workflow.get()
    return ctx.shard_key if ctx is not None else None


def take_workflow_id() -> AssignedWorkflowID | None:
    """The ID (and reuse policy) set by :class:`SetWorkflowID` for the next start; using
    it clears it."""
    workflow_id = _next_workflow_id.get()
    if workflow_id is not None:
        _next_workflow_id.set(None)
    return workflow_id


def workflow_timeout() -> float | None:
    return _timeout.get()


def next_shard_key() -> str | None:
    """The shard key :class:`SetShardKey` gives workflows started in this block."""
    return _shard_key.get()


def workflow_attributes() -> str | None:
    """The attributes of the next start, as a JSON object (text): those set by
    :class:`SetWorkflowAttributes`, with the keys of :func:`added_attributes` over them."""
    user = _attributes.get()
    added = _added_attributes.get()
    if added is None:
        return user
    return attributes_json({**(json.loads(user) if user is not None else {}), **added})


@contextmanager
def added_attributes(extra: dict[str, Any]) -> Iterator[None]:
    """Add ``extra`` over the attributes of workflows started in the block, keeping the
    user's own: integrations record what they need (a request digest, a trace context) in
    keys of their own, so a caller's ``SetWorkflowAttributes`` and theirs combine, whichever
    is entered first."""
    attributes_json(extra)  # checked now, where the integration calls it
    token = _added_attributes.set({**(_added_attributes.get() or {}), **extra})
    try:
        yield
    finally:
        _added_attributes.reset(token)


def attributes_json(attributes: dict[str, Any] | None) -> str | None:
    """Check custom workflow attributes (a JSON-serializable dict) and encode them."""
    if attributes is None:
        return None
    if not isinstance(attributes, dict):
        raise DBOSError(f"Workflow attributes must be a dict, got {attributes!r}")
    try:
        text = json.dumps(attributes, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise DBOSError(f"Workflow attributes must be JSON-serializable: {error}") from None
    check_jsonb(attributes, "workflow attributes")
    return text


class SetWorkflowID:
    """Give the next workflow started in this block a chosen ID, making the start idempotent.

    Starting a workflow with an ID that already exists returns that workflow (its recorded
    result once it finished) instead of running it again, unless
    ``workflow_id_reuse_policy="reject"``: then that start raises
    :class:`~dbos_async.WorkflowIDInUseError` (a retry of the start that created the row
    is not refused). As the ``dbos`` package's ``SetWorkflowID``.

    Args:
        workflow_id: The ID of the next workflow started in the block.
        workflow_id_reuse_policy: ``"return-existing"`` (the default, also None) or
            ``"reject"``.

    Raises:
        InvalidArgumentError: an empty ID or an unknown policy.
    """

    def __init__(self, workflow_id: str, *,
                 workflow_id_reuse_policy: WorkflowIDReusePolicy | None = None) -> None:
        check_identifier(workflow_id, "workflow ID given to SetWorkflowID")
        self.workflow_id = workflow_id
        self.workflow_id_reuse_policy = check_reuse_policy(workflow_id_reuse_policy)

    def __enter__(self) -> SetWorkflowID:
        self._token = _next_workflow_id.set(
            AssignedWorkflowID(self.workflow_id, self.workflow_id_reuse_policy))
        return self

    def __exit__(self, *exc: object) -> None:
        _next_workflow_id.reset(self._token)


class SetWorkflowAttributes:
    """Attach custom key-value attributes to workflows started or enqueued in this block
    (as the ``dbos`` package's ``SetWorkflowAttributes``): stored in the workflow's jsonb
    ``attributes`` column at creation and not inherited by its children; filter listings
    with ``list_workflows(attributes={...})`` (containment). ``None`` removes enclosing
    attributes."""

    def __init__(self, attributes: dict[str, Any] | None) -> None:
        self.attributes = attributes_json(attributes)

    def __enter__(self) -> SetWorkflowAttributes:
        self._token = _attributes.set(self.attributes)
        return self

    def __exit__(self, *exc: object) -> None:
        _attributes.reset(self._token)


class SetShardKey:
    """Give the workflows started, enqueued or called in this block the shard key ``key``
    (required on a sharded system database). A workflow never inherits its caller's key:
    a child started from a workflow body under no ``SetShardKey`` has none."""

    def __init__(self, shard_key: str) -> None:
        check_identifier(shard_key, "shard key given to SetShardKey")
        self.shard_key = shard_key

    def __enter__(self) -> SetShardKey:
        self._token = _shard_key.set(self.shard_key)
        return self

    def __exit__(self, *exc: object) -> None:
        _shard_key.reset(self._token)


class SetWorkflowTimeout:
    """Give workflows started in this block a start-to-close timeout, in seconds.

    The deadline is fixed when a workflow starts and is inherited by its children; an overdue
    workflow is cancelled. ``None`` removes an enclosing timeout.
    """

    def __init__(self, seconds: float | None) -> None:
        check_seconds(seconds, "workflow timeout given to SetWorkflowTimeout", positive=True)
        self.seconds = seconds

    def __enter__(self) -> SetWorkflowTimeout:
        self._token = _timeout.set(self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        _timeout.reset(self._token)
