"""What every fenced write of a workflow shares: the verdict of the fence (this execution
owns the PENDING workflow), the step a replay finds already recorded, and the group-commit
batches of one kind of write, one statement per shard key (or, on Citus, one routed program
per write, by node).

:class:`FencedWrites` is the base of the families that write a workflow's rows under its
fence: the workflows' own (:mod:`dbos_async._sysdb.database`) and messaging
(:mod:`dbos_async._sysdb.messaging`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

import asyncpg

from dbos_async._sysdb.records import StepRecord
from dbos_async._sysdb.shard_keys import (
    WorkflowAddress,
    by_key,
    cleared_shard_keys,
    shard_key_scope,
)
from dbos_async._sysdb.statements import CANCELLED, PENDING, Query
from dbos_async._sysdb.writes.routed import Program, Results, RoutedWrites, Row, ran_whole
from dbos_async.errors import (
    NondeterminismError,
    NonExistentWorkflowError,
    WorkflowCancelledError,
    WorkflowConflictError,
)

T = TypeVar("T")

KeyGroup = tuple[list[int], str | None]
"""Rows of a batch (their indexes) under one shard key, and the key: one statement's rows."""

Keyed = tuple[str | None, T]
"""A row to write and the shard key of its workflow (None unsharded)."""


def key_groups(keys: Sequence[str | None]) -> list[KeyGroup]:
    """The indexes of a batch's rows grouped by their keys, in order of first appearance."""
    groups = by_key((key, i) for i, key in enumerate(keys))
    return [(indexes, key) for key, indexes in groups.items()]


def batch_verdicts(rows: Sequence[Keyed[T]],
                   found: Mapping[str | None, Sequence[Row] | Exception],
                   of_row: Callable[[str | None, T], Hashable],
                   of_record: Callable[[Row], Hashable]) -> list[bool | BaseException]:
    """Per row of a group-commit batch: whether its write landed (its identity is among
    the rows its key's statement read back), or the error that ended that key's
    transaction. Of two rows claiming one write, the first landed."""
    landed = {of_record(r) for outcome in found.values()
              if not isinstance(outcome, Exception) for r in outcome}
    verdicts: list[bool | BaseException] = []
    for key, row in rows:
        outcome = found[key]
        if isinstance(outcome, Exception):
            verdicts.append(outcome)
            continue
        identity = of_row(key, row)
        verdicts.append(identity in landed)
        landed.discard(identity)
    return verdicts


def keys_given(rows: Sequence[Keyed[T]]) -> list[str] | None:
    """Each row's key, or None if a row has none (then it cannot be placed in a shard)."""
    keys = [key for key, _ in rows if key is not None]
    return keys if len(keys) == len(rows) else None


def programs_landed(programs: Sequence[tuple[WorkflowAddress, Program]],
                    found: Sequence[Results | Exception]) -> list[bool | BaseException]:
    """Per routed write of a group-commit batch: whether it landed whole, or the error
    that ended it."""
    return [results if isinstance(results, Exception) else ran_whole(program, results)
            for (_, program), results in zip(programs, found, strict=True)]



class FencedWrites(RoutedWrites):
    """The fence's verdicts and the group-commit batches the fenced writes share."""

    async def _lane(self, shard_key: str | None) -> Hashable:
        """The group-commit lane of a write under ``shard_key``: on Citus one per node
        (the batch goes to the node holding its keys, one program per write, see routed);
        on PostgreSQL one for every key (one statement per key, see _fetch_per_key). Each
        batch goes in one round trip."""
        if not self.routes_single_tables:  # decided here: every write asks, Citus or not
            return None
        return await self.node_of(shard_key)

    def _per_key(self, rows: Sequence[Keyed[T]], one: Callable[[str | None, T], Query],
                 batch: Callable[[str | None, list[T]], Query]
                 ) -> tuple[list[KeyGroup], list[tuple[str | None, Query]]]:
        """The statements of a group-commit batch, one per key, and the rows (indexes) each
        writes: where every key holds one row (a lone write, or workflows spread over many
        keys), each row's single-row statement ``one``, which costs the server less to run
        than the array form ``batch`` takes for several rows of a key. Every statement
        reads back each written row's ID and key, whatever its form."""
        groups = key_groups([key for key, _ in rows])
        statements = []
        for indexes, key in groups:
            if len(groups) == len(rows):
                statements.append((key, one(*rows[indexes[0]])))
                continue
            with cleared_shard_keys(), shard_key_scope(key):
                statements.append((key, batch(key, [rows[i][1] for i in indexes])))
        return groups, statements

    def _check_fence(self, row: Row | None, workflow_id: str) -> bool:
        """Raise if the fenced write found the workflow gone, cancelled or owned elsewhere."""
        if row is None:
            raise NonExistentWorkflowError(workflow_id)
        if row["status"] == CANCELLED:
            raise WorkflowCancelledError(workflow_id)
        if row["status"] != PENDING or not row["owned"]:
            raise WorkflowConflictError(workflow_id)
        return bool(row["inserted"])

    async def _recorded_or_existing(
        self, row: Row | None, workflow_id: str, function_id: int, function_name: str
    ) -> StepRecord | None:
        """None if this statement recorded the step; else the record already there."""
        if self._check_fence(row, workflow_id):
            return None
        record = await self._existing_step(workflow_id, function_id, function_name)
        if record is None:
            raise RuntimeError(f"Step {function_id} of {workflow_id} vanished while recorded")
        return record

    async def _existing_step(self, workflow_id: str, function_id: int, function_name: str
                             ) -> StepRecord | None:
        """The step recorded at ``function_id`` (None if none), which must be ``function_name``."""
        row = await self._fetchrow(
            self.sql.get_checkpoint(workflow_id, function_id), "reading a checkpoint"
        )
        if row is None:
            return None
        record = StepRecord(**dict(row))
        if record.function_name != function_name:
            raise NondeterminismError(workflow_id, function_id, record.function_name, function_name)
        return record

    async def _fetchrow_fk(self, query: Query, what: str, destination_id: str
                           ) -> asyncpg.Record | None:
        try:
            return await self._fetchrow(query, what)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(destination_id) from None
