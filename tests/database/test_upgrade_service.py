"""A deploy in the middle of a durable sleep, as a service's operator meets it: a FastAPI
service (a real uvicorn process) starts a workflow under an Idempotency-Key, is killed
(SIGKILL) while the workflow sleeps, the workflow's source is edited, and the service
starts again. The workflow is never stranded silently: in patching mode the new process
recovers and finishes it; in the default mode (a version per source hash) the new process
logs the old version's waiting workflow, and the operator path — the replay check, then
its --move — finishes it under the same ID, so the idempotency key still finds it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fetch, wait_until
from helpers.web_services import PATIENCE, Service

CLI = str(Path(sys.executable).with_name("dbos-async"))
SLEEP_SECONDS = 4.0  # long enough to be asleep when killed; the test waits it out

SERVICE = '''\
"""Reminders: each one a workflow that notes the reminder, sleeps durably, then sends it."""

from fastapi import FastAPI

from dbos_async import DBOS
from dbos_async.fastapi import DBOSDep, install, lifespan, workflow_router

dbos = DBOS(name="reminders")


@dbos.step()
async def note(text: str) -> str:
    return text


@dbos.step()
async def send(text: str) -> str:
    return "sent: " + text


@dbos.workflow()
async def remind(text: str, seconds: float) -> str:
    await note(text)
    await dbos.sleep(seconds)
    # Send the reminder.
    return await send(text)


app = FastAPI(lifespan=lifespan(dbos))
install(app)
app.include_router(workflow_router())


@app.post("/reminders")
async def create(text: str, seconds: float, executor: DBOSDep) -> dict[str, str]:
    handle = await executor.start_workflow(remind, text, seconds)
    return {"workflow_id": handle.workflow_id}
'''

EDITED = ("    # Send the reminder.\n", "    # Send the reminder (to its owner).\n")


async def status_of(url: str, workflow_id: str) -> tuple[str, str | None, str]:
    [row] = await fetch(url, """
        SELECT ws.status, coalesce(ws.output, wo.output) AS output, ws.application_version
        FROM dbos.workflow_status ws
        LEFT JOIN dbos.workflow_output wo ON wo.workflow_uuid = ws.workflow_uuid
        WHERE ws.workflow_uuid = $1""", workflow_id)
    return row["status"], row["output"], row["application_version"]


async def step_count(url: str, workflow_id: str) -> int:
    rows = await fetch(url, "SELECT count(*) AS n FROM dbos.operation_outputs "
                            "WHERE workflow_uuid = $1", workflow_id)
    return int(rows[0]["n"])


async def create_reminder(service: Service) -> str:
    answer = await service.client.post("/reminders", params={
        "text": "water the plants", "seconds": SLEEP_SECONDS},
        headers={"Idempotency-Key": "reminder-1"})
    assert answer.status_code == 200, answer.text
    workflow_id: str = answer.json()["workflow_id"]
    return workflow_id


@pytest.mark.parametrize("patching", [True, False], ids=["patching", "hash-versions"])
async def test_killed_during_a_durable_sleep_then_edited(
        database_url: str, tmp_path: Path, patching: bool) -> None:
    source = tmp_path / "reminders.py"
    source.write_text(SERVICE)
    command = (sys.executable, "-m", "uvicorn", "reminders:app", "--log-level", "warning",
               "--fd", "{fd}")
    service = Service(command, database_url, "", tmp_path)
    service.env.update(PYTHONPATH=str(tmp_path), DBOS_SHUTDOWN_GRACE_PERIOD="0")
    service.env.pop("DBOS_APPLICATION_VERSION", None)
    if patching:
        service.env["DBOS_ENABLE_PATCHING"] = "true"
    try:
        await _scenario(service, source, database_url, patching, tmp_path)
    finally:
        await service.close()


async def _scenario(service: Service, source: Path, url: str, patching: bool,
                    tmp_path: Path) -> None:
    await service.start()
    workflow_id = await create_reminder(service)
    assert workflow_id == "reminder-1"  # the idempotency key is the workflow's ID

    async def asleep() -> bool:
        return await step_count(url, workflow_id) >= 2

    await wait_until(asleep, what="the durable sleep's checkpoint")
    await service.kill()
    status, _, old_version = await status_of(url, workflow_id)
    assert status == "PENDING"

    await asyncio.to_thread(source.write_text, SERVICE.replace(*EDITED))
    await service.start()

    if not patching:
        new_version = await _operator_moves_it(service, url, workflow_id, old_version,
                                               tmp_path)
    else:
        new_version = old_version
        assert old_version == "PATCHING_ENABLED"

    async def finished() -> bool:
        return (await status_of(url, workflow_id))[0] == "SUCCESS"

    await wait_until(finished, patience=PATIENCE, what="the reminder to be sent")
    assert await status_of(url, workflow_id) == ("SUCCESS", '"sent: water the plants"',
                                                 new_version)
    # The retried request finds the same workflow, with its result.
    assert await create_reminder(service) == workflow_id
    shown = await service.client.get(f"/workflows/{workflow_id}")
    assert shown.json()["status"] == "SUCCESS", shown.text


async def _operator_moves_it(service: Service, url: str, workflow_id: str,
                             old_version: str, tmp_path: Path) -> str:
    """Default mode: the restarted executor (a new hash) leaves the workflow waiting and
    says so; the replay check passes and moves it to the new version."""
    log = service.output()
    assert "1 PENDING and 0 ENQUEUED workflows of other application versions" in log, log
    assert f"{old_version} (1 PENDING, 0 ENQUEUED)" in log
    status, _, version = await status_of(url, workflow_id)
    assert (status, version) == ("PENDING", old_version)

    env = {k: v for k, v in os.environ.items() if not k.startswith("DBOS_")}
    env["PYTHONPATH"] = str(tmp_path)
    checked = await asyncio.to_thread(
        subprocess.run, [CLI, "replay", "reminders:dbos", "--url", url, "--workflow-id",
                         workflow_id, "--move"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"OK       {workflow_id} (remind, PENDING)" in checked.stdout
    moved = [line for line in checked.stdout.splitlines() if line.startswith("Moved 1")]
    assert len(moved) == 1 and moved[0].endswith(f": {workflow_id}"), checked.stdout
    new_version = moved[0].split(" to version ")[1].split(":")[0]
    assert new_version != old_version
    return new_version
