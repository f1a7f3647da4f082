"""Ownership of background tasks: every task started here is waited for, or cancelled, on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger("dbos_async")

T = TypeVar("T")


class TaskOwner:
    """Starts tasks and, when closed, gives them a grace period before cancelling the rest."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        if self.closed:
            coro.close()
            raise RuntimeError("This executor is shutting down and starts no new tasks")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("Task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self, grace_period: float) -> None:
        """Wait up to ``grace_period`` seconds, then stop accepting tasks, cancel and reap.

        Tasks may still start others during the grace period (a workflow starting a child).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_period
        # Again while tasks remain: a task started during the wait gets the rest of the period.
        while self._tasks and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self._tasks), timeout=left)
        self.closed = True
        remaining = set(self._tasks)
        for task in remaining:
            task.cancel()
        if remaining:
            await asyncio.gather(*remaining, return_exceptions=True)
