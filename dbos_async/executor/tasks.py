"""Task owners: every task the executor starts has one, which waits for it or cancels it.

Each owner is an anyio task group. The group runs in a host task of its own rather than in
the task that enters the executor, because ``async with dbos:`` may be entered in one task
and left in another (a pytest fixture's set-up and tear-down, a framework's lifespan), and
a task group must be left by the task that entered it.

What anyio guarantees here: a task spawned into an owner is cancelled and awaited before
:meth:`TaskOwner.close` returns (no task outlives its executor), the grace period is a
cancel scope (``move_on_after``), and the reaping is shielded, so a closer that is itself
cancelled still leaves nothing running. A task that fails is logged and does not take its
siblings down: the owner is a supervisor, not an all-or-nothing group.

A background task (listener, notifier, watcher, claim loop...) runs through
:meth:`TaskOwner.supervise`: on any unexpected error it is logged and started again, with
backoff, and its :class:`TaskHealth` says so, so no background task ever dies silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

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
    """What :meth:`dbos_async.DBOS.health` reports: the executor's state and each of its
    background tasks (notification listener, notifier, cancellation watcher, executor ID
    keeper, queue claim loops, queue watcher, scheduler, maintenance jobs).
    ``healthy`` holds while the executor runs and every one of them runs."""

    state: str
    executor_id: str | None
    tasks: tuple[TaskHealth, ...]

    @property
    def down(self) -> list[TaskHealth]:
        """The tasks that are not running (restarting after a failure, or stopped)."""
        return [task for task in self.tasks if task.state != "running"]

    @property
    def healthy(self) -> bool:
        return self.state == "running" and not self.down


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
        try:
            with self._scope:
                while True:
                    started = time.monotonic()
                    try:
                        await self._factory()
                        return
                    except Exception as error:
                        logger.exception("Background task %s failed; restarting it in %.1fs",
                                         self.name, delay)
                        health = self.health
                        self.health = TaskHealth(self.name, "restarting", health.restarts,
                                                 repr(error), time.time())
                    if time.monotonic() - started > RESTART_MAX_DELAY:
                        delay = RESTART_INITIAL_DELAY  # it ran a while: a fresh failure
                    await anyio.sleep(delay)
                    delay = min(delay * 2, RESTART_MAX_DELAY)
                    health = self.health
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
    """Starts tasks in one task group; on close, a grace period, then cancellation."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._group: TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._stop = anyio.Event()
        self._count = 0
        self._drained = anyio.Event()
        self._drained.set()
        self.closed = False
        self._supervised_tasks: list[SupervisedTask] = []

    async def open(self) -> None:
        """Start the host task and wait until its group accepts tasks."""
        ready = anyio.Event()
        self._host = asyncio.get_running_loop().create_task(self._host_group(ready),
                                                            name=f"{self.name} (task owner)")
        await ready.wait()

    async def _host_group(self, ready: anyio.Event) -> None:
        async with anyio.create_task_group() as group:
            self._group = group
            ready.set()
            await self._stop.wait()
            group.cancel_scope.cancel()
        self._group = None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` as a task of this owner (it inherits the caller's context)."""
        if self.closed or self._group is None:
            coro.close()
            raise RuntimeError("This executor is shutting down and starts no new tasks")
        if self._count == 0:
            self._drained = anyio.Event()
        self._count += 1
        self._group.start_soon(self._supervised, coro, name, name=name)

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

    async def _supervised(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        try:
            await coro
        except Exception:
            logger.exception("Task %s failed", name)
        finally:
            self._count -= 1
            if self._count == 0:
                self._drained.set()

    def __len__(self) -> int:
        return self._count

    async def close(self, grace_period: float) -> None:
        """Give the tasks up to ``grace_period`` seconds, then cancel and reap the rest.

        Tasks may still start others during the grace period (a workflow starting a child);
        those share what is left of it. Closing again is harmless.
        """
        try:
            with anyio.move_on_after(grace_period):
                while self._count:
                    await self._drained.wait()
        finally:
            # Even when the closer is cancelled while it waits, nothing is left running.
            self.closed = True
            self._stop.set()
            if self._host is not None:
                with anyio.CancelScope(shield=True):
                    await self._host
