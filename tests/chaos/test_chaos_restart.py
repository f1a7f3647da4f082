"""A server restart in the middle of waits and claims, on a private throwaway cluster.

The cluster comes from the machine's initdb/pg_ctl (the test-server finder's ``local``
branch, :func:`dbos_async.testing.servers.start_local_cluster`); the test is skipped where
those binaries are missing. Each round starts workflows blocked in ``recv``, in a durable
``sleep``, in ``get_event`` (inside a workflow and outside), and a queue backlog whose claims
go on throughout, then stops the server (immediate mode: every connection dies), keeps it
down for a while and starts it again. Afterwards every wait completes with the right value,
every queued workflow runs, and no call saw a raw driver error.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import shlex
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from faults import Calls, failed_tasks, register, unfinished_workflows
from helpers import fetch, new_dbos, wait_until

from dbos_async.testing import databases, servers

pytestmark = pytest.mark.chaos

OUTAGE_SECONDS = 1.5
QUEUE = "chaos_restart_queue"
WAITERS = 3
BACKLOG = 12
WAIT = 60.0


@dataclass
class PrivateCluster:
    server: servers.PgServer
    bindir: Path
    user: pwd.struct_passwd | None

    def pg_ctl(self, *args: str) -> None:
        assert self.server.base_dir is not None
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        done = subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.server.base_dir / "data"), *args],
            cwd=self.server.base_dir, capture_output=True, text=True, timeout=60, check=False,
            **kwargs)
        assert done.returncode == 0, f"pg_ctl {args}: {done.stdout}{done.stderr}"

    def restart(self, outage: float) -> None:
        """Stop the server at once (connections are cut, as by a crash), keep it down for
        ``outage`` seconds, start it again with the options it ran with."""
        assert self.server.base_dir is not None
        data = self.server.base_dir / "data"
        # postmaster.opts: the server binary and every option of its last start.
        options = shlex.split((data / "postmaster.opts").read_text())[1:]
        at = options.index("-D")
        options[at:at + 2] = []
        self.pg_ctl("-m", "immediate", "-w", "stop")
        subprocess.run(["sleep", str(outage)], check=True)
        self.pg_ctl("-w", "-t", "60", "-l", str(self.server.base_dir / "server.log"),
                    "-o", shlex.join(options), "start")


@pytest.fixture(scope="module")
def private_cluster() -> Iterator[PrivateCluster]:
    try:
        bindir, user = servers._check_local()
    except servers.Unavailable as e:
        pytest.skip(f"no local PostgreSQL binaries for a private cluster: {e}")
    # The finder's clusters commit asynchronously (fast, and enough for tests that never
    # crash the server); an immediate stop is a crash: commits must be durable to survive it.
    server = servers.start_local_cluster(bindir, user, extra_conf=["synchronous_commit=on"])
    try:
        yield PrivateCluster(server, bindir, user)
    finally:
        server.stop()


async def test_server_restart_during_waits_and_claims(
    private_cluster: PrivateCluster, scale: int, chaos_figures: Counter[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="dbos_async")
    admin_url = private_cluster.server.url
    url = await databases.create_database(admin_url, databases.new_database_name())
    dbos = new_dbos(url, pool_size=6, connect_timeout=5.0)
    app = register(dbos)
    dbos.queue(QUEUE, concurrency=2, polling_interval=0.2)
    calls = Calls(chaos_figures)
    async with dbos:
        queue = await dbos.get_queue(QUEUE)
        for restart in range(scale):
            receivers = [await dbos.start_workflow(app.receiver, 1, WAIT) for _ in range(WAITERS)]
            relays = [await dbos.start_workflow(app.relay, WAIT) for _ in range(WAITERS)]
            in_workflow = [await dbos.start_workflow(app.event_waiter, r.workflow_id, WAIT)
                           for r in relays]
            sleepers = [await dbos.start_workflow(app.sleeper, 2 * OUTAGE_SECONDS)
                        for _ in range(WAITERS)]
            outside = [asyncio.create_task(calls("get_event", dbos.get_event(
                r.workflow_id, "relayed", WAIT))) for r in relays]
            backlog = [await queue.enqueue(app.steps, 3) for _ in range(BACKLOG)]
            waiting = [h.workflow_id for h in (*receivers, *relays, *in_workflow, *sleepers)]

            async def all_waiting(ids: list[str] = waiting) -> bool:
                # Each of them checkpoints one step, then waits.
                rows = await fetch(url, "SELECT count(DISTINCT workflow_uuid) FROM "
                                        "dbos.operation_outputs WHERE workflow_uuid = ANY($1)", ids)
                return bool(rows[0][0] == len(ids))

            await wait_until(all_waiting, patience=60, what="the workflows to start waiting")
            await asyncio.to_thread(private_cluster.restart, OUTAGE_SECONDS)
            chaos_figures["restarts"] += 1

            for i, handle in enumerate((*receivers, *relays)):
                await calls("send", dbos.send(handle.workflow_id, f"m{restart}-{i}",
                                              topic="chaos", idempotency_key=f"{restart}-{i}"))
            expected: dict[str, Any] = {}
            for i, handle in enumerate(receivers):
                expected[handle.workflow_id] = [f"m{restart}-{i}"]
            for i, (relay, waiter) in enumerate(zip(relays, in_workflow, strict=True)):
                expected[relay.workflow_id] = expected[waiter.workflow_id] = (
                    f"m{restart}-{WAITERS + i}")
            for handle in sleepers:
                expected[handle.workflow_id] = 2 * OUTAGE_SECONDS
            for handle in backlog:
                expected[handle.workflow_id] = 3
            handles = (*receivers, *relays, *in_workflow, *sleepers, *backlog)
            results = {h.workflow_id: await calls("get_result", h.get_result()) for h in handles}
            events = [await task for task in outside]
            chaos_figures["workflows_checked"] += len(handles)
            chaos_figures["workflows_lost"] += sum(results[k] != v for k, v in expected.items())
            assert results == expected, "\n".join(calls.documented + calls.raw)
            assert events == [f"m{restart}-{WAITERS + i}" for i in range(WAITERS)]

        async def settled() -> bool:
            return not await unfinished_workflows(url)

        await wait_until(settled, patience=60, what="every workflow to reach a terminal state")
    assert calls.raw == [], "\n".join(calls.raw)
    assert calls.documented == [], "\n".join(calls.documented)
    assert failed_tasks(caplog) == []
