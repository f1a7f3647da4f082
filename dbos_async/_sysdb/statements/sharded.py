"""The statements of a sharded system database: the seam of
:class:`~dbos_async._sysdb.statements.base.StatementBase`, routed by shard key.

Every per-workflow row carries ``shard_key``, leading its table's primary key (and, on
Citus, distributing it). A statement that names a workflow finds it by ``(shard_key,
workflow_uuid)``: workflow IDs are unique only per key, so the key comes with the ID, from
an explicit argument or from the bindings of :mod:`dbos_async._sysdb.shard_keys`. One
statement names one key, so a router sends it to one shard; a statement that names no
workflow is confined to the current :func:`~dbos_async._sysdb.shard_keys.shard_key_scope`,
or, with none, spans every key (listings, recovery, maintenance).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dbos_async._sysdb import shard_keys
from dbos_async._sysdb.statements import Statements
from dbos_async._sysdb.statements.base import Params, WorkflowAddress, qualify
from dbos_async.errors import DBOSError

CLAIM_LOCK_CLASS = 0x44425143
"""The first half of a claim gate's advisory lock key (``DBQC``): its second half hashes the
claim's schema, queue, partition and shard key."""


class ShardedStatements(Statements):
    """Every statement of the system database, for one sharded schema."""

    workflow_key_columns = ("shard_key",)

    @property
    def sharded(self) -> bool:
        return True

    def key_of(self, workflow_id: str, shard_key: str | None = None) -> str:
        """The key of ``workflow_id`` for a statement: the one given, else the one bound,
        else the current scope's (a claim names the rows it found in its scope)."""
        shard_keys.validate_shard_key(shard_key)
        key = shard_key if shard_key is not None else shard_keys.bound_shard_key(workflow_id)
        if key is None:
            key = shard_keys.current_scope()
        if key is None:
            raise DBOSError(
                f"Workflow {workflow_id!r} needs a shard key: this system database is sharded "
                "(start it under SetShardKey(...), or pass shard_key=... to address it)")
        return key

    def wf(self, alias: str | None, workflow_id: str, p: Params, column: str = "workflow_uuid",
           shard_key: str | None = None) -> str:
        key = self.key_of(workflow_id, shard_key)
        return (f"{qualify(alias, 'shard_key')} = {p(key)} "
                f"AND {qualify(alias, column)} = {p(workflow_id)}")

    def wf_in(self, alias: str | None, workflow_ids: Sequence[str], p: Params) -> str:
        keys = {self.key_of(workflow_id) for workflow_id in workflow_ids}
        if len(keys) > 1:
            raise DBOSError("One statement addresses workflows of one shard key; these live "
                            f"under {len(keys)} keys: {sorted(keys)!r}")
        ids = f"{qualify(alias, 'workflow_uuid')} = ANY({p(list(workflow_ids), 'text[]')})"
        if not keys:
            return ids
        return f"{qualify(alias, 'shard_key')} = {p(keys.pop())} AND {ids}"

    def among(self, alias: str | None, refs: Sequence[WorkflowAddress], p: Params,
              column: str = "workflow_uuid") -> str:
        ids, keys = [i for i, _ in refs], [k or "" for _, k in refs]
        if len(set(keys)) == 1:
            # One key (a claim's rows come from one dequeue scope): a plain equality, which
            # a router sends to that key's shard alone.
            return (f"{qualify(alias, 'shard_key')} = {p(keys[0])} "
                    f"AND {qualify(alias, column)} = ANY({p(ids, 'text[]')})")
        # IDs repeat across keys: the pairs, not the IDs.
        return (f"({qualify(alias, 'shard_key')}, {qualify(alias, column)}) IN "
                f"(SELECT * FROM unnest({p(keys, 'text[]')}, {p(ids, 'text[]')}))")

    def parent_in(self, workflow_ids: Sequence[str], p: Params) -> str:
        # The children may live under any key; their parent's is stored with them.
        keys = {self.key_of(workflow_id) for workflow_id in workflow_ids}
        if len(keys) != 1:
            raise DBOSError("One statement addresses the children of workflows of one shard key")
        return (f"parent_shard_key = {p(keys.pop())} "
                f"AND parent_workflow_id = ANY({p(list(workflow_ids), 'text[]')})")

    def wf_join(self, left: str, right: str) -> str:
        return (f"{left}.shard_key = {right}.shard_key "
                f"AND {left}.workflow_uuid = {right}.workflow_uuid")

    def scoped_join(self, left: str, right: str, p: Params) -> str:
        scope = shard_keys.current_scope()
        if scope is None:
            return self.wf_join(left, right)
        # The scope's key as a parameter: a subquery correlated on the key column makes
        # Citus send the statement to every shard.
        return (f"{left}.shard_key = {p(scope)} "
                f"AND {left}.workflow_uuid = {right}.workflow_uuid")

    def wf_values(self, workflow_id: str, shard_key: str | None = None) -> dict[str, Any]:
        return {"shard_key": self.key_of(workflow_id, shard_key)}

    def parent_values(self, parent_workflow_id: str | None,
                      shard_key: str | None = None) -> dict[str, Any]:
        if parent_workflow_id is None:
            return {}
        return {"parent_shard_key": self.key_of(parent_workflow_id, shard_key)}

    def child_values(self, child_workflow_id: str | None,
                     shard_key: str | None = None) -> dict[str, Any]:
        if child_workflow_id is None:
            return {}
        return {"child_shard_key": self.key_of(child_workflow_id, shard_key)}

    def key_hint(self, workflow_id: str) -> str | None:
        return self.key_of(workflow_id)

    def key_conflict(self, *columns: str) -> str:
        return ", ".join(("shard_key", *columns))

    def scoped(self, alias: str | None, p: Params) -> str:
        scope = shard_keys.current_scope()
        return "TRUE" if scope is None else f"{qualify(alias, 'shard_key')} = {p(scope)}"

    def key_columns(self, alias: str | None = None,
                    names: Sequence[str] = ("shard_key",)) -> str:
        return "".join(f", {qualify(alias, name)}" for name in names)

    def claim_gate(self, queue_name: str, partition_key: str | None, p: Params) -> str:
        """One claimer at a time per key (and partition) of a queue: an advisory lock of
        the claim's transaction, tried once before the scan (a subquery that reads no row
        runs once). Executors claiming the same key at once would each scan past the rows
        the others locked; the one that does not get the lock claims nothing from this key
        this round and goes on to its other keys. All claims of a key run on the node that
        holds it, so on Citus the lock is that node's, as the rows are."""
        scope = shard_keys.current_scope()
        if scope is None:
            return "TRUE"
        name = p(self.claim_gate_name(queue_name, partition_key, scope))
        return (f"(SELECT pg_catalog.pg_try_advisory_xact_lock({CLAIM_LOCK_CLASS}, "
                f"pg_catalog.hashtext({name})))")

    def claim_gate_name(self, queue_name: str, partition_key: str | None,
                        shard_key: str) -> str:
        """What the claim gate's lock of a queue's key (and partition) is named by."""
        return json.dumps([self.schema, queue_name, partition_key, shard_key])

    def key_in(self, alias: str | None, keys: Sequence[str], p: Params,
               column: str = "shard_key") -> str:
        for key in keys:
            shard_keys.validate_shard_key(key)
        return f"{qualify(alias, column)} = ANY({p(list(keys), 'text[]')})"
