"""The replay check: workflows recorded by one version of the code (one finished, one still
running) replayed against new code — the same, a reordered step, a renamed step, a patched
and an unpatched change, a step added after the running one's last checkpoint — reporting
the first divergence, running no step body and writing nothing to the database."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from helpers import fetch, new_dbos

from dbos_async import DBOS, DBOSClient, SetWorkflowID
from dbos_async.executor.exports import ExportedWorkflow
from dbos_async.executor.replay import Divergence, ReplayResult

VARIANTS = ("recorded", "same", "reordered", "renamed", "patched", "unpatched",
            "added_after_last", "fewer_calls")


@dataclass
class App:
    dbos: DBOS
    order: Callable[[int, bool], Awaitable[int]]
    ran: Counter[str]  # step bodies run, by name


def app(url: str, variant: str) -> App:
    """The order workflow as one version of the code has it (``variant``)."""
    dbos = new_dbos(url, shutdown_grace_period=0.0)
    ran: Counter[str] = Counter()

    def step(name: str):  # type: ignore[no-untyped-def]
        @dbos.step(name=name)
        async def body(x: int) -> int:
            ran[name] += 1
            return x + 1

        return body

    reserve, charge, ship, ship_v2, audit = (
        step(n) for n in ("reserve", "charge", "ship", "ship_v2", "audit"))

    @dbos.workflow(name="child")
    async def child(x: int) -> int:
        return x * 2

    @dbos.workflow(name="order")
    async def order(x: int, wait: bool) -> int:
        if variant == "reordered":
            x = await reserve(await charge(x))
        else:
            x = await reserve(x)
            x = await charge(x)
        await dbos.set_event("charged", x)
        x = await child(x)
        await dbos.sleep(0.01)
        if variant == "added_after_last":
            x = await audit(x)
        if wait:
            reply = await dbos.recv("go", timeout=None)
            x += int(reply)
        if variant in ("renamed", "unpatched"):
            x = await ship_v2(x)
        elif variant == "patched":
            x = await (ship_v2(x) if await dbos.patch("new-shipper") else ship(x))
        elif variant != "fewer_calls":
            x = await ship(x)
        return x

    return App(dbos, order, ran)


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
        await first.dbos.get_event("running", "charged", timeout=10)
        while len(await first.dbos.list_workflow_steps("running")) < 5:
            await asyncio.sleep(0.01)
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
