"""Statements of messages, events and streams (see dbos_async/_sysdb/notifications.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dbos_async._sysdb.statements.base import (
    ACTIVE_STATUSES,
    PENDING,
    PORTABLE_JSON,
    Params,
    Payload,
    Query,
    StatementBase,
    WorkflowAddress,
    Writes,
)

SEND_BULK = "DBOS.send_bulk"
"""The checkpoint name of a workflow's batch send (the `dbos` package's)."""

# The order recv consumes a workflow's messages in: created_at has millisecond resolution;
# within one millisecond the inserting transaction's ID keeps one sender's messages in the
# order it sent them.
MESSAGE_ORDER = "n.created_at_epoch_ms, n.xmin::text::bigint, n.message_uuid"


@dataclass(frozen=True)
class OutgoingMessage:
    """A message of a batch send, addressed: its destination (with its shard key), the
    stored topic and the message ID that makes it idempotent."""

    destination_id: str
    message_uuid: str
    topic: str
    message: str
    shard_key: str | None = None
    # The format of ``message`` (the serialization column beside it).
    serialization: str = PORTABLE_JSON


@dataclass(frozen=True)
class Consume:
    """A recv's consuming write: the waiting workflow (under its owner token), its step and
    the stored topic it waits on."""

    workflow_id: str
    function_id: int
    owner_xid: str
    topic: str


class MessagingStatements(StatementBase):
    def _insert_message(
        self, destination_id: str, message_uuid: str, topic: str, message: Payload,
        source: str | None, p: Params,
    ) -> str:
        """A message insert; a repeated message_uuid is ignored. The trigger on
        notifications NOTIFYs dbos_notifications_channel; a missing destination fails the
        foreign key (23503)."""
        values = self._key_values(destination_id, p)
        values.update({
            "message_uuid": p(message_uuid, "text"),
            "destination_uuid": p(destination_id, "text"),
            "topic": p(topic, "text"),
            "message": p(message.text, "text"),
            "serialization": p(message.serialization, "text"),
        })
        return self._insert_select("notifications", values, source,
                                   f"ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING")

    def send_message(
        self, destination_id: str, message_uuid: str, topic: str, message: Payload
    ) -> Query:
        """A message from outside a workflow."""
        p = Params()
        return Query(self._insert_message(destination_id, message_uuid, topic, message, None, p),
                     p.values)

    def send_message_fenced(
        self, workflow_id: str, owner_xid: str, destination_id: str, message_uuid: str,
        topic: str, message: Payload,
    ) -> Query:
        """A message from a step of ``workflow_id``: only while the caller owns it."""
        p = Params()
        return self._fenced_write(workflow_id, owner_xid, p, self._message_writes(
            destination_id, message_uuid, topic, message, p))

    def send_message_recorded(
        self, workflow_id: str, function_id: int, owner_xid: str, destination_id: str,
        message_uuid: str, topic: str, message: Payload, now_ms: int,
    ) -> Query:
        """A workflow's send: its checkpoint and the message, in one fenced statement."""
        p = Params()
        return self._recorded_write(
            workflow_id, function_id, "DBOS.send", owner_xid, now_ms, p,
            self._message_writes(destination_id, message_uuid, topic, message, p))

    def _message_writes(self, destination_id: str, message_uuid: str, topic: str,
                        message: Payload, p: Params) -> Writes:
        return lambda source: [("sent", self._insert_message(
            destination_id, message_uuid, topic, message, source, p))]

    def _insert_messages(self, messages: Sequence[OutgoingMessage], key: WorkflowAddress,
                         source: str | None, p: Params) -> str:
        """One insert of a batch of messages to workflows of one shard key (``key``: a
        workflow of that key and the key), their columns as arrays, so the statement's size
        does not grow with the batch; with ``source`` the rows land only if it has a row.
        Repeated message IDs are ignored; a missing destination fails the foreign key."""
        keys = {col: p(val, "text") for col, val in self.wf_values(*key).items()}
        arrays = ", ".join(p([getattr(m, f) for m in messages], "text[]")
                           for f in ("message_uuid", "destination_id", "topic", "message",
                                     "serialization"))
        columns = {**keys, "message_uuid": "m.message_uuid",
                   "destination_uuid": "m.destination_uuid", "topic": "m.topic",
                   "message": "m.message", "serialization": "m.serialization"}
        joined = f" CROSS JOIN {source}" if source is not None else ""
        return f"""INSERT INTO {self.table('notifications')} ({', '.join(columns)})
                  SELECT {', '.join(columns.values())}
                  FROM unnest({arrays})
                    AS m(message_uuid, destination_uuid, topic, message, serialization)
                  {joined}
                  ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING"""

    def send_messages(self, messages: Sequence[OutgoingMessage],
                      shard_key: str | None) -> Query:
        """A batch of messages from outside a workflow, to workflows of one key."""
        p = Params()
        return Query(self._insert_messages(
            messages, WorkflowAddress(messages[0].destination_id, shard_key), None, p), p.values)

    def send_messages_fenced(self, workflow_id: str, owner_xid: str,
                             messages: Sequence[OutgoingMessage]) -> Query:
        """A batch from a step of ``workflow_id``, to workflows of its key: only while the
        caller owns it."""
        p = Params()
        key = WorkflowAddress(workflow_id, self.key_hint(workflow_id))
        return self._fenced_write(workflow_id, owner_xid, p, lambda source: [
            ("sent", self._insert_messages(messages, key, source, p))])

    def send_messages_recorded(self, workflow_id: str, function_id: int, owner_xid: str,
                               messages: Sequence[OutgoingMessage], now_ms: int,
                               function_name: str = SEND_BULK) -> Query:
        """A workflow's batch send: its checkpoint (``function_name``: a batch, or one
        send delivered to forks too) and the messages to workflows of its own key, in one
        fenced statement."""
        p = Params()
        key = WorkflowAddress(workflow_id, self.key_hint(workflow_id))
        return self._recorded_write(
            workflow_id, function_id, function_name, owner_xid, now_ms, p,
            lambda source: [("sent", self._insert_messages(messages, key, source, p))])

    def consume_message(
        self, workflow_id: str, function_id: int, owner_xid: str, topic: str, now_ms: int
    ) -> Query:
        """recv: consume the oldest unconsumed message and record it as the step's output.

        One fenced statement: the status row lock fences ownership; the message row is
        locked FOR UPDATE SKIP LOCKED (a concurrent consumer takes the next one); nothing is
        consumed if the step is already recorded. ``message`` is NULL if none was waiting.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        dest = self.wf("n", workflow_id, p, "destination_uuid")
        topic_ref = p(topic)
        fid = p(function_id, "integer")
        step = self._step_cte(workflow_id, function_id, "DBOS.recv", owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms,
                              output_sql="consumed.message",
                              serialization_sql="consumed.serialization", source="consumed")
        return Query(
            f"""WITH {owner}, msg AS (
                  -- Lock the oldest waiting message; SKIP LOCKED passes one being consumed.
                  SELECT n.message_uuid FROM {self.table('notifications')} n
                  WHERE {dest} AND n.topic = {topic_ref} AND n.consumed = false
                    AND EXISTS (SELECT 1 FROM owner WHERE {self._owned(owner_xid, p)})
                    AND NOT EXISTS (
                      SELECT 1 FROM {self.table('operation_outputs')} oo
                      WHERE {self.wf('oo', workflow_id, p)} AND oo.function_id = {fid})
                  ORDER BY {MESSAGE_ORDER}
                  LIMIT 1
                  FOR UPDATE SKIP LOCKED
                ), consumed AS (
                  UPDATE {self.table('notifications')} n
                  SET consumed = true, consumed_by_function_id = {fid}
                  FROM msg WHERE n.message_uuid = msg.message_uuid
                    AND {self.wf('n', workflow_id, p, 'destination_uuid')}
                  RETURNING n.message, n.serialization
                ), {step}
                SELECT owner.status, owner.owner_xid IS NOT DISTINCT FROM {p(owner_xid)} AS owned,
                       (SELECT message FROM consumed) AS message,
                       (SELECT serialization FROM consumed) AS serialization,
                       EXISTS (SELECT 1 FROM step) AS inserted,
                       -- Already recorded (a retry whose first reply was lost).
                       EXISTS (SELECT 1 FROM {self.table('operation_outputs')} oo
                               WHERE {self.wf('oo', workflow_id, p)}
                                 AND oo.function_id = {fid}) AS recorded
                FROM owner""",
            p.values,
        )

    def consume_messages(self, rows: Sequence[Consume], now_ms: int) -> Query:
        """:meth:`consume_message` for many waiting workflows, each named once, in one
        statement (unsharded schema only): one row per given row, in order, with the same
        columns, and the status NULL for a workflow that does not exist.

        The status rows are locked FOR NO KEY UPDATE in ID order (no hand-off commits
        between the check and the writes; batches locking several cannot deadlock one
        another); each workflow's oldest waiting message is locked FOR UPDATE SKIP LOCKED
        (a concurrent consumer takes the next one), only while the workflow is owned and
        its step not yet recorded."""
        p = Params()
        ids = p([r.workflow_id for r in rows], "text[]")
        arrays = ", ".join([ids, p([r.function_id for r in rows], "integer[]"),
                            p([r.owner_xid for r in rows], "text[]"),
                            p([r.topic for r in rows], "text[]")])
        recorded = f"""EXISTS (SELECT 1 FROM {self.table('operation_outputs')} oo
                               WHERE oo.workflow_uuid = waiting.workflow_uuid
                                 AND oo.function_id = waiting.function_id)"""
        at = p(now_ms, "bigint")
        return Query(
            f"""WITH waiting AS (
                  SELECT * FROM unnest({arrays})
                    WITH ORDINALITY
                    AS waiting(workflow_uuid, function_id, owner_xid, topic, ord)
                ), owner AS (
                  SELECT ws.workflow_uuid, ws.status, ws.owner_xid
                  FROM {self.table('workflow_status')} ws
                  WHERE ws.workflow_uuid = ANY({ids})
                  ORDER BY ws.workflow_uuid
                  FOR NO KEY UPDATE
                ), msg AS (
                  SELECT waiting.ord, waiting.function_id, m.message_uuid
                  FROM waiting JOIN owner ON owner.workflow_uuid = waiting.workflow_uuid
                                   AND owner.status = {p(PENDING)}
                                   AND owner.owner_xid = waiting.owner_xid
                  CROSS JOIN LATERAL (
                    SELECT n.message_uuid FROM {self.table('notifications')} n
                    WHERE n.destination_uuid = waiting.workflow_uuid
                      AND n.topic = waiting.topic
                      AND n.consumed = false AND NOT {recorded}
                    ORDER BY {MESSAGE_ORDER}
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED
                  ) m
                ), consumed AS (
                  UPDATE {self.table('notifications')} n
                  SET consumed = true, consumed_by_function_id = msg.function_id
                  FROM msg WHERE n.message_uuid = msg.message_uuid
                  RETURNING msg.ord, n.message, n.serialization
                ), step AS (
                  INSERT INTO {self.table('operation_outputs')} (workflow_uuid, function_id,
                      function_name, output, started_at_epoch_ms, completed_at_epoch_ms,
                      serialization, application_name)
                  SELECT waiting.workflow_uuid, waiting.function_id, 'DBOS.recv',
                         consumed.message,
                         {at}, {at}, consumed.serialization, {p(self.app_name, 'text')}
                  FROM consumed JOIN waiting ON waiting.ord = consumed.ord
                  {self._checkpoint_conflict()}
                  RETURNING workflow_uuid, function_id
                )
                SELECT owner.status,
                       owner.owner_xid IS NOT DISTINCT FROM waiting.owner_xid AS owned,
                       consumed.message, consumed.serialization,
                       step.workflow_uuid IS NOT NULL AS inserted,
                       -- Already recorded (a retry whose first reply was lost).
                       {recorded} AS recorded
                FROM waiting
                LEFT JOIN owner ON owner.workflow_uuid = waiting.workflow_uuid
                LEFT JOIN consumed ON consumed.ord = waiting.ord
                LEFT JOIN step ON step.workflow_uuid = waiting.workflow_uuid
                              AND step.function_id = waiting.function_id
                ORDER BY waiting.ord""",
            p.values,
        )

    def _event_writes(
        self, workflow_id: str, key: str, value: Payload, function_id: int | None,
        source: str | None,
        p: Params,
    ) -> list[tuple[str, str]]:
        """The event's latest value and, for a workflow's own set_event (``function_id``),
        its history row; each replaces what an earlier write to the same place left. No
        ``source``: rows of VALUES, for a transaction that checked the fence itself."""
        replace = "DO UPDATE SET value = EXCLUDED.value, serialization = EXCLUDED.serialization"
        latest = self._key_values(workflow_id, p)
        latest.update({"workflow_uuid": p(workflow_id, "text"), "key": p(key, "text"),
                       "value": p(value.text, "text"),
                       "serialization": p(value.serialization, "text")})
        writes = [("event", self._insert_select(
            "workflow_events", latest, source,
            f"ON CONFLICT ({self.key_conflict('workflow_uuid', 'key')}) {replace}"))]
        if function_id is not None:
            history = {**latest, "function_id": p(function_id, "integer")}
            writes.append(("history", self._insert_select(
                "workflow_events_history", history, source,
                f"ON CONFLICT ({self.key_conflict('workflow_uuid', 'function_id', 'key')})"
                f" {replace}")))
        return writes

    def set_event_recorded(
        self, workflow_id: str, function_id: int, owner_xid: str, key: str, value: Payload,
        now_ms: int,
    ) -> Query:
        """A workflow's set_event: checkpoint, latest value and history row, one statement."""
        p = Params()
        return self._recorded_write(
            workflow_id, function_id, "DBOS.setEvent", owner_xid, now_ms, p,
            lambda source: self._event_writes(workflow_id, key, value, function_id, source, p))

    def set_event_fenced(self, workflow_id: str, owner_xid: str, key: str,
                         value: Payload) -> Query:
        """set_event from a step: the latest value, written only while the caller owns it."""
        p = Params()
        return self._fenced_write(
            workflow_id, owner_xid, p,
            lambda source: self._event_writes(workflow_id, key, value, None, source, p))

    def get_event(self, workflow_id: str, key: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT value, serialization FROM {self.table('workflow_events')}
                WHERE {self.wf(None, workflow_id, p)} AND key = {p(key)}""",
            p.values,
        )

    def get_all_events(self, workflow_id: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT key, value, serialization FROM {self.table('workflow_events')}
                WHERE {self.wf(None, workflow_id, p)} ORDER BY key""",
            p.values,
        )

    def _next_offset(self, workflow_id: str, key_ref: str, p: Params) -> str:
        """The offset after the last value of a stream (0 for a new one)."""
        return f"""COALESCE((SELECT max(s."offset") FROM {self.table('streams')} s
                             WHERE {self.wf('s', workflow_id, p)} AND s.key = {key_ref}),
                            -1) + 1"""

    def next_stream_offset(self, workflow_id: str, key: str) -> Query:
        """The offset a stream's next value takes, read before an INSERT ... VALUES of it
        (Citus refuses a subquery in VALUES). The caller holds the workflow's status row
        lock, which every writer of its streams takes first, so the offset stays free."""
        p = Params()
        return Query(f"SELECT {self._next_offset(workflow_id, p(key, 'text'), p)} AS next_offset",
                     p.values)

    def _stream_write(
        self, workflow_id: str, key: str, value: Payload, function_id: int,
        source: str | None, p: Params, offset: int | None = None,
    ) -> list[tuple[str, str]]:
        """The stream's next value; with ``offset`` (read by :meth:`next_stream_offset`)
        at that offset, else at the one derived in the insert."""
        key_ref = p(key, "text")
        values = self._key_values(workflow_id, p)
        values.update({
            "workflow_uuid": p(workflow_id, "text"),
            "key": key_ref,
            "value": p(value.text, "text"),
            # The next offset, derived in the insert; a concurrent writer that took the same
            # one fails the primary key and the caller retries.
            '"offset"': (p(offset, "integer") if offset is not None
                         else self._next_offset(workflow_id, key_ref, p)),
            "function_id": p(function_id, "integer"),
            "serialization": p(value.serialization, "text"),
        })
        return [("written", self._insert_select("streams", values, source))]

    def write_stream_recorded(
        self, workflow_id: str, function_id: int, function_name: str, owner_xid: str,
        key: str, value: Payload, now_ms: int,
    ) -> Query:
        """A workflow's stream write (or close): checkpoint and value, in one fenced statement."""
        p = Params()
        return self._recorded_write(
            workflow_id, function_id, function_name, owner_xid, now_ms, p,
            lambda source: self._stream_write(workflow_id, key, value, function_id, source, p))

    def write_stream_fenced(
        self, workflow_id: str, owner_xid: str, key: str, value: Payload, function_id: int
    ) -> Query:
        """A stream write from a step: only while the caller owns the workflow; not recorded."""
        p = Params()
        return self._fenced_write(
            workflow_id, owner_xid, p,
            lambda source: self._stream_write(workflow_id, key, value, function_id, source, p))

    def read_stream_value(self, workflow_id: str, key: str, offset: int) -> Query:
        """The value at ``offset`` and the writer's status, in one primary-key lookup.

        No row: no such workflow. A NULL ``stream_offset``: nothing at that offset yet.
        """
        p = Params()
        return Query(
            f"""SELECT ws.status, s.value, s.serialization, s."offset" AS stream_offset
                FROM {self.table('workflow_status')} ws
                LEFT JOIN {self.table('streams')} s
                  ON {self.wf_join('s', 'ws')} AND s.key = {p(key)}
                     AND s."offset" = {p(offset, 'integer')}
                WHERE {self.wf('ws', workflow_id, p)}""",
            p.values,
        )

    def finished_first(self, refs: Sequence[WorkflowAddress]) -> Query:
        """Which of these workflows exist, the finished ones first in the order they
        finished (what ``wait_first`` reads on every wake, in one query)."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid{self.key_columns()},
                       status <> ALL({p(list(ACTIVE_STATUSES), 'text[]')}) AS finished
                FROM {self.table('workflow_status')}
                WHERE {self.among(None, refs, p)}
                ORDER BY finished DESC, completed_at NULLS LAST, updated_at""",
            p.values,
        )

    def forks_of(self, refs: Sequence[WorkflowAddress]) -> Query:
        """The workflows forked directly from these (one level of a ``send_to_forks``
        walk; a fork lives under its original's key). A plain read, no lock: a fork
        created after it is not among the recipients, as in the ``dbos`` package."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid, forked_from{self.key_columns()}
                FROM {self.table('workflow_status')}
                WHERE {self.among(None, refs, p, column='forked_from')}""",
            p.values,
        )

    def notify_with_transaction(self, channel: str, payload: str) -> Query:
        """A notification queued in the caller's transaction: PostgreSQL delivers it at
        commit and drops it on rollback (the transactional outbox's wake-up)."""
        p = Params()
        return Query(f"SELECT pg_notify({p(channel, 'text')}, {p(payload, 'text')})", p.values)
