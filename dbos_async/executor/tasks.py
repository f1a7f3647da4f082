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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import anyio
from anyio.abc import TaskGroup

logger = logging.getLogger("dbos_async")


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
