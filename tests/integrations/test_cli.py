"""The ``dbos-async`` command line tool, run as the installed console script in a subprocess
against a database that a real executor (or client) filled: each command's output and exit
status, ``--json`` parsed back, unknown IDs and unreachable databases."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from helpers import new_dbos, unique_name

from dbos_async import (
    DBOS,
    DBOSClient,
    SetShardKey,
    SetWorkflowID,
    WorkflowCancelledError,
)

CLI = str(Path(sys.executable).with_name("dbos-async"))


def run_cli(*args: str, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``dbos-async`` with ``args``; no DBOS_* setting leaks in from this process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DBOS_")}
    clean.update(env or {})
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=clean, check=False)


async def cli(*args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    """:func:`run_cli` without blocking the event loop an executor runs on."""
    return await asyncio.to_thread(run_cli, *args, **options)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """The one-line error of a failed command (and no traceback, no output)."""
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def table_rows(output: str) -> list[list[str]]:
    """A printed table's rows (header first), split on runs of two or more spaces (so an
    empty cell disappears)."""
    return [re.split(r"\s{2,}", line.strip()) for line in output.strip().splitlines()]


@dataclass
class Shop:
    """An executor with a two-step workflow, a failing one and one held at a gate."""

    dbos: DBOS
    charges: Counter[str] = field(default_factory=Counter)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    at_gate: asyncio.Event = field(default_factory=asyncio.Event)


def make_shop(url: str, version: str = "v1", **settings: Any) -> Shop:
    shop = Shop(new_dbos(url, application_version=version, **settings))
    dbos = shop.dbos

    @dbos.step(name="charge")
    async def charge(order: str) -> int:
        shop.charges[order] += 1
        return 42

    @dbos.step(name="ship")
    async def ship(order: str) -> str:
        return f"shipment-{order}"

    @dbos.workflow(name="checkout")
    async def checkout(order: str) -> str:
        await charge(order)
        return await ship(order)

    @dbos.workflow(name="broken")
    async def broken() -> None:
        raise ValueError("bad 3")

    @dbos.step(name="wait_at_gate")
    async def wait_at_gate() -> None:
        shop.at_gate.set()
        await shop.gate.wait()

    @dbos.workflow(name="gated")
    async def gated() -> str:
        await wait_at_gate()
        return "through"

    shop.checkout, shop.broken, shop.gated = checkout, broken, gated  # type: ignore[attr-defined]
    return shop


@pytest.fixture
async def shop(database_url: str) -> AsyncIterator[Shop]:
    """The shop's executor, entered, with order-1, order-2 and broken-1 finished."""
    shop = make_shop(database_url, shutdown_grace_period=0)
    async with shop.dbos:
        for order in ("order-1", "order-2"):
            with SetWorkflowID(order):
                await shop.checkout(order)  # type: ignore[attr-defined]
        with SetWorkflowID("broken-1"), pytest.raises(ValueError):
            await shop.broken()  # type: ignore[attr-defined]
        yield shop


async def test_workflow_list_table_and_json(shop: Shop, database_url: str) -> None:
    rows = table_rows(ok(await cli("workflow", "list", "--url", database_url)))
    assert rows[0] == ["WORKFLOW ID", "STATUS", "NAME", "QUEUE", "CREATED (UTC)"]
    # Newest first by default.
    assert [r[:3] for r in rows[1:]] == [["broken-1", "ERROR", "broken"],
                                         ["order-2", "SUCCESS", "checkout"],
                                         ["order-1", "SUCCESS", "checkout"]]

    listed = json.loads(ok(await cli("workflow", "list", "--json", "--url", database_url)))
    by_id = {w["workflow_id"]: w for w in listed}
    assert by_id["order-1"]["output"] == "shipment-order-1"
    assert by_id["order-1"]["input"] == {"args": ["order-1"], "kwargs": {}}
    assert by_id["broken-1"]["error"] == {"name": "ValueError", "message": "bad 3"}
    assert by_id["order-1"]["application_version"] == "v1"

    async def ids(*filters: str) -> list[str]:
        out = ok(await cli("workflow", "list", "--json", "--url", database_url, *filters))
        return [w["workflow_id"] for w in json.loads(out)]

    assert await ids("--status", "error") == ["broken-1"]
    assert await ids("--status", "SUCCESS", "--status", "ERROR", "--name", "checkout") == [
        "order-2", "order-1"]
    assert await ids("--prefix", "order-", "--sort", "asc", "--limit", "1") == ["order-1"]
    assert await ids("--prefix", "order-", "--sort", "asc", "--offset", "1") == ["order-2"]
    assert await ids("--application-version", "v2") == []
    assert await ids("--start-time", "2999-01-01T00:00:00") == []
    assert await ids("--end-time", "0") == []
    assert await ids("--queued") == []


async def test_workflow_get_and_steps(shop: Shop, database_url: str) -> None:
    status = json.loads(ok(await cli("workflow", "get", "order-1", "--json",
                                     "--url", database_url)))
    assert (status["workflow_id"], status["status"], status["output"]) == (
        "order-1", "SUCCESS", "shipment-order-1")

    shown = ok(await cli("workflow", "get", "broken-1", "--url", database_url))
    lines = dict(line.split(":", 1) for line in shown.splitlines())
    assert lines["Status"].strip() == "ERROR"
    assert lines["Name"].strip() == "broken"
    assert lines["Error"].strip() == "ValueError: bad 3"

    steps = json.loads(ok(await cli("workflow", "steps", "order-1", "--json",
                                    "--url", database_url)))
    assert [(s["function_id"], s["name"], s["output"]) for s in steps] == [
        (0, "charge", 42), (1, "ship", "shipment-order-1")]
    rows = table_rows(ok(await cli("workflow", "steps", "order-1", "--url", database_url)))
    assert rows[0] == ["STEP", "NAME", "OUTPUT", "CHILD WORKFLOW", "MS"]
    assert [r[:3] for r in rows[1:]] == [["0", "charge", "42"],
                                         ["1", "ship", "shipment-order-1"]]


async def test_unknown_workflow_is_one_line_and_status_1(shop: Shop, database_url: str) -> None:
    for command in (["get", "nope"], ["steps", "nope"], ["cancel", "nope"], ["resume", "nope"],
                    ["fork", "nope", "--step", "1"], ["rewind", "nope", "--step", "1"],
                    ["delete", "nope"]):
        message = failed(await cli("workflow", *command, "--url", database_url))
        assert message == "Error: Workflow 'nope' does not exist", command
    # All or nothing: a known ID next to an unknown one is not deleted either.
    failed(await cli("workflow", "delete", "order-1", "nope", "--url", database_url))
    assert await shop.dbos.get_workflow_status("order-1") is not None


async def test_cancel_and_resume_a_running_workflow(shop: Shop, database_url: str) -> None:
    with SetWorkflowID("gated-1"):
        handle = await shop.dbos.start_workflow(shop.gated)  # type: ignore[attr-defined]
    await shop.at_gate.wait()
    assert ok(await cli("workflow", "cancel", "gated-1", "order-1", "--url", database_url)) == (
        "Cancelled gated-1\nUnchanged order-1 (already finished or cancelled)\n")
    with pytest.raises(WorkflowCancelledError):
        await handle.get_result()

    shop.gate.set()
    assert ok(await cli("workflow", "resume", "gated-1", "--url", database_url)) == (
        "Resumed gated-1\n")
    resumed = await shop.dbos.retrieve_workflow("gated-1")
    assert await resumed.get_result() == "through"


async def test_resume_under_another_application_version(shop: Shop,
                                                          database_url: str) -> None:
    """``workflow resume --application-version`` moves a workflow of version v1 to v2: an
    executor of v2 runs it from its checkpoints, under its own ID."""
    with SetWorkflowID("gated-2"):
        handle = await shop.dbos.start_workflow(shop.gated)  # type: ignore[attr-defined]
    await shop.at_gate.wait()
    ok(await cli("workflow", "cancel", "gated-2", "--url", database_url))
    with pytest.raises(WorkflowCancelledError):
        await handle.get_result()
    assert ok(await cli("workflow", "resume", "gated-2", "--application-version", "v2",
                        "--url", database_url)) == "Resumed gated-2\n"
    status = await shop.dbos.get_workflow_status("gated-2")
    assert status is not None
    assert (status.status, status.application_version) == ("ENQUEUED", "v2")

    later = make_shop(database_url, version="v2", executor_id="later",
                      shutdown_grace_period=0)
    later.gate.set()
    async with later.dbos:
        resumed = await later.dbos.retrieve_workflow("gated-2")
        assert await resumed.get_result() == "through"
    assert later.at_gate.is_set()  # the step ran on the v2 executor
    status = await shop.dbos.get_workflow_status("gated-2")
    assert status is not None
    assert (status.status, status.application_version) == ("SUCCESS", "v2")
    message = failed(await cli("workflow", "resume", "gated-2", "--application-version", "",
                               "--url", database_url))
    assert "application_version" in message, message


async def test_fork_rewind_and_delete(shop: Shop, database_url: str) -> None:
    forked = ok(await cli("workflow", "fork", "order-1", "--step", "1", "--new-id", "forked-1",
                          "--url", database_url))
    assert forked == "forked-1\n"  # the new ID alone, for scripts
    assert await (await shop.dbos.retrieve_workflow("forked-1")).get_result() == (
        "shipment-order-1")
    assert shop.charges["order-1"] == 1  # step 0 replayed from the copy, not run again
    status = await shop.dbos.get_workflow_status("forked-1")
    assert status is not None and status.forked_from == "order-1"

    random_id = ok(await cli("workflow", "fork", "order-2", "--step", "0",
                             "--url", database_url)).strip()
    assert random_id and random_id != "order-2"
    assert await (await shop.dbos.retrieve_workflow(random_id)).get_result() == (
        "shipment-order-2")
    assert shop.charges["order-2"] == 2  # from step 0: everything ran again

    assert ok(await cli("workflow", "rewind", "order-1", "--step", "0",
                        "--url", database_url)) == "Rewound order-1 to step 0\n"
    await shop.dbos.wait_all([await shop.dbos.retrieve_workflow("order-1")])
    assert shop.charges["order-1"] == 2

    assert ok(await cli("workflow", "delete", "forked-1", random_id, "--url", database_url)) == (
        f"Deleted forked-1\nDeleted {random_id}\n")
    assert await shop.dbos.get_workflow_status("forked-1") is None
    failed(await cli("workflow", "get", "forked-1", "--url", database_url))

    # Usage errors are click's: exit status 2.
    result = await cli("workflow", "fork", "order-1", "--step", "0", "--last-step",
                       "--url", database_url)
    assert result.returncode == 2 and "--step" in result.stderr


async def test_queue_list_with_depth_per_status(database_url: str) -> None:
    shop = make_shop(database_url)
    async with shop.dbos:  # migrates; then only the client acts
        pass
    async with DBOSClient(database_url) as client:
        await client.register_queue("emails", concurrency=5, limiter=(10, 60.0))
        for n in range(2):  # a function no executor has: they stay ENQUEUED
            await client.enqueue("emails", "send_email", f"user-{n}")
        await client.enqueue("emails", "send_email", "later", delay=3600)
        await client.enqueue("reports", "build_report")  # a queue with no stored settings

    queues = json.loads(ok(await cli("queue", "list", "--json", "--url", database_url)))
    by_name = {q["name"]: q for q in queues}
    assert by_name["emails"]["depth"] == {"DELAYED": 1, "ENQUEUED": 2, "PENDING": 0}
    assert by_name["emails"]["concurrency"] == 5
    assert by_name["emails"]["rate_limit"] == {"limit": 10, "period": 60.0}
    assert by_name["reports"] == {"name": "reports", "stored": False,
                                  "depth": {"DELAYED": 0, "ENQUEUED": 1, "PENDING": 0}}

    rows = table_rows(ok(await cli("queue", "list", "--url", database_url)))
    assert rows[0] == ["QUEUE", "CONCURRENCY", "PER WORKER", "RATE", "DELAYED", "ENQUEUED",
                       "PENDING"]
    assert ["emails", "5", "10/60s", "1", "2", "0"] in rows
    assert ["reports", "0", "1", "0"] in rows


async def test_versions_list_and_set_latest(database_url: str) -> None:
    async with make_shop(database_url).dbos:  # registers v1
        pass
    assert ok(await cli("version", "set-latest", "v2", "--url", database_url)) == (
        "v2 is now the latest application version\n")
    versions = json.loads(ok(await cli("version", "list", "--json", "--url", database_url)))
    assert [v["version_name"] for v in versions] == ["v2", "v1"]
    rows = table_rows(ok(await cli("version", "list", "--url", database_url)))
    assert rows[0] == ["VERSION", "LATEST", "TIMESTAMP (UTC)", "REGISTERED (UTC)"]
    assert rows[1][:2] == ["v2", "*"]
    assert rows[2][0] == "v1" and len(rows[2]) == 3  # no mark: its LATEST cell is empty

    ok(await cli("version", "set-latest", "v1", "--url", database_url))
    versions = json.loads(ok(await cli("version", "list", "--json", "--url", database_url)))
    assert versions[0]["version_name"] == "v1"


async def test_migrate_creates_and_migrates_a_database(
    make_database_url: Any, admin_url: str, tmp_path: Path
) -> None:
    name = unique_name("dbos_test_cli")
    url = make_database_url(name)
    try:
        first = ok(await cli("migrate", "--url", url))
        assert first == f"System schema 'dbos' at {url} is at version 125\n"
        assert ok(await cli("migrate", "--url", url)) == first  # again: nothing to do

        # The URL from the environment, then from a configuration file, with a schema.
        assert "version 125" in ok(await cli("migrate", "--schema", "ops",
                                             env={"DBOS_SYSTEM_DATABASE_URL": url}))
        config = tmp_path / "settings.toml"
        config.write_text(f'system_database_url = "{url}"\nschema_name = "app"\n')
        assert ok(await cli("migrate", "--config", str(config))) == (
            f"System schema 'app' at {url} is at version 125\n")
        (tmp_path / "pyproject.toml").write_text(
            f'[project]\nname = "x"\n\n[tool.dbos_async]\nsystem_database_url = "{url}"\n')
        assert ok(await cli("workflow", "list", "--json", cwd=tmp_path)) == "[]\n"
        async with DBOSClient(url, schema_name="app") as client:
            assert await client.list_workflows() == []
    finally:
        from dbos_async.testing import drop_database

        await drop_database(admin_url, name)


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_bad_or_missing_urls(tmp_path: Path, make_database_url: Any, admin_url: str) -> None:
    port = closed_port()
    unreachable = f"postgresql://postgres@127.0.0.1:{port}/app"
    message = failed(run_cli("workflow", "list", "--url", unreachable))
    assert message.startswith(
        f"Error: Cannot connect to the system database 'app' at 127.0.0.1:{port} as user "
        "'postgres': ConnectionRefusedError")
    failed(run_cli("migrate", "--url", unreachable))
    message = failed(run_cli("queue", "list", "--url", "mysql://root@127.0.0.1/app"))
    assert "postgresql:// URL" in message and "mysql" in message
    message = failed(run_cli("version", "list", cwd=tmp_path))
    assert "no system database URL" in message and "DBOS_SYSTEM_DATABASE_URL" in message
    bad_config = tmp_path / "bad.toml"
    bad_config.write_text("system_database_urll = 'x'\n")
    message = failed(run_cli("workflow", "list", "--config", str(bad_config)))
    assert "system_database_urll" in message and "bad.toml" in message
    assert run_cli("workflow", "lst").returncode == 2
    # A database that does not exist, a role that does not exist: named, not a traceback.
    missing = make_database_url(unique_name("dbos_test_missing"))
    message = failed(run_cli("workflow", "list", "--url", missing))
    assert "does not exist" in message and "dbos-async migrate" in message
    parts = urlsplit(admin_url)
    stranger = urlunsplit(parts._replace(netloc=f"no_such_role@{parts.hostname}:{parts.port}"))
    message = failed(run_cli("workflow", "list", "--url", stranger))
    assert message.startswith("Error: Cannot connect to the system database") and (
        "no_such_role" in message)


async def test_sharded_schema_is_detected(database_url: str) -> None:
    dbos = new_dbos(database_url, sharding=True)

    @dbos.workflow(name="tenant_job")
    async def tenant_job(n: int) -> int:
        return n

    async with dbos:
        for key, n in (("acme", 1), ("globex", 2)):
            with SetShardKey(key), SetWorkflowID("job-1"):
                await tenant_job(n)

    rows = table_rows(ok(await cli("workflow", "list", "--url", database_url)))
    assert rows[0][:3] == ["WORKFLOW ID", "SHARD KEY", "STATUS"]
    assert sorted(r[:3] for r in rows[1:]) == [["job-1", "acme", "SUCCESS"],
                                               ["job-1", "globex", "SUCCESS"]]
    message = failed(await cli("workflow", "get", "job-1", "--url", database_url))
    assert "several shard keys" in message and "--shard-key" in message
    status = json.loads(ok(await cli("workflow", "get", "job-1", "--shard-key", "globex",
                                     "--json", "--url", database_url)))
    assert (status["shard_key"], status["output"]) == ("globex", 2)
    steps = await cli("workflow", "steps", "job-1", "--shard-key", "acme", "--json",
                      "--url", database_url)
    assert json.loads(ok(steps)) == []
    listed = json.loads(ok(await cli("workflow", "list", "--shard-key", "acme", "--json",
                                     "--url", database_url)))
    assert [w["shard_key"] for w in listed] == ["acme"]
    message = failed(await cli("workflow", "cancel", "job-1", "--url", database_url))
    assert "shard key" in message
