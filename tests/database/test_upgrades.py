"""Deploys that keep in-flight work: patching mode (one application version across deploys,
so a new deploy recovers the last one's PENDING workflows and claims its ENQUEUED ones),
and, in the default mode, work of other versions counted and logged at start and
periodically, shown by health() and the console, and moved by a resume naming the
version."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from helpers import execute, fetch, new_dbos, wait_for_steps, wait_until

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    NondeterminismError,
    SetShardKey,
    SetWorkflowID,
    VersionBacklog,
)
from dbos_async.console import console_app
from dbos_async.testing import replay_check


@dataclass
class Deliveries:
    dbos: DBOS
    deliver: Callable[[float], Awaitable[str]]
    ran: list[str] = field(default_factory=list)


def deliveries(url: str, *, shipper: str, **settings: Any) -> Deliveries:
    """A workflow that charges, sleeps durably, then ships; ``shipper`` is the version of
    the code (``new`` changes the shipping behind a patch, ``unpatched`` renames the
    charge step without one)."""
    dbos = new_dbos(url, shutdown_grace_period=0.0, **settings)
    ran: list[str] = []

    @dbos.step(name="charge")
    async def charge() -> None:
        ran.append("charge")

    @dbos.step(name="ship")
    async def ship() -> str:
        ran.append("ship")
        return "old shipper"

    @dbos.step(name="ship_v2")
    async def ship_v2() -> str:
        ran.append("ship_v2")
        return "new shipper"

    @dbos.step(name="charge_v2")
    async def charge_v2() -> None:
        ran.append("charge_v2")

    @dbos.workflow(name="deliver")
    async def deliver(seconds: float) -> str:
        await (charge_v2() if shipper == "unpatched" else charge())
        await dbos.sleep(seconds)
        if shipper == "new" and await dbos.patch("new-shipper"):
            return await ship_v2()
        return await ship()

    return Deliveries(dbos, deliver, ran)


async def wake_now(url: str, workflow_id: str) -> None:
    """Bring the recorded end of the workflow's sleep to now (as if the hour had passed)."""
    await execute(url, "UPDATE dbos.operation_outputs SET output = '0' "
                       "WHERE workflow_uuid = $1 AND function_name = 'DBOS.sleep'", workflow_id)


async def sleeping_workflow(url: str, workflow_id: str, **settings: Any) -> None:
    """``workflow_id`` left PENDING in its hour-long sleep by an executor that stopped."""
    old = deliveries(url, shipper="old", **settings)
    async with old.dbos:
        with SetWorkflowID(workflow_id):
            await old.dbos.start_workflow(old.deliver, 3600.0)
        await wait_for_steps(url, workflow_id, 2)


async def version_of(url: str, workflow_id: str) -> tuple[str, str]:
    [row] = await fetch(url, "SELECT status, application_version FROM dbos.workflow_status "
                             "WHERE workflow_uuid = $1", workflow_id)
    return row["status"], row["application_version"]


async def test_patching_mode_recovers_the_last_deploys_work(database_url: str) -> None:
    patching: dict[str, Any] = {"application_version": None, "enable_patching": True}
    await sleeping_workflow(database_url, "sleeping", **patching)
    assert await version_of(database_url, "sleeping") == ("PENDING", "PATCHING_ENABLED")
    async with DBOSClient(database_url, pool_size=2) as client:
        await client.enqueue("_dbos_internal_queue", "deliver", 0.0, workflow_id="queued",
                             application_version="PATCHING_ENABLED")
    # A deploy of changed code (behind a patch) runs as the same version: it recovers the
    # sleeping workflow, which replays its steps (charge does not run again) and, having not
    # reached the patch before, takes the new path; it claims the queued one too.
    new = deliveries(database_url, shipper="new", **patching)
    await wake_now(database_url, "sleeping")
    async with new.dbos:
        assert new.dbos.application_version == "PATCHING_ENABLED"
        assert await (await new.dbos.retrieve_workflow("sleeping")).get_result() \
            == "new shipper"
        assert await (await new.dbos.retrieve_workflow("queued")).get_result() \
            == "new shipper"
        assert new.dbos.health().waiting_versions == ()
    assert sorted(new.ran) == ["charge", "ship_v2", "ship_v2"]


async def test_other_versions_work_is_logged_shown_and_moved(
        database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    await sleeping_workflow(database_url, "sleeping", application_version="v1")
    async with DBOSClient(database_url, pool_size=2) as client:
        await client.enqueue("_dbos_internal_queue", "deliver", 0.0, workflow_id="queued",
                             application_version="v1")
    new = deliveries(database_url, shipper="new", application_version="v2",
                     version_report_interval=0.05)
    async with DBOSClient(database_url, pool_size=2) as client:
        # Asleep for an hour: the check replays past the sleep without waiting it out.
        checked = await replay_check(new.dbos, client=client, workflow_ids=["sleeping"],
                                     time_limit=5.0)
    assert [(r.passed, r.checked_steps) for r in checked] == [(True, 2)], checked
    await wake_now(database_url, "sleeping")
    caplog.set_level(logging.WARNING, logger="dbos_async")
    async with new.dbos:
        waiting = (VersionBacklog("v1", 1, 1),)
        # Counted at start: logged, and in health().
        assert new.dbos.health().waiting_versions == waiting
        def reports() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if "other application" in r.getMessage()]

        line = reports()[0]
        assert "1 PENDING and 1 ENQUEUED workflows of other application versions" in line
        assert "v1 (1 PENDING, 1 ENQUEUED)" in line and "runs version v2" in line
        assert "dbos-async replay" in line

        # Logged again every version_report_interval while the work waits.
        async def logged_again() -> bool:
            return len(reports()) >= 2

        await wait_until(logged_again, what="the periodic report")
        assert set(reports()) == {line}
        assert await new.dbos.list_waiting_versions() == [VersionBacklog("v1", 1, 1)]
        assert await new.dbos.list_waiting_versions(other_than="v1") == []
        assert await version_of(database_url, "sleeping") == ("PENDING", "v1")

        # Moved by a resume under this version: it runs here, from its checkpoints.
        handles = await new.dbos.resume_workflows(["sleeping", "queued"],
                                                  application_version="v2")
        assert [await h.get_result() for h in handles] == ["new shipper", "new shipper"]
        assert await version_of(database_url, "sleeping") == ("SUCCESS", "v2")

        # Counted again periodically.
        async def cleared() -> bool:
            return new.dbos.health().waiting_versions == ()

        await wait_until(cleared, what="the periodic count")
    assert sorted(new.ran) == ["charge", "ship_v2", "ship_v2"]


async def test_console_shows_other_versions_work(database_url: str) -> None:
    await sleeping_workflow(database_url, "sleeping", application_version="v1")
    latest = deliveries(database_url, shipper="new", application_version="v2")
    async with latest.dbos:
        app = console_app(latest.dbos)
        transport = httpx2.ASGITransport(app, client=("127.0.0.1", 5000))
        async with httpx2.AsyncClient(transport=transport,
                                      base_url="http://localhost:8000") as http:
            page = await http.get("/executors")
            listed = await http.get("/workflows", params={
                "application_version": "v1", "status": ["PENDING", "ENQUEUED"]})
            other = await http.get("/workflows", params={"application_version": "v9"})
    assert page.status_code == 200
    html = page.text
    assert "Work of other application versions" in html
    assert "versions other than the latest (v2)" in html
    assert '<tr data-version="v1">' in html
    assert "application_version=v1&amp;status=PENDING&amp;status=ENQUEUED" in html
    # The link lists them.
    assert listed.status_code == 200 and "sleeping" in listed.text
    assert other.status_code == 200 and "sleeping" not in other.text


async def test_resume_refuses_a_bad_version(database_url: str) -> None:
    await sleeping_workflow(database_url, "sleeping", application_version="v1")
    new = deliveries(database_url, shipper="old", application_version="v2")
    async with new.dbos:
        with pytest.raises(DBOSError, match="application_version"):
            await new.dbos.resume_workflow("sleeping", application_version="")
    assert await version_of(database_url, "sleeping") == ("PENDING", "v1")


async def test_sharded_other_versions_work_is_counted_checked_and_moved(
        database_url: str) -> None:
    old = deliveries(database_url, shipper="old", application_version="v1", sharding=True)
    async with old.dbos:
        with SetShardKey("tenant-a"), SetWorkflowID("sleeping"):
            await old.dbos.start_workflow(old.deliver, 3600.0)
        await wait_for_steps(database_url, "sleeping", 2)
    await wake_now(database_url, "sleeping")
    new = deliveries(database_url, shipper="new", application_version="v2", sharding=True)
    async with new.dbos, DBOSClient(database_url, sharding=True, pool_size=2) as client:
        assert new.dbos.health().waiting_versions == (VersionBacklog("v1", 1, 0),)
        assert await client.list_waiting_versions(other_than="v2") == [
            VersionBacklog("v1", 1, 0)]
        [checked] = await replay_check(new.dbos, client=client, application_version=["v1"])
        assert checked.passed and checked.shard_key == "tenant-a", checked.summary()
        [handle] = await client.resume_workflows(["sleeping"], shard_key="tenant-a",
                                                 application_version="v2")
        assert await handle.get_result() == "new shipper"
        assert await client.list_waiting_versions() == []


async def test_patching_mode_fails_an_unpatched_change_the_replay_check_catches(
        database_url: str) -> None:
    """Patching mode runs recorded work on new code unchecked: a change to a recorded call
    without a patch fails the recovered workflow (ERROR, for good). The replay check
    before the deploy says so."""
    patching: dict[str, Any] = {"application_version": None, "enable_patching": True}
    await sleeping_workflow(database_url, "sleeping", **patching)
    new = deliveries(database_url, shipper="unpatched", **patching)
    async with DBOSClient(database_url, pool_size=2) as client:
        [checked] = await replay_check(new.dbos, client=client)
    assert checked.divergence is not None and checked.divergence.step_id == 0
    assert (checked.divergence.recorded_name, checked.divergence.new_name) == (
        "charge", "charge_v2")

    await wake_now(database_url, "sleeping")
    async with new.dbos:
        handle = await new.dbos.retrieve_workflow("sleeping")
        with pytest.raises(NondeterminismError, match="recorded as 'charge'"):
            await handle.get_result()
        assert (await handle.get_status()).status == "ERROR"
        [again] = await new.dbos.resume_workflows(["sleeping"])
        with pytest.raises(NondeterminismError):
            await again.get_result()
    assert new.ran == []
