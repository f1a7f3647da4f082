"""Durable communication: messages (send/recv), events, streams, durable sleep, and waits.

Inside a workflow each primitive is a checkpoint at a step ID allocated when it is *called*
(the ``DBOS`` methods are plain functions returning coroutines), so a replay meets the same
IDs. Writes are fenced by the workflow's ``owner_xid`` in the same statement that records
the checkpoint. Timeouts of ``recv`` and ``get_event`` and the wake-up time of ``sleep`` are
recorded as a ``DBOS.sleep`` checkpoint before waiting, so a recovered workflow waits only
what remains. Waits register with the notification dispatcher *before* reading the database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dbos_async._executor.context import WorkflowContext
from dbos_async._executor.serialization import Formats, to_json
from dbos_async._executor.steps import record_failure, record_read, recorded_read, replay
from dbos_async._sysdb.clock import Clock, after
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.notifications import (
    NOTIFICATIONS_CHANNEL,
    STREAMS_CHANNEL,
    WORKFLOW_COMPLETION_CHANNEL,
    WORKFLOW_EVENTS_CHANNEL,
    NotificationDispatcher,
    Waiter,
    keyed,
)
from dbos_async._sysdb.shard_keys import WorkflowAddress, bind_shard_keys, validate_shard_key
from dbos_async._sysdb.statements import (
    ACTIVE_STATUSES,
    PORTABLE_JSON,
    SEND_BULK,
    STREAM_CLOSED_SERIALIZED,
    OutgoingMessage,
    Payload,
)
from dbos_async.errors import (
    DBOSError,
    InvalidArgumentError,
    NonExistentWorkflowError,
    StreamTimeoutError,
)

if TYPE_CHECKING:
    from dbos_async._executor.handles import WorkflowHandle
    from dbos_async._executor.peer import Peer

NULL_TOPIC = "__null__topic__"
"""The topic of a message sent without one (the same sentinel every DBOS SDK uses)."""

SEND = "DBOS.send"
RECV = "DBOS.recv"
SET_EVENT = "DBOS.setEvent"
GET_EVENT = "DBOS.getEvent"
SLEEP = "DBOS.sleep"
WRITE_STREAM = "DBOS.writeStream"
CLOSE_STREAM = "DBOS.closeStream"
READ_STREAM = "DBOS.readStream"
READ_STREAM_OFFSET = "DBOS.readStreamOffset"

# What close_stream writes: the marker every DBOS SDK closes a stream with, portable JSON.
CLOSED_MARKER = Payload(STREAM_CLOSED_SERIALIZED)
# What a read that found nothing (a recv or get_event timing out) records.
NOTHING = Payload("null")


def _dispatcher(sysdb: SystemDatabase) -> NotificationDispatcher:
    dispatcher = sysdb.notifications
    if dispatcher is None:
        raise DBOSError("The notification dispatcher is not running")
    return dispatcher


async def durable_deadline(ctx: WorkflowContext, step_id: int, seconds: float,
                           *, complete_at_deadline: bool) -> int:
    """Record (or read back) the epoch-ms deadline ``seconds`` from now as a checkpoint.

    For a real sleep the checkpoint's completion time is the deadline; for a timeout marker it
    is the start, since the deadline may never be reached.
    """
    done, value = recorded_read(ctx, step_id, SLEEP)
    if done:
        return int(value)
    clock = ctx.runtime.system_database.clock
    started = clock.now_ms()
    deadline = after(clock, seconds)  # checked non-negative by the API
    existing = await ctx.runtime.system_database.record_step(
        ctx.workflow_id, step_id, SLEEP, ctx.owner_xid, output=to_json(deadline, "a deadline"),
        error=None, started_at_ms=started,
        completed_at_ms=deadline if complete_at_deadline else started,
    )
    if existing is not None:
        return int(replay(ctx, step_id, SLEEP, existing))
    return deadline


# ---- send / recv ----


def message_address(destination_id: str, topic: str | None,
                    idempotency_key: str | None) -> tuple[str, str]:
    """The stored topic and message ID of a send (``<key>::<destination>`` when it is
    idempotent)."""
    message_uuid = (f"{idempotency_key}::{destination_id}" if idempotency_key is not None
                    else str(uuid.uuid4()))
    return (topic if topic is not None else NULL_TOPIC), message_uuid


async def send(peer: Peer, ctx: WorkflowContext | None, step_ctx: WorkflowContext | None,
               step_id: int | None, destination_id: str, message: Payload, topic: str | None,
               idempotency_key: str | None) -> None:
    topic, message_uuid = message_address(destination_id, topic, idempotency_key)
    if ctx is not None and step_id is not None:
        done, _ = recorded_read(ctx, step_id, SEND)
        if done:
            return
    sysdb = peer.system_database  # after the replay: a replay check has no database
    if ctx is not None and step_id is not None:
        destination_key = sysdb.sql.key_hint(destination_id)
        try:
            if destination_key == ctx.shard_key:
                existing = await sysdb.send_recorded(ctx.workflow_id, step_id, ctx.owner_xid,
                                                     destination_id, message_uuid, topic,
                                                     message)
            else:
                existing = await sysdb.send_recorded_across(
                    WorkflowAddress(ctx.workflow_id, ctx.shard_key), step_id, ctx.owner_xid,
                    WorkflowAddress(destination_id, destination_key), message_uuid, topic,
                    message)
        except NonExistentWorkflowError as missing:
            # Recorded as the step's outcome, so a replay raises the same error.
            with ctx.routed():
                raise await record_failure(ctx, step_id, SEND, missing) from missing
        if existing is not None:
            replay(ctx, step_id, SEND, existing)
            return
    elif step_ctx is not None:
        await sysdb.send_fenced(step_ctx.workflow_id, step_ctx.owner_xid, destination_id,
                                message_uuid, topic, message)
    else:
        await sysdb.send(destination_id, message_uuid, topic, message)
    _announce_message(sysdb, sysdb.waiter_key(destination_id, topic))


def _announce_message(sysdb: SystemDatabase, waiter: str) -> None:
    """Wake the receivers of a committed message."""
    if sysdb.sharded:
        # No trigger on a sharded schema (on Citus it would fire on a worker): the writer
        # tells every process.
        sysdb.notify(NOTIFICATIONS_CHANNEL, waiter)
    else:
        # The trigger on notifications NOTIFYs other processes; wake this one's waiters now.
        _dispatcher(sysdb).wake(NOTIFICATIONS_CHANNEL, waiter)


@dataclass(frozen=True)
class SendMessage:
    """One message of :meth:`~dbos_async.DBOS.send_bulk` (named and shaped as the `dbos`
    package's): to workflow ``destination_id`` (under ``shard_key``, on a sharded
    database), on ``topic``; with ``idempotency_key`` it is delivered once however often
    the batch is sent."""

    destination_id: str
    message: Any
    topic: str | None = None
    idempotency_key: str | None = None
    shard_key: str | None = None


def outgoing(messages: Sequence[SendMessage], formats: Formats,
             serialization_type: object = None) -> list[OutgoingMessage]:
    """Check and address a batch before anything is written: at least one message, each a
    :class:`SendMessage` to a named workflow with a portable value, no idempotency key
    twice (the `dbos` package's rule). Values are written in the format
    ``serialization_type`` chooses (None: the peer's own)."""
    serialization = formats.chosen(serialization_type)
    if isinstance(messages, SendMessage) or not isinstance(messages, Sequence) or not messages:
        raise DBOSError("send_bulk needs a non-empty list of SendMessage")
    keys = [m.idempotency_key for m in messages
            if isinstance(m, SendMessage) and m.idempotency_key is not None]
    repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
    if repeated:
        raise DBOSError(f"send_bulk received duplicate idempotency keys: {', '.join(repeated)}")
    batch = []
    for index, m in enumerate(messages):
        if not isinstance(m, SendMessage):
            raise DBOSError(f"send_bulk message {index} is not a SendMessage: {m!r}")
        if not isinstance(m.destination_id, str) or not m.destination_id:
            raise DBOSError(f"send_bulk message {index} has no destination_id")
        validate_shard_key(m.shard_key)
        topic, message_uuid = message_address(m.destination_id, m.topic, m.idempotency_key)
        message = formats.encode_as(serialization, m.message, f"send_bulk message {index}")
        batch.append(OutgoingMessage(m.destination_id, message_uuid, topic, message.text,
                                     m.shard_key, message.serialization))
    return batch


def to_forks(messages: Sequence[SendMessage], batch: Sequence[OutgoingMessage],
             forks: dict[WorkflowAddress, list[WorkflowAddress]]) -> list[OutgoingMessage]:
    """``batch`` (the addressed ``messages``) with a copy of each message for every fork
    of its destination: an idempotency key gives each copy the ID ``<key>::<fork>``."""
    out: list[OutgoingMessage] = []
    for m, sent in zip(messages, batch, strict=True):
        out.append(sent)
        for fork_id, _ in forks.get(WorkflowAddress(m.destination_id, m.shard_key), ()):
            _, message_uuid = message_address(fork_id, m.topic, m.idempotency_key)
            out.append(dataclasses.replace(sent, destination_id=fork_id,
                                           message_uuid=message_uuid))
    return out


async def send_bulk(peer: Peer, ctx: WorkflowContext | None, step_ctx: WorkflowContext | None,
                    step_id: int | None, messages: Sequence[OutgoingMessage], *,
                    name: str = SEND_BULK,
                    forks_of: Sequence[SendMessage] | None = None) -> None:
    """Send a batch in one transaction (one statement per shard key): inside a workflow
    one checkpoint (``name``) covers the whole batch, so it is delivered exactly once; from
    a step it lands only while the workflow is owned by this execution. With ``forks_of``
    (the batch's messages as given), each is also sent to every workflow forked,
    recursively, from its destination, as they are when the send starts."""
    if ctx is not None and step_id is not None:
        done, _ = recorded_read(ctx, step_id, name)
        if done:
            return
    sysdb = peer.system_database  # after the replay: a replay check has no database
    if forks_of is not None:
        forks = await sysdb.fork_descendants(
            [WorkflowAddress(m.destination_id, m.shard_key) for m in forks_of])
        messages = to_forks(forks_of, messages, forks)
    if ctx is not None and step_id is not None:
        try:
            existing = await sysdb.send_many(
                messages, sender=WorkflowAddress(ctx.workflow_id, ctx.shard_key),
                owner_xid=ctx.owner_xid, function_id=step_id, function_name=name)
        except NonExistentWorkflowError as missing:
            with ctx.routed():
                raise await record_failure(ctx, step_id, name, missing) from missing
        if existing is not None:
            replay(ctx, step_id, name, existing)
            return
    elif step_ctx is not None:
        await sysdb.send_many(messages, sender=WorkflowAddress(step_ctx.workflow_id,
                                                               step_ctx.shard_key),
                              owner_xid=step_ctx.owner_xid)
    else:
        await sysdb.send_many(messages)
    for waiter in dict.fromkeys(_waiter_of(sysdb, m) for m in messages):
        _announce_message(sysdb, waiter)


def _waiter_of(sysdb: SystemDatabase, m: OutgoingMessage) -> str:
    with WorkflowAddress(m.destination_id, m.shard_key).routed():
        return sysdb.waiter_key(m.destination_id, m.topic)


async def recv(ctx: WorkflowContext, step_id: int, timeout_id: int, topic: str | None,
               timeout: float | None) -> Any:  # noqa: ASYNC109
    done, value = recorded_read(ctx, step_id, RECV)
    if done:
        return value
    sysdb = ctx.runtime.system_database
    dispatcher = _dispatcher(sysdb)
    topic = topic if topic is not None else NULL_TOPIC
    deadline = (await durable_deadline(ctx, timeout_id, timeout, complete_at_deadline=False)
                if timeout is not None else None)
    with dispatcher.register(NOTIFICATIONS_CHANNEL,
                             sysdb.waiter_key(ctx.workflow_id, topic)) as w:
        while True:
            # Batched, the reads of every waiter woken at once are a few statements: the
            # bound on concurrent reads would only shrink the batches.
            async with (nullcontext() if sysdb.consumes_in_batches
                        else dispatcher.polling()):
                found, message, serialization = await sysdb.consume_message(
                    ctx.workflow_id, step_id, ctx.owner_xid, topic
                )
            if found:
                return ctx.runtime.formats.decode(message, serialization, "a received message")
            if deadline is not None and sysdb.clock.now_ms() >= deadline:
                return await record_read(ctx, step_id, RECV, NOTHING)
            # Interrupted if the workflow is cancelled meanwhile.
            with ctx.runtime.cancellation.region(ctx), ctx.runtime.workflows.parked():
                await w.wait(None, until_ms=deadline)


# ---- Events ----


async def set_event(ctx: WorkflowContext | None, step_ctx: WorkflowContext | None,
                    step_id: int | None, key: str, value: Payload) -> None:
    if ctx is not None and step_id is not None:
        done, _ = recorded_read(ctx, step_id, SET_EVENT)
        if done:
            return
        sysdb = ctx.runtime.system_database
        existing = await sysdb.set_event_recorded(ctx.workflow_id, step_id, ctx.owner_xid,
                                                  key, value)
        if existing is not None:
            replay(ctx, step_id, SET_EVENT, existing)
            return
        workflow_id = ctx.workflow_id
    elif step_ctx is not None:
        sysdb = step_ctx.runtime.system_database
        await sysdb.set_event_fenced(step_ctx.workflow_id, step_ctx.owner_xid, key, value)
        workflow_id = step_ctx.workflow_id
    else:
        raise DBOSError("set_event can only be called from a workflow or one of its steps")
    _dispatcher(sysdb).notify(WORKFLOW_EVENTS_CHANNEL, sysdb.waiter_key(workflow_id, key))


async def _poll_event(sysdb: SystemDatabase, workflow_id: str, key: str,
                      deadline: int | None) -> tuple[str, str | None] | None:
    dispatcher = _dispatcher(sysdb)
    with dispatcher.register(WORKFLOW_EVENTS_CHANNEL,
                             sysdb.waiter_key(workflow_id, key)) as waiter:
        while True:
            async with dispatcher.polling():
                found = await sysdb.get_event(workflow_id, key)
            if found is not None:
                return found
            if deadline is not None and sysdb.clock.now_ms() >= deadline:
                return None
            await waiter.wait(None, until_ms=deadline)


async def get_event(peer: Peer, ctx: WorkflowContext | None, step_id: int | None,
                    timeout_id: int | None, workflow_id: str, key: str,
                    timeout: float | None) -> Any:  # noqa: ASYNC109
    if ctx is None or step_id is None or timeout_id is None:
        deadline = after(peer.system_database.clock, timeout) if timeout is not None else None
        found = await _poll_event(peer.system_database, workflow_id, key, deadline)
        return (peer.formats.decode(found[0], found[1], "an event") if found is not None
                else None)
    done, value = recorded_read(ctx, step_id, GET_EVENT)
    if done:
        return value
    sysdb = peer.system_database
    # The target may share the caller's ID under another key: each side is routed by its
    # own key alone.
    target = WorkflowAddress(workflow_id, sysdb.sql.key_hint(workflow_id))
    with ctx.routed():
        deadline = (await durable_deadline(ctx, timeout_id, timeout, complete_at_deadline=False)
                    if timeout is not None else None)
    with ctx.runtime.cancellation.region(ctx), target.routed(), \
            ctx.runtime.workflows.parked():
        found = await _poll_event(sysdb, workflow_id, key, deadline)
    with ctx.routed():
        if found is None:
            return await record_read(ctx, step_id, GET_EVENT, NOTHING)
        peer.formats.decode(found[0], found[1], "an event")  # check it before recording it
        return await record_read(ctx, step_id, GET_EVENT,
                                 Payload(found[0], found[1] or PORTABLE_JSON))


async def get_all_events(peer: Peer, workflow_id: str) -> dict[str, Any]:
    rows = await peer.system_database.get_all_events(workflow_id)
    return {key: peer.formats.decode(value, serialization, f"event {key!r}")
            for key, value, serialization in rows}


# ---- Streams ----


async def write_stream(ctx: WorkflowContext | None, step_ctx: WorkflowContext | None,
                       step_id: int | None, key: str, value: Payload, name: str) -> None:
    if ctx is not None and step_id is not None:
        done, _ = recorded_read(ctx, step_id, name)
        if done:
            return
        sysdb = ctx.runtime.system_database
        existing = await sysdb.write_stream_recorded(ctx.workflow_id, step_id, name,
                                                     ctx.owner_xid, key, value)
        if existing is not None:
            replay(ctx, step_id, name, existing)
            return
        workflow_id = ctx.workflow_id
    elif step_ctx is not None:
        sysdb = step_ctx.runtime.system_database
        await sysdb.write_stream_fenced(step_ctx.workflow_id, step_ctx.owner_xid, key, value)
        workflow_id = step_ctx.workflow_id
    else:
        raise DBOSError("Streams can be written only from a workflow or one of its steps")
    _dispatcher(sysdb).notify(STREAMS_CHANNEL, sysdb.waiter_key(workflow_id, key))


STREAM_CLOSED = json.loads(STREAM_CLOSED_SERIALIZED)
"""The close marker's value, in whatever format its writer stored it (the end of a read
and of the values a replay yields)."""


TIMED_OUT = Payload("")
"""What :func:`_stream_value` returns when the deadline passed first."""


async def _stream_value(peer: Peer, waiter: Waiter, workflow_id: str, key: str, offset: int,
                        route: Callable[[], AbstractContextManager[None]],
                        deadline: int | None, ctx: WorkflowContext | None) -> Payload | None:
    """The value at ``offset`` as stored, once it is there; None at the end of the stream
    (its close marker, or its workflow finished with nothing there); :data:`TIMED_OUT`
    once ``deadline`` (epoch ms) passed. Waits are woken by ``waiter``."""
    sysdb = peer.system_database
    # Other clients may not announce completion: re-read at least this often.
    cap = peer.config.result_poll_interval
    while True:
        async with _dispatcher(sysdb).polling():
            with route():
                status, text, serialization, found = await sysdb.read_stream_value(
                    workflow_id, key, offset)
        if status is None:
            raise NonExistentWorkflowError(workflow_id)
        if found and text is not None:
            value = peer.formats.decode(text, serialization,
                                        f"stream {key!r} at offset {offset}")
            if value != STREAM_CLOSED:
                # Recorded by a workflow as stored, in its writer's format.
                return Payload(text, serialization or PORTABLE_JSON)
        if found or status not in ACTIVE_STATUSES:
            return None
        if deadline is not None and sysdb.clock.now_ms() >= deadline:
            return TIMED_OUT
        if ctx is None:
            await waiter.wait(cap, until_ms=deadline)
        else:
            with ctx.runtime.cancellation.region(ctx):
                await waiter.wait(cap, until_ms=deadline)


def _stream_waiter(sysdb: SystemDatabase, workflow_id: str, key: str,
                   route: Callable[[], AbstractContextManager[None]]) -> Waiter:
    """A waiter woken by the stream's writes and by its workflow's completion."""
    with route():
        targets = (sysdb.waiter_key(workflow_id, key), sysdb.waiter_key(workflow_id))
    return _dispatcher(sysdb).register(STREAMS_CHANNEL, targets[0],
                                       also=[(WORKFLOW_COMPLETION_CHANNEL, targets[1])])


async def read_stream(peer: Peer, workflow_id: str, key: str, offset: int,
                      shard_key: str | None = None, *,
                      timeout: float | None = None,  # noqa: ASYNC109 (a bound per value)
                      ctx: WorkflowContext | None = None) -> AsyncIterator[Any]:
    """The stream's values from ``offset`` as they come; each waits at most ``timeout``
    seconds (None: no bound). Read by a workflow's body (``ctx``), each value delivered, the
    end and a timeout are checkpoints (``DBOS.readStream``, one step each, allocated as the
    read asks for the value), so a replay sees what the first run saw even if the stream
    changed since (a rewind, a delete)."""
    if ctx is not None and ctx.replaying:
        # A replay check reads only the recorded values (ReplayStop past the last one).
        while True:
            _, value = recorded_read(ctx, ctx.allocate_step_id(), READ_STREAM)
            if value == STREAM_CLOSED:
                return
            yield value
    sysdb = peer.system_database
    # Bound only around each read, never across a yield: the consumer's context is its own.
    route = functools.partial(bind_shard_keys, {workflow_id: shard_key})
    # Step IDs are allocated in order: past the first one not recorded, none is.
    replaying = ctx is not None
    with _stream_waiter(sysdb, workflow_id, key, route) as waiter:
        while True:
            step_id = ctx.allocate_step_id() if ctx is not None else None
            if ctx is not None and step_id is not None and replaying:
                done, value = recorded_read(ctx, step_id, READ_STREAM)
                if done:
                    if value == STREAM_CLOSED:
                        return
                    yield value
                    offset += 1
                    continue
                replaying = False
            deadline = after(sysdb.clock, timeout) if timeout is not None else None
            stored = await _stream_value(peer, waiter, workflow_id, key, offset, route,
                                         deadline, ctx)
            if stored is TIMED_OUT:
                error = StreamTimeoutError(workflow_id, key, timeout or 0.0)
                if ctx is None or step_id is None:
                    raise error
                with ctx.routed():
                    raise await record_failure(ctx, step_id, READ_STREAM, error) from error
            if stored is None:
                # The end is recorded too, so a replay stops where this read did.
                if ctx is not None and step_id is not None:
                    with ctx.routed():
                        await record_read(ctx, step_id, READ_STREAM, CLOSED_MARKER)
                return
            if ctx is None or step_id is None:
                value = peer.formats.decode(stored.text, stored.serialization,
                                            f"stream {key!r} at offset {offset}")
            else:
                # Recorded before it is handed over: a crash after the workflow acted on
                # the value replays the same value.
                with ctx.routed():
                    value = await record_read(ctx, step_id, READ_STREAM, stored)
            yield value
            offset += 1


async def read_stream_offset(peer: Peer, workflow_id: str, key: str, offset: int,
                             shard_key: str | None, timeout: float | None,  # noqa: ASYNC109
                             ctx: WorkflowContext | None, step_id: int | None) -> Any:
    """The one value at ``offset`` of the stream, once it is written. A stream that ends
    before it, or a ``timeout`` (seconds) passing first, raises :class:`StreamTimeoutError`.
    From a workflow's body the value (or the error) is a checkpoint
    (``DBOS.readStreamOffset``, as the ``dbos`` package records it)."""
    if ctx is not None and step_id is not None:
        done, value = recorded_read(ctx, step_id, READ_STREAM_OFFSET)
        if done:
            return value
    sysdb = peer.system_database
    route = functools.partial(bind_shard_keys, {workflow_id: shard_key})
    deadline = after(sysdb.clock, timeout) if timeout is not None else None
    with _stream_waiter(sysdb, workflow_id, key, route) as waiter:
        stored = await _stream_value(peer, waiter, workflow_id, key, offset, route,
                                     deadline, ctx)
    if stored is None or stored is TIMED_OUT:
        error = StreamTimeoutError(workflow_id, key, timeout or 0.0,
                                   ended_before=offset if stored is None else None)
        if ctx is None or step_id is None:
            raise error
        with ctx.routed():
            raise await record_failure(ctx, step_id, READ_STREAM_OFFSET, error) from error
    if ctx is None or step_id is None:
        return peer.formats.decode(stored.text, stored.serialization,
                                   f"stream {key!r} at offset {offset}")
    with ctx.routed():
        return await record_read(ctx, step_id, READ_STREAM_OFFSET, stored)


# ---- Sleep ----


async def sleep(clock: Clock, ctx: WorkflowContext | None, step_id: int | None,
                seconds: float) -> None:
    """Sleep ``seconds`` on ``clock`` (the caller's executor's), durably in a workflow."""
    if ctx is None or step_id is None:
        await clock.sleep_until(after(clock, seconds))
        return
    deadline = await durable_deadline(ctx, step_id, seconds, complete_at_deadline=True)
    if not ctx.replaying:  # a replay check waits for nothing
        with ctx.runtime.cancellation.region(ctx), ctx.runtime.workflows.parked():
            await clock.sleep_until(deadline)


# ---- Waiting for workflows ----


WAIT_FIRST = "DBOS.waitFirst"


def check_waited(handles: Sequence[WorkflowHandle[Any]], what: str) -> None:
    """Refuse an empty list of handles, or one naming a workflow twice."""
    if not handles:
        raise InvalidArgumentError(f"{what} handles", "needs at least one handle")
    refs = [WorkflowAddress(h.workflow_id, h.shard_key) for h in handles]
    repeated = [ref for ref, n in Counter(refs).items() if n > 1]
    if repeated:
        raise InvalidArgumentError(f"{what} handles",
                                   f"got workflow {repeated[0][0]!r} twice")


async def wait_first(peer: Peer, handles: Sequence[WorkflowHandle[Any]],
                     ctx: WorkflowContext | None = None,
                     step_id: int | None = None) -> WorkflowHandle[Any]:
    """The handle whose workflow finished first, by one query over all of them per wake:
    woken by the completion notifications of any of them (this process's and others'),
    reading again at most every ``result_poll_interval`` for writers that send none. From
    a workflow's body (``ctx``) the choice is a checkpoint (``DBOS.waitFirst``, the chosen
    workflow's ID, as the ``dbos`` package records it), so a replay returns the same
    handle whichever finished first since."""
    by_id: dict[str, WorkflowHandle[Any]] = {h.workflow_id: h for h in reversed(handles)}
    if ctx is not None and step_id is not None:
        done, chosen = recorded_read(ctx, step_id, WAIT_FIRST)
        if done:
            if str(chosen) not in by_id:
                raise DBOSError(f"Workflow {ctx.workflow_id!r} recorded at step {step_id} "
                                f"that wait_first chose {chosen!r}, which this call does "
                                "not wait for")
            return by_id[str(chosen)]
    sysdb = peer.system_database
    refs = [WorkflowAddress(h.workflow_id, h.shard_key) for h in handles]
    for workflow_id, key in refs:
        if sysdb.sharded and key is None:
            raise DBOSError(f"wait_first needs the shard key of workflow {workflow_id!r}: "
                            "this system database is sharded")
    by_ref = dict(zip(refs, handles, strict=True))
    dispatcher = _dispatcher(sysdb)
    cap = peer.config.result_poll_interval
    delay = min(0.05, cap)
    [first, *rest] = [(WORKFLOW_COMPLETION_CHANNEL, keyed(i, k)) for i, k in refs]
    with dispatcher.register(*first, also=rest) as waiter:
        while True:
            async with dispatcher.polling():
                finished, missing = await sysdb.finished_first(refs)
            if missing:
                raise NonExistentWorkflowError(", ".join(i for i, _ in missing))
            if finished is not None:
                break
            if ctx is None:
                await waiter.wait(delay)
            else:
                with ctx.runtime.cancellation.region(ctx):
                    await waiter.wait(delay)
            delay = min(delay * 2, cap)
    if ctx is None or step_id is None:
        return by_ref[finished]
    with ctx.routed():
        chosen = await record_read(ctx, step_id, WAIT_FIRST,
                                   ctx.runtime.formats.encode(finished[0], "a workflow ID"))
    return by_id[str(chosen)]


async def wait_all(handles: Sequence[WorkflowHandle[Any]]) -> list[Any]:
    """Every handle's result, in order, once all have finished; the error of the first
    handle (in the list's order) that failed, so a replay raises the same one."""
    outcomes = await asyncio.gather(*(handle.get_result() for handle in handles),
                                    return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return list(outcomes)
