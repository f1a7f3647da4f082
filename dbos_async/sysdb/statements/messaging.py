"""Statements of messages, events and streams (see dbos_async/sysdb/notifications.py)."""

from __future__ import annotations

from collections.abc import Sequence

from dbos_async.sysdb.statements.base import (
    ACTIVE_STATUSES,
    PORTABLE_JSON,
    Params,
    Query,
    StatementBase,
)


class MessagingStatements(StatementBase):
    def _notification_values(
        self, destination_id: str, message_uuid: str, topic: str, message: str, p: Params
    ) -> dict[str, str]:
        values = {col: p(val, 'text') for col, val in self.wf_values(destination_id).items()}
        values.update({
            "message_uuid": p(message_uuid, "text"),
            "destination_uuid": p(destination_id, "text"),
            "topic": p(topic, "text"),
            "message": p(message, "text"),
            "serialization": p(PORTABLE_JSON, "text"),
        })
        return values

    def send_message(
        self, destination_id: str, message_uuid: str, topic: str, message: str
    ) -> Query:
        """Insert a message (from outside a workflow); a repeated message_uuid is ignored.

        The trigger on notifications NOTIFYs dbos_notifications_channel. A missing
        destination fails the foreign key (23503).
        """
        p = Params()
        values = self._notification_values(destination_id, message_uuid, topic, message, p)
        return Query(
            f"""INSERT INTO {self.table('notifications')} ({', '.join(values)})
                VALUES ({', '.join(values.values())})
                ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING""",
            p.values,
        )

    def send_message_fenced(
        self, workflow_id: str, owner_xid: str, destination_id: str, message_uuid: str,
        topic: str, message: str,
    ) -> Query:
        """Insert a message from a step of ``workflow_id``: only while the caller owns it.

        Not a checkpoint (the step's own checkpoint covers it); the status row lock fences
        the insert against a hand-off of the sending workflow.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        values = self._notification_values(destination_id, message_uuid, topic, message, p)
        return Query(
            f"""WITH {owner}, sent AS (
                  INSERT INTO {self.table('notifications')} ({', '.join(values)})
                  SELECT {', '.join(values.values())}
                  FROM owner WHERE {self._owned(owner_xid, p)}
                  ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING
                  RETURNING 1
                )
                {self._verdict(owner_xid, 'sent', p)}""",
            p.values,
        )

    def send_message_recorded(
        self, workflow_id: str, function_id: int, owner_xid: str, destination_id: str,
        message_uuid: str, topic: str, message: str, now_ms: int,
    ) -> Query:
        """A workflow's send: its checkpoint and the message, in one fenced statement.

        The message is inserted only if the checkpoint was (it selects from the step's
        RETURNING), so a retried or replayed send never delivers twice.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, "DBOS.send", owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms)
        values = self._notification_values(destination_id, message_uuid, topic, message, p)
        return Query(
            f"""WITH {owner}, {step}, sent AS (
                  INSERT INTO {self.table('notifications')} ({', '.join(values)})
                  SELECT {', '.join(values.values())} FROM step
                  ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING
                  RETURNING 1
                )
                {self._verdict(owner_xid, 'step', p)}""",
            p.values,
        )

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
                              output_sql="consumed.message", source="consumed")
        return Query(
            f"""WITH {owner}, msg AS (
                  -- Lock the oldest waiting message; SKIP LOCKED passes one being consumed.
                  SELECT n.message_uuid FROM {self.table('notifications')} n
                  WHERE {dest} AND n.topic = {topic_ref} AND n.consumed = false
                    AND EXISTS (SELECT 1 FROM owner WHERE {self._owned(owner_xid, p)})
                    AND NOT EXISTS (
                      SELECT 1 FROM {self.table('operation_outputs')} oo
                      WHERE {self.wf('oo', workflow_id, p)} AND oo.function_id = {fid})
                  -- created_at has millisecond resolution; within one millisecond the inserting
                  -- transaction's ID keeps one sender's messages in the order it sent them.
                  ORDER BY n.created_at_epoch_ms, n.xmin::text::bigint, n.message_uuid
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

    def _event_ctes(
        self, workflow_id: str, key: str, value: str, function_id: int | None, source: str,
        p: Params,
    ) -> str:
        keys = {col: p(val, 'text') for col, val in self.wf_values(workflow_id).items()}
        event = {**keys, "workflow_uuid": p(workflow_id, "text"), "key": p(key, "text"),
                 "value": p(value, "text"), "serialization": p(PORTABLE_JSON, "text")}
        ctes = [
            f"""event AS (
                  INSERT INTO {self.table('workflow_events')} ({', '.join(event)})
                  SELECT {', '.join(event.values())} FROM {source}
                  ON CONFLICT ({self.key_conflict('workflow_uuid', 'key')})
                    DO UPDATE SET value = EXCLUDED.value, serialization = EXCLUDED.serialization
                  RETURNING 1
                )"""
        ]
        if function_id is not None:
            history = {**keys, "workflow_uuid": p(workflow_id, "text"),
                       "function_id": p(function_id, "integer"), "key": p(key, "text"),
                       "value": p(value, "text"), "serialization": p(PORTABLE_JSON, "text")}
            ctes.append(
                f"""history AS (
                  INSERT INTO {self.table('workflow_events_history')} ({', '.join(history)})
                  SELECT {', '.join(history.values())} FROM {source}
                  ON CONFLICT ({self.key_conflict('workflow_uuid', 'function_id', 'key')})
                    DO UPDATE SET value = EXCLUDED.value, serialization = EXCLUDED.serialization
                  RETURNING 1
                )"""
            )
        return ", ".join(ctes)

    def set_event_recorded(
        self, workflow_id: str, function_id: int, owner_xid: str, key: str, value: str,
        now_ms: int,
    ) -> Query:
        """A workflow's set_event: checkpoint, latest value and history row, one statement.

        The event rows are written only if the checkpoint was, under the status row lock.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, "DBOS.setEvent", owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms)
        events = self._event_ctes(workflow_id, key, value, function_id, "step", p)
        return Query(
            f"""WITH {owner}, {step}, {events}
                {self._verdict(owner_xid, 'step', p)}""",
            p.values,
        )

    def set_event_fenced(self, workflow_id: str, owner_xid: str, key: str, value: str) -> Query:
        """set_event from a step: the latest value, written only while the caller owns it."""
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        events = self._event_ctes(workflow_id, key, value, None,
                                  f"owner WHERE {self._owned(owner_xid, p)}", p)
        return Query(
            f"""WITH {owner}, {events}
                {self._verdict(owner_xid, 'event', p)}""",
            p.values,
        )

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

    def _stream_cte(
        self, workflow_id: str, key: str, value: str, function_id: int, source: str, p: Params
    ) -> str:
        keys = {col: p(val, 'text') for col, val in self.wf_values(workflow_id).items()}
        key_ref = p(key, "text")
        values = {
            **keys,
            "workflow_uuid": p(workflow_id, "text"),
            "key": key_ref,
            "value": p(value, "text"),
            # The next offset, derived in the insert; a concurrent writer that took the same
            # one fails the primary key and the caller retries.
            '"offset"': f"""COALESCE((SELECT max(s."offset") FROM {self.table('streams')} s
                                WHERE {self.wf('s', workflow_id, p)} AND s.key = {key_ref}),
                               -1) + 1""",
            "function_id": p(function_id, "integer"),
            "serialization": p(PORTABLE_JSON, "text"),
        }
        return f"""written AS (
                  INSERT INTO {self.table('streams')} ({', '.join(values)})
                  SELECT {', '.join(values.values())} FROM {source}
                  RETURNING "offset"
                )"""

    def write_stream_recorded(
        self, workflow_id: str, function_id: int, function_name: str, owner_xid: str,
        key: str, value: str, now_ms: int,
    ) -> Query:
        """A workflow's stream write (or close): checkpoint and value, in one fenced statement."""
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, function_name, owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms)
        written = self._stream_cte(workflow_id, key, value, function_id, "step", p)
        return Query(
            f"""WITH {owner}, {step}, {written}
                {self._verdict(owner_xid, 'step', p)}""",
            p.values,
        )

    def write_stream_fenced(
        self, workflow_id: str, owner_xid: str, key: str, value: str, function_id: int
    ) -> Query:
        """A stream write from a step: only while the caller owns the workflow; not recorded."""
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        written = self._stream_cte(workflow_id, key, value, function_id,
                                   f"owner WHERE {self._owned(owner_xid, p)}", p)
        return Query(
            f"""WITH {owner}, {written}
                {self._verdict(owner_xid, 'written', p)}""",
            p.values,
        )

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

    def completed_among(self, workflow_ids: Sequence[str]) -> Query:
        """Those of these workflows that reached a terminal status."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.wf_in(None, workflow_ids, p)}
                  AND status <> ALL({p(list(ACTIVE_STATUSES), 'text[]')})""",
            p.values,
        )
