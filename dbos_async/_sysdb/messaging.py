"""Messages, events and streams in the system database: sends (from outside a workflow, in
group commit; from a workflow, with its checkpoint; in batches over shard keys), recv's
consuming write, events and stream values, each under the writing workflow's fence.

The executor's side is :mod:`dbos_async._executor.messaging`; the statements are
:mod:`dbos_async._sysdb.statements.messaging`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, TypeVar

import asyncpg

from dbos_async._sysdb.notifications import NOTIFICATIONS_CHANNEL
from dbos_async._sysdb.records import StepRecord
from dbos_async._sysdb.shard_keys import (
    WorkflowAddress,
    bind_shard_keys,
    by_key,
    cleared_shard_keys,
)
from dbos_async._sysdb.statements import (
    PENDING,
    SEND_BULK,
    Consume,
    OutgoingMessage,
    Payload,
    Query,
)
from dbos_async._sysdb.writes.fenced import FencedWrites, Keyed
from dbos_async._sysdb.writes.group_commit import GroupCommit
from dbos_async._sysdb.writes.routed import Row
from dbos_async.errors import (
    NonExistentWorkflowError,
    WorkflowCancelledError,
    WorkflowConflictError,
)

T = TypeVar("T")

Received = tuple[bool, str | None, str | None]
"""What recv's consuming write found: (found, message, serialization)."""


async def _outcome_of(verdict: Awaitable[T]) -> T | BaseException:
    """A row's verdict in a group-commit batch: its value, or the error that is its alone
    (a fence), which the batch hands its caller rather than raising for every row."""
    try:
        return await verdict
    except (NonExistentWorkflowError, WorkflowCancelledError, WorkflowConflictError) as error:
        return error


class MessagingOperations(FencedWrites):
    """Every write and read of messages, events and streams."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Sends from outside workflows, in group commit (see group_commit) by lane (_lane).
        self._sends = GroupCommit[Keyed[OutgoingMessage], bool](self._write_sends)
        # recv's consuming writes of woken waiters, in group commit (unsharded only).
        self._consumes = GroupCommit[Consume, Received](self._write_consumes)

    async def close(self) -> None:
        await self._sends.aclose()
        await self._consumes.aclose()
        await super().close()

    async def send(self, destination_id: str, message_uuid: str, topic: str, message: Payload
                   ) -> None:
        """Send from outside a workflow; idempotent by ``message_uuid``. The sends made
        together go as one statement per key (group commit; on Citus, each alone): each
        caller continues once its message has committed, exactly as alone."""
        if self.routes_single_tables:
            query = self.sql.send_message(destination_id, message_uuid, topic, message)
            try:
                await self._execute(query, f"sending to {destination_id}")
            except asyncpg.ForeignKeyViolationError:
                raise NonExistentWorkflowError(destination_id) from None
            return
        key = self.sql.key_hint(destination_id)
        outgoing = OutgoingMessage(destination_id, message_uuid, topic, message.text, key,
                                   message.serialization)
        await self._sends.submit(await self._lane(key), (key, outgoing))

    async def _write_sends(self, lane: Hashable, rows: Sequence[Keyed[OutgoingMessage]]
                           ) -> list[bool | BaseException]:
        """One group-commit batch of sends from outside workflows, one statement per key. A
        key's statement that fails the foreign key (a destination is missing) wrote none of
        its rows: they go again one by one, so only a send to a missing workflow fails."""
        groups, statements = self._per_key(
            rows, lambda key, m: self.sql.send_messages([m], key),
            lambda key, group: self.sql.send_messages(group, key))
        found = await self._fetch_per_key(statements, f"sending {len(rows)} messages")
        verdicts: list[bool | BaseException] = [True] * len(rows)
        for indexes, key in groups:
            refused = found[key]
            if not isinstance(refused, Exception):
                continue
            for i in indexes:
                verdicts[i] = (await self._send_alone(rows[i][1])
                               if isinstance(refused, asyncpg.ForeignKeyViolationError)
                               else refused)
        return verdicts

    async def _send_alone(self, m: OutgoingMessage) -> bool | BaseException:
        """A send of a refused batch, on its own: True once written, or why not."""
        try:
            await self._execute(self.sql.send_messages([m], m.shard_key),
                                f"sending to {m.destination_id}")
        except asyncpg.ForeignKeyViolationError:
            return NonExistentWorkflowError(m.destination_id)
        except Exception as error:
            return error
        return True

    async def send_fenced(self, workflow_id: str, owner_xid: str, destination_id: str,
                          message_uuid: str, topic: str, message: Payload) -> None:
        if self.routes_single_tables:
            sent = self.sql.send_message(destination_id, message_uuid, topic, message)
            try:
                row = await self._send_fenced_routed(workflow_id, owner_xid, sent)
            except asyncpg.ForeignKeyViolationError:
                raise NonExistentWorkflowError(destination_id) from None
            self._check_fence(row, workflow_id)
            return
        query = self.sql.send_message_fenced(workflow_id, owner_xid, destination_id,
                                             message_uuid, topic, message)
        row = await self._fetchrow_fk(query, f"sending to {destination_id}", destination_id)
        self._check_fence(row, workflow_id)

    async def send_recorded(self, workflow_id: str, function_id: int, owner_xid: str,
                            destination_id: str, message_uuid: str, topic: str, message: Payload
                            ) -> StepRecord | None:
        if self.routes_single_tables:
            return await self.send_recorded_across(
                WorkflowAddress(workflow_id, self.sql.key_hint(workflow_id)), function_id,
                owner_xid, WorkflowAddress(destination_id, self.sql.key_hint(destination_id)),
                message_uuid, topic, message)
        query = self.sql.send_message_recorded(workflow_id, function_id, owner_xid,
                                               destination_id, message_uuid, topic, message,
                                               self.clock.now_ms())
        row = await self._fetchrow_fk(query, f"sending to {destination_id}", destination_id)
        return await self._recorded_or_existing(row, workflow_id, function_id, "DBOS.send")

    async def send_recorded_across(self, sender: WorkflowAddress, function_id: int,
                                   owner_xid: str, destination: WorkflowAddress,
                                   message_uuid: str, topic: str, message: Payload
                                   ) -> StepRecord | None:
        """A workflow's send to a workflow under another shard key: the sender's checkpoint
        and the message, one statement per key, in one transaction, so the message lands
        only with the checkpoint. Each statement is built under its own key alone: the
        destination may have the sender's ID."""
        now = self.clock.now_ms()
        with sender.routed():
            checkpoint = self.sql.record_step(sender.workflow_id, function_id, "DBOS.send",
                                              owner_xid, None, None, now, now)
        with destination.routed():
            sent = self.sql.send_message(destination.workflow_id, message_uuid, topic, message)

        async def attempt() -> bool:
            async with self.locking_transaction() as conn:
                if await conn.fetchrow(checkpoint.sql, *checkpoint.params) is None:
                    return False  # nothing to send: not ours, or sent already
                await conn.execute(sent.sql, *sent.params)
                return True

        what = f"sending to {destination.workflow_id}"
        try:
            if await self._retried(what, attempt):
                return None
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(destination.workflow_id) from None
        with sender.routed():
            verdict = await self._fetchrow(
                self.sql.fence_verdict(sender.workflow_id, owner_xid), what)
            return await self._recorded_or_existing(verdict, sender.workflow_id, function_id,
                                                    "DBOS.send")

    async def send_many(self, messages: Sequence[OutgoingMessage], *,
                        sender: WorkflowAddress | None = None, owner_xid: str | None = None,
                        function_id: int | None = None,
                        function_name: str = SEND_BULK) -> StepRecord | None:
        """Insert a batch of messages: one statement per shard key (one in all, unsharded),
        in one transaction, so the batch lands whole or not at all. From a workflow
        (``sender`` with ``function_id``) the statement of the sender's key also records
        its checkpoint and the other keys' messages are written only if it landed; from a
        step (``sender`` without ``function_id``) they land only while its execution owns
        the workflow. Returns the checkpoint a replay found already recorded. A missing
        destination raises :class:`NonExistentWorkflowError` naming every missing one."""
        groups = by_key((m.shard_key, m) for m in messages)
        attempt: Callable[[], Awaitable[Row | None]] = (
            self._send_many_routed(groups, sender, owner_xid, function_id, self.clock.now_ms(),
                                   function_name)
            if self.routes_single_tables
            else self._send_many_attempt(groups, sender, owner_xid, function_id,
                                         function_name))

        destinations = sorted({m.destination_id for m in messages})
        what = f"sending to {', '.join(destinations)}"
        try:
            verdict = await self._retried(what, attempt)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(await self._missing(messages)) from None
        if sender is None:
            return None
        with sender.routed():
            if function_id is None:
                self._check_fence(verdict, sender.workflow_id)
                return None
            return await self._recorded_or_existing(verdict, sender.workflow_id,
                                                    function_id, function_name)

    def _send_many_attempt(self, groups: dict[str | None, list[OutgoingMessage]],
                           sender: WorkflowAddress | None, owner_xid: str | None,
                           function_id: int | None, function_name: str
                           ) -> Callable[[], Awaitable[asyncpg.Record | None]]:
        """:meth:`send_many`'s attempt: one statement per key, the sender's key's fenced
        (and, from a workflow, recording the checkpoint)."""
        head: Query | None = None
        if sender is not None:
            own = groups.pop(sender.shard_key, [])
            assert owner_xid is not None
            with sender.routed():
                head = (self.sql.send_messages_recorded(sender.workflow_id, function_id,
                                                        owner_xid, own, self.clock.now_ms(),
                                                        function_name)
                        if function_id is not None
                        else self.sql.send_messages_fenced(sender.workflow_id, owner_xid, own))
        rest = [self.sql.send_messages(batch, key) for key, batch in groups.items()]

        async def attempt() -> asyncpg.Record | None:
            alone = [head] if head is not None else []
            if len(alone) + len(rest) == 1:  # one key: one autocommit statement
                q = (alone or rest)[0]
                return await self.pool.fetchrow(q.sql, *q.params)
            async with self.locking_transaction() as conn:
                verdict = await conn.fetchrow(head.sql, *head.params) if head else None
                if verdict is not None and not (
                        verdict["status"] == PENDING and verdict["owned"]
                        and (function_id is None or verdict["inserted"])):
                    return verdict  # not ours, or sent already: nothing more to write
                for q in rest:
                    await conn.execute(q.sql, *q.params)
                return verdict

        return attempt

    async def send_many_on(self, conn: asyncpg.Connection,
                           messages: Sequence[OutgoingMessage]) -> None:
        """Insert a batch of messages on the caller's connection, inside the transaction it
        holds (see :meth:`send_on`): one statement per shard key; on a sharded schema the
        receivers' notifications are queued in that transaction too."""
        groups = by_key((m.shard_key, m) for m in messages)
        try:
            batches = (self._message_batches(groups) if self.routes_single_tables
                       else [self.sql.send_messages(batch, key) for key, batch in groups.items()])
            for q in batches:
                await conn.execute(q.sql, *q.params)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(await self._missing(messages)) from None
        if self.sharded:
            for m in messages:
                with WorkflowAddress(m.destination_id, m.shard_key).routed():
                    q = self.sql.notify_with_transaction(
                        NOTIFICATIONS_CHANNEL, self.waiter_key(m.destination_id, m.topic))
                await conn.execute(q.sql, *q.params)

    async def _missing(self, messages: Sequence[OutgoingMessage]) -> str:
        """The destinations of these messages that do not exist, for the error."""
        missing: list[str] = []
        for key, listed in by_key((m.shard_key, m.destination_id) for m in messages).items():
            ids = set(listed)
            with cleared_shard_keys(), bind_shard_keys(dict.fromkeys(ids, key)):
                found = {r["workflow_uuid"] for r in await self._fetch(
                    self.sql.existing(sorted(ids)), "reading destinations")}
            missing += sorted(ids - found)
        return ", ".join(missing)

    @property
    def consumes_in_batches(self) -> bool:
        """Whether recv's consuming writes are group-committed (on an unsharded schema):
        then the reads of many woken waiters are a few statements, not one each."""
        return not self.sharded

    async def consume_message(self, workflow_id: str, function_id: int, owner_xid: str,
                              topic: str) -> Received:
        """recv's consuming write: (found, message, serialization); found is False if none.
        On an unsharded schema it joins the others of its turn of the event loop (or of
        the round trip before) in one statement."""
        if self.consumes_in_batches:
            return await self._consumes.submit(
                None, Consume(workflow_id, function_id, owner_xid, topic))
        return await self._consume_one(Consume(workflow_id, function_id, owner_xid, topic))

    async def _write_consumes(self, _lane: Hashable, rows: Sequence[Consume]
                              ) -> list[Received | BaseException]:
        """One group-commit batch of recv's consuming writes, each judged on its own. A
        batch naming a workflow twice (two readers of one workflow, as a retry can make)
        goes row by row: one statement would hand both the same message."""
        if len(rows) == 1 or len({r.workflow_id for r in rows}) < len(rows):
            return [await _outcome_of(self._consume_one(r)) for r in rows]
        found = await self._fetch(self.sql.consume_messages(rows, self.clock.now_ms()),
                                  f"receiving for {len(rows)} workflows")
        return [await _outcome_of(self._received(r, row if row["status"] is not None
                                                 else None))
                for r, row in zip(rows, found, strict=True)]

    async def _consume_one(self, c: Consume) -> Received:
        row: Row | None
        workflow_id, function_id, owner_xid, topic = (c.workflow_id, c.function_id,
                                                      c.owner_xid, c.topic)
        if self.routes_single_tables:
            row = await self._consume_message_routed(workflow_id, function_id, owner_xid,
                                                     topic, self.clock.now_ms())
        else:
            query = self.sql.consume_message(workflow_id, function_id, owner_xid, topic,
                                             self.clock.now_ms())
            row = await self._fetchrow(query, f"receiving for {workflow_id}")
        return await self._received(c, row)

    async def _received(self, c: Consume, row: Row | None) -> Received:
        """What a consuming write's row (None: no such workflow) says recv received."""
        self._check_fence(row, c.workflow_id)
        assert row is not None
        if row["inserted"]:
            return True, row["message"], row["serialization"]
        if row["recorded"]:
            record = await self._existing_step(c.workflow_id, c.function_id, "DBOS.recv")
            if record is not None:
                return True, record.output, record.serialization
        return False, None, None

    async def set_event_recorded(self, workflow_id: str, function_id: int, owner_xid: str,
                                 key: str, value: Payload) -> StepRecord | None:
        row: Row | None
        if self.routes_single_tables:
            row = await self._set_event_routed(workflow_id, owner_xid, key, value,
                                               function_id, self.clock.now_ms())
        else:
            query = self.sql.set_event_recorded(workflow_id, function_id, owner_xid, key,
                                                value, self.clock.now_ms())
            row = await self._fetchrow(query, f"setting event {key!r} of {workflow_id}")
        return await self._recorded_or_existing(row, workflow_id, function_id, "DBOS.setEvent")

    async def set_event_fenced(self, workflow_id: str, owner_xid: str, key: str, value: Payload
                               ) -> None:
        if self.routes_single_tables:
            self._check_fence(await self._set_event_routed(workflow_id, owner_xid, key, value,
                                                           None, self.clock.now_ms()), workflow_id)
            return
        query = self.sql.set_event_fenced(workflow_id, owner_xid, key, value)
        self._check_fence(await self._fetchrow(query, f"setting event {key!r}"), workflow_id)

    async def get_event(self, workflow_id: str, key: str) -> tuple[str, str | None] | None:
        row = await self._fetchrow(self.sql.get_event(workflow_id, key), "reading an event")
        return (row["value"], row["serialization"]) if row is not None else None

    async def get_all_events(self, workflow_id: str) -> list[tuple[str, str, str | None]]:
        rows = await self._fetch(self.sql.get_all_events(workflow_id), "reading events")
        return [(row["key"], row["value"], row["serialization"]) for row in rows]

    async def _write_stream(self, workflow_id: str, owner_xid: str, key: str, value: Payload,
                            function_id: int, function_name: str | None) -> Row | None:
        """A stream write; with ``function_name``, the workflow's own, recorded."""
        if self.routes_single_tables:
            at = self.clock.now_ms()

            def write() -> Awaitable[Row | None]:
                return self._write_stream_routed(workflow_id, owner_xid, key, value,
                                                 function_id, function_name, at)
        else:
            query = (self.sql.write_stream_recorded(workflow_id, function_id, function_name,
                                                    owner_xid, key, value, self.clock.now_ms())
                     if function_name is not None else
                     self.sql.write_stream_fenced(workflow_id, owner_xid, key, value,
                                                  function_id))

            def write() -> Awaitable[Row | None]:
                return self._fetchrow(query, f"writing stream {key!r} of {workflow_id}")
        # Two writers can derive the same next offset; the loser fails the primary key (the
        # whole statement rolls back) and simply runs again.
        for _ in range(100):
            try:
                return await write()
            except asyncpg.UniqueViolationError:
                await asyncio.sleep(0)
        raise RuntimeError(f"Could not append to stream {key!r} of {workflow_id}")

    async def write_stream_recorded(self, workflow_id: str, function_id: int,
                                    function_name: str, owner_xid: str, key: str, value: Payload
                                    ) -> StepRecord | None:
        row = await self._write_stream(workflow_id, owner_xid, key, value, function_id,
                                       function_name)
        return await self._recorded_or_existing(row, workflow_id, function_id, function_name)

    async def write_stream_fenced(self, workflow_id: str, owner_xid: str, key: str, value: Payload,
                                  function_id: int = 0) -> None:
        self._check_fence(await self._write_stream(workflow_id, owner_xid, key, value,
                                                   function_id, None), workflow_id)

    async def read_stream_value(self, workflow_id: str, key: str, offset: int
                                ) -> tuple[str | None, str | None, str | None, bool]:
        """(writer status or None if no workflow, value, serialization, whether found)."""
        row = await self._fetchrow(self.sql.read_stream_value(workflow_id, key, offset),
                                   "reading a stream")
        if row is None:
            return None, None, None, False
        found = row["stream_offset"] is not None
        return row["status"], row["value"], row["serialization"], found
