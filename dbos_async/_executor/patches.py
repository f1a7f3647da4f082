"""Workflow patches: let changed workflow code take a new path for new executions while
executions recorded before the change replay the old one.

``await dbos.patch("name")`` marks a code change at the workflow's next step position:

- no checkpoint there yet (a new execution, or one that had not got this far): record a
  ``DBOS.patch-<name>`` checkpoint at that position and return True (take the new path);
- the checkpoint there is this patch marker (a replay of a patched execution): consume the
  position and return True;
- another checkpoint there (a replay of an execution from before the patch): return False
  (take the old path) and consume nothing, so the old path's steps keep their positions.

``await dbos.deprecate_patch("name")``, for once no execution from before the patch is
left: always True; it consumes the position only if the marker is there, and records none.

The decision is taken when the call is made (from the checkpoints loaded when the
execution started), before anything is awaited, like every step position.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from dbos_async._executor.context import WorkflowContext

PATCH_PREFIX = "DBOS.patch-"


def marker_name(name: str) -> str:
    return f"{PATCH_PREFIX}{name}"


async def _value(value: bool) -> bool:
    return value


async def _record(ctx: WorkflowContext, step_id: int, marker: str) -> bool:
    started = ctx.runtime.system_database.clock.now_ms()
    existing = await ctx.runtime.system_database.record_step(
        ctx.workflow_id, step_id, marker, ctx.owner_xid, output=None, error=None,
        started_at_ms=started, completed_at_ms=started,
    )
    # An existing record with another name raised NondeterminismError already.
    return existing is None or existing.function_name == marker


def patch(ctx: WorkflowContext, name: str) -> Coroutine[Any, Any, bool]:
    marker = marker_name(name)
    step_id = ctx.next_step_id
    recorded = ctx.checkpoints.get(step_id)
    if recorded is not None and recorded.function_name != marker:
        return _value(False)
    if recorded is None:
        ctx.recorded(step_id, marker)  # a replay check ends here: it would record one
    ctx.allocate_step_id()
    if recorded is not None:
        return _value(True)
    return _record(ctx, step_id, marker)


def deprecate_patch(ctx: WorkflowContext, name: str) -> Coroutine[Any, Any, bool]:
    recorded = ctx.checkpoints.get(ctx.next_step_id)
    if recorded is not None and recorded.function_name == marker_name(name):
        ctx.allocate_step_id()
    return _value(True)
