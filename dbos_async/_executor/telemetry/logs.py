"""Log records of workflow runs and step retries.

Two loggers under ``dbos_async``: ``dbos_async.workflows`` (a run's start and finish) and
``dbos_async.steps`` (retries). A busy service runs many workflows, so a run that goes well
is logged at DEBUG only; what an operator should hear of is louder: a cancelled or
interrupted run at INFO, a failed run and a retried step at WARNING. Each record carries
what it is about as attributes (``extra``) named ``dbos_*``, which never collide with
:class:`logging.LogRecord`'s own and which JSON formatters emit as fields.
"""

from __future__ import annotations

import logging
import sys

from dbos_async._executor.context import workflow_of_step
from dbos_async.statuses import WorkflowStatusString

workflow_logger = logging.getLogger("dbos_async.workflows")
step_logger = logging.getLogger("dbos_async.steps")

SUCCESS, ERROR = WorkflowStatusString.SUCCESS.value, WorkflowStatusString.ERROR.value
CANCELLED, PENDING = WorkflowStatusString.CANCELLED.value, WorkflowStatusString.PENDING.value
_FINISH_LEVELS = {SUCCESS: logging.DEBUG, CANCELLED: logging.INFO, PENDING: logging.INFO,
                  ERROR: logging.WARNING}


def workflow_started(workflow_id: str, name: str, recorded_steps: int) -> None:
    if not workflow_logger.isEnabledFor(logging.DEBUG):
        return
    resumed = f", resuming after {recorded_steps} recorded steps" if recorded_steps else ""
    workflow_logger.debug("Workflow %s (%s) started%s", workflow_id, name, resumed,
                          extra={"dbos_workflow_id": workflow_id, "dbos_workflow_name": name})


def workflow_finished(workflow_id: str, name: str, status: str, duration_ms: float,
                      error: BaseException | None) -> None:
    """The outcome of a run here: ``PENDING`` when the executor's shutdown interrupted it
    (it resumes on recovery)."""
    level = _FINISH_LEVELS[status]
    if not workflow_logger.isEnabledFor(level):
        return
    how = {SUCCESS: "succeeded", ERROR: "failed", CANCELLED: "was cancelled",
           PENDING: "was interrupted by shutdown (stays PENDING)"}[status]
    workflow_logger.log(
        level, "Workflow %s (%s) %s after %.1f ms%s", workflow_id, name, how, duration_ms,
        f": {type(error).__name__}: {error}" if status == ERROR and error else "",
        extra={"dbos_workflow_id": workflow_id, "dbos_workflow_name": name,
               "dbos_workflow_status": status, "dbos_duration_ms": round(duration_ms, 3)},
    )


def step_retrying(name: str, step_id: int | None, attempt: int, attempts: int, delay: float,
                  error: BaseException) -> None:
    """A step's attempt ``attempt`` (from 1) of ``attempts`` failed; the next follows in
    ``delay`` seconds."""
    if not step_logger.isEnabledFor(logging.WARNING):
        return
    extra: dict[str, object] = {"dbos_step_name": name, "dbos_step_attempt": attempt}
    workflow = workflow_of_step()
    where = ""
    if workflow is not None:
        extra["dbos_workflow_id"] = workflow.workflow_id
        where = f" of workflow {workflow.workflow_id}"
    if step_id is not None:
        extra["dbos_step_id"] = step_id
    step_logger.warning("Step %s%s failed (attempt %d of %d), retrying in %.2fs: %r",
                        name, where, attempt, attempts, delay, error, extra=extra)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`log_to_stderr` adds (told apart from the application's own)."""


def log_to_stderr(level: int | str = logging.INFO) -> logging.Handler:
    """Show dbos_async's records at ``level`` and above on standard error, for an
    application that configures no logging of its own (uvicorn's default configuration
    sets up only uvicorn's loggers). Records still propagate to the root logger. Calling it
    again replaces the handler it added; returns the handler (remove it to undo)."""
    logger = logging.getLogger("dbos_async")
    for previous in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(previous)
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
