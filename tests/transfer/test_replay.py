"""The replay check: workflows recorded by one version of the code (one finished, one still
running) replayed against new code — the same, a reordered step, a renamed step, a patched
and an unpatched change, a step added after the running one's last checkpoint — reporting
the first divergence, running no step body and writing nothing to the database; through
DBOS.replay_workflows, dbos_async.testing.replay_check and the `dbos-async replay` command
(on an export file and on a live database, with --move)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import fetch, new_dbos, wait_for_steps
from helpers.order_versions import App, app

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    Queue,
    SetWorkflowID,
    WorkflowImportError,
    current_workflow_id,
)
from dbos_async._executor.replay import Divergence, ReplayResult
from dbos_async._executor.transfer import ExportedWorkflow
from dbos_async.testing import replay_check

CLI = str(Path(sys.executable).with_name("dbos-async"))
TESTS = Path(__file__).resolve().parents[1]
APPLICATION = "helpers.order_versions:dbos"


@dataclass
class Recorded:
    url: str
    finished: ExportedWorkflow
    running: ExportedWorkflow
    children: list[ExportedWorkflow]


@pytest.fixture
async def recorded(database_url: str) -> AsyncIterator[Recorded]:
    """One finished and one running ``order`` (waiting in recv after its sleep), recorded
    by the ``recorded`` variant, exported."""
    first = app(database_url, "recorded")
    async with first.dbos:
        with SetWorkflowID("finished"):
            assert await first.order(1, False) == 7
        with SetWorkflowID("running"):
            await first.dbos.start_workflow(first.order, 1, True)
        await wait_for_steps(database_url, "running", 5)  # up to its sleep; then recv
    async with DBOSClient(database_url, pool_size=2) as client:
        exported = {w.workflow_id: w async for w in client.export_workflows()}
    children = [w for w in exported.values() if w.status["name"] == "child"]
    yield Recorded(database_url, exported["finished"], exported["running"], children)


async def check(rec: Recorded, variant: str) -> tuple[ReplayResult, ReplayResult, App]:
    new = app(rec.url, variant)
    finished, running = await new.dbos.replay_workflows(
        [rec.finished, rec.running], children=rec.children)
    return finished, running, new


async def test_same_code_replays(recorded: Recorded) -> None:
    finished, running, new = await check(recorded, "same")
    assert finished.passed and finished.divergence is None, finished.summary()
    assert finished.checked_steps == finished.recorded_steps == 6
    assert running.passed, running.summary()
    assert running.status == "PENDING" and running.checked_steps == 5
    assert "last checkpoint" in (running.stopped or "")
    assert not new.ran  # no step body ran


async def test_reordered_step_diverges(recorded: Recorded) -> None:
    finished, running, new = await check(recorded, "reordered")
    for result in (finished, running):
        assert not result.passed
        assert result.divergence == Divergence(0, "reserve", "charge")
    assert not new.ran


async def test_renamed_step_diverges(recorded: Recorded) -> None:
    finished, running, _ = await check(recorded, "renamed")
    assert finished.divergence == Divergence(5, "ship", "ship_v2")
    # The running workflow has not reached it: nothing recorded there to differ from.
    assert running.passed, running.summary()


async def test_patched_change_passes_and_unpatched_fails(recorded: Recorded) -> None:
    finished, running, new = await check(recorded, "patched")
    assert finished.passed and running.passed, (finished.summary(), running.summary())
    assert not new.ran
    finished, _, _ = await check(recorded, "unpatched")
    assert finished.divergence == Divergence(5, "ship", "ship_v2")


async def test_step_added_after_the_last_checkpoint(recorded: Recorded) -> None:
    finished, running, _ = await check(recorded, "added_after_last")
    # In flight, the new step comes after everything recorded: it would simply run.
    assert running.passed and running.checked_steps == 5, running.summary()
    # Finished, the recording holds another call there.
    assert finished.divergence == Divergence(5, "ship", "audit")


async def test_fewer_calls_diverges_at_the_end(recorded: Recorded) -> None:
    finished, _, _ = await check(recorded, "fewer_calls")
    assert finished.divergence == Divergence(5, "ship", None)


async def test_the_testing_function_reads_a_database_or_a_file(recorded: Recorded,
                                                               tmp_path: Path) -> None:
    new = app(recorded.url, "renamed")
    async with DBOSClient(recorded.url, pool_size=2) as client:
        from_db = await replay_check(new.dbos, client=client, name=["order"])
        only_pending = await replay_check(new.dbos, client=client, status=["PENDING"])
    assert [(r.workflow_id, r.passed) for r in from_db] == [("finished", False),
                                                            ("running", True)]
    assert [r.workflow_id for r in only_pending] == ["running"]
    export = tmp_path / "workflows.jsonl"
    export.write_text(recorded.finished.to_json() + "\n\n" + recorded.running.to_json())
    from_file = await replay_check(new.dbos, path=export)
    # The child's outcome is not in the file: the check stops where the body awaits it.
    assert [r.passed for r in from_file] == [True, True]
    assert all("is not recorded" in (r.stopped or "") for r in from_file)
    assert all(r.checked_steps == 4 for r in from_file)  # up to the child start, at 3


async def written_state(url: str) -> dict[str, str]:
    """Every system table's rows with their versions (xmin, ctid): a write of any kind,
    even one that changes no value, changes it."""
    tables = [r["tablename"] for r in await fetch(
        url, "SELECT tablename FROM pg_tables WHERE schemaname = 'dbos'")]
    state = {}
    for table in tables:
        state[table] = (await fetch(url, f"""
            SELECT count(*) AS n, md5(coalesce(string_agg(
                t.xmin::text || t.ctid::text || t::text, ',' ORDER BY t.ctid), '')) AS digest
            FROM dbos."{table}" t"""))[0]["digest"]
    return state


def run_replay(*args: str, variant: str, url: str,
               version: str = "test-version-1") -> subprocess.CompletedProcess[str]:
    """``dbos-async replay`` of the ``variant`` code (imported from this directory)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBOS_")}
    env.update(ORDER_URL=url, ORDER_VARIANT=variant, ORDER_VERSION=version)
    return subprocess.run([CLI, "replay", APPLICATION, *args], capture_output=True,
                          text=True, timeout=120, cwd=TESTS, env=env, check=False)


async def test_cli_on_an_export_file(recorded: Recorded, tmp_path: Path) -> None:
    export = tmp_path / "workflows.jsonl"
    export.write_text("".join(w.to_json() + "\n" for w in
                              (recorded.finished, recorded.running, *recorded.children)))
    same = await asyncio.to_thread(run_replay, "--file", str(export), variant="same",
                                   url=recorded.url)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "OK       finished (order, SUCCESS): 6 of 6 checkpoints replayed" in same.stdout
    assert "4 of 4 workflow(s) replay" in same.stdout  # with the two children
    renamed = await asyncio.to_thread(run_replay, "--file", str(export), variant="renamed",
                                      url=recorded.url)
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    assert ("DIVERGES finished (order, SUCCESS): step 5: recorded ship, new code calls "
            "ship_v2") in renamed.stdout
    assert "OK       running (order, PENDING)" in renamed.stdout
    as_json = await asyncio.to_thread(run_replay, "--file", str(export), "--json",
                                      variant="renamed", url=recorded.url)
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["application_version"] == "test-version-1" and report["moved"] == []
    [finished] = [r for r in report["results"] if r["workflow_id"] == "finished"]
    assert finished["passed"] is False
    assert finished["divergence"] == {"step_id": 5, "recorded_name": "ship",
                                      "new_name": "ship_v2"}
    refused = await asyncio.to_thread(run_replay, "--file", str(export), "--status",
                                      "PENDING", variant="same", url=recorded.url)
    assert refused.returncode == 2 and "--file takes no filters" in refused.stderr


async def test_cli_on_a_live_database_writes_nothing(recorded: Recorded) -> None:
    before = await written_state(recorded.url)
    reordered = await asyncio.to_thread(run_replay, "--url", recorded.url, "--name", "order",
                                        variant="reordered", url=recorded.url)
    assert reordered.returncode == 1, reordered.stdout + reordered.stderr
    assert ("DIVERGES finished (order, SUCCESS): step 0: recorded reserve, new code calls "
            "charge") in reordered.stdout
    assert "0 of 2 workflow(s) replay" in reordered.stdout
    same = await asyncio.to_thread(run_replay, "--url", recorded.url, variant="same",
                                   url=recorded.url)
    assert same.returncode == 0, same.stdout + same.stderr
    assert await written_state(recorded.url) == before


async def test_cli_moves_waiting_workflows_once_they_replay(recorded: Recorded) -> None:
    """The running workflow of version 1 waits for an executor of its version; the new
    code (version 2) is checked against it and it is moved to version 2, which runs it."""
    url = recorded.url
    waiting = await asyncio.to_thread(subprocess.run, [
        CLI, "version", "waiting", "--url", url, "--other-than", "v2"],
        capture_output=True, text=True, timeout=60, check=False)
    assert waiting.returncode == 0, waiting.stderr
    assert waiting.stdout.split() == ["VERSION", "PENDING", "ENQUEUED",
                                      "test-version-1", "1", "0"]
    diverging = await asyncio.to_thread(run_replay, "--url", url, "--move", variant="reordered",
                                        url=url, version="v2")
    assert diverging.returncode == 1 and "Moved nothing" in diverging.stdout
    [row] = await fetch(url, "SELECT status, application_version FROM dbos.workflow_status "
                             "WHERE workflow_uuid = 'running'")
    assert (row["status"], row["application_version"]) == ("PENDING", "test-version-1")

    moved = await asyncio.to_thread(run_replay, "--url", url, "--move", variant="patched",
                                    url=url, version="v2")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "Moved 1 workflow(s) to version v2: running" in moved.stdout
    [row] = await fetch(url, "SELECT status, application_version FROM dbos.workflow_status "
                             "WHERE workflow_uuid = 'running'")
    assert (row["status"], row["application_version"]) == ("ENQUEUED", "v2")

    waiting = await asyncio.to_thread(subprocess.run, [
        CLI, "version", "waiting", "--url", url, "--all", "--json"],
        capture_output=True, text=True, timeout=60, check=False)
    assert json.loads(waiting.stdout) == [
        {"application_version": "v2", "pending": 0, "enqueued": 1}]

    new = app(url, "patched", application_version="v2")
    async with new.dbos:
        handle = await new.dbos.retrieve_workflow("running")
        await new.dbos.send("running", "100", "go")
        # Recorded steps replayed; the message and the new shipper (patched in) ran.
        assert await handle.get_result() == 7 + 100
        assert new.ran == {"ship_v2": 1}


def conversation(url: str, variant: str) -> tuple[DBOS, Callable[[], Awaitable[list[Any]]],
                                                   Counter[str]]:
    """A workflow making every kind of recorded call: a child start, steps (two of them
    concurrently), an event set and one read, a send and a receive, a stream read and
    written, a child's status and result, an enqueue, a sleep, a patch and a deprecated
    patch. ``variant`` ``no_event`` leaves out the event it sets."""
    dbos = new_dbos(url, shutdown_grace_period=0.0)
    jobs = dbos.register_queue(Queue("jobs"))
    ran: Counter[str] = Counter()

    @dbos.step(name="double")
    async def double(x: int) -> int:
        ran["double"] += 1
        return 2 * x

    @dbos.step(name="square")
    async def square(x: int) -> int:
        ran["square"] += 1
        return x * x

    @dbos.workflow(name="peer")
    async def peer(caller: str) -> str:
        await dbos.set_event("ready", "yes")
        await dbos.write_stream("ps", "v1")
        await dbos.close_stream("ps")
        got: str = await dbos.recv("t", timeout=30)
        await dbos.send(caller, f"re: {got}", "reply")
        return got

    @dbos.workflow(name="job")
    async def job(x: int) -> int:
        return x + 100

    @dbos.workflow(name="everything")
    async def everything() -> list[Any]:
        me = current_workflow_id()
        assert me is not None
        other = await dbos.start_workflow(peer, me)
        out: list[Any] = [await double(1)]
        out += await asyncio.gather(double(2), square(3))
        if variant != "no_event":
            await dbos.set_event("mine", 1)
        out.append(await dbos.get_event(other.workflow_id, "ready", timeout=30))
        await dbos.send(other.workflow_id, "hello", "t")
        out.append(await dbos.recv("reply", timeout=30))
        out.append([v async for v in dbos.read_stream(other.workflow_id, "ps")])
        await dbos.write_stream("s", 1)
        await dbos.close_stream("s")
        out.append((await other.get_status()).workflow_id)
        out.append(await other.get_result())
        out.append(await (await jobs.enqueue(job, 3)).get_result())
        await dbos.sleep(0.01)
        out.append(await dbos.patch("p"))
        out.append(await dbos.deprecate_patch("q"))
        return out

    return dbos, everything, ran


async def test_every_kind_of_call_replays(database_url: str) -> None:
    first, everything, _ = conversation(database_url, "recorded")
    async with first:
        with SetWorkflowID("everything"):
            recorded_result = await everything()
    assert recorded_result[-2:] == [True, True]
    async with DBOSClient(database_url, pool_size=2) as client:
        exported = [w async for w in client.export_workflows()]
    [main] = [w for w in exported if w.workflow_id == "everything"]
    checkpoints = len(main.tables["operation_outputs"])

    before = await written_state(database_url)
    same, _, ran = conversation(database_url, "same")
    [result] = await same.replay_workflows([main], children=exported)
    assert result.passed, result.summary()
    assert result.checked_steps >= result.recorded_steps == checkpoints
    assert not ran

    changed, _, _ = conversation(database_url, "no_event")
    [result] = await changed.replay_workflows([main], children=exported)
    assert result.divergence == Divergence(4, "DBOS.setEvent", "DBOS.getEvent")
    assert await written_state(database_url) == before


def failing_app(url: str, variant: str) -> tuple[DBOS, Callable[[int], Awaitable[int]]]:
    """A workflow whose one step fails (so it ends ERROR); the ``hangs`` variant awaits
    something no checkpoint resolves, ``raises`` fails before its step."""
    dbos = new_dbos(url, shutdown_grace_period=0.0)

    @dbos.step(name="refuse")
    async def refuse(x: int) -> int:
        raise ValueError(f"refused {x}")

    @dbos.workflow(name="failing")
    async def failing(x: int) -> int:
        if variant == "hangs":
            await asyncio.Event().wait()
        if variant == "raises":
            raise RuntimeError("new code fails first")
        return await refuse(x)

    return dbos, failing


async def test_a_failed_workflow_replays_and_bad_checks_say_why(database_url: str,
                                                                tmp_path: Path) -> None:
    first, failing = failing_app(database_url, "recorded")
    async with first:
        with SetWorkflowID("failed"), pytest.raises(ValueError):
            await failing(1)
    async with DBOSClient(database_url, pool_size=2) as client:
        [recorded] = [w async for w in client.export_workflows()]

    same, _ = failing_app(database_url, "same")
    [result] = await same.replay_workflows([recorded])
    assert result.passed and result.status == "ERROR", result.summary()
    assert result.raised == "ValueError: refused 1"  # the recorded failure, replayed

    raises, _ = failing_app(database_url, "raises")
    [result] = await raises.replay_workflows([recorded])
    assert result.divergence == Divergence(0, "refuse", None)
    assert result.summary().endswith(
        "step 0: recorded refuse, new code calls nothing (the workflow ends); the body "
        "raised RuntimeError: new code fails first")

    hangs, _ = failing_app(database_url, "hangs")
    [result] = await hangs.replay_workflows([recorded], time_limit=0.2)
    assert not result.passed and result.error is not None
    assert "did not finish in 0.2 s" in result.error

    elsewhere = new_dbos(database_url)  # registers no workflow named "failing"
    [result] = await elsewhere.replay_workflows([recorded])
    assert result.summary() == ("ERROR    failed (failing, ERROR): no workflow named "
                                "'failing' is registered")

    with pytest.raises(DBOSError, match="a client or a file"):
        await replay_check(same)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(recorded.to_json() + "\nnot json\n")
    with pytest.raises(WorkflowImportError, match="line 2 is not JSON"):
        await replay_check(same, path=bad)
    with pytest.raises(DBOSError, match="time_limit"):
        await same.replay_workflows([recorded], time_limit=0)
