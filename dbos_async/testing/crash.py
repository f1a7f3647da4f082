"""Crash an executor in the middle of a workflow and recover it, inside one test.

A test marks where the crash happens by awaiting :meth:`CrashSimulator.point` in code a step
runs (typically a fake of a service the step calls). :meth:`CrashSimulator.run` starts the
workflow, waits until it reaches that point, stops the executor there without a grace period
(the workflow is left ``PENDING`` with the checkpoints recorded so far, as a dead process
leaves it), enters the executor again (recovery resumes the workflow from its checkpoints)
and returns the recovered workflow's result. The point blocks until the crash, so where the
workflow stops never depends on timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast

from dbos_async._executor.dbos import DBOS
from dbos_async._executor.lifecycle import close_runtime

P = ParamSpec("P")
R = TypeVar("R")


class CrashSimulator:
    """Crashes ``dbos`` (an entered executor) once, where the workflow awaits :meth:`point`,
    then recovers it. ``crashed`` tells whether the crash has happened."""

    def __init__(self, dbos: DBOS) -> None:
        self._dbos = dbos
        self._reached = asyncio.Event()
        self.crashed = False

    async def point(self) -> None:
        """Where the executor crashes: the first execution to get here stops here (until
        the crash cancels it); once the executor has crashed, it returns at once."""
        if self.crashed:
            return
        self._reached.set()
        await asyncio.Event().wait()

    async def run(self, workflow: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args,
                  **kwargs: P.kwargs) -> R:
        """Start ``workflow(*args, **kwargs)``, crash when it reaches :meth:`point`, recover,
        and return its result (or raise its error). Fails if the workflow finishes without
        reaching the point: a crash test that never crashed proves nothing."""
        if self.crashed:
            raise RuntimeError("This CrashSimulator has already crashed its executor once")
        handle = await self._dbos.start_workflow(workflow, *args, **kwargs)
        reached = asyncio.ensure_future(self._reached.wait())
        finished = asyncio.ensure_future(handle.get_result())
        await asyncio.wait({reached, finished}, return_when=asyncio.FIRST_COMPLETED)
        if not reached.done():
            reached.cancel()
            outcome = (f"raised {finished.exception()!r}" if finished.exception() is not None
                       else f"returned {finished.result()!r}")
            raise AssertionError(
                f"Workflow {handle.workflow_id} finished without reaching the crash point "
                f"(it {outcome}): await the CrashSimulator's point() in a step it runs")
        finished.cancel()  # only this wait: the workflow's result is shielded from it
        await self.crash_and_recover()
        recovered = await self._dbos.retrieve_workflow(handle.workflow_id)
        return cast(R, await recovered.get_result())

    async def crash_and_recover(self) -> None:
        """Stop the executor now, without a grace period: running workflows stop where they
        are and stay ``PENDING``. Then enter it again: recovery resumes them."""
        self.crashed = True
        await close_runtime(self._dbos._current_runtime, grace_period=0)
        await self._dbos.__aenter__()
