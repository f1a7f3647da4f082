"""Task owners: every task the executor starts has one, which waits for it or cancels it.

Each task an owner spawns runs inside a cancel scope of its own, which the owner holds.
What that guarantees: a task spawned into an owner is cancelled and awaited before
:meth:`TaskOwner.close` returns (no task outlives its executor); cancellation is anyio's,
level-triggered (a task that swallows it is cancelled again at its next await) and stopped
by the shields the task sets up itself; the grace period is a cancel scope
(``move_on_after``), and the reaping is shielded, so a closer that is itself cancelled still
leaves nothing running. A task that fails is logged and does not take its siblings down:
the owner is a supervisor, not an all-or-nothing group. The tasks are plain asyncio tasks
of the loop, so any task may close the owner, whichever task spawned into it, and spawning
costs a workflow no more than a task and a scope.

A background task (listener, notifier, watcher, claim loop...) runs through
:meth:`TaskOwner.supervise`: on any unexpected error it is logged and started again, with
backoff, and its :class:`TaskHealth` says so, so no background task ever dies silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from dbos_async import _metrics as metrics
from dbos_async._sysdb.health import DatabaseHealth
from dbos_async._sysdb.records import VersionBacklog
from dbos_async._sysdb.repeats import Repeats

logger = logging.getLogger("dbos_async")

TaskState = Literal["running", "restarting", "stopped"]

RESTART_INITIAL_DELAY = 0.1
RESTART_MAX_DELAY = 5.0
"""Backoff of a failing background task's restarts: the delay doubles from the first to the
second, and starts over once the task ran longer than the second before failing."""


@dataclass(frozen=True)
class TaskHealth:
    """What one background task of an executor is doing.

    ``running``: it runs; ``restarting``: it failed and starts again after a backoff;
    ``stopped``: it ended by itself (e.g. a claim loop whose executor ID was taken) or with
    its executor. ``last_error`` is the ``repr`` of its latest failure (``None`` if it
    never failed), ``restarts`` how often it was started again.
    """

    name: str
    state: TaskState
    restarts: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    """Epoch seconds of ``last_error``."""


@dataclass(frozen=True)
class ExecutorHealth:
    """What :meth:`dbos_async.DBOS.health` reports: the executor's state, how its system
    database answers, whether its notification listener is connected, and each of its
    background tasks (notification listener, notifier, cancellation watcher, executor ID
    keeper, queue claim loops, queue watcher, scheduler, maintenance jobs).

    ``problems`` says in sentences what is wrong; ``healthy`` holds while the executor runs
    and nothing is; ``degraded`` while it runs with problems (it still serves what it can:
    workflows pause through an outage, waits poll without the listener).
    """

    state: str
    executor_id: str | None
    tasks: tuple[TaskHealth, ...]
    database: DatabaseHealth | None = None
    """None outside ``async with dbos:``."""
    listener: str | None = None
    """Why the notification listener is not connected (waits poll meanwhile); None while
    it is, or where LISTEN/NOTIFY is turned off."""
    waiting_versions: tuple[VersionBacklog, ...] = ()
    """The PENDING and ENQUEUED workflows of other application versions, per version, as
    last counted (at start, then every ``version_report_interval``): work this executor
    does not run. Not a problem of this executor (an older version's executors may still
    run it), but nothing runs it if none is left."""

    @property
    def down(self) -> list[TaskHealth]:
        """The tasks that are not running (restarting after a failure, or stopped)."""
        return [task for task in self.tasks if task.state != "running"]

    @property
    def problems(self) -> list[str]:
        """What is wrong, one sentence each (empty when nothing is)."""
        found = [] if self.database is None or self.database.problem is None \
            else [self.database.problem]
        if self.listener is not None:
            found.append(self.listener)
        found += [f"background task {task.name} is {task.state}"
                  + (f" ({task.last_error})" if task.last_error else "") for task in self.down]
        return found

    @property
    def healthy(self) -> bool:
        return self.state == "running" and not self.problems

    @property
    def degraded(self) -> bool:
        return self.state == "running" and bool(self.problems)


class SupervisedTask:
    """A background task restarted on failure; :meth:`stop` ends it for good."""

    def __init__(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._factory = factory
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self.health = TaskHealth(name, "running")

    async def run(self) -> None:
        delay = RESTART_INITIAL_DELAY
        repeats = Repeats(logger)
        try:
            with self._scope:
                while True:
                    started = time.monotonic()
                    try:
                        await self._factory()
                        return
                    except Exception as error:
                        repeats.log(logging.ERROR,
                                    "Background task %s failed; restarting it in %.1fs",
                                    self.name, delay, exc_info=True)
                        health = self.health
                        self.health = TaskHealth(self.name, "restarting", health.restarts,
                                                 repr(error), time.time())
                    if time.monotonic() - started > RESTART_MAX_DELAY:
                        delay = RESTART_INITIAL_DELAY  # it ran a while: a fresh failure
                    await anyio.sleep(delay)
                    delay = min(delay * 2, RESTART_MAX_DELAY)
                    health = self.health
                    metrics.task_restarted(self.name)
                    self.health = TaskHealth(self.name, "running", health.restarts + 1,
                                             health.last_error, health.last_error_at)
        finally:
            health = self.health
            self.health = TaskHealth(self.name, "stopped", health.restarts,
                                     health.last_error, health.last_error_at)
            self._done.set()

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended."""
        self._scope.cancel()
        with anyio.CancelScope(shield=True):
            await self._done.wait()


class TaskOwner:
    """Starts tasks, each in a cancel scope it holds; on close, a grace period, then
    cancellation."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._scopes: dict[asyncio.Task[None], anyio.CancelScope] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        # The tasks waiting in parked() blocks, and a wake-up for close() whenever a task
        # ends or parks.
        self._parked: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self.closed = False
        self._supervised_tasks: list[SupervisedTask] = []

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` as a task of this owner (it inherits the caller's context)."""
        if self.closed:
            coro.close()
            raise RuntimeError("This executor is shutting down and starts no new tasks")
        scope = anyio.CancelScope()
        task = asyncio.get_running_loop().create_task(self._owned(coro, scope, name),
                                                      name=name)
        self._scopes[task] = scope
        self._drained.clear()
        task.add_done_callback(self._forget)

    def supervise(self, factory: Callable[[], Coroutine[Any, Any, None]],
                  name: str) -> SupervisedTask:
        """Run ``factory()`` as a background task of this owner, started again (with
        backoff) whenever it raises; it ends when it returns, is stopped, or the owner
        closes. Its health is in :meth:`health`."""
        task = SupervisedTask(name, factory)
        self.spawn(task.run(), name)
        self._supervised_tasks.append(task)
        return task

    def health(self) -> list[TaskHealth]:
        """The health of every background task started with :meth:`supervise`."""
        return [task.health for task in self._supervised_tasks]

    @staticmethod
    async def _owned(coro: Coroutine[Any, Any, None], scope: anyio.CancelScope,
                     name: str) -> None:
        try:
            with scope:
                await coro
        except Exception:
            logger.exception("Task %s failed", name)

    def _forget(self, task: asyncio.Task[None]) -> None:
        del self._scopes[task]
        self._parked.discard(task)
        self._changed.set()
        if not self._scopes:
            self._drained.set()

    @contextlib.contextmanager
    def parked(self) -> Iterator[None]:
        """Within the block the calling task (one of this owner's) waits with nothing of
        its own to finish (a workflow in a durable sleep, ``recv`` or ``get_event``):
        closing cancels it at once instead of giving it the grace period."""
        task = asyncio.current_task()
        if task is None or task not in self._scopes:
            yield
            return
        self._parked.add(task)
        self._changed.set()
        try:
            yield
        finally:
            self._parked.discard(task)

    @property
    def busy(self) -> int:
        """How many tasks are not parked: what a closing grace period waits for."""
        return len(self._scopes) - len(self._parked)

    def __len__(self) -> int:
        return len(self._scopes)

    async def close(self, grace_period: float) -> None:
        """Give the tasks up to ``grace_period`` seconds, then cancel and reap the rest;
        parked tasks (see :meth:`parked`) are not waited for.

        Tasks may still start others during the grace period (a workflow starting a child);
        those share what is left of it. Closing again is harmless.
        """
        try:
            with anyio.move_on_after(grace_period):
                while self.busy:
                    self._changed.clear()
                    await self._changed.wait()
        finally:
            # Even when the closer is cancelled while it waits, nothing is left running.
            self.closed = True
            for scope in self._scopes.values():
                scope.cancel()
            with anyio.CancelScope(shield=True):
                while self._scopes:
                    await self._drained.wait()
