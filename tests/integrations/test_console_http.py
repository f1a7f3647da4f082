"""The console over HTTP: what each page shows, and its safety rules (auth, loopback,
allowed hosts, read-only default, CSRF and origin of actions, escaping, security headers,
limits of its input)."""

from __future__ import annotations

import asyncio
import base64
import re
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from click.testing import CliRunner
from fastapi import FastAPI

from dbos_async import ConfigurationError, DBOSError, SetShardKey, SetWorkflowID
from dbos_async.cli.main import cli
from dbos_async.console import ConsoleAuth, console_app
from dbos_async.console.safety import check_bind
from tests.helpers import new_dbos, wait_until
from tests.helpers.console_scenario import (
    XSS_INPUT,
    XSS_NAME,
    Scenario,
    scenario,
    serving,
    status_of,
)

TOKEN = "t0ken-for-the-console-tests"
BASE = "http://localhost:8000"


@pytest.fixture
async def world(database_url: str) -> AsyncIterator[Scenario]:
    async with scenario(database_url) as running:
        yield running


def client(app: object, peer: str = "127.0.0.1") -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app, client=(peer, 5000)),
                              base_url=BASE)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert match is not None
    return match.group(1)


async def test_pages_show_the_workflows_and_escape_every_value(world: Scenario) -> None:
    async with client(console_app(world.dbos)) as http:
        listing = await http.get("/workflows")
        assert listing.status_code == 200
        for workflow_id in (world.succeeded, world.failed, world.waiting, world.cancelled,
                            world.exhausted, world.delayed, *world.backlog):
            assert workflow_id in listing.text
        for status in ("SUCCESS", "ERROR", "PENDING", "ENQUEUED", "DELAYED", "CANCELLED",
                       "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
            assert f">{status}<" in listing.text
        assert XSS_NAME not in listing.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in listing.text
        assert "script-src 'self'" in listing.headers["content-security-policy"]

        errors = await http.get("/workflows", params={"status": "ERROR"})
        assert world.failed in errors.text and world.succeeded not in errors.text
        by_prefix = await http.get("/workflows", params={"workflow_id_prefix": "backlog-"})
        assert all(w in by_prefix.text for w in world.backlog)
        assert world.waiting not in by_prefix.text
        bad = await http.get("/workflows", params={"attributes": "[1]"})
        assert bad.status_code == 400 and "must be a JSON object" in bad.text

        detail = await http.get("/workflow", params={"id": world.succeeded})
        assert "load_order" in detail.text and world.child in detail.text
        tree = detail.text[detail.text.index('id="children"'):]
        assert tree.index(world.child) < tree.index(world.grandchild)
        assert "Show all" in detail.text  # the step's 200 lines are cut
        assert "progress" in detail.text and "&#34;shipped&#34;" in detail.text
        full = await http.get("/workflow/value", params={"id": world.succeeded,
                                                         "part": "step", "step": "0"})
        assert full.headers["content-type"].startswith("text/plain")
        assert "sku-199" in full.text

        failed = await http.get("/workflow", params={"id": world.failed})
        assert "retries exhausted" in failed.text and "card declined" in failed.text
        xss = await http.get("/workflow", params={"id": world.xss})
        assert XSS_INPUT not in xss.text and "&lt;img src=x onerror=alert(2)&gt;" in xss.text
        waiting = await http.get("/workflow", params={"id": world.waiting})
        assert "note for later" in waiting.text and "unrelated" in waiting.text
        missing = await http.get("/workflow", params={"id": "no-such-workflow"})
        assert missing.status_code == 404

        queues = await http.get("/queues")
        assert "backlog" in queues.text and world.backlog[0] in queues.text
        live = await http.get("/api/statuses", params={"id": [world.waiting, world.failed]})
        assert {(s["id"], s["status"]) for s in live.json()} == {
            (world.waiting, "PENDING"), (world.failed, "ERROR")}


async def test_read_only_by_default(world: Scenario) -> None:
    async with client(console_app(world.dbos)) as http:
        page = await http.get("/workflow", params={"id": world.waiting})
        assert 'id="cancel"' not in page.text
        refused = await http.post("/workflow/cancel", data={
            "id": world.waiting, "csrf_token": csrf_of(page.text)})
        assert refused.status_code == 403 and "read-only" in refused.text
    assert await status_of(world.dbos, world.waiting) == "PENDING"


async def test_actions_need_the_csrf_token_and_the_same_origin(world: Scenario) -> None:
    app = console_app(world.dbos, allow_actions=True)
    async with client(app) as http:
        page = await http.get("/workflow", params={"id": world.waiting})
        token = csrf_of(page.text)
        assert 'id="cancel"' in page.text
        for data, headers in (({"id": world.waiting}, {}),
                              ({"id": world.waiting, "csrf_token": "forged"}, {}),
                              ({"id": world.waiting, "csrf_token": token},
                               {"origin": "http://evil.example"}),
                              ({"id": world.waiting, "csrf_token": token},
                               {"sec-fetch-site": "cross-site"})):
            refused = await http.post("/workflow/cancel", data=data, headers=headers)
            assert refused.status_code == 403, (data, headers)
        # Another browser's token (without its cookie) is refused too.
        async with client(app) as stranger:
            refused = await stranger.post("/workflow/cancel",
                                          data={"id": world.waiting, "csrf_token": token})
            assert refused.status_code == 403
        assert await status_of(world.dbos, world.waiting) == "PENDING"
        done = await http.post("/workflow/cancel", data={"id": world.waiting,
                                                         "csrf_token": token},
                               headers={"origin": BASE})
        assert done.status_code == 303
        assert await status_of(world.dbos, world.waiting) == "CANCELLED"
        resumed = await http.post("/workflow/resume", data={"id": world.waiting},
                                  headers={"x-csrf-token": token,
                                           "accept": "application/json"})
        assert resumed.json()["workflow_id"] == world.waiting

        async def running() -> bool:
            return await status_of(world.dbos, world.waiting) == "PENDING"

        await wait_until(running, what="the resumed workflow to run")
        confirm = await http.get("/workflow/fork", params={"id": world.succeeded,
                                                           "start_step": "1"})
        assert "load_order" in confirm.text  # replayed
        forked = await http.post("/workflow/fork", data={
            "id": world.succeeded, "start_step": "1", "csrf_token": token})
        assert forked.status_code == 303 and world.succeeded not in forked.headers["location"]

        paused = await http.post("/schedules/pause", data={"name": "nightly",
                                                           "csrf_token": token})
        assert paused.status_code == 303
        schedule = await world.dbos.get_schedule("nightly")
        assert schedule is not None and schedule.paused
        assert "Resume" in (await http.get("/schedules")).text


async def test_auth_is_required_off_loopback(world: Scenario) -> None:
    open_app = console_app(world.dbos)
    async with client(open_app, peer="203.0.113.9") as http:
        assert (await http.get("/workflows")).status_code == 403

    token_app = console_app(world.dbos, allow_actions=True, auth=ConsoleAuth(token=TOKEN))
    async with client(token_app, peer="203.0.113.9") as http:
        assert (await http.get("/workflows")).status_code == 401
        assert (await http.get("/workflows",
                               headers={"authorization": "Bearer wrong-token-123456"})
                ).status_code == 401
        # An action without the token is refused before anything else is looked at.
        refused = await http.post("/workflow/cancel", data={"id": world.waiting})
        assert refused.status_code == 401
        ok = await http.get("/workflows", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        login = await http.get("/workflows", params={"token": TOKEN, "status": "ERROR"})
        assert login.status_code == 303 and "token" not in login.headers["location"]
        assert "httponly" in login.headers["set-cookie"].lower()
        assert (await http.get(login.headers["location"])).status_code == 200
    assert await status_of(world.dbos, world.waiting) == "PENDING"

    basic_app = console_app(world.dbos, auth=ConsoleAuth(username="ops", password="s3cret"))
    async with client(basic_app, peer="203.0.113.9") as http:
        refused_basic = await http.get("/queues")
        assert refused_basic.status_code == 401
        assert refused_basic.headers["www-authenticate"].startswith("Basic")
        good = base64.b64encode(b"ops:s3cret").decode()
        bad = base64.b64encode(b"ops:guess").decode()
        assert (await http.get("/queues", headers={"authorization": f"Basic {bad}"})
                ).status_code == 401
        assert (await http.get("/queues", headers={"authorization": f"Basic {good}"})
                ).status_code == 200


async def test_only_allowed_host_names_are_answered(world: Scenario) -> None:
    """DNS rebinding: a site whose name now points at 127.0.0.1 sends its page's requests
    to the console from this machine's browser, with its own name as ``Host`` and
    ``Origin``. They are refused, reads and actions alike, even with a CSRF pair."""
    app = console_app(world.dbos, allow_actions=True)
    async with client(app) as http:
        token = csrf_of((await http.get("/workflows")).text)
        rebound = {"host": "evil.example.com:8000"}
        read = await http.get("/workflows", headers=rebound)
        assert read.status_code == 400 and world.waiting not in read.text
        assert "allowed_hosts" in read.text and "--allowed-host" in read.text
        refused = await http.post("/workflow/cancel", data={"id": world.waiting,
                                                            "csrf_token": token},
                                  headers={**rebound, "origin": "http://evil.example.com:8000"})
        assert refused.status_code == 400
        for host in ("evil.example.com", "127.0.0.1.evil.example.com", "localhost.example",
                     "evil.example.com@127.0.0.1", "127.0.0.1/x", "[::1", ""):
            assert (await http.get("/workflows", headers={"host": host})
                    ).status_code == 400, host
        for host in ("localhost", "localhost:8000", "LocalHost:1", "127.0.0.1",
                     "127.0.0.1:43210", "[::1]", "[::1]:8000"):
            assert (await http.get("/workflows", headers={"host": host})
                    ).status_code == 200, host
        # An action's Origin must be the host it was sent to: another port is another site.
        for origin in ("http://evil.example.com:8000", "http://localhost:3000", "null"):
            other = await http.post("/workflow/cancel", data={"id": world.waiting,
                                                              "csrf_token": token},
                                    headers={"origin": origin})
            assert other.status_code == 403, origin
    assert await status_of(world.dbos, world.waiting) == "PENDING"

    # Reached through a proxy by a name of its own: allowed hosts, the loopback names still.
    named = console_app(world.dbos, allow_actions=True,
                        allowed_hosts=["console.example.com", "*.ops.example.com",
                                       "[2001:db8::1]"])
    async with client(named) as http:
        for host, status_code in (("console.example.com", 200),
                                  ("Console.Example.com:443", 200),
                                  ("eu.ops.example.com", 200), ("ops.example.com", 400),
                                  ("evil.example.com", 400), ("localhost:8000", 200),
                                  ("[2001:db8::1]:8000", 200), ("[2001:db8::2]", 400)):
            assert (await http.get("/workflows", headers={"host": host})
                    ).status_code == status_code, host
        site = {"host": "console.example.com", "origin": "https://console.example.com"}
        token = csrf_of((await http.get("/workflows", headers=site)).text)
        done = await http.post("/workflow/cancel", headers=site,
                               data={"id": world.waiting, "csrf_token": token})
        assert done.status_code == 303
    assert await status_of(world.dbos, world.waiting) == "CANCELLED"

    # With authentication, any name unless allowed hosts are given.
    bearer = {"authorization": f"Bearer {TOKEN}"}
    for allowed, status_code in ((None, 200), (["console.example.com"], 400)):
        authed = console_app(world.dbos, auth=ConsoleAuth(token=TOKEN),
                             allowed_hosts=allowed)
        async with client(authed, peer="203.0.113.9") as http:
            answer = await http.get("/workflows",
                                    headers={**bearer, "host": "other.example.com"})
            assert answer.status_code == status_code, allowed
            assert (await http.get("/workflows", headers={
                **bearer, "host": "console.example.com"})).status_code == 200
    for wrong in (["https://console.example.com"], ["console.example.com:8000"], ["a b"],
                  ["2001:db8::1"], ["*."], [""]):
        with pytest.raises(ConfigurationError, match="must be a host name"):
            console_app(world.dbos, allowed_hosts=wrong)


async def test_bad_and_oversized_input_is_refused_with_the_reason(world: Scenario) -> None:
    """Over a real server: each refusal names the parameter and the problem, and a body
    refused unread is still an answer, not a reset connection."""
    def nested(depth: int) -> str:
        return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"

    async with serving(console_app(world.dbos, allow_actions=True)) as base, \
            httpx2.AsyncClient(base_url=base) as http:
        for params, status_code, reason in (
                ({"page": "1111111111111111111"}, 400,
                 "page must be from 0 to 184467440737095516"),
                ({"page": "-1"}, 400, "page must be from 0"),
                ({"page": "184467440737095516"}, 200, ""),  # its offset fits a bigint
                ({"attributes": "[" * 1300 + "]" * 1300}, 400,  # deeper than json recurses
                 "must nest at most 32 levels"),
                ({"attributes": nested(33)}, 400, "must nest at most 32 levels"),
                ({"attributes": nested(32)}, 200, ""),
                ({"attributes": '{"a": "' + "[{" * 100 + '\\""}'}, 200, ""),
                ({"name": "x" * 9000}, 414, "The URL is over 8192 bytes")):
            answer = await http.get("/workflows", params=params)
            assert answer.status_code == status_code, params
            assert reason in answer.text, params
        for path, params in (("/workflow/fork", {"start_step": "2147483648"}),
                             ("/workflow/value", {"part": "step", "step": "9" * 30})):
            step = await http.get(path, params={"id": world.succeeded, **params})
            assert step.status_code == 400 and "must be from 0 to 2147483647" in step.text

        token = csrf_of((await http.get("/workflows")).text)
        form = {"id": world.waiting, "csrf_token": token, "padding": "x" * 1_000_000}
        too_large = await http.post("/workflow/cancel", data=form)
        assert too_large.status_code == 413 and "over 65536 bytes" in too_large.text

        async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            yield f"id={world.waiting}&csrf_token={token}&padding=".encode()
            for _ in range(100):
                yield b"x" * 1000

        chunked = await http.post("/workflow/cancel", content=streamed(), headers={
            "content-type": "application/x-www-form-urlencoded"})
        assert chunked.status_code == 413
    assert await status_of(world.dbos, world.waiting) == "PENDING"


async def test_mounted_into_fastapi(world: Scenario) -> None:
    app = FastAPI()
    app.mount("/dbos", console_app(world.dbos))
    async with client(app) as http:
        page = await http.get("/dbos/workflows")
        assert page.status_code == 200
        assert f'href="/dbos/workflow?id={world.failed}"' in page.text
        assert 'href="/dbos/static/console.css"' in page.text
        assert (await http.get("/dbos/static/console.js")).status_code == 200


def test_a_non_loopback_bind_needs_an_auth_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="without authentication"):
        check_bind("0.0.0.0", None)
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", ConsoleAuth(token=TOKEN))
    monkeypatch.delenv("DBOS_CONSOLE_TOKEN", raising=False)
    monkeypatch.delenv("DBOS_CONSOLE_BASIC_AUTH", raising=False)
    refused = CliRunner().invoke(cli, ["console", "--url", "postgresql://127.0.0.1/x",
                                       "--host", "0.0.0.0"])
    assert refused.exit_code == 1 and "without authentication" in refused.output
    url_as_host = CliRunner().invoke(cli, ["console", "--url", "postgresql://127.0.0.1/x",
                                           "--allowed-host", "https://console.example.com"])
    assert url_as_host.exit_code == 1 and "must be a host name" in url_as_host.output
    monkeypatch.setenv("DBOS_CONSOLE_BASIC_AUTH", "no-colon")
    malformed = CliRunner().invoke(cli, ["console", "--url", "postgresql://127.0.0.1/x"])
    assert malformed.exit_code == 1 and "user:password" in malformed.output
    with pytest.raises(ConfigurationError, match="at least 16"):
        ConsoleAuth(token="short")


async def test_sharded_reads_and_pages_address_one_key(database_url: str) -> None:
    """The same workflow ID under two keys: every read and page names its key, and sees
    only that workflow's rows."""
    dbos = new_dbos(database_url, sharding=True, shutdown_grace_period=0.2)
    jobs = dbos.queue("jobs", concurrency=1)

    @dbos.workflow(name="tenant_job")
    async def tenant_job(tenant: str) -> Any:
        await dbos.set_event("tenant", tenant)
        await dbos.write_stream("log", f"hello {tenant}")
        return await dbos.recv("go", timeout=600)

    async with dbos:
        for tenant in ("acme", "globex"):
            with SetShardKey(tenant), SetWorkflowID("job-1"):
                await jobs.enqueue(tenant_job, tenant)
            with SetShardKey(tenant), SetWorkflowID("job-2"):
                await jobs.enqueue(tenant_job, tenant)
        await dbos.send("job-1", "memo", topic="memo", shard_key="globex")

        async def running_and_counted() -> bool:
            # However the limit of one splits across keys, those running have written
            # their stream and are the queue's starts.
            rows = await dbos.list_workflows(queue_name="jobs", status="PENDING")
            activity = await dbos.queue_activity(minutes=5)
            return (bool(rows) and all([await dbos.list_stream_values(
                        r.workflow_id, shard_key=r.shard_key) for r in rows])
                    and [(a.queue_name, a.started, a.completed) for a in activity]
                    == [("jobs", len(rows), 0)])

        await wait_until(running_and_counted, what="the running jobs to be counted")
        running = (await dbos.list_workflows(queue_name="jobs", status="PENDING"))[0]
        key = running.shard_key
        assert key is not None
        history = await dbos.get_event_history(running.workflow_id, shard_key=key)
        assert [(h.key, h.value) for h in history] == [("tenant", key)]
        [value] = await dbos.list_stream_values(running.workflow_id, shard_key=key)
        assert (value.key, value.offset, value.value) == ("log", 0, f"hello {key}")
        [memo] = await dbos.list_unconsumed_messages("job-1", shard_key="globex")
        assert (memo.topic, memo.value) == ("memo", "memo")
        assert await dbos.list_unconsumed_messages("job-1", shard_key="acme") == []
        oldest = (await dbos.oldest_waiting_workflows())["jobs"]
        assert oldest.status == "ENQUEUED" and oldest.shard_key is not None
        with pytest.raises(DBOSError, match="minutes"):
            await dbos.queue_activity(minutes=0)
        with pytest.raises(DBOSError, match="shard key"):
            await dbos.get_event_history("job-1")

        async with client(console_app(dbos)) as http:
            listing = await http.get("/workflows", params={"shard_key": "globex"})
            assert 'name="shard_key"' in listing.text
            assert "shard_key=globex" in listing.text and "shard_key=acme" not in listing.text
            page = await http.get("/workflow", params={"id": "job-1", "shard_key": "globex"})
            assert page.status_code == 200 and ">memo<" in page.text
            other = await http.get("/workflow", params={"id": "job-1", "shard_key": "acme"})
            assert ">memo<" not in other.text
            live = await http.get("/api/statuses", params={"id": "job-1", "key": "acme"})
            assert [s["key"] for s in live.json()] == ["acme"]
            assert "jobs" in (await http.get("/queues")).text


async def raw_request(port: int, head: bytes) -> bytes:
    """What the server at ``port`` answers to ``head``, sent whole over a socket of its
    own (an HTTP client would refuse to send a URL of a megabyte)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_command_serves_the_console(world: Scenario, database_url: str) -> None:
    """``dbos-async console`` connects a client in its lifespan and serves read-only, to
    its allowed hosts; a request too large to parse gets an answer saying so."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from dbos_async.cli import main; main()", "console",
        "--url", database_url, "--port", str(port), "--allowed-host", "console.example.com",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            pages: list[httpx2.Response] = []

            async def answered() -> bool:
                try:
                    pages.append(await http.get("/workflows"))
                except httpx2.TransportError:
                    assert process.returncode is None, "the console exited"
                    return False
                return True

            await wait_until(answered, what="the console to answer")
            assert pages[-1].status_code == 200 and world.failed in pages[-1].text
            refused = await http.post("/workflow/cancel", data={"id": world.waiting})
            assert refused.status_code == 403
            for host, status_code in (("console.example.com", 200),
                                      ("evil.example.com", 400)):
                answer = await http.get("/workflows", headers={"host": host})
                assert answer.status_code == status_code, host
            long_url = await http.get("/workflows", params={"name": "x" * 9000})
            assert long_url.status_code == 414
        huge_url = await raw_request(port, b"GET /workflows?name=" + b"x" * 1_000_000
                                     + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert huge_url.startswith(b"HTTP/1.1 414 ")
        assert huge_url.endswith(b"The URL is over 8192 bytes")
        huge_header = await raw_request(port, b"GET /workflows HTTP/1.1\r\nHost: 127.0.0.1"
                                        b"\r\nX-Padding: " + b"x" * 1_000_000 + b"\r\n\r\n")
        assert huge_header.startswith(b"HTTP/1.1 431 ")
        garbled = await raw_request(port, b"\x00 not http\r\n\r\n")
        assert garbled.startswith(b"HTTP/1.1 400 ")
    finally:
        process.terminate()
        await process.wait()
    assert await status_of(world.dbos, world.waiting) == "PENDING"


_PICKLED_SEND = """
import sys
from dbos import DBOSClient
client = DBOSClient(system_database_url=sys.argv[1])
try:
    client.send("approval-waiting", {"sent": "by dbos"}, topic="pickled")
finally:
    client.destroy()
"""


async def test_a_value_in_another_sdks_format_spoils_only_its_section(
        world: Scenario, database_url: str) -> None:
    """A message the `dbos` package sent in its default (pickle) format: the page still
    shows, and says why the messages cannot be."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PICKLED_SEND, database_url, stderr=asyncio.subprocess.PIPE)
    _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    async with client(console_app(world.dbos)) as http:
        page = await http.get("/workflow", params={"id": world.waiting})
        assert page.status_code == 200
        assert "Some values cannot be shown" in page.text and "py_pickle" in page.text
        assert "await_approval" in page.text


async def test_the_executors_page_tells_live_from_gone(database_url: str) -> None:
    """An executor is alive while its process holds its executor-ID lock: one that exited
    shows as gone, with the PENDING workflow it left behind."""
    def executor(executor_id: str) -> Any:
        dbos = new_dbos(database_url, executor_id=executor_id, failover_after=None,
                        shutdown_grace_period=0.1)

        @dbos.workflow(name="waits")
        async def waits() -> Any:
            return await dbos.recv("go", timeout=600)

        return dbos, waits

    alpha, alpha_waits = executor("alpha")
    beta, beta_waits = executor("beta")
    async with alpha:
        with SetWorkflowID("on-alpha"):
            await alpha.start_workflow(alpha_waits)
        async with beta:
            with SetWorkflowID("on-beta"):
                await beta.start_workflow(beta_waits)
            both = {e.executor_id: e for e in await alpha.list_executors()}
            assert both["alpha"].alive and both["beta"].alive
        found = {e.executor_id: e for e in await alpha.list_executors()}
        assert found["alpha"].alive and [w.workflow_id for w in found["alpha"].running] == [
            "on-alpha"]
        assert not found["beta"].alive and found["beta"].pending == 1
        async with client(console_app(alpha)) as http:
            page = (await http.get("/executors")).text
        rows = dict(re.findall(r'data-executor="([^"]+)" data-alive="(yes|no)"', page))
        assert rows == {"alpha": "yes", "beta": "no"}
        assert "on-alpha" in page and "on-beta" in page
