"""``dbos-async schedule list/pause/resume/trigger/backfill/delete``, run as the installed
console script against schedules a client stored; unknown names fail in one line."""

from __future__ import annotations

import json

from helpers import fetch, new_dbos

from dbos_async import DBOSClient
from tests.integrations.test_cli import cli, failed, ok, table_rows


async def test_schedule_commands(database_url: str) -> None:
    async with new_dbos(database_url):  # migrates; then only the client and the CLI act
        pass
    async with DBOSClient(database_url) as client:
        await client.create_schedule("nightly", "report", "0 3 * * *",
                                     timezone="Europe/Paris", context={"k": 1})
    url = ("--url", database_url)

    [listed] = json.loads(ok(await cli("schedule", "list", "--json", *url)))
    assert listed["schedule_name"] == "nightly" and listed["context"] == {"k": 1}
    rows = table_rows(ok(await cli("schedule", "list", *url)))
    assert rows[0] == ["SCHEDULE", "WORKFLOW", "CRON", "TIME ZONE", "STATUS", "LAST FIRED"]
    assert rows[1] == ["nightly", "report", "0 3 * * *", "Europe/Paris", "ACTIVE"]

    assert ok(await cli("schedule", "pause", "nightly", *url)) == "Schedule nightly paused\n"
    [listed] = json.loads(ok(await cli("schedule", "list", "--json", *url)))
    assert listed["status"] == "PAUSED"
    ok(await cli("schedule", "resume", "nightly", *url))

    triggered = ok(await cli("schedule", "trigger", "nightly", *url)).strip()
    assert triggered.startswith("sched-nightly-trigger-")
    args = ("schedule", "backfill", "nightly", "2026-01-01", "2026-01-03", *url)
    first = ok(await cli(*args)).split()
    assert first == ["sched-nightly-2026-01-01T03:00:00+01:00",
                     "sched-nightly-2026-01-02T03:00:00+01:00"]
    assert ok(await cli(*args)).split() == first  # idempotent
    rows = await fetch(database_url, "SELECT workflow_uuid FROM dbos.workflow_status"
                       " WHERE workflow_uuid LIKE 'sched-nightly-%'")
    assert len(rows) == 3

    assert ok(await cli("schedule", "delete", "nightly", *url)) == "Schedule nightly deleted\n"
    for command in ("pause", "resume", "trigger", "delete"):
        assert failed(await cli("schedule", command, "nightly", *url)) == (
            "Error: Schedule 'nightly' does not exist")
