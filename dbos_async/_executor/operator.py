"""The operator API that an executor (:class:`~dbos_async.DBOS`) and a client
(:class:`~dbos_async.DBOSClient`) share: handles, events and streams read from outside,
waits, cancel, delete, resume, fork, rewind, listings and application versions.

:class:`Operator` defines each of these methods once, as thin wrappers over
:mod:`~dbos_async._executor.management.control` and :mod:`~dbos_async._executor.messaging`, run on a
:class:`~dbos_async._executor.peer.Peer` of the system database. Where an executor and a
client differ, a small hook decides:

- :meth:`Operator._peer`: what the operations run on: an executor's running runtime (so an
  executor operates only while running), or the client itself;
- :meth:`Operator._contexts`: the workflow (or step) the call comes from, so that ``send``
  and ``get_event`` are checkpoints inside a workflow (a client is never in one);
- :meth:`Operator._fork_call`: the start context of a fork (an executor adds the ID and
  timeout ``SetWorkflowID`` and ``SetWorkflowTimeout`` give; a client takes arguments only);
- :meth:`Operator._handle`: the handle resume, fork and rewind return (an executor looks the
  workflow up to type its result; a client's handles are plain JSON and need no lookup).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from dbos_async._executor import messaging, observability, transfer
from dbos_async._executor.handles import (
    WorkflowHandle,
    WorkflowStatus,
    read_status,
    workflow_handle,
)
from dbos_async._executor.management import control
from dbos_async._executor.management.control import (
    ApplicationVersion,
    ForkRequest,
    StartStep,
    TimeBound,
    WorkflowFilters,
    WorkflowStepInfo,
)
from dbos_async._executor.observability import (
    EventChange,
    ExecutorActivity,
    MetricData,
    PendingMessage,
    QueueDepth,
    QueueMetrics,
    QueueMinute,
    StepAggregate,
    StreamValue,
    WaitingWorkflow,
    WorkflowActivity,
    WorkflowAggregate,
)
from dbos_async._executor.peer import Peer
from dbos_async._executor.queues.declaration import LimiterSpec, Queue, internal_queue
from dbos_async._executor.queues.enqueue import check_partition
from dbos_async._executor.queues.options import check_options
from dbos_async._executor.schedules.operator import ScheduleOperator
from dbos_async._executor.serialization import SerializationType
from dbos_async._executor.start import CallContext
from dbos_async._executor.transfer import ExportedWorkflow, ImportSummary
from dbos_async._sysdb.records import VersionBacklog
from dbos_async._sysdb.shard_keys import bind_shard_keys, validate_shard_key
from dbos_async._sysdb.statements.observability import HISTORY_MINUTES
from dbos_async._validation import (
    check_flag,
    check_identifier,
    check_lookup,
    check_offset,
    check_seconds,
)
from dbos_async.errors import DBOSError, InvalidArgumentError, NonExistentWorkflowError

if TYPE_CHECKING:
    from dbos_async._executor.context import WorkflowContext

T = TypeVar("T")


async def _routed(keys: dict[str, str | None], call: Coroutine[Any, Any, T]) -> T:
    """Run ``call`` with these workflows bound to their keys (None binds nothing); a key
    refused as invalid closes ``call`` unrun, so it is not left never awaited."""
    try:
        for workflow_id, key in keys.items():
            check_lookup(workflow_id, "workflow ID")
            validate_shard_key(key)
    except DBOSError:
        call.close()
        raise
    with bind_shard_keys(keys):
        return await call


_UNCHANGED: Any = object()
"""An ``update_queue`` setting not given: the stored value stays."""


def _limit(limit: int) -> int:
    """A read's row limit, checked: a positive integer."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise DBOSError(f"limit must be a positive integer, not {limit!r}")
    return limit


def _minutes(minutes: int) -> int:
    """A dashboard's window in minutes: up to a day."""
    if (not isinstance(minutes, int) or isinstance(minutes, bool)
            or not 1 <= minutes <= HISTORY_MINUTES):
        raise InvalidArgumentError(
            "minutes", f"must be an integer from 1 to {HISTORY_MINUTES}, not {minutes!r}")
    return minutes


def _queue_name(queue: str | Queue | None) -> str | None:
    """The name of a queue given as a :class:`Queue` or by name."""
    return queue.name if isinstance(queue, Queue) else queue


class Operator(ScheduleOperator):
    """The operator API of an executor or a client of a system database."""

    # ---- Hooks ----

    def _peer(self, during_shutdown: bool = False) -> Peer:
        """What the operations run on; raises if this executor or client cannot operate
        workflows now. ``during_shutdown``: messages and events also flow while running
        workflows finish in an executor's shutdown grace period."""
        raise NotImplementedError

    def _caller_peer(self, ctx: WorkflowContext | None) -> Peer:
        """A workflow's own runtime (the one that owns it) for calls from its body or
        steps, else :meth:`_peer`."""
        return ctx.runtime if ctx is not None else self._peer(during_shutdown=True)

    def _contexts(self) -> tuple[WorkflowContext | None, WorkflowContext | None]:
        """The workflow whose body makes this call, and the workflow whose step makes it
        (each None when there is none)."""
        return None, None

    def transaction_names(self) -> frozenset[str]:
        """The names of the transactions (``@dbos.transaction()``) this executor registers,
        so a step recorded under one can be shown as a transaction; none for a client."""
        return frozenset()

    def _fork_call(self, workflow_id: str | None, timeout: float | None) -> CallContext:
        """The start context of a fork given these arguments."""
        return CallContext(workflow_id=workflow_id, timeout=timeout)

    async def _handle(self, workflow_id: str,
                      shard_key: str | None = None) -> WorkflowHandle[Any]:
        """The handle resume, fork and rewind return on ``workflow_id``."""
        return await self.retrieve_workflow(workflow_id, shard_key=shard_key)

    @property
    def sharded(self) -> bool:
        """Whether the system database is sharded (workflows are addressed with a shard
        key there)."""
        return self._peer().system_database.sharded

    async def check_connection(self) -> None:
        """Check that the system database answers now, as the ``dbos`` package's
        ``DBOSClient.check_connection`` does: one round trip on a pooled connection,
        within ``connect_timeout``, not retried.

        Raises:
            DatabaseUnavailableError: The database did not answer (its servers and the
                cause named).
            DBOSError: This executor or client is not running.
        """
        await self._peer().system_database.check_connection()

    # ---- Handles and waits ----

    async def retrieve_workflow(self, workflow_id: str, *,
                                shard_key: str | None = None) -> WorkflowHandle[Any]:
        """A handle on an existing workflow, started by any executor (under ``shard_key``,
        on a sharded database). Its ``get_result()`` is typed by the registered workflow's
        signature in an executor that has it, and returns plain JSON values elsewhere (as
        in a client)."""
        peer = self._peer()
        with bind_shard_keys({workflow_id: shard_key}):
            row = await peer.system_database.get_workflow(workflow_id)
        if row is None:
            raise NonExistentWorkflowError(workflow_id)
        return workflow_handle(peer, workflow_id, workflow_name=row.name, shard_key=shard_key)

    def get_workflow_status(self, workflow_id: str, *, shard_key: str | None = None
                            ) -> Coroutine[Any, Any, WorkflowStatus | None]:
        """The status row of ``workflow_id``, or None if there is no such workflow. In a
        workflow the status read is a checkpoint: a replay sees the same status."""
        ctx, step_ctx = self._contexts()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return _routed({workflow_id: shard_key}, read_status(
            self._caller_peer(ctx or step_ctx), workflow_id, ctx, step_id))

    def wait_first(self, handles: Sequence[WorkflowHandle[Any]]
                   ) -> Coroutine[Any, Any, WorkflowHandle[Any]]:
        """The first of ``handles`` whose workflow finishes (successfully or not): one
        query over all of them per wake, woken by their completion notifications.

        In a workflow the choice is a checkpoint (its position fixed by this call), so a
        replay returns the same handle.

        Args:
            handles: the workflows to wait for (at least one, each once).

        Returns:
            The handle of the workflow that finished first.

        Raises:
            InvalidArgumentError: an empty list, or a workflow given twice.
            NonExistentWorkflowError: a workflow that does not exist.
        """
        messaging.check_waited(handles, "wait_first")
        ctx, step_ctx = self._contexts()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.wait_first(self._caller_peer(ctx or step_ctx), handles, ctx, step_id)

    async def wait_all(self, handles: Sequence[WorkflowHandle[Any]]) -> list[Any]:
        """The results of all ``handles``, in order, once every one has finished.

        Args:
            handles: the workflows to wait for (at least one, each once).

        Returns:
            Their results, in the order of ``handles``.

        Raises:
            InvalidArgumentError: an empty list, or a workflow given twice.
            Exception: the error of the first handle, in the list's order, whose workflow
                failed (the same on a replay).
        """
        messaging.check_waited(handles, "wait_all")
        return await messaging.wait_all(handles)

    # ---- Messages, events and streams ----

    def send(self, destination_id: str, message: Any, topic: str | None = None,
             idempotency_key: str | None = None, *, shard_key: str | None = None,
             send_to_forks: bool = False,
             serialization_type: SerializationType = None) -> Coroutine[Any, Any, None]:
        """Send ``message`` to workflow ``destination_id`` under ``topic``.

        In a workflow the send is a checkpoint (exactly once); in a step it is not recorded
        but lands only while the workflow is still owned by this execution; elsewhere it is a
        plain insert.

        Args:
            destination_id: the receiving workflow (under ``shard_key``, sharded).
            message: the value (portable JSON, or the configured serializer's).
            topic: the topic ``recv`` takes it from (None: the default topic).
            idempotency_key: a repeated send with the same key delivers once.
            send_to_forks: deliver it also to every workflow forked, recursively, from
                ``destination_id`` (the forks there are when the send starts), in the
                same transaction.
            serialization_type: the message's format (``"portable"``, ``"native"``;
                None: the configured one).

        Raises:
            NonExistentWorkflowError: ``destination_id`` does not exist.
            InvalidArgumentError: a bad ID, topic, key, ``send_to_forks`` or
                ``serialization_type``.
        """
        check_lookup(destination_id, "destination workflow ID")
        check_identifier(topic, "topic", optional=True, empty_ok=True)
        check_identifier(idempotency_key, "idempotency key", optional=True)
        check_flag(send_to_forks, "send_to_forks")
        ctx, step_ctx = self._contexts()
        peer = self._caller_peer(ctx or step_ctx)
        if send_to_forks:
            given = [messaging.SendMessage(destination_id, message, topic, idempotency_key,
                                           shard_key)]
            batch = messaging.outgoing(given, peer.formats, serialization_type)
            step_id = ctx.allocate_step_id() if ctx is not None else None
            return messaging.send_bulk(peer, ctx, step_ctx, step_id, batch,
                                       name=messaging.SEND, forks_of=given)
        text = peer.formats.encode_as(peer.formats.chosen(serialization_type), message,
                                      "a message")
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return _routed({destination_id: shard_key}, messaging.send(
            peer, ctx, step_ctx, step_id, destination_id, text, topic, idempotency_key))

    def send_bulk(self, messages: Sequence[messaging.SendMessage], *,
                  send_to_forks: bool = False,
                  serialization_type: SerializationType = None) -> Coroutine[Any, Any, None]:
        """Send every :class:`SendMessage` of ``messages`` in one transaction (one statement
        per shard key): all are delivered or, if one destination is missing, none. In a
        workflow the batch is one checkpoint (exactly once); in a step it lands only while
        the workflow is owned by this execution.

        Args:
            messages: the batch; a message with an ``idempotency_key`` is delivered once
                however often it is sent.
            send_to_forks: deliver each message also to every workflow forked,
                recursively, from its destination.
            serialization_type: the messages' format (None: the configured one).

        Raises:
            NonExistentWorkflowError: naming each missing destination; nothing was sent.
            DBOSError: an empty batch or an idempotency key given twice.
        """
        check_flag(send_to_forks, "send_to_forks")
        ctx, step_ctx = self._contexts()
        peer = self._caller_peer(ctx or step_ctx)
        batch = messaging.outgoing(messages, peer.formats, serialization_type)
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return messaging.send_bulk(peer, ctx, step_ctx, step_id, batch,
                                   forks_of=list(messages) if send_to_forks else None)

    def get_event(self, workflow_id: str, key: str, timeout: float | None = 60.0, *,
                  shard_key: str | None = None) -> Coroutine[Any, Any, Any]:
        """Wait up to ``timeout`` seconds for event ``key`` of ``workflow_id``; None if unset.
        In a workflow the value seen (or None) is a checkpoint."""
        check_lookup(workflow_id, "workflow ID")
        check_lookup(key, "event key")
        check_seconds(timeout, "get_event timeout")
        ctx, _ = self._contexts()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        timeout_id = ctx.allocate_step_id() if ctx is not None else None
        return _routed({workflow_id: shard_key}, messaging.get_event(
            self._caller_peer(ctx), ctx, step_id, timeout_id, workflow_id, key, timeout))

    async def get_all_events(self, workflow_id: str, *,
                             shard_key: str | None = None) -> dict[str, Any]:
        """Every event of ``workflow_id`` with its latest value (a read, not a checkpoint)."""
        with bind_shard_keys({workflow_id: shard_key}):
            return await messaging.get_all_events(self._peer(), workflow_id)

    def read_stream(self, workflow_id: str, key: str, offset: int = 0, *,
                    timeout: float | None = None,
                    shard_key: str | None = None) -> AsyncIterator[Any]:
        """The values of stream ``key`` of ``workflow_id`` from ``offset``, as they come.

        Ends at the close marker, or when the workflow is finished and nothing more is there;
        a value not there within ``timeout`` seconds raises :class:`StreamTimeoutError`. In a
        workflow each value read (and the end, and a timeout) is a checkpoint.
        """
        check_lookup(workflow_id, "workflow ID")
        check_lookup(key, "stream key")
        check_offset(offset)
        check_seconds(timeout, "read_stream timeout")
        ctx, step_ctx = self._contexts()
        return messaging.read_stream(self._caller_peer(ctx or step_ctx), workflow_id, key,
                                     offset, shard_key, timeout=timeout, ctx=ctx)

    def read_stream_offset(self, workflow_id: str, key: str, offset: int, *,
                           timeout: float | None = None,
                           shard_key: str | None = None) -> Coroutine[Any, Any, Any]:
        """The value at ``offset`` of stream ``key`` of ``workflow_id``, once it is written.

        In a workflow the value read is a checkpoint (its position fixed by this call).

        Args:
            workflow_id: the workflow writing the stream (under ``shard_key``, sharded).
            key: the stream's key.
            offset: the value's position, 0 for the first.
            timeout: seconds to wait for it (None: no bound).

        Returns:
            The value.

        Raises:
            StreamTimeoutError: the timeout passed, or the stream ended before ``offset``.
            InvalidArgumentError: a negative or non-integer offset, or a bad timeout.
            NonExistentWorkflowError: ``workflow_id`` does not exist.
        """
        check_lookup(workflow_id, "workflow ID")
        check_lookup(key, "stream key")
        check_offset(offset)
        check_seconds(timeout, "read_stream_offset timeout")
        ctx, step_ctx = self._contexts()
        step_id = ctx.allocate_step_id() if ctx is not None else None
        return _routed({workflow_id: shard_key}, messaging.read_stream_offset(
            self._caller_peer(ctx or step_ctx), workflow_id, key, offset, shard_key,
            timeout, ctx, step_id))

    # ---- Cancel and delete (see executor/management/control.py) ----

    async def cancel_workflow(self, workflow_id: str, cancel_children: bool = False, *,
                              shard_key: str | None = None) -> None:
        """Cancel a workflow (and with ``cancel_children`` every workflow it started,
        recursively). A finished one keeps its outcome; cancelling twice changes nothing;
        an unknown ID raises :class:`NonExistentWorkflowError`. A running workflow stops at
        once (its step or wait is interrupted) and its ``get_result()`` raises
        :class:`WorkflowCancelledError`."""
        await self.cancel_workflows([workflow_id], cancel_children=cancel_children,
                                    shard_key=shard_key)

    async def cancel_workflows(self, workflow_ids: Sequence[str],
                               cancel_children: bool = False, *,
                               shard_key: str | None = None) -> list[str]:
        """Cancel several workflows (all under ``shard_key``, on a sharded database) in one
        transaction (all or, if one is unknown, none). Returns the IDs whose status
        changed."""
        with bind_shard_keys(dict.fromkeys(workflow_ids, shard_key)):
            return await control.cancel(self._peer(), list(workflow_ids), cancel_children)

    async def delete_workflow(self, workflow_id: str, delete_children: bool = False, *,
                              shard_key: str | None = None) -> None:
        """Delete every row of a workflow (status, inputs, outputs, steps, messages,
        events, streams), and with ``delete_children`` of its descendants. Unknown IDs are
        ignored."""
        await self.delete_workflows([workflow_id], delete_children=delete_children,
                                    shard_key=shard_key)

    async def delete_workflows(self, workflow_ids: Sequence[str],
                               delete_children: bool = False, *,
                               shard_key: str | None = None) -> None:
        """Delete several workflows (under ``shard_key``), in one transaction."""
        with bind_shard_keys(dict.fromkeys(workflow_ids, shard_key)):
            await control.delete(self._peer(), list(workflow_ids), delete_children)

    # ---- Resume, fork and rewind ----

    async def resume_workflow(self, workflow_id: str, queue: str | Queue | None = None, *,
                              shard_key: str | None = None,
                              application_version: str | None = None) -> WorkflowHandle[Any]:
        """Continue a cancelled, dead-lettered or stuck workflow from its last checkpoint:
        it is re-enqueued on ``queue`` (default: the internal queue every executor
        serves), with its recovery attempts and deadline reset. Resuming a SUCCESS or
        ERROR workflow changes nothing (its handle returns the recorded outcome); an
        unknown ID raises :class:`NonExistentWorkflowError`.

        ``application_version`` names the version whose executors may run it (default:
        the one it has): give the current one to move a workflow an old version's deploy
        left waiting, once the replay check passes (see "Application versions")."""
        [handle] = await self.resume_workflows([workflow_id], queue, shard_key=shard_key,
                                               application_version=application_version)
        return handle

    async def resume_workflows(self, workflow_ids: Sequence[str],
                               queue: str | Queue | None = None, *,
                               shard_key: str | None = None,
                               application_version: str | None = None
                               ) -> list[WorkflowHandle[Any]]:
        """Resume several workflows (under ``shard_key``; under ``application_version``,
        if given) in one transaction (all or, if one is unknown, none)."""
        ids = list(workflow_ids)
        check_lookup(_queue_name(queue), "queue name")
        check_identifier(application_version, "application_version", optional=True)
        with bind_shard_keys(dict.fromkeys(ids, shard_key)):
            await control.resume(self._peer(), ids, _queue_name(queue), application_version)
        return [await self._handle(workflow_id, shard_key) for workflow_id in ids]

    async def fork_workflow(
        self, workflow_id: str, start_step: StartStep = 0, *,
        application_version: str | None = None,
        queue: str | Queue | None = None, replacement_children: dict[str, str] | None = None,
        new_workflow_id: str | None = None, workflow_timeout: float | None = None,
        shard_key: str | None = None, queue_partition_key: str | None = None,
    ) -> WorkflowHandle[Any]:
        """Start a new workflow with ``workflow_id``'s inputs whose steps below
        ``start_step`` replay from copies of the original's checkpoints (and its events
        and streams up to there); steps from ``start_step`` run again. The new ID is
        ``new_workflow_id``, else (in an executor) the one ``SetWorkflowID`` gives, else
        random; its timeout is ``workflow_timeout``, else (in an executor) the one
        ``SetWorkflowTimeout`` gives. ``start_step`` (0, the whole workflow, by default)
        must be between 0 and one past the last recorded step, or a point found in the
        recorded steps: ``StartPoint.LAST_FAILURE``, ``StartPoint.LAST_STEP`` or
        ``StepNamed(name, occurrence=0)`` (one that is not there raises
        :class:`DBOSError`). ``replacement_children`` maps child IDs recorded in the copied
        steps to other workflows to use instead. The fork lives under the original's
        ``shard_key``. On a partitioned ``queue`` the fork needs ``queue_partition_key``,
        the partition it is enqueued in."""
        check_identifier(new_workflow_id, "new_workflow_id", optional=True)
        check_seconds(workflow_timeout, "workflow_timeout")
        for original, replacement in (replacement_children or {}).items():
            check_lookup(original, "replacement_children key")
            check_lookup(replacement, "replacement_children value")
        call = self._fork_call(new_workflow_id, workflow_timeout)
        [handle] = await self.fork_workflows(
            [ForkRequest(workflow_id, start_step, call.workflow_id, shard_key,
                         replacement_children)],
            application_version=application_version, queue=queue,
            queue_partition_key=queue_partition_key, workflow_timeout=call.timeout)
        return handle

    async def fork_workflows(
        self, forks: Sequence[ForkRequest], *, application_version: str | None = None,
        queue: str | Queue | None = None, queue_partition_key: str | None = None,
        workflow_timeout: float | None = None,
    ) -> list[WorkflowHandle[Any]]:
        """Fork every :class:`ForkRequest` of ``forks`` as :meth:`fork_workflow` forks one,
        all in one transaction: every fork is created, or, if one is refused (an unknown
        workflow, a ``start_step`` out of range, a new ID that exists or is given twice),
        none. The forks share the options: ``application_version``, ``queue`` (the
        internal queue by default), ``queue_partition_key`` (required on, and only on, a
        partitioned queue) and ``workflow_timeout``. Returns their handles, in order."""
        check_seconds(workflow_timeout, "workflow_timeout")
        check_identifier(application_version, "application_version", optional=True)
        check_lookup(_queue_name(queue), "queue name")
        peer = self._peer()
        check_options({"partition_key": queue_partition_key})
        name = _queue_name(queue)
        target = queue if isinstance(queue, Queue) else None
        if target is None and name is None:
            target = internal_queue()
        elif target is None and name is not None:
            stored = await peer.system_database.list_queues([name])
            target = Queue._from_record(stored[0]) if stored else None
        if target is not None:
            check_partition(target, queue_partition_key)
        forked = await control.fork(peer, forks, workflow_timeout=workflow_timeout,
                                    application_version=application_version, queue_name=name,
                                    partition_key=queue_partition_key)
        return [await self._handle(f.workflow_id, f.shard_key) for f in forked]

    async def rewind_workflow(
        self, workflow_id: str, start_step: StartStep = 0, *,
        application_version: str | None = None,
        queue: str | Queue | None = None, shard_key: str | None = None,
    ) -> WorkflowHandle[Any]:
        """Rewind a finished workflow in place: its checkpoints from ``start_step`` on (0,
        the whole workflow, by default; or a point found in its recorded steps, as
        :meth:`fork_workflow` takes it) are
        discarded (events rolled back, stream close markers removed, messages consumed
        since deleted) and it is re-enqueued under the same ID to run them again."""
        check_identifier(application_version, "application_version", optional=True)
        check_lookup(_queue_name(queue), "queue name")
        with bind_shard_keys({workflow_id: shard_key}):
            await control.rewind(self._peer(), workflow_id, start_step,
                                 application_version=application_version,
                                 queue_name=_queue_name(queue))
        return await self._handle(workflow_id, shard_key)

    # ---- Listing ----

    async def list_workflows(self, *, load_input: bool = True, load_output: bool = True,
                             **filters: Unpack[WorkflowFilters]) -> list[WorkflowStatus]:
        """Workflows matching every given filter (a list matches any of its values), by
        creation time (``sort_desc`` for newest first), a page of ``limit`` after
        ``offset``. The filters (:class:`~dbos_async._executor.management.control.WorkflowFilters`):
        ``workflow_ids``, ``status``, ``name``, ``queue_name``, ``parent_workflow_id``,
        ``forked_from``, ``executor_id``, ``application_version``, ``authenticated_user``,
        ``workflow_id_prefix``, ``schedule_name``; ``start_time``/``end_time`` bound
        ``created_at``, ``completed_after``/``completed_before`` ``completed_at`` and
        ``dequeued_after``/``dequeued_before`` ``started_at_epoch_ms`` (inclusive);
        ``has_parent``, ``is_fork`` and ``was_forked_from`` (True, False or None: either)
        keep children or top-level workflows, forks or others, workflows forked or
        not. ``load_input``/``load_output`` fill ``input``, ``output`` and
        ``error`` (typed by the registered workflow's signature in an executor that has it,
        plain JSON otherwise). ``application_name`` lists those applications' workflows
        (and unclaimed ones); by default this executor's or client's own application's
        (every one when it has no name). ``attributes`` keeps workflows whose attributes
        contain the given dict. ``shard_key`` / ``parent_shard_key`` (sharded databases)
        keep workflows of those keys, or whose parent has them (an empty list matches
        nothing). ``queues_only`` keeps workflows on a queue that have not finished (as
        :meth:`list_queued_workflows`)."""
        return await control.list_workflows(self._peer(), control.workflow_filter(
            filters, load_input=load_input, load_output=load_output))

    async def list_queued_workflows(
        self,
        *,
        queue_name: str | Sequence[str] | None = None,
        status: str | Sequence[str] | None = None,
        name: str | Sequence[str] | None = None,
        start_time: TimeBound | None = None,
        end_time: TimeBound | None = None,
        executor_id: str | Sequence[str] | None = None,
        workflow_id_prefix: str | Sequence[str] | None = None,
        limit: int | None = None,
        offset: int | None = None,
        sort_desc: bool = False,
        load_input: bool = True,
        load_output: bool = False,
    ) -> list[WorkflowStatus]:
        """Workflows on a queue that have not finished (DELAYED, ENQUEUED or PENDING
        unless ``status`` says otherwise), with the filters of :meth:`list_workflows`."""
        return await self.list_workflows(
            queue_name=queue_name, status=status, name=name, start_time=start_time,
            end_time=end_time, executor_id=executor_id,
            workflow_id_prefix=workflow_id_prefix, limit=limit, offset=offset,
            sort_desc=sort_desc, load_input=load_input, load_output=load_output,
            queues_only=True,
        )

    async def list_workflow_steps(self, workflow_id: str, *, load_output: bool = True,
                                  limit: int | None = None, offset: int | None = None,
                                  shard_key: str | None = None) -> list[WorkflowStepInfo]:
        """The recorded steps (and other checkpoints) of a workflow, by position, a page
        of ``limit`` after ``offset``; ``load_output=False`` leaves outputs and errors
        unread (None). An unknown ID raises :class:`NonExistentWorkflowError`."""
        with bind_shard_keys({workflow_id: shard_key}):
            return await control.list_steps(self._peer(), workflow_id, limit=limit,
                                            offset=offset, load_output=load_output)

    # ---- Export and import (see executor/transfer.py) ----

    def export_workflows(self, *, batch_size: int = 100,
                         **filters: Unpack[WorkflowFilters]) -> AsyncIterator[ExportedWorkflow]:
        """Every workflow the filters of :meth:`list_workflows` select, in its order, each
        with every row it owns (status, inputs, outputs, checkpoints, messages, events and
        their history, streams): ``async for workflow in dbos.export_workflows(...)``, and
        ``workflow.to_json()`` is its line of the export format. One read-only transaction
        on one snapshot, no row locked; ``batch_size`` workflows are read at a time."""
        f = control.workflow_filter(filters, load_input=False, load_output=False)
        return transfer.export_workflows(self._peer(), f, batch_size)

    async def import_workflows(
        self,
        rows: Iterable[ExportedWorkflow | str] | AsyncIterable[ExportedWorkflow | str],
        *,
        shard_key_of: Callable[[ExportedWorkflow], str] | None = None,
        batch_size: int = 100,
    ) -> ImportSummary:
        """Store exported workflows (:class:`ExportedWorkflow` objects or lines of the
        export format), ``batch_size`` per transaction: a batch is written whole or not at
        all. A workflow already stored with the same rows is left alone, so importing the
        same lines again changes nothing; one stored with other rows raises
        :class:`~dbos_async.errors.WorkflowImportConflictError`. ``shard_key_of`` gives
        each workflow its key in a sharded target (how an unsharded database moves onto a
        sharded one); without it a sharded target takes the exported keys."""
        return await transfer.import_workflows(self._peer(), rows, shard_key_of, batch_size)

    async def queue_depths(self) -> dict[str, dict[str, int]]:
        """How many workflows wait or run on each queue: ``{queue name: {status: count}}``
        for the statuses ``DELAYED``, ``ENQUEUED`` and ``PENDING`` (those with none are left
        out), counting this application's own workflows and unclaimed ones, under every
        shard key. One grouped count, for dashboards and ``dbos-async queue list``."""
        return await self._peer().system_database.queue_depths()

    async def queue_activity(self, minutes: int = 60) -> list[QueueMinute]:
        """Per queue, how many workflows started and how many finished in each minute of
        the last ``minutes`` (minutes with neither are left out), oldest first; this
        application's own workflows and unclaimed ones, under every shard key."""
        return await observability.queue_activity(self._peer(), _minutes(minutes))

    async def oldest_waiting_workflows(self) -> dict[str, WaitingWorkflow]:
        """Each queue's oldest workflow still waiting to start (ENQUEUED or DELAYED), by
        queue name; queues with none waiting are left out."""
        return await observability.oldest_waiting(self._peer())

    async def get_workflow_aggregates(
            self, *, group_by: str | Sequence[str] = ("status", "name"),
            start_time: TimeBound | None = None, end_time: TimeBound | None = None,
            time_column: str = "created") -> list[WorkflowAggregate]:
        """Workflows counted per group over a time range, with the mean and p50/p95/p99 of
        their run times (dequeue or creation to completion; unfinished ones count but have
        no run time). This application's own workflows and unclaimed ones, under every
        shard key; an observability read served by the timestamp's index.

        Args:
            group_by: columns to group by, among ``status``, ``name``, ``queue_name``,
                ``application_version`` and ``executor_id`` (empty: one group of all).
            start_time: start of the range, inclusive (default: an hour before the end).
            end_time: end of the range, exclusive (default: now).
            time_column: the timestamp the range applies to: ``created`` or ``completed``.

        Returns:
            One :class:`WorkflowAggregate` per group with workflows, ordered by group.

        Raises:
            InvalidArgumentError: an unknown column or time column, or an empty range.
            QueryTimeoutError: the read ran over the observability query timeout.
        """
        return await observability.workflow_aggregates(self._peer(), group_by, start_time,
                                                       end_time, time_column)

    async def get_step_aggregates(self, *, start_time: TimeBound | None = None,
                                  end_time: TimeBound | None = None) -> list[StepAggregate]:
        """Steps completed in a time range, counted per name and outcome (``SUCCESS`` or
        ``ERROR``), with the mean and p50/p95/p99 of their durations; an observability read
        served by the index on completion time.

        Args:
            start_time: start of the range, inclusive (default: an hour before the end).
            end_time: end of the range, exclusive (default: now).

        Returns:
            One :class:`StepAggregate` per name and outcome, ordered by name.

        Raises:
            InvalidArgumentError: an empty range.
            QueryTimeoutError: the read ran over the observability query timeout.
        """
        return await observability.step_aggregates(self._peer(), start_time, end_time)

    async def get_queue_metrics(self) -> list[QueueMetrics]:
        """Each queue's backlog now: its DELAYED, ENQUEUED and PENDING workflows and how
        long its oldest waiting one has waited (queues with none of these are left out).

        Returns:
            One :class:`QueueMetrics` per queue, by name.

        Raises:
            QueryTimeoutError: a read ran over the observability query timeout.
        """
        return await observability.queue_metrics(self._peer())

    async def get_workflow_activity(
            self, *, start_time: TimeBound | None = None, end_time: TimeBound | None = None,
            bucket_seconds: int = 60) -> list[WorkflowActivity]:
        """Workflows finished per name and interval of ``bucket_seconds`` over a time range
        (intervals with none are left out): in all, succeeded and failed; for throughput
        and failure charts. An observability read served by the completed_at index.

        Args:
            start_time: start of the range, inclusive (default: an hour before the end).
            end_time: end of the range, exclusive (default: now).
            bucket_seconds: the length of each interval.

        Returns:
            One :class:`WorkflowActivity` per name and interval, by name then time.

        Raises:
            InvalidArgumentError: an empty range or an interval that is not a positive
                integer.
            QueryTimeoutError: the read ran over the observability query timeout.
        """
        return await observability.workflow_activity(self._peer(), start_time, end_time,
                                                     bucket_seconds)

    async def get_queue_depth_history(self, minutes: int = 60) -> list[QueueDepth]:
        """Each queue's waiting workflows (ENQUEUED or DELAYED) at the end of each of the
        last ``minutes`` minutes: measured where an executor sampled the minute (those
        whose queues had work sample their depths once a minute) and for the current
        minute (the count now); the other minutes worked back from the next measured one
        through the enqueues and starts between (a waiting workflow cancelled or deleted
        since is not counted back). On a sharded schema every past minute is worked back.

        Args:
            minutes: how many minutes, from 1 to 1440.

        Returns:
            ``minutes`` :class:`QueueDepth` per queue, by queue then time, each saying
            whether it was ``measured``.

        Raises:
            InvalidArgumentError: ``minutes`` out of range.
            QueryTimeoutError: a read ran over the observability query timeout.
        """
        return await observability.queue_depth_history(self._peer(), _minutes(minutes))

    async def get_metrics(self, start_time: TimeBound, end_time: TimeBound) -> list[MetricData]:
        """How many workflows of each name were created and how many steps of each name
        completed in [start_time, end_time).

        Args:
            start_time: start of the range, inclusive.
            end_time: end of the range, exclusive.

        Returns:
            ``workflow_count`` then ``step_count`` :class:`MetricData`, one per name.

        Raises:
            InvalidArgumentError: an empty range.
            QueryTimeoutError: a read ran over the observability query timeout.
        """
        return await observability.metrics(self._peer(), start_time, end_time)

    async def list_executors(self, recent_minutes: int = 60,
                             shown: int = 10) -> list[ExecutorActivity]:
        """The executors owning PENDING workflows or having started one in the last
        ``recent_minutes``: whether each is alive (holds its executor-ID lock) and its
        oldest ``shown`` PENDING workflows. Reads the lock table; takes no lock."""
        return await observability.executors(self._peer(), recent_minutes, shown)

    # ---- Events, messages and streams as stored (reads, never checkpoints) ----

    async def get_event_history(self, workflow_id: str, *, limit: int = 1000,
                                shard_key: str | None = None) -> list[EventChange]:
        """Every value each event of ``workflow_id`` was set to, in the order of the steps
        that set them (at most ``limit``)."""
        with bind_shard_keys({workflow_id: shard_key}):
            return await observability.event_history(self._peer(), workflow_id,
                                                     _limit(limit))

    async def list_unconsumed_messages(self, workflow_id: str, *, limit: int = 100,
                                       shard_key: str | None = None) -> list[PendingMessage]:
        """Messages sent to ``workflow_id`` that it has not received yet, oldest first (at
        most ``limit``)."""
        with bind_shard_keys({workflow_id: shard_key}):
            return await observability.unconsumed_messages(self._peer(), workflow_id,
                                                           _limit(limit))

    async def list_stream_values(self, workflow_id: str, *, limit: int = 1000,
                                 shard_key: str | None = None) -> list[StreamValue]:
        """The values written to the streams of ``workflow_id``, by key and offset (at most
        ``limit``), without waiting for more (as :meth:`read_stream` does)."""
        with bind_shard_keys({workflow_id: shard_key}):
            return await observability.stream_values(self._peer(), workflow_id,
                                                     _limit(limit))

    # ---- Permissions ----

    async def grant_permissions(self, role: str) -> None:
        """Grant database role ``role`` what an executor or client needs on the system
        schema (DBOS Transact's grant list): usage of the schema, reading and writing its
        tables and sequences, executing its functions, and the same on objects later
        migrations create. It may not alter or drop the tables: migrate as their owner,
        then run the application as ``role``. Run this as the schema's owner."""
        await self._peer().system_database.grant_permissions(role)

    # ---- Changing workflows in place ----

    async def set_workflow_priority(self, workflow_id: str, priority: int, *,
                                    shard_key: str | None = None) -> None:
        """Give a workflow still waiting on its queue (ENQUEUED or DELAYED) a new priority
        (lower runs first; 0 to 2**31-1). An unknown ID raises
        :class:`NonExistentWorkflowError`, a workflow that has started or finished
        :class:`WorkflowStateError`; nothing changes then."""
        with bind_shard_keys({workflow_id: shard_key}):
            await control.set_priority(self._peer(), workflow_id, priority)

    async def set_workflow_delay(self, workflow_id: str, *, delay_seconds: float | None = None,
                                 delay_until_epoch_ms: int | None = None,
                                 shard_key: str | None = None) -> None:
        """Make a workflow still waiting on its queue (ENQUEUED or DELAYED) wait until
        ``delay_seconds`` from now, or until ``delay_until_epoch_ms`` (exactly one): it is
        DELAYED until then, and ENQUEUED when due (at once for a time already past). An
        unknown ID raises :class:`NonExistentWorkflowError`, a started or finished
        workflow :class:`WorkflowStateError`; nothing changes then."""
        peer = self._peer()
        until = control.delay_until_ms(peer.system_database.clock, delay_seconds,
                                       delay_until_epoch_ms)
        with bind_shard_keys({workflow_id: shard_key}):
            await control.set_delay(peer, workflow_id, until)

    async def update_workflow_attributes(self, workflow_id: str,
                                         attributes: dict[str, Any] | None, *,
                                         merge: bool = False,
                                         shard_key: str | None = None) -> None:
        """Replace a workflow's custom attributes (None clears them), or with ``merge``
        add these top-level keys to them (replacing those it has), in one statement. Any
        status; an unknown ID raises :class:`NonExistentWorkflowError`."""
        with bind_shard_keys({workflow_id: shard_key}):
            await control.update_attributes(self._peer(), workflow_id, attributes, merge)

    # ---- Queues stored in the database ----

    async def list_queues(self) -> list[Queue]:
        """The queues stored in the ``queues`` table: this application's and unclaimed
        ones (every one when it has no name)."""
        return [Queue._from_record(r) for r in await self._peer().system_database.list_queues()]

    async def get_queue_definition(self, name: str) -> Queue | None:
        """The settings of queue ``name`` as stored in the ``queues`` table (whichever
        application owns it), or None if none are."""
        check_lookup(name, "queue name")
        records = await self._peer().system_database.list_queues([name])
        return Queue._from_record(records[0]) if records else None

    async def update_queue(
        self, name: str, *, concurrency: int | None = _UNCHANGED,
        worker_concurrency: int | None = _UNCHANGED, limiter: LimiterSpec | None = _UNCHANGED,
        partition_queue: bool = _UNCHANGED, partition_concurrency: int | None = _UNCHANGED,
        partition_worker_concurrency: int | None = _UNCHANGED,
        partition_limiter: LimiterSpec | None = _UNCHANGED,
        polling_interval: float = _UNCHANGED,
    ) -> Queue:
        """Change the settings given (the arguments of :class:`Queue`; None removes a
        limit) of a stored queue, keeping the others, in one transaction; the result is
        checked as a declaration is (:class:`ConfigurationError`, nothing written). An
        unknown name raises :class:`QueueNotFoundError`, another application's queue
        :class:`ApplicationOwnershipError`. Returns the queue as stored. Executors apply
        the new settings when they next start listening to the queue; one that declares
        it in code stores its own definition again when it starts."""
        changes = {key: value for key, value in {
            "concurrency": concurrency, "worker_concurrency": worker_concurrency,
            "limiter": limiter, "partition_queue": partition_queue,
            "partition_concurrency": partition_concurrency,
            "partition_worker_concurrency": partition_worker_concurrency,
            "partition_limiter": partition_limiter, "polling_interval": polling_interval,
        }.items() if value is not _UNCHANGED}
        check_lookup(name, "queue name")
        record = await self._peer().system_database.update_queue(
            name, lambda current: Queue._changed(current, changes)._record)
        return Queue._from_record(record)

    async def delete_queue(self, name: str) -> None:
        """Delete a stored queue's settings. Its workflows stay where they are, run only by
        executors that declare it in code (which store it again when they start). An
        unknown name raises :class:`QueueNotFoundError`, another application's queue
        :class:`ApplicationOwnershipError`."""
        check_lookup(name, "queue name")
        await self._peer().system_database.delete_queue(name)

    # ---- Applications ----

    async def rename_application(self, old_name: str | None, new_name: str, *,
                                 adopt_unclaimed_rows: bool = False) -> dict[str, int]:
        """Give application ``new_name`` every row ``old_name`` owns and, with
        ``adopt_unclaimed_rows``, every unclaimed one (``old_name=None``: only those): its
        queues, schedules, versions, workflows and steps, in one transaction. Returns the
        rows moved per table. Run it while the renamed application is stopped, from a
        client or executor acting for another application (or none)."""
        peer = self._peer()
        acting_for = peer.system_database.application_name
        if old_name is not None and old_name == acting_for:
            raise DBOSError(f"This executor or client acts for application {old_name!r}: "
                            "rename it from one acting for another application (or none), "
                            "while it is stopped")
        return await control.rename_application(peer, old_name, new_name, adopt_unclaimed_rows)

    # ---- Application versions ----

    async def list_application_versions(self) -> list[ApplicationVersion]:
        """Every registered application version, latest first."""
        records = await self._peer().system_database.list_versions()
        return [ApplicationVersion._from_record(r) for r in records]

    async def get_latest_application_version(self) -> ApplicationVersion | None:
        """The version with the newest timestamp (None if none is registered)."""
        record = await self._peer().system_database.latest_version()
        return ApplicationVersion._from_record(record) if record is not None else None

    async def list_waiting_versions(self, other_than: str | None = None
                                    ) -> list[VersionBacklog]:
        """Per application version (except ``other_than``), how many PENDING and ENQUEUED
        workflows carry it: work only an executor of that version runs. An observability
        read over the in-flight rows; takes no lock.

        Args:
            other_than: leave this version out (e.g. the one now deployed).

        Returns:
            One :class:`VersionBacklog` per version with such work, by version name.
        """
        check_identifier(other_than, "application version name", optional=True)
        return await self._peer().system_database.waiting_by_version(other_than)

    async def set_latest_application_version(self, version_name: str) -> None:
        """Make ``version_name`` the latest (registering it if it is unknown)."""
        check_identifier(version_name, "application version name")
        await self._peer().system_database.set_latest_version(version_name)
