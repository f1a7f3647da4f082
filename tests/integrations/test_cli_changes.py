"""The command line's changes in place, run as the installed console script: a queued
workflow's priority, delay and attributes, a page of steps, a stored queue's settings, and
an application's rename; bad input is one line and exit status 1 (or 2 for usage)."""

from __future__ import annotations

import json
import subprocess

from helpers import fetch, new_dbos, workflow_row

from dbos_async import DBOSClient, SetWorkflowID
from tests.integrations.test_cli import cli, failed, ok, table_rows


async def test_priority_delay_and_attributes(database_url: str) -> None:
    async with new_dbos(database_url):
        pass
    async with DBOSClient(database_url, pool_size=2) as client:
        await client.enqueue("parked", "job", workflow_id="waiting", attributes={"a": 1})
    url = ("--url", database_url)
    assert ok(await cli("workflow", "set-priority", "waiting", "9", *url)) == (
        "waiting now has priority 9\n")
    assert ok(await cli("workflow", "set-delay", "waiting", "--until", "4102444800000",
                        *url)) == "waiting is delayed\n"
    ok(await cli("workflow", "set-attributes", "waiting", '{"b": [2]}', "--merge", *url))
    row = await workflow_row(database_url, "waiting")
    assert row is not None
    assert (row["priority"], row["status"], row["delay_until_epoch_ms"],
            json.loads(row["attributes"])) == (9, "DELAYED", 4102444800000,
                                               {"a": 1, "b": [2]})
    ok(await cli("workflow", "set-attributes", "waiting", "null", *url))
    assert (await workflow_row(database_url, "waiting"))["attributes"] is None  # type: ignore[index]

    assert "does not exist" in failed(await cli("workflow", "set-priority", "nope", "1",
                                                *url))
    assert "priority must be an integer" in failed(
        await cli("workflow", "set-priority", "waiting", "2147483648", *url))
    assert "exactly one" in failed(await cli("workflow", "set-delay", "waiting", *url))
    assert "not JSON" in run_usage(await cli("workflow", "set-attributes", "waiting", "{",
                                             *url))


def run_usage(result: subprocess.CompletedProcess[str]) -> str:
    """The message of a usage error (exit status 2)."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    return result.stderr


async def test_steps_page(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step(name="square")
    async def square(x: int) -> int:
        return x * x

    @dbos.workflow(name="four")
    async def four() -> None:
        for x in range(4):
            await square(x)

    async with dbos:
        with SetWorkflowID("four"):
            await four()
    steps = json.loads(ok(await cli("workflow", "steps", "four", "--limit", "2", "--offset",
                                    "1", "--json", "--url", database_url)))
    assert [(s["function_id"], s["output"]) for s in steps] == [(1, 1), (2, 4)]
    rows = table_rows(ok(await cli("workflow", "steps", "four", "--offset", "3",
                                   "--no-output", "--url", database_url)))
    assert len(rows) == 2 and rows[1][:3] == ["3", "square", "null"]


async def test_queue_get_update_delete(database_url: str) -> None:
    async with new_dbos(database_url):
        pass
    async with DBOSClient(database_url, pool_size=2) as client:
        await client.register_queue("emails", concurrency=5, limiter=(10, 60.0))
    url = ("--url", database_url)
    shown = json.loads(ok(await cli("queue", "get", "emails", "--json", *url)))
    assert (shown["concurrency"], shown["rate_limit"]) == (5, {"limit": 10, "period": 60.0})
    updated = json.loads(ok(await cli("queue", "update", "emails", "--worker-concurrency",
                                      "2", "--remove", "rate-limit", "--json", *url)))
    assert (updated["concurrency"], updated["worker_concurrency"],
            updated["rate_limit"]) == (5, 2, None)
    lines = ok(await cli("queue", "update", "emails", "--rate-limit", "50/60", *url))
    assert "Rate:" in lines and "50/60s" in lines
    assert "exceeds concurrency" in failed(
        await cli("queue", "update", "emails", "--worker-concurrency", "9", *url))
    assert "Nothing to change" in run_usage(await cli("queue", "update", "emails", *url))
    assert ok(await cli("queue", "delete", "emails", *url)) == "Deleted queue emails\n"
    assert "'emails'" in failed(await cli("queue", "get", "emails", *url))
    assert "'emails'" in failed(await cli("queue", "delete", "emails", *url))


async def test_application_rename(database_url: str) -> None:
    dbos = new_dbos(database_url, application_name="alpha")
    dbos.queue("alpha-jobs")
    async with dbos:
        pass
    moved = json.loads(ok(await cli("application", "rename", "gamma", "--from", "alpha",
                                    "--json", "--url", database_url)))
    assert moved["queues"] == moved["application_versions"] == 1
    owners = {r["application_name"] for r in await fetch(
        database_url, "SELECT application_name FROM dbos.queues WHERE name = 'alpha-jobs'")}
    assert owners == {"gamma"}
    assert "Nothing to rename" in failed(await cli("application", "rename", "gamma",
                                                   "--url", database_url))
