"""Stopping cancelled workflows promptly: interruptible regions and one watcher per executor.

A cancelled workflow stops at its next checkpoint anyway (every fenced write fails on a
CANCELLED row). What the watcher adds is promptness: a step running for minutes, or a wait
in ``recv``/``get_event``/``sleep``, runs inside a :class:`Region`; the watcher cancels the
asyncio task of each region of a workflow it finds CANCELLED, and the region turns that
into :class:`~dbos_async.errors.WorkflowCancelledError` (as ``asyncio.timeout`` turns its
cancellation into ``TimeoutError``). A step declared ``cancellable=False`` is not
interrupted: it finishes, and its result is discarded at the checkpoint.

The watcher is one task for every running workflow of the executor. It is woken by
notifications on :data:`~dbos_async._sysdb.notifications.WORKFLOW_CANCEL_CHANNEL` (sent
after a cancel commits, by any dbos_async executor or client), and while regions exist it
also polls for cancellations by clients that do not notify: every
``cancellation_poll_interval`` while new regions start, doubling after each read that finds
nothing up to ``idle_poll_max_interval`` (a long step costs little). An idle executor (no
regions) issues no statement.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from types import TracebackType
from typing import Protocol

from dbos_async._executor.backoff import IdleBackoff
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.notifications import WORKFLOW_CANCEL_CHANNEL, Supervise, keyed
from dbos_async._sysdb.repeats import Repeats
from dbos_async._sysdb.shard_keys import bind_shard_keys
from dbos_async.errors import WorkflowCancelledError

logger = logging.getLogger("dbos_async")

_CANCEL_MESSAGE = "dbos_async: the workflow was cancelled"


class Execution(Protocol):
    """What the watcher needs of one execution of a workflow (its context)."""

    workflow_id: str
    shard_key: str | None
    cancelled: bool


def _waiter(ctx: Execution) -> str:
    # IDs repeat across shard keys: executions are told apart as notifications name them.
    return keyed(ctx.workflow_id, ctx.shard_key)


class Region:
    """A stretch of a workflow (a step, a wait) that the watcher may interrupt."""

    def __init__(self, watcher: CancellationWatcher, ctx: Execution,
                 cancellable: bool) -> None:
        self._watcher = watcher
        self.ctx = ctx
        self.waiter = _waiter(ctx)
        self.cancellable = cancellable
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._interrupted = False

    def interrupt(self) -> None:
        self.ctx.cancelled = True
        if self.cancellable and not self._interrupted and self._task is not None:
            self._interrupted = True
            self._task.cancel(_CANCEL_MESSAGE)

    def __enter__(self) -> Region:
        if self.ctx.cancelled:
            raise WorkflowCancelledError(self.ctx.workflow_id)
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._watcher._add(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._watcher._remove(self)
        # Ours to absorb only if nobody else (shutdown, a deadline) cancelled the task too.
        if (self._interrupted and self._task is not None
                and self._task.uncancel() <= self._cancelling
                and exc_type is asyncio.CancelledError):
            raise WorkflowCancelledError(self.ctx.workflow_id) from None


class CancellationWatcher:
    """The regions running in this executor, and the task that interrupts cancelled ones."""

    def __init__(self, backoff: IdleBackoff) -> None:
        self.backoff = backoff
        # Both by waiter key (see sysdb.notifications.keyed).
        self._regions: dict[str, set[Region]] = {}
        # Every execution running here, so a cancel marks even one between steps.
        self._contexts: dict[str, list[Execution]] = {}
        self._suspects: set[str] = set()
        self._event = asyncio.Event()
        # Whether the watcher waits without its poll timer (no regions when it began): the
        # first region must wake it then, and only then.
        self._waiting_untimed = False
        self.polls = 0
        """How many status reads the watcher made (for tests and diagnostics)."""
        self._repeats = Repeats(logger)

    def region(self, ctx: Execution, cancellable: bool = True) -> Region:
        return Region(self, ctx, cancellable)

    def attach(self, ctx: Execution) -> None:
        self._contexts.setdefault(_waiter(ctx), []).append(ctx)

    def detach(self, ctx: Execution) -> None:
        waiter = _waiter(ctx)
        contexts = self._contexts.get(waiter)
        if contexts is None:
            return
        if len(contexts) == 1 and contexts[0] is ctx:  # the common case: its only one here
            del self._contexts[waiter]
            return
        contexts[:] = [c for c in contexts if c is not ctx]
        if not contexts:
            del self._contexts[waiter]

    def _add(self, region: Region) -> None:
        self._regions.setdefault(region.waiter, set()).add(region)
        # Work: the next read comes at the fast interval. A watcher waiting without a timeout,
        # or on a backed-off one, starts its timer again; one already timing its poll at the
        # fast interval is left alone (waking it at every step would restart the timer, and
        # the poll might never come).
        if self.backoff.reset() or self._waiting_untimed:
            self._waiting_untimed = False
            self._event.set()

    def _remove(self, region: Region) -> None:
        regions = self._regions.get(region.waiter)
        if regions is not None:
            regions.discard(region)
            if not regions:
                del self._regions[region.waiter]

    def on_notification(self, waiter: str) -> None:
        """A cancel notification (local or from another process)."""
        if waiter in self._regions:
            self.backoff.reset()
            self._suspects.add(waiter)
            self._event.set()

    def interrupt(self, waiters: set[str]) -> None:
        """Stop the executions of these (cancelled) workflows running here, named by their
        waiter keys: interrupt their regions, and mark them so no further step or wait
        starts."""
        for waiter in waiters:
            for ctx in self._contexts.get(waiter, ()):
                ctx.cancelled = True
            for region in list(self._regions.get(waiter, ())):
                region.interrupt()

    async def _cancelled_among(self, sysdb: SystemDatabase, waiters: set[str]) -> set[str]:
        """Which of these running executions' workflows are CANCELLED: one read per key."""
        by_key: dict[str | None, dict[str, str]] = {}
        for waiter in waiters:
            for region in self._regions.get(waiter, ()):
                ctx = region.ctx
                by_key.setdefault(ctx.shard_key, {})[ctx.workflow_id] = waiter
                break
        cancelled: set[str] = set()
        for key, ids in by_key.items():
            with bind_shard_keys(dict.fromkeys(ids, key)):
                found = await sysdb.cancelled_among(sorted(ids))
            cancelled |= {ids[workflow_id] for workflow_id in found}
        return cancelled

    def start(self, sysdb: SystemDatabase, supervise: Supervise) -> None:
        """Subscribe to cancel notifications and start the watcher (a background task)."""
        if sysdb.notifications is not None:
            sysdb.notifications.subscribe(WORKFLOW_CANCEL_CHANNEL, self.on_notification)
        supervise(functools.partial(self._run, sysdb), "cancellation watcher")

    async def _run(self, sysdb: SystemDatabase) -> None:
        while True:
            timed_out = False
            if not self._suspects:
                self._waiting_untimed = not self._regions
                try:
                    async with asyncio.timeout(self.backoff.interval if self._regions
                                               else None):
                        await self._event.wait()
                except TimeoutError:
                    timed_out = True
            self._event.clear()
            if self._suspects:
                ids = self._suspects & set(self._regions)
                self._suspects.clear()
            elif timed_out:
                ids = set(self._regions)
            else:
                continue  # regions appeared: wait again, now with the poll timer
            if not ids:
                continue
            try:
                self.polls += 1
                cancelled = await self._cancelled_among(sysdb, ids)
            except Exception as error:  # the database is down: try again next round
                self._repeats.log(logging.WARNING,
                                  "The cancellation watcher could not read statuses: %r", error)
                continue
            self._repeats.reset()
            if timed_out:
                self.backoff.polled(bool(cancelled))
            if cancelled:
                logger.info("Interrupting cancelled workflows: %s", ", ".join(sorted(cancelled)))
                self.interrupt(cancelled)
