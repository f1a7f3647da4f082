"""Operations on workflows as a whole: cancel, delete, list, resume, fork, rewind,
application versions, and the maintenance jobs under their advisory locks.

Each runs in one transaction where it writes more than one statement, with the system
database's retry policy; the executor turns the rows into typed values and sends the
notifications the writes owe.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

import asyncpg

from dbos_async._sysdb import connection
from dbos_async._sysdb.core import DatabaseCore, PooledConnection
from dbos_async._sysdb.records import StatusRecord, status_record
from dbos_async._sysdb.shard_keys import bind_shard_keys, by_key, cleared_shard_keys
from dbos_async._sysdb.statements import (
    ACTIVE_STATUSES,
    Query,
    RetentionCutoff,
    VersionRecord,
    WorkflowAddress,
    WorkflowFilter,
    job_lock_key,
)
from dbos_async.errors import DBOSError, NonExistentWorkflowError

T = TypeVar("T")

JobConnection: TypeAlias = PooledConnection
"""The connection a locked job runs its statements on (inside the lock's transaction)."""

RETENTION_JOB = "retention"
GLOBAL_TIMEOUT_JOB = "global_timeout"



@dataclass(frozen=True)
class CancelledWorkflow:
    """A workflow a cancel changed: the queue whose slot it freed, and its key."""

    workflow_id: str
    queue_name: str | None
    shard_key: str | None = None


@dataclass(frozen=True)
class ForkSpec:
    """One fork: its original (under ``shard_key``, which the fork shares), the fork's ID,
    the step it re-runs from, and the child IDs its copied steps name instead."""

    original_id: str
    fork_id: str
    start_step: int
    shard_key: str | None = None
    replacement_children: dict[str, str] = field(default_factory=dict)


class WorkflowOperations(DatabaseCore):
    # ---- Cancel and delete ----

    async def cancel(self, workflow_ids: Sequence[str], *,
                     children: bool) -> list[CancelledWorkflow]:
        """Cancel the workflows (and, with ``children``, every descendant), in one
        transaction; unknown IDs raise :class:`NonExistentWorkflowError` and change nothing.
        Returns the workflows whose status changed, with the queue each one was on. On a
        sharded database each statement addresses one key (children may live under others)."""
        refs = self._refs(workflow_ids)
        now = self.clock.now_ms()

        async def run(again: bool) -> list[CancelledWorkflow]:
            async with self.locking_transaction() as conn:
                for key, ids in _ids_by_key(refs).items():
                    with bind_shard_keys(dict.fromkeys(ids, key)):
                        await self._require_existing(conn, ids)
                cancelled: list[CancelledWorkflow] = []
                visited = set(refs)
                frontier = refs
                while frontier:
                    kids: list[WorkflowAddress] = []
                    for key, ids in _ids_by_key(frontier).items():
                        with bind_shard_keys(dict.fromkeys(ids, key)):
                            cancelled += _cancelled(
                                await _fetch_on(conn, self.sql.cancel(ids, now)))
                            if children:
                                kids += _refs_of(
                                    await _fetch_on(conn, self.sql.direct_children(ids)))
                    frontier = [kid for kid in dict.fromkeys(kids) if kid not in visited]
                    visited.update(frontier)
                if again:
                    cancelled += await self._cancelled_before(conn, visited, cancelled)
                return cancelled

        return await self._retried_again("cancelling workflows", run)

    async def _cancelled_before(self, conn: JobConnection, refs: Iterable[WorkflowAddress],
                                changed: Sequence[CancelledWorkflow]
                                ) -> list[CancelledWorkflow]:
        """On a retried cancel: the workflows among ``refs`` found CANCELLED that this
        attempt did not change, as the lost attempt may have cancelled them (announced
        again, harmlessly if it did not; their queue is unknown, so no slot is announced)."""
        done = {(row.workflow_id, row.shard_key) for row in changed}
        found: list[CancelledWorkflow] = []
        for key, ids in _ids_by_key([ref for ref in refs if ref not in done]).items():
            with bind_shard_keys(dict.fromkeys(ids, key)):
                rows = await _fetch_on(conn, self.sql.cancelled_among(ids))
            found += [CancelledWorkflow(r["workflow_uuid"], None, key) for r in rows]
        return found

    async def descendants(self, workflow_ids: Sequence[str]) -> list[WorkflowAddress]:
        """Every workflow started by these, recursively (not including them), with its key."""
        refs = self._refs(workflow_ids)
        seen = set(refs)
        found: list[WorkflowAddress] = []
        frontier = refs
        while frontier:
            kids: list[WorkflowAddress] = []
            for key, ids in _ids_by_key(frontier).items():
                with bind_shard_keys(dict.fromkeys(ids, key)):
                    kids += _refs_of(await self._fetch(self.sql.direct_children(ids),
                                                       "reading children"))
            frontier = [kid for kid in dict.fromkeys(kids) if kid not in seen]
            seen.update(frontier)
            found += frontier
        return found

    async def delete(self, workflow_ids: Sequence[str],
                     extra: Sequence[WorkflowAddress] = ()) -> None:
        """Delete every row of the workflows (and of the ``extra`` ones, given with their
        keys), in one transaction."""
        refs = list(dict.fromkeys([*self._refs(workflow_ids), *extra]))
        if not refs:
            return

        async def run() -> None:
            async with self.locking_transaction() as conn:
                for key, ids in _ids_by_key(refs).items():
                    with bind_shard_keys(dict.fromkeys(ids, key)):
                        for q in self.sql.delete(ids):
                            await conn.execute(q.sql, *q.params)

        await self._retried("deleting workflows", run)

    def _refs(self, workflow_ids: Sequence[str]) -> list[WorkflowAddress]:
        """The workflows with the keys bound to them (None unsharded), once each."""
        return [WorkflowAddress(i, self.sql.key_hint(i)) for i in dict.fromkeys(workflow_ids)]

    async def cancelled_among(self, workflow_ids: Sequence[str]) -> set[str]:
        rows = await self._fetch(self.sql.cancelled_among(workflow_ids), "reading statuses")
        return {r["workflow_uuid"] for r in rows}

    async def _require_existing(self, conn: JobConnection, ids: Sequence[str]) -> None:
        found = {r["workflow_uuid"] for r in await _fetch_on(conn, self.sql.existing(ids))}
        missing = [i for i in ids if i not in found]
        if missing:
            raise NonExistentWorkflowError(", ".join(missing))

    # ---- Listing ----

    async def list_workflows(self, f: WorkflowFilter) -> list[StatusRecord]:
        rows = await self._observed_fetch(self.sql.list_workflows(f), "listing workflows")
        return [status_record(row) for row in rows]

    async def list_steps(self, workflow_id: str, *, limit: int | None = None,
                         offset: int | None = None,
                         load_output: bool = True) -> list[asyncpg.Record]:
        return await self._observed_fetch(
            self.sql.list_steps(workflow_id, limit=limit, offset=offset, load_output=load_output),
            f"listing the steps of {workflow_id}")

    async def step_position(self, workflow_id: str, *, name: str | None = None,
                            failed: bool = False, index: int = -1) -> int | None:
        """The position of a workflow's checkpoint chosen as
        :meth:`ControlStatements.step_position` chooses it; None if there is none."""
        row = await self._fetchrow(
            self.sql.step_position(workflow_id, name=name, failed=failed, index=index),
            f"finding a step of {workflow_id}")
        return None if row is None else int(row["function_id"])

    # ---- Application versions ----

    async def register_version(self, version_name: str) -> None:
        await self._execute(self.sql.register_version(version_name, self.clock.now_ms()),
                            "registering the application version")
        await self.check_version_owner(version_name)

    async def check_version_owner(self, version_name: str) -> None:
        """Raise if another application owns ``version_name`` (version names are unique
        across the applications sharing a system database)."""
        row = await self._fetchrow(self.sql.version_owner(version_name),
                                   "reading an application version's owner")
        self._check_owner("Application version", version_name,
                          row["application_name"] if row is not None else None)

    async def list_versions(self) -> list[VersionRecord]:
        rows = await self._fetch(self.sql.list_versions(), "listing application versions")
        return [VersionRecord(**dict(r)) for r in rows]

    async def latest_version(self) -> VersionRecord | None:
        rows = await self._fetch(self.sql.latest_version(), "reading the latest version")
        return VersionRecord(**dict(rows[0])) if rows else None

    async def set_latest_version(self, version_name: str) -> None:
        await self._execute(self.sql.set_latest_version(version_name, self.clock.now_ms()),
                            "setting the latest application version")
        await self.check_version_owner(version_name)

    # ---- Permissions ----

    async def grant_permissions(self, role: str) -> None:
        """Grant ``role`` what an application needs on the system schema, in one
        transaction; an unknown role, or a connected user who may not grant, changes
        nothing and raises :class:`DBOSError` saying so."""
        if not isinstance(role, str) or not role or "\x00" in role \
                or len(role.encode()) > 63:
            raise DBOSError(f"Invalid role name {role!r}: a PostgreSQL role name of 1 to 63 "
                            "bytes is needed")
        exists = self.sql.role_exists(role)
        grants = self.sql.grant_schema_permissions(role)

        async def run() -> None:
            async with connection.pooled_transaction(self.pool) as conn:
                if not await conn.fetchval(exists.sql, *exists.params):
                    raise DBOSError(f"Role {role!r} does not exist (CREATE ROLE it first)")
                for q in grants:
                    await conn.execute(q.sql, *q.params)

        try:
            await self._retried(f"granting permissions to {role}", run)
        except asyncpg.InsufficientPrivilegeError as error:
            raise DBOSError(
                f"Cannot grant permissions on schema {self.schema!r} to {role!r}: {error} "
                "(connect as the schema's owner, the user that migrated it)") from None

    # ---- Maintenance jobs ----

    async def run_locked(self, job_name: str, job: Callable[[JobConnection], Awaitable[T]]
                         ) -> tuple[bool, T | None]:
        """Run ``job`` on a connection holding the job's transaction-scoped advisory lock,
        if no other executor holds it: (whether it ran, its result). The job's statements
        run in that transaction; the lock goes when it ends (rolled back or committed by
        the job's outcome)."""
        q = self.sql.try_job_lock(job_lock_key(self.schema, self.application_name, job_name))
        async with connection.pooled_transaction(self.pool) as conn:
            if not await conn.fetchval(q.sql, *q.params):
                return False, None
            return True, await job(conn)

    async def delete_finished_before(self, cutoff_ms: int | None, batch_size: int,
                                     rows_threshold: int | None = None) -> int | None:
        """The retention job: delete terminal workflows finished before ``cutoff_ms``, and
        those older than the ``rows_threshold`` newest workflows, ``batch_size`` per
        statement, and the queues' depth samples before ``cutoff_ms``. How many workflows,
        or None if another executor holds the lock."""

        async def job(conn: JobConnection) -> int:
            created_before = None
            if rows_threshold is not None:
                q = self.sql.newest_created_at(rows_threshold)
                # Fewer workflows than the threshold: none is past it.
                created_before = await conn.fetchval(q.sql, *q.params)
            cutoff = RetentionCutoff(cutoff_ms, created_before)
            if cutoff_ms is not None and self.depth_samples_table:
                # The queues' depth samples of those times go with their workflows.
                q = self.sql.delete_depth_samples_before(cutoff_ms)
                await conn.execute(q.sql, *q.params)
            total = 0
            while True:
                deleted = await self._delete_terminal_batch(conn, cutoff, batch_size)
                total += deleted
                if deleted < batch_size:
                    return total

        ran, total = await self.run_locked(RETENTION_JOB, job)
        return total if ran else None

    async def cancel_created_before(self, cutoff_ms: int) -> list[CancelledWorkflow] | None:
        """The global timeout: cancel in-flight workflows created before ``cutoff_ms``. The
        cancelled workflows with their queues, or None if another executor holds the lock."""

        async def job(conn: JobConnection) -> list[CancelledWorkflow]:
            if not self.sharded:
                return _cancelled(await _fetch_on(
                    conn, self.sql.cancel_created_before(cutoff_ms, self.clock.now_ms())))
            # Sharded: read the candidates across keys, then cancel each key's (one
            # statement per key, as a lock may not span shards).
            candidates = _refs_of(await _fetch_on(conn, self.sql.active_created_before(cutoff_ms)))
            cancelled: list[CancelledWorkflow] = []
            for key, ids in _ids_by_key(candidates).items():
                with bind_shard_keys(dict.fromkeys(ids, key)):
                    cancelled += _cancelled(
                        await _fetch_on(conn, self.sql.cancel(ids, self.clock.now_ms())))
            return cancelled

        ran, rows = await self.run_locked(GLOBAL_TIMEOUT_JOB, job)
        return rows if ran else None

    async def _delete_terminal_batch(self, conn: JobConnection, cutoff: RetentionCutoff,
                                     batch_size: int) -> int:
        """One retention batch: one statement unsharded; sharded, the batch read across
        keys, then each key's workflows deleted with their rows."""
        if not self.sharded:
            return len(await _fetch_on(conn, self.sql.delete_terminal_batch(cutoff,
                                                                            batch_size)))
        victims = _refs_of(await _fetch_on(
            conn, self.sql.terminal_finished_before(cutoff, batch_size)))
        for key, ids in _ids_by_key(victims).items():
            with bind_shard_keys(dict.fromkeys(ids, key)):
                for q in self.sql.delete(ids):
                    await conn.execute(q.sql, *q.params)
        return len(victims)

    # ---- Resume, fork, rewind ----

    async def resume(self, workflow_ids: Sequence[str], queue_name: str,
                     application_version: str | None = None) -> list[str]:
        """Re-enqueue the workflows on ``queue_name`` (under ``application_version``, if
        given; see ``ControlStatements.resume``), in one transaction; unknown IDs raise
        :class:`NonExistentWorkflowError` and change nothing. Returns the IDs that were
        re-enqueued (a SUCCESS or ERROR one is not)."""
        ids = list(dict.fromkeys(workflow_ids))
        now = self.clock.now_ms()

        async def run(again: bool) -> list[str]:
            async with self.locking_transaction() as conn:
                await self._require_existing(conn, ids)
                # A retry keeps what the lost attempt may have done (see resumed_since).
                earlier = await _fetch_on(conn, self.sql.resumed_since(ids, queue_name, now)) \
                    if again else []
                rows = await _fetch_on(conn, self.sql.resume(ids, queue_name, now, again,
                                                             application_version))
                resumed = {r["workflow_uuid"] for r in [*earlier, *rows]}
                return [i for i in ids if i in resumed]

        return await self._retried_again("resuming workflows", run)

    async def _locked_for_fork(self, conn: JobConnection, workflow_id: str,
                               start_step: int) -> str:
        """Lock the workflow's row and check ``start_step`` against its recorded steps:
        from 0 to one past the last recorded step. Returns its status."""
        q = self.sql.lock_for_fork(workflow_id)
        row = await conn.fetchrow(q.sql, *q.params)
        if row is None:
            raise NonExistentWorkflowError(workflow_id)
        last = row["last_step"] if row["last_step"] is not None else -1
        if isinstance(start_step, bool) or not isinstance(start_step, int) \
                or not 0 <= start_step <= last + 1:
            raise DBOSError(
                f"start_step {start_step!r} is out of range for workflow {workflow_id!r}: "
                + (f"its recorded steps are 0..{last}, so start_step must be from 0 to "
                   f"{last + 1}" if last >= 0 else "it has no recorded step, so start_step "
                   "must be 0"))
        status: str = row["status"]
        return status

    async def fork(self, forks: Sequence[ForkSpec], *, queue_name: str,
                   application_version: str | None, timeout_ms: int | None,
                   partition_key: str | None = None) -> None:
        """Create each fork from its original with the original's history below its
        ``start_step``, all in one transaction (on a sharded database each fork's statements
        address its original's key): every fork is created, or none. The originals are
        locked in one order, so two batches over the same workflows cannot deadlock. Safe
        to retry: the forks carry one creator token, so a retry finding the first fork
        created by its lost attempt knows the whole batch committed."""
        now = self.clock.now_ms()
        creator_xid = str(uuid.uuid4())
        ordered = sorted(forks, key=lambda f: (f.shard_key or "", f.original_id, f.fork_id))

        async def run(again: bool) -> None:
            async with self.locking_transaction() as conn:
                if again:
                    first = ordered[0]
                    with cleared_shard_keys(), bind_shard_keys({first.fork_id: first.shard_key}):
                        q = self.sql.fork_creator(first.fork_id)
                    if await conn.fetchval(q.sql, *q.params) == creator_xid:
                        return
                for spec in ordered:
                    with cleared_shard_keys(), bind_shard_keys(
                            {spec.original_id: spec.shard_key, spec.fork_id: spec.shard_key}):
                        await self._fork_on(conn, spec, queue_name, application_version,
                                            timeout_ms, partition_key, now, creator_xid)

        what = ", ".join(dict.fromkeys(f.original_id for f in forks))
        await self._retried_again(f"forking workflow {what}", run)

    async def _fork_on(self, conn: JobConnection, spec: ForkSpec, queue_name: str,
                       application_version: str | None, timeout_ms: int | None,
                       partition_key: str | None, now: int, creator_xid: str) -> None:
        await self._locked_for_fork(conn, spec.original_id, spec.start_step)
        queries = self.sql.insert_fork(spec.original_id, spec.fork_id, queue_name,
                                       application_version, timeout_ms, now, creator_xid,
                                       partition_key)
        if spec.start_step > 0 and spec.replacement_children and self.sharded:
            q = self.sql.ambiguous_children(spec.original_id, spec.start_step,
                                            list(spec.replacement_children))
            ambiguous = await conn.fetchval(q.sql, *q.params)
            if ambiguous is not None:
                raise DBOSError(f"Can't replace child workflow {ambiguous}: the forked steps "
                                "refer to children with that ID under more than one shard key")
        if spec.start_step > 0:
            queries += self.sql.copy_history(spec.original_id, spec.fork_id, spec.start_step,
                                             spec.replacement_children)
        try:
            for q in queries:
                await conn.execute(q.sql, *q.params)
        except asyncpg.UniqueViolationError:
            raise DBOSError(f"Cannot fork {spec.original_id!r} as {spec.fork_id!r}: a "
                            "workflow with that ID exists") from None

    async def rewind(self, workflow_id: str, start_step: int, *, queue_name: str,
                     application_version: str | None,
                     while_locked: Callable[[], Awaitable[None]] | None = None) -> None:
        """Discard the workflow's history from ``start_step`` on and re-enqueue it under
        its own ID, in one transaction; only a finished (terminal) workflow is rewound.
        ``while_locked`` runs once the workflow is found finished, before the commit (it
        discards what other databases hold of that history: nothing runs the workflow
        until the commit)."""
        now = self.clock.now_ms()

        async def run() -> None:
            async with self.locking_transaction() as conn:
                status = await self._locked_for_fork(conn, workflow_id, start_step)
                if status in ACTIVE_STATUSES:
                    raise DBOSError(f"Cannot rewind {workflow_id!r} ({status}): only a "
                                    "finished workflow can be rewound; cancel it first")
                if while_locked is not None:
                    await while_locked()
                for q in self.sql.rewind(workflow_id, start_step):
                    await conn.execute(q.sql, *q.params)
                q = self.sql.requeue_rewound(workflow_id, status, queue_name,
                                             application_version, now)
                if await conn.execute(q.sql, *q.params) != "UPDATE 1":
                    raise DBOSError(f"Workflow {workflow_id!r} changed status while being "
                                    "rewound; retry the rewind")

        await self._retried(f"rewinding workflow {workflow_id}", run)


async def _fetch_on(conn: JobConnection, query: Query) -> list[asyncpg.Record]:
    return await conn.fetch(query.sql, *query.params)


def _cancelled(rows: list[asyncpg.Record]) -> list[CancelledWorkflow]:
    """A cancel statement's rows: each cancelled workflow with the queue it was on."""
    return [CancelledWorkflow(r["workflow_uuid"], r["queue_name"], r.get("shard_key"))
            for r in rows]


def _refs_of(rows: list[asyncpg.Record]) -> list[WorkflowAddress]:
    return [WorkflowAddress(r["workflow_uuid"], r.get("shard_key")) for r in rows]


def _ids_by_key(refs: Sequence[WorkflowAddress]) -> dict[str | None, list[str]]:
    """Workflow IDs grouped by key, for statements that each address one key."""
    return by_key((key, workflow_id) for workflow_id, key in refs)
