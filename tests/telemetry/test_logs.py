"""Log records of workflow runs and step retries (``dbos_async/_executor/telemetry/logs.py``): their
loggers, levels and ``dbos_*`` record attributes, and :func:`dbos_async.log_to_stderr`."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers import new_dbos

from dbos_async import SetWorkflowID, SetWorkflowTimeout, WorkflowCancelledError, log_to_stderr


def records(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


async def test_start_and_finish_carry_the_workflow_and_its_outcome(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="dbos_async")
    dbos = new_dbos(database_url)

    @dbos.workflow(name="greet")
    async def greet(who: str) -> str:
        return f"hello {who}"

    @dbos.workflow(name="fail")
    async def fail() -> None:
        raise ValueError("bad 3")

    async with dbos:
        with SetWorkflowID("w-ok"):
            assert await greet("you") == "hello you"
        with SetWorkflowID("w-bad"), pytest.raises(ValueError):
            await fail()
    # Leaving the executor waits for every workflow task, so the finish records are in.
    started, ok, started_bad, bad = records(caplog, "dbos_async.workflows")
    assert (started.levelno, started.dbos_workflow_id, started.dbos_workflow_name) == (
        logging.DEBUG, "w-ok", "greet")
    assert started.getMessage() == "Workflow w-ok (greet) started"
    assert (ok.levelno, ok.dbos_workflow_id, ok.dbos_workflow_status) == (
        logging.DEBUG, "w-ok", "SUCCESS")
    assert isinstance(ok.dbos_duration_ms, float) and ok.dbos_duration_ms >= 0
    assert started_bad.dbos_workflow_id == "w-bad"
    assert (bad.levelno, bad.dbos_workflow_id, bad.dbos_workflow_name,
            bad.dbos_workflow_status) == (logging.WARNING, "w-bad", "fail", "ERROR")
    assert bad.getMessage().endswith(": ValueError: bad 3")


async def test_a_cancelled_workflow_is_reported_at_info(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dbos_async")
    dbos = new_dbos(database_url)

    @dbos.workflow(name="slow")
    async def slow() -> None:
        await dbos.sleep(30)

    async with dbos:
        with SetWorkflowID("w-late"), SetWorkflowTimeout(0.2), \
                pytest.raises(WorkflowCancelledError):
            await slow()
    [cancelled] = records(caplog, "dbos_async.workflows")  # no DEBUG start at INFO
    assert (cancelled.levelno, cancelled.dbos_workflow_id, cancelled.dbos_workflow_status) == (
        logging.INFO, "w-late", "CANCELLED")


async def test_a_step_retry_names_the_workflow_step_and_attempt(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dbos_async")
    dbos = new_dbos(database_url)
    calls = 0

    @dbos.step(name="flaky", retries=3, retry_interval=0.01)
    async def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError(f"try {calls}")
        return calls

    @dbos.step(name="first")
    async def first() -> None:
        pass

    @dbos.workflow(name="retrying")
    async def retrying() -> int:
        await first()
        return await flaky()

    async with dbos:
        with SetWorkflowID("w-retry"):
            assert await retrying() == 3
        assert await flaky() == 4  # outside a workflow: retried too, no workflow to name
    retries = records(caplog, "dbos_async.steps")
    assert [(r.levelno, r.dbos_workflow_id, r.dbos_step_id, r.dbos_step_name,
             r.dbos_step_attempt) for r in retries] == [
        (logging.WARNING, "w-retry", 1, "flaky", 1), (logging.WARNING, "w-retry", 1, "flaky", 2)]
    assert retries[0].getMessage() == (
        "Step flaky of workflow w-retry failed (attempt 1 of 4), retrying in 0.01s: "
        "ConnectionError('try 1')")


@pytest.fixture
def dbos_logger() -> Iterator[logging.Logger]:
    """The ``dbos_async`` logger, its handlers and level restored after the test."""
    logger = logging.getLogger("dbos_async")
    handlers, level = list(logger.handlers), logger.level
    try:
        yield logger
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)


def test_log_to_stderr_adds_one_handler_at_the_level(
    dbos_logger: logging.Logger, capsys: pytest.CaptureFixture[str],
) -> None:
    before = list(dbos_logger.handlers)
    log_to_stderr(logging.DEBUG)
    handler = log_to_stderr()  # again: replaces its handler, INFO by default
    assert dbos_logger.handlers == [*before, handler]
    assert dbos_logger.level == logging.INFO
    logging.getLogger("dbos_async.workflows").debug("hidden")
    logging.getLogger("dbos_async.workflows").info("shown %s", 1)
    err = capsys.readouterr().err
    assert "hidden" not in err
    assert err.count("INFO dbos_async.workflows: shown 1") == 1


def test_importing_configures_no_logging() -> None:
    code = ("import logging, dbos_async; "
            "print(logging.getLogger().handlers, logging.getLogger('dbos_async').handlers, "
            "logging.getLogger('dbos_async').level)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[] [] 0"
