"""What the command line and the console show: an error whole (wrapped, not cut), a
closed stream as "closed" (not DBOS's internal marker), when a workflow started, an unknown
status refused as the command line refuses it, and configuration errors in our own words
(without pydantic's "Value error, " prefix)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from helpers import new_dbos

from dbos_async import DBOS, ConfigurationError, DBOSClient, SetWorkflowID
from dbos_async.console import console_app

CLI = str(Path(sys.executable).with_name("dbos-async"))

LONG_MESSAGE = ("the payment provider refused the charge after three attempts because the "
                "card was reported stolen; contact the customer before retrying — réessayer")


@pytest.fixture
async def dbos(database_url: str) -> AsyncIterator[DBOS]:
    dbos = new_dbos(database_url)

    @dbos.workflow(name="failing")
    async def failing() -> None:
        raise RuntimeError(LONG_MESSAGE)

    @dbos.workflow(name="streaming")
    async def streaming() -> None:
        await dbos.write_stream("log", "first")
        await dbos.close_stream("log")

    async with dbos:
        with SetWorkflowID("failing-1"), pytest.raises(RuntimeError):
            await failing()
        with SetWorkflowID("streaming-1"):
            await streaming()
        async with DBOSClient(system_database_url=database_url) as client:
            # On a queue no executor claims from: it stays ENQUEUED.
            await client.enqueue("nowhere", "streaming", workflow_id="queued-1")
        yield dbos


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBOS_")}
    env["COLUMNS"] = "80"
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60,
                          env=env, check=False)


async def test_workflow_get_shows_the_error_whole_and_wrapped(dbos: DBOS,
                                                             database_url: str) -> None:
    """It used to cut it at 60 characters ("...failed afte...")."""
    done = await asyncio.to_thread(run_cli, "workflow", "get", "failing-1",
                                   "--url", database_url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), done.stdout
    start = next(i for i, line in enumerate(lines) if line.startswith("Error:"))
    indent = lines[start].index("RuntimeError")
    shown = [lines[start][indent:]]
    for line in lines[start + 1:]:
        if not line.startswith(" " * indent):
            break
        shown.append(line.strip())
    assert " ".join(shown) == f"RuntimeError: {LONG_MESSAGE}"
    started = next(line for line in lines if line.startswith("Started (UTC):"))
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$", started)


async def test_the_console_shows_a_closed_stream_and_when_a_workflow_started(
        dbos: DBOS) -> None:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(console_app(dbos)),
                                  base_url="http://localhost:8000") as http:
        page = (await http.get("/workflow", params={"id": "streaming-1"})).text
        assert "__DBOS_STREAM_CLOSED__" not in page
        streams = page[page.index("<h2>Streams</h2>"):]
        assert "<em>closed</em>" in streams and "first" in streams
        started = re.search(r"<th>Started</th><td>([^<]*)</td>", page)
        assert started is not None and started.group(1).strip()
        # Still on its queue: not started.
        queued = (await http.get("/workflow", params={"id": "queued-1"})).text
        started = re.search(r"<th>Started</th><td>([^<]*)</td>", queued)
        assert started is not None and not started.group(1).strip()


async def test_list_stream_values_marks_the_close(dbos: DBOS) -> None:
    values = await dbos.list_stream_values("streaming-1")
    assert [(v.offset, v.value, v.closed) for v in values] == [
        (0, "first", False), (1, None, True)]


async def test_the_console_refuses_an_unknown_status_as_the_cli_does(
        dbos: DBOS, database_url: str) -> None:
    """It used to answer "No workflow matches"."""
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(console_app(dbos)),
                                  base_url="http://localhost:8000") as http:
        bogus = await http.get("/workflows", params={"status": "BOGUS"})
        assert bogus.status_code == 400
        assert "Unknown status &#39;BOGUS&#39;: choose from PENDING" in bogus.text
        lower = await http.get("/workflows", params={"status": "error"})
        assert lower.status_code == 200 and "failing-1" in lower.text
    refused = await asyncio.to_thread(run_cli, "workflow", "list", "--status", "BOGUS",
                                      "--url", database_url)
    assert refused.returncode == 2 and "BOGUS" in refused.stderr


@pytest.mark.parametrize(("url", "problem"), [
    ("mysql://app@db/app", "system_database_url must be a postgresql:// URL, got scheme"),
    ("postgresql://app@db:99999/app", "has an invalid port '99999'"),
])
def test_a_bad_url_is_refused_in_our_own_words(url: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        DBOS(system_database_url=url)
    message = str(raised.value)
    assert problem in message and "Value error" not in message
    done = run_cli("workflow", "list", "--url", url)
    assert done.returncode == 1 and problem in done.stderr
    assert "Value error" not in done.stderr


