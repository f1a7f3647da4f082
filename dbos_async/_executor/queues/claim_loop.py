"""Claim loops: claim enqueued workflows under the queues' limits and run them.

One claim loop task per queue this executor listens to. Each claim is one transaction (see
``SystemDatabase.claim_queued``): the limits are read, the next workflows locked and flipped
to PENDING with a fresh owner token each, and their inputs returned; each claimed workflow
then runs as a task of the runtime. A claim loop sleeps until an enqueue notification
for its queue (``dbos_enqueue_channel``, payload: the queue's name), the end of one of its
workflows' bodies (it frees a slot, while the outcome is still being written; announced on
the same channel so other executors wake too),
the end of a rate-limit window, or, while its queue has work in flight (a shared limit
is spent, its own workers are busy), its polling interval, whichever is first. A round that
finds nothing to start makes it idle: then the queue watcher
(:mod:`dbos_async._executor.queues.watcher`) polls for it, with every other idle queue and
the DELAYED workflows in one statement, backing off while it finds nothing. A claim that
loses a race for a shared budget (55P03 lock not available, 40001 serialization failure)
backs off with jitter and tries again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time

import asyncpg

from dbos_async import _metrics as metrics
from dbos_async._executor import workflows
from dbos_async._executor.backoff import IdleBackoff
from dbos_async._executor.context import Telemetry
from dbos_async._executor.queues.depth_samples import DepthSampler
from dbos_async._executor.queues.rotation import Rotation, fair_share
from dbos_async._executor.queues.watcher import QueueWatcher
from dbos_async._executor.recorded_errors import PORTABLE_ONLY, serialize_error
from dbos_async._executor.runtime import ClaimLoopState, Runtime
from dbos_async._executor.telemetry import observe
from dbos_async._sysdb.database import WorkflowRow
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL, WORKFLOW_COMPLETION_CHANNEL, keyed
from dbos_async._sysdb.queues import Claim
from dbos_async._sysdb.repeats import Repeats
from dbos_async._sysdb.retry import is_transient
from dbos_async._sysdb.shard_keys import bind_shard_keys, shard_key_scope
from dbos_async._sysdb.statements import PORTABLE_JSON, QueueRecord
from dbos_async.errors import (
    DatabaseUnavailableError,
    DBOSError,
    ExecutorIdLostError,
    SerializationError,
    WorkflowNotRegisteredError,
)

logger = logging.getLogger("dbos_async")

CONFLICTS = (
    asyncpg.LockNotAvailableError,  # 55P03: NOWAIT found the rows locked by another claim
    asyncpg.SerializationError,  # 40001: a concurrent claim spent the same budget
    asyncpg.DeadlockDetectedError,
)

SWEEP_CAP = 1000
"""Most partitions one claim round visits (and heads one sweep admits)."""

UNREGISTERED_CHECK_INTERVAL = 10.0
"""Seconds between two looks for enqueued work this executor lacks the function of (the
first look is at the first claim round that starts nothing)."""


class ClaimLoop:
    """Claims and starts the workflows of one queue in this executor."""

    def __init__(self, runtime: Runtime, state: ClaimLoopState, watcher: QueueWatcher) -> None:
        self.runtime = runtime
        self.state = state
        self.watcher = watcher
        self.queue = state.queue
        # The running workflows (as notifications name them) -> partition key
        self.running: dict[str, str | None] = {}
        # The workflows whose bodies have ended and whose outcomes are being written.
        self._recording: set[str] = set()
        self._next_unregistered_check = 0.0
        # Sharded: the keys with work on the queue, and when to read them again.
        self._scope_keys: list[str] = []
        self._scopes_due = 0.0
        self._fresh_scopes = False
        # Whose turn it is: among the keys, and among each key's (scope's) partitions.
        self._scope_turn = Rotation()
        self._partition_turns: dict[str | None, Rotation] = {}
        # Whether the slots freed in this turn of the event loop are to be announced.
        self._announcing = False

    def _room(self) -> int | None:
        """The workflows a claim may start now: the worker slots free, less the outcomes
        being written beyond as many again. A slot is free once its body ends, so that the
        next claim overlaps the outcome's write; the bound keeps claims from running ahead
        of a lagging outcome writer with ever more PENDING workflows."""
        limit = self.queue.worker_concurrency
        if limit is None:
            return None
        behind = max(0, len(self._recording) - limit)
        return max(0, limit - len(self.running) - behind)

    def _partition_room(self, key: str, room: int | None) -> int | None:
        limit = self.queue.partition_worker_concurrency
        if limit is None:
            return room
        mine = sum(1 for k in self.running.values() if k == key)
        left = max(0, limit - mine)
        return left if room is None else min(room, left)

    async def run(self) -> None:
        notifications = self.runtime.system_database.notifications
        assert notifications is not None
        backoff = 0.0
        poll = self.queue.polling_interval_sec
        repeats = Repeats(logger)
        # Registered before the first read: a notification arriving mid-claim is kept.
        with notifications.register(ENQUEUE_CHANNEL, self.queue.name) as waiter:
            while True:
                try:
                    # Until its workflows are launched, recovery must not take them for
                    # crashed ones.
                    async with self.runtime.claim_gate.claiming():
                        started, retry_at, spent = await self.claim_once()
                    metrics.claim_round(self.queue.name, started)
                    backoff = 0.0
                    repeats.reset()
                except ExecutorIdLostError:
                    # Another process holds this executor's ID now (logged once, where it
                    # was found out): claim nothing more under it.
                    return
                except CONFLICTS as conflict:
                    # Conflict and error backoff are real time, not the clock of durable
                    # timers: another process's transaction ends in real seconds.
                    backoff = min(max(backoff * 2, 0.005), poll)
                    logger.debug("Queue %s: claim conflict (%s), retrying in %.3fs",
                                 self.queue.name, type(conflict).__name__, backoff)
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                    continue
                except Exception as error:
                    # Database trouble or a bug: keep the claim loop alive, try again later.
                    if is_transient(error):
                        repeats.log(logging.WARNING,
                                    "Queue %s: claim failed, retrying in %.1fs: %r",
                                    self.queue.name, poll, error)
                    else:
                        logger.exception("Queue %s: claim failed", self.queue.name)
                    await asyncio.sleep(poll)
                    continue
                if started:
                    self.watcher.activity()
                    continue  # There may be more: claim again before sleeping.
                await self._report_unregistered()
                if retry_at is not None or spent or self._room() == 0:
                    # Work in flight: the queue's own polling interval, or the rate limit
                    # (a durable period: on the clock).
                    await waiter.wait(poll, until_ms=retry_at)
                    continue
                # Nothing to start: the watcher polls for this queue until it is woken.
                self.watcher.idle(self.queue.name)
                try:
                    await waiter.wait(None, polled=True)
                finally:
                    self.watcher.busy(self.queue.name)

    async def claim_once(self) -> tuple[int, int | None, bool]:
        """One claim round: (workflows started, when a rate limit frees a slot, if known,
        whether a shared limit is spent).

        On a sharded database a round claims in each dequeue scope (a key with ENQUEUED
        work on the queue) in turn, so every claim statement addresses one key.
        """
        self.state.rounds += 1
        started, retry_at, spent = await self._claim_in(await self._scopes())
        if not started and self.runtime.system_database.sharded and not self._fresh_scopes:
            # A key enqueued since the scopes were read: read them again at once.
            self._scopes_due = 0.0
            started, retry_at, spent = await self._claim_in(await self._scopes())
        return started, retry_at, spent

    async def _claim_in(self, scopes: list[str | None]) -> tuple[int, int | None, bool]:
        """Claim in each scope in turn, each taking at most its fair share of the worker
        budget left. A key whose node is out of reach does not stop the round: the keys
        after it are claimed, and its error is raised (for the loop to report and wait)
        only if nothing started."""
        started = 0
        retry_at: int | None = None
        spent = False
        unreachable: DatabaseUnavailableError | None = None
        for index, scope in enumerate(scopes):
            room = fair_share(self._room(), len(scopes) - index)
            try:
                with shard_key_scope(scope):
                    count, at, limited = await self._claim_scope(scope, room)
            except DatabaseUnavailableError as error:
                if scope is None:
                    raise
                unreachable = unreachable or error
                continue
            if count and scope is not None:
                self._scope_turn.served(scope)
            started += count
            spent = spent or limited
            if at is not None:
                retry_at = at if retry_at is None else min(retry_at, at)
        if unreachable is not None and not started:
            raise unreachable
        return started, retry_at, spent

    async def _scopes(self) -> list[str | None]:
        """The scopes of a round: one, unsharded; sharded, the keys with ENQUEUED work on
        the queue, read at most every polling interval, each round from the key after the
        last one that started work, so that the keys share the worker budget in turns."""
        sysdb = self.runtime.system_database
        if not sysdb.sharded:
            return [None]
        now = time.monotonic()
        self._fresh_scopes = now >= self._scopes_due
        if self._fresh_scopes:
            self._scope_keys = await sysdb.dequeue_scopes(self.queue.name)
            self._scopes_due = now + self.queue.polling_interval_sec
            kept = set(self._scope_keys)  # the turns of keys without work are forgotten
            self._partition_turns = {k: t for k, t in self._partition_turns.items()
                                     if k in kept}
        scopes: list[str | None] = [*self._scope_turn.order(self._scope_keys)]
        return scopes

    async def _claim_scope(self, scope: str | None,
                           room: int | None) -> tuple[int, int | None, bool]:
        """Claim in one scope, at most ``room`` workflows (None: no worker limit), the
        partitions of a partitioned queue in turns, each its fair share."""
        queue, runtime = self.queue, self.runtime
        sysdb = runtime.system_database
        names = list(runtime.registry.workflows)
        if room == 0 or not names:
            return 0, None, False
        executor_id, version = runtime.executor_id, runtime.application_version
        if not queue.partition_queue:
            claim = await sysdb.claim_queued(queue, None, room=room, executor_id=executor_id,
                                             application_version=version, names=names)
            await self._start(claim)
            return len(claim.rows), claim.retry_at_ms, claim.spent
        turn = self._partition_turns.setdefault(scope, Rotation())
        # The sweep of every partition's head joins rows across keys: sharded, each
        # partition is claimed in turn instead.
        if queue.head_of_line and not sysdb.sharded:
            claim = await sysdb.claim_partition_heads(
                queue, cap=min(room, SWEEP_CAP) if room is not None else SWEEP_CAP,
                executor_id=executor_id, application_version=version, names=names,
                after=turn.last)
            await self._start(claim)
            if claim.rows and claim.rows[-1][1] is not None:
                turn.served(claim.rows[-1][1])
            return len(claim.rows), None, False
        started = 0
        retry_at: int | None = None
        spent = False
        keys = await sysdb.queue_partitions(queue.name, SWEEP_CAP, turn.last)
        for index, key in enumerate(keys):
            partition_room = self._partition_room(key, fair_share(room, len(keys) - index))
            if partition_room == 0:
                continue
            claim = await sysdb.claim_queued(queue, key, room=partition_room,
                                             executor_id=executor_id,
                                             application_version=version, names=names)
            await self._start(claim)
            if claim.rows:
                turn.served(key)
            started += len(claim.rows)
            spent = spent or claim.spent
            if claim.retry_at_ms is not None:
                retry_at = min(retry_at or claim.retry_at_ms, claim.retry_at_ms)
            if room is not None:
                room -= len(claim.rows)
                if room <= 0:
                    break
        return started, retry_at, spent

    async def _report_unregistered(self) -> None:
        """Warn, once per function name, about ENQUEUED workflows on this queue that this
        executor would take but for their function, which it does not have: they are (rightly)
        left for an executor that has it, but nothing else would tell the user. One cheap
        indexed query, at most every ``UNREGISTERED_CHECK_INTERVAL`` seconds, and only
        after a claim round found nothing to start."""
        now = time.monotonic()
        if now < self._next_unregistered_check:
            return
        self._next_unregistered_check = now + max(UNREGISTERED_CHECK_INTERVAL,
                                                  self.queue.polling_interval_sec)
        runtime, unregistered = self.runtime, self.state.unregistered
        try:
            found = await runtime.system_database.unregistered_enqueued(
                self.queue.name, names=list(runtime.registry.workflows),
                known=sorted(unregistered), application_version=runtime.application_version)
        except Exception:
            logger.debug("Queue %s: checking for unregistered functions failed",
                         self.queue.name, exc_info=True)
            return
        for name, workflow_id in found:
            if name in unregistered:
                continue
            unregistered.add(name)
            warning = WorkflowNotRegisteredError(workflow_id, name, self.queue.name)
            runtime.queue_warnings.append(warning)
            logger.warning(
                "Queue %r holds ENQUEUED workflows of function %r (e.g. %s) that executor %s "
                "cannot run: the function is not registered here. They stay ENQUEUED until "
                "an executor that registers it dequeues them.",
                self.queue.name, name, workflow_id, runtime.executor_id)

    async def _start(self, claim: Claim) -> None:
        if not claim.rows:
            return
        # What the round's workflows report to, read once for all of them.
        telemetry = observe.current_telemetry()
        metrics.queue_waits(telemetry.instruments, self.queue.name,
                            (row.queued_ms for row, _ in claim.rows))
        for row, partition_key in claim.rows:
            await self._launch(row, partition_key, telemetry)

    async def _launch(self, row: WorkflowRow, partition_key: str | None,
                      telemetry: Telemetry) -> None:
        runtime = self.runtime
        sysdb = runtime.system_database
        workflow_id = row.workflow_id
        info = runtime.registry.workflows.get(row.name)
        assert row.owner_xid is not None
        try:
            if info is None:  # Filtered out by the claim; kept as a guard.
                raise DBOSError(f"Workflow {row.name!r} is not registered here")
            execution = await workflows.launch_claimed(runtime, info, row, telemetry)
        except DBOSError as error:
            # It cannot run anywhere as stored: record why, rather than retry forever.
            logger.error("Queued workflow %s cannot start: %s", workflow_id, error)
            try:  # in its row's format, if this executor writes it
                text = serialize_error(error, runtime.formats,
                                       row.serialization or PORTABLE_JSON)
            except SerializationError:
                text = serialize_error(error, PORTABLE_ONLY)
            with bind_shard_keys({workflow_id: row.shard_key}):
                await sysdb.record_outcome(workflow_id, row.owner_xid, error=text)
            self._freed()
            return
        if execution.result.done():  # refused its identity: ended without running
            self._freed()
            return
        running = keyed(workflow_id, row.shard_key)
        self.running[running] = partition_key
        execution.result.add_done_callback(functools.partial(self._recorded, running))
        # The slot is free as soon as the body is done: the next claim goes while the
        # outcomes are being written (the row stays PENDING under this execution's owner
        # token until they commit, so a shared concurrency budget still counts it). A run
        # that started always gets there, the executor's shutdown included.
        execution.on_body_end = functools.partial(self.finished, running)

    def finished(self, running: str) -> None:
        """A workflow of this loop ended (its body returned or raised, or its completion
        was announced): its worker slot is free, and its outcome is being written."""
        if running in self.running:
            del self.running[running]
            self._recording.add(running)
            self._freed()

    def _recorded(self, running: str, _result: object) -> None:
        """A workflow of this loop is settled here (its outcome written, or its run
        given up): it no longer counts against the outcomes being written."""
        self.finished(running)  # nothing, once its body's end was seen
        limit = self.queue.worker_concurrency
        behind = limit is not None and len(self._recording) > limit
        self._recording.discard(running)
        if behind:
            self._freed()

    def _freed(self) -> None:
        """A slot is free: wake this claim loop, and the queue's claim loops elsewhere, once
        for all the slots freed in this turn of the event loop (a claim's workflows end
        together)."""
        if self._announcing:
            return
        self._announcing = True
        asyncio.get_running_loop().call_soon(self._announce_freed)

    def _announce_freed(self) -> None:
        self._announcing = False
        self.runtime.system_database.notify(ENQUEUE_CHANNEL, self.queue.name)


def start_claim_loops(runtime: Runtime, queues: list[QueueRecord]) -> None:
    """Start a claim loop per queue, the queue watcher and the depth sampler, as tasks of
    the runtime's queue owner (stopped first on exit: nothing new starts while running
    workflows finish)."""
    if not queues:
        return
    fast = min(q.polling_interval_sec for q in queues)
    runtime.queue_poll = IdleBackoff(fast, runtime.config.idle_poll_max_interval)
    watcher = QueueWatcher(runtime, runtime.queue_poll, {q.name for q in queues})
    notifications = runtime.system_database.notifications
    assert notifications is not None
    notifications.subscribe(ENQUEUE_CHANNEL, watcher.on_notification)
    for queue in queues:
        state = runtime.claim_loops[queue.name] = ClaimLoopState(queue)
        loop = ClaimLoop(runtime, state, watcher)
        notifications.subscribe(WORKFLOW_COMPLETION_CHANNEL, loop.finished)
        runtime.queue_tasks.supervise(loop.run, f"queue claim loop {queue.name}")
    runtime.queue_tasks.supervise(watcher.run, "queue watcher")
    if runtime.system_database.depth_samples_table:
        sampler = DepthSampler(runtime, watcher, [q.name for q in queues])
        runtime.queue_tasks.supervise(sampler.run, "queue depth sampler")
