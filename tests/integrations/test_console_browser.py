"""The console in a real browser: headless Chromium (Debian's package) driven by
Playwright, over a running executor with workflows in every status. Screenshots of each
page go to tests/artifacts/console/<test name>/ for a reviewer to look at; with
DOCS_SCREENSHOTS=1 (``make screenshots``) the ones the documentation shows are also copied
to docs/images/, to be committed with the change that alters them.

Without /usr/bin/chromium the tests are skipped, except under CI=true, where they fail
(``make test`` installs it where apt can)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

from dbos_async.console import console_app
from tests.helpers.console_scenario import XSS_INPUT, XSS_NAME, Scenario, scenario, serving

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

if not CHROMIUM.exists():
    reason = f"{CHROMIUM} is missing: install Debian's chromium package (make test does)"
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"The browser tests cannot run under CI: {reason}")
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        yield launched
        await launched.close()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Path:
    folder = ARTIFACTS / request.node.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def for_docs(shot: Path, name: str) -> None:
    """Copy ``shot`` to the documentation's images as ``name``, under DOCS_SCREENSHOTS=1:
    the pictures on the site are the pages these tests checked."""
    if os.environ.get("DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGES / name)


@pytest.fixture
async def world(database_url: str) -> AsyncIterator[Scenario]:
    async with scenario(database_url) as running:
        yield running


async def new_page(browser: Browser, dialogs: list[str], accept: bool = False) -> Page:
    """A page that records every dialog (an XSS would open one), and accepts it (an
    action's confirmation) or dismisses it."""
    page = await browser.new_page(viewport={"width": 1280, "height": 900})

    async def seen(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await (dialog.accept() if accept else dialog.dismiss())

    page.on("dialog", seen)
    return page


async def test_pages_read_only_and_escaped(browser: Browser, world: Scenario,
                                           shots: Path) -> None:
    dialogs: list[str] = []
    async with serving(console_app(world.dbos)) as base:
        page = await new_page(browser, dialogs)
        await page.goto(f"{base}/workflows")
        table = page.locator("#workflows")
        for workflow_id, status in ((world.succeeded, "SUCCESS"), (world.failed, "ERROR"),
                                    (world.waiting, "PENDING"),
                                    (world.cancelled, "CANCELLED"),
                                    (world.exhausted, "MAX_RECOVERY_ATTEMPTS_EXCEEDED"),
                                    (world.backlog[0], "ENQUEUED"),
                                    (world.delayed, "DELAYED")):
            row = table.locator(f'tr[data-workflow-id="{workflow_id}"]')
            await expect(row.locator("[data-status]")).to_have_text(status)
        # The workflow named like a script shows as text; nothing ran.
        await expect(table.locator(f'tr[data-workflow-id="{world.xss}"] td.name')
                     ).to_have_text(XSS_NAME)
        await expect(page.locator(".mode")).to_have_text("read-only")
        await page.screenshot(path=shots / "workflows.png", full_page=True)
        for_docs(shots / "workflows.png", "console-workflows.png")

        await page.goto(f"{base}/workflow?id={world.xss}")
        await expect(page.locator("#workflow-name")).to_have_text(XSS_NAME)
        await expect(page.locator("#value-input")).to_contain_text(XSS_INPUT)
        # Read-only: no action is offered.
        assert await page.locator("#cancel, #resume, #fork").count() == 0

        await page.goto(f"{base}/workflow?id={world.failed}")
        await expect(page.locator("#timeline .bar-retried")).to_have_count(1)
        await expect(page.locator("#timeline")).to_contain_text("retries exhausted")
        await expect(page.locator("#value-error")).to_contain_text("card declined")
        await page.screenshot(path=shots / "workflow-failed.png", full_page=True)

        await page.goto(f"{base}/workflow?id={world.succeeded}")
        await expect(page.locator("#timeline .lane")).to_have_count(
            len(await world.dbos.list_workflow_steps(world.succeeded)))
        await page.locator("#children a", has_text=world.child).click()
        await expect(page.locator(".wid")).to_have_text(world.child)
        await page.go_back()
        await page.screenshot(path=shots / "workflow.png", full_page=True)

        await page.goto(f"{base}/queues")
        backlog = page.locator('section[data-queue="backlog"]')
        await expect(backlog.locator(".depth-ENQUEUED")).to_have_text(str(len(world.backlog)))
        await expect(backlog.locator(".depth-PENDING")).to_have_text("1")
        await expect(backlog).to_contain_text(world.backlog[0])
        await expect(backlog.locator("svg rect.started")).not_to_have_count(0)
        await page.screenshot(path=shots / "queues.png", full_page=True)

        await page.goto(f"{base}/schedules")
        nightly = page.locator('tr[data-schedule="nightly"]')
        await expect(nightly).to_contain_text("ACTIVE")
        await expect(nightly).to_contain_text("03:00:00+00:00")
        await page.screenshot(path=shots / "schedules.png", full_page=True)

        await page.goto(f"{base}/executors")
        await expect(page.locator('tr[data-alive="yes"]').first).to_contain_text("alive")
        await page.screenshot(path=shots / "executors.png", full_page=True)
    assert dialogs == []


async def test_cancel_and_resume_change_the_status_live(browser: Browser, world: Scenario,
                                                        shots: Path) -> None:
    dialogs: list[str] = []
    async with serving(console_app(world.dbos, allow_actions=True)) as base:
        page = await new_page(browser, dialogs, accept=True)
        await page.goto(f"{base}/workflow?id={world.waiting}")
        status = page.locator("#status")
        await expect(status).to_have_text("PENDING")
        await expect(page.locator("#messages")).to_contain_text("note for later")
        await page.locator("#cancel").click()
        await expect(status).to_have_text("CANCELLED")
        assert (await world.dbos.get_workflow_status(world.waiting)).status == "CANCELLED"

        await page.goto(f"{base}/workflow?id={world.waiting}")
        await page.locator("#resume").click()
        await expect(status).to_have_text("PENDING")
        await page.screenshot(path=shots / "workflow-resumed.png", full_page=True)

        # A list page follows a status changed elsewhere, without reloading.
        await page.goto(f"{base}/workflows")
        row = page.locator(f'tr[data-workflow-id="{world.waiting}"] [data-status]')
        await expect(row).to_have_text("PENDING")
        await world.dbos.cancel_workflow(world.waiting)
        await expect(row).to_have_text("CANCELLED")

        await page.goto(f"{base}/workflow?id={world.succeeded}")
        await page.locator("#fork-step").select_option("1")
        await page.locator("#fork").click()
        await expect(page.locator("#rerun")).not_to_contain_text("load_order")
        await page.screenshot(path=shots / "fork-confirmation.png", full_page=True)
        await page.locator("#confirm-fork").click()
        await expect(page.locator(".wid")).not_to_have_text(world.succeeded)
        await expect(page.locator("#status")).to_have_text("SUCCESS")
    assert all(message.startswith(("Cancel", "Resume")) for message in dialogs)


async def test_metrics_charts(browser: Browser, world: Scenario, shots: Path) -> None:
    dialogs: list[str] = []
    async with serving(console_app(world.dbos)) as base:
        page = await new_page(browser, dialogs)
        await page.goto(f"{base}/metrics/charts")
        # Throughput and failures per workflow name: one bar each, this minute's.
        checkout = page.locator('section[data-activity="checkout"]')
        await expect(checkout).to_have_attribute("data-succeeded", "1")
        await expect(checkout.locator("rect.succeeded")).to_have_count(1)
        await expect(checkout.locator("rect.failed")).to_have_count(0)
        pay = page.locator('section[data-activity="pay"]')
        await expect(pay).to_have_attribute("data-failed", "1")
        await expect(pay.locator("rect.failed")).to_have_count(1)
        # The name written like a script is text here too.
        await expect(page.locator(f'section[data-activity="{XSS_NAME}"] h3')).to_have_text(
            XSS_NAME)
        # Run-time percentiles: three bars per finished name, p50 <= p95 <= p99.
        p99 = page.locator('#latency rect[data-percentile="p99"]')
        assert await p99.count() >= 4
        widths = [float(await page.locator(f'#latency rect[data-percentile="{p}"]').first
                        .get_attribute("width") or "nan") for p in ("p50", "p95", "p99")]
        assert widths == sorted(widths), widths
        # The backlog queue: four waiting (three ENQUEUED behind the running one, one
        # DELAYED), drawn as a line over the hour.
        backlog = page.locator('section[data-depth="backlog"]')
        await expect(backlog).to_have_attribute("data-waiting", "4")
        points = await backlog.locator("polyline").get_attribute("points") or ""
        assert len(points.split()) == 60
        # This minute is measured (the count now): drawn over the worked-back line.
        assert int(await backlog.get_attribute("data-measured") or "0") >= 1
        await expect(backlog.locator("path.depth-measured")).to_have_count(1)
        await page.screenshot(path=str(shots / "metrics-hour.png"), full_page=True)
        for_docs(shots / "metrics-hour.png", "console-metrics.png")

        await page.click("text=day")
        await expect(page.locator("p.windows a.active")).to_have_text("day")
        points = await page.locator(
            'section[data-depth="backlog"] polyline').get_attribute("points") or ""
        assert len(points.split()) == 1440
        await expect(page.locator('section[data-activity="checkout"]')).to_have_attribute(
            "data-succeeded", "1")
        await page.screenshot(path=str(shots / "metrics-day.png"), full_page=True)
    assert dialogs == []
