"""Failover: a live executor takes over the PENDING workflows of a dead one.

Every executor holds its ID's advisory lock on a connection of its own for its lifetime
(:mod:`dbos_async._sysdb.executor_ids`), so an ID whose lock is free has no live process,
and knowing who is alive costs no heartbeat writes. Every ``failover_after / 2`` seconds
the watcher lists the other executor IDs with PENDING workflows of this version (one
statement over the partial index of PENDING rows; when nothing is in flight elsewhere, it
is the only statement) and tries the lock of each. While a scan finds no such ID, the
next one waits twice as long, up to ``idle_poll_max_interval`` (an idle system stays
quiet); any ID found, or a notification that an executor which ran nothing started a
workflow, brings it back to ``failover_after / 2``. An ID found free on two
scans in a row is dead: the watcher holds its lock, so no process can claim that ID
meanwhile, and runs recovery for it (:func:`~dbos_async._executor.recovery.recover_pending`):
its queued workflows go back to their queues, the others are claimed for this executor under fresh
owner tokens and resumed from their checkpoints. Then it lets the lock go.

Why this is exactly once: the claim is one UPDATE of rows still PENDING under the dead ID,
so of several executors taking over at once each row goes to one of them; the new owner
token fences off any execution of the old process that still runs (a network-partitioned
zombie fails its next checkpoint). Why a live executor's workflows are never taken: its lock
is held. Two scans rather than one give a live executor whose lock connection dropped the
time to re-acquire its ID (it does so at once) before its work is judged abandoned.

The bound: a process that exits or is killed frees its lock when its session ends
(immediately; a vanished machine or a partition after the lock session's TCP keepalives,
about 25 s, see :data:`~dbos_async._sysdb.statements.executor_ids.HALF_OPEN_BOUND_SECONDS`),
and its workflows are claimed within ``failover_after`` seconds of that (if the notification
of its first workflow was lost, as while the listener reconnects, the scans may come up to
``idle_poll_max_interval`` late).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from dbos_async._executor import recovery
from dbos_async._executor.backoff import IdleBackoff
from dbos_async._executor.runtime import EXECUTOR_BUSY_KEY, Runtime
from dbos_async._sysdb.executor_ids import ExecutorIdLock
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async._sysdb.repeats import Repeats
from dbos_async.errors import DBOSError

logger = logging.getLogger("dbos_async")

SCANS_PER_BOUND = 2
"""Scans within ``failover_after``: a dead ID is seen free on one, taken on the next."""


def start(runtime: Runtime) -> None:
    """Watch the other executors (a background task), unless ``failover_after`` is None."""
    after, lock = runtime.config.failover_after, runtime.executor_lock
    if after is None or lock is None:
        return
    poll = runtime.failover_poll = IdleBackoff(after / SCANS_PER_BOUND,
                                               runtime.config.idle_poll_max_interval)
    busy_elsewhere = asyncio.Event()

    def on_notification(key: str) -> None:
        if key == EXECUTOR_BUSY_KEY and poll.reset():
            busy_elsewhere.set()  # the backed-off wait ends now

    notifications = runtime.system_database.notifications
    if notifications is not None:
        notifications.subscribe(ENQUEUE_CHANNEL, on_notification)
    runtime.background.supervise(
        functools.partial(_watch, runtime, lock, poll, busy_elsewhere), "failover")


async def _watch(runtime: Runtime, lock: ExecutorIdLock, poll: IdleBackoff,
                 busy_elsewhere: asyncio.Event) -> None:
    suspects: set[str] = set()
    repeats = Repeats(logger)
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(busy_elsewhere.wait(), poll.interval)
        busy_elsewhere.clear()
        try:
            suspects, busy = await scan(runtime, lock, suspects)
            poll.polled(busy)
            repeats.reset()
        except DBOSError as error:
            poll.reset()
            repeats.log(logging.WARNING, "Failover scan failed (retried in %.1f s): %s",
                        poll.fast, error)
            suspects = set()
        except Exception:
            # One failed round must not end failover for the executor's lifetime.
            poll.reset()
            logger.exception("Failover scan failed unexpectedly (retried in %.1f s)",
                             poll.fast)
            suspects = set()


async def scan(runtime: Runtime, lock: ExecutorIdLock,
               suspects: set[str]) -> tuple[set[str], bool]:
    """One round: take over the workflows of the ``suspects`` (found free last round) whose
    lock is still free; return the IDs found free for the first time, and whether any other
    executor has PENDING workflows of this version (or this one's ID is in doubt): then
    the next round comes soon."""
    runtime.failover_scans += 1
    if lock.state != "held":
        return set(), True  # not while this executor's own ID is in doubt
    sysdb = runtime.system_database
    free: set[str] = set()
    others = await sysdb.executors_with_pending(runtime.application_version,
                                                runtime.executor_id)
    for executor_id in others:
        if executor_id not in suspects:
            if await lock.is_free(executor_id):
                free.add(executor_id)
            continue
        async with lock.holding_other(executor_id) as held:
            if held:
                logger.warning("Executor %s is gone: taking over its pending workflows",
                               executor_id)
                await recovery.recover_pending(runtime, from_executor_id=executor_id)
    return free, bool(others)
