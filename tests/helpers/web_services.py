"""Real HTTP services for the FastAPI and aiohttp tests.

:class:`Service` runs an example service (``examples/fastapi_app.py`` under uvicorn,
``examples/aiohttp_app.py`` with its own ``main``) as a subprocess serving a listening socket
the test binds once, so a restarted server answers on the same address and a request sent
while none runs waits in the socket's backlog. :class:`Warehouse` is the service the
examples' shipping step calls, run in the test's own loop: it records every call and holds
them while its gate is closed, which is how a test catches a workflow in the middle of a
step.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx2
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
FASTAPI_COMMAND = (sys.executable, "-m", "uvicorn", "examples.fastapi_app:app",
                   "--log-level", "warning", "--fd", "{fd}")
AIOHTTP_COMMAND = (sys.executable, "examples/aiohttp_app.py", "--fd", "{fd}")
# Both runs of a service are one executor, so the second recovers what the first left.
EXECUTOR_ID = "web-test-executor"
PATIENCE = 60.0


class Warehouse:
    """``POST /shipments`` answering ``{"tracking": "track-<order>-<call number>"}``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.arrivals: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.gate = asyncio.Event()
        self.gate.set()
        self.url = ""
        self._runner: web.AppRunner | None = None

    def hold(self) -> None:
        """Calls from now on wait until :meth:`release`."""
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    async def next_arrival(self) -> dict[str, Any]:
        """The next call's body, as soon as the call arrives (answered or held)."""
        return await asyncio.wait_for(self.arrivals.get(), PATIENCE)

    async def _ship(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(body)
        self.arrivals.put_nowait(body)
        await self.gate.wait()
        return web.json_response({"tracking": f"track-{body['order_id']}-{len(self.calls)}"})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/shipments", self._ship)
        self._runner = web.AppRunner(app, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def close(self) -> None:
        self.release()
        if self._runner is not None:
            await self._runner.cleanup()


class Service:
    """An example service in a subprocess, on a socket that outlives its processes."""

    def __init__(self, command: Sequence[str], database_url: str, warehouse_url: str,
                 log_dir: Path) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(128)
        self.socket.set_inheritable(True)
        host, port = self.socket.getsockname()
        self.url = f"http://{host}:{port}"
        fd = str(self.socket.fileno())
        self.command = [part.replace("{fd}", fd) for part in command]
        self.env = dict(os.environ, DBOS_SYSTEM_DATABASE_URL=database_url,
                        WAREHOUSE_URL=warehouse_url, DBOS_EXECUTOR_ID=EXECUTOR_ID,
                        DBOS_SHUTDOWN_GRACE_PERIOD="1")
        self.log_dir = log_dir
        self.runs = 0
        self.process: asyncio.subprocess.Process | None = None
        self.client = httpx2.AsyncClient(base_url=self.url, timeout=PATIENCE)

    @property
    def log(self) -> Path:
        return self.log_dir / f"service-{self.runs}.log"

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    async def start(self) -> None:
        """Start a server process and wait until it answers (failing with its output if
        it exits first)."""
        self.runs += 1
        with self.log.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.command, cwd=ROOT, env=self.env, pass_fds=(self.socket.fileno(),),
                stdout=log, stderr=log)
        probe = asyncio.ensure_future(self.client.get("/workflows", params={"limit": 1}))
        exited = asyncio.ensure_future(self.process.wait())
        await asyncio.wait({probe, exited}, return_when=asyncio.FIRST_COMPLETED)
        if not probe.done():
            probe.cancel()
            raise AssertionError(f"the service exited at start:\n{self.output()}")
        exited.cancel()
        assert probe.result().status_code == 200, self.output()

    async def kill(self) -> None:
        """SIGKILL the server: a crash, mid-whatever it was doing."""
        assert self.process is not None
        self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        """SIGTERM the server and wait for its graceful exit (SIGKILL if it hangs)."""
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), PATIENCE)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise AssertionError(f"the service did not stop on SIGTERM:\n{self.output()}") from None

    async def close(self) -> None:
        try:
            await self.stop()
        finally:
            await self.client.aclose()
            self.socket.close()


@contextlib.asynccontextmanager
async def running_service(command: Sequence[str], database_url: str,
                          log_dir: Path) -> AsyncIterator[tuple[Service, Warehouse]]:
    """A started service and the warehouse its shipping step calls."""
    warehouse = Warehouse()
    await warehouse.start()
    service = Service(command, database_url, warehouse.url, log_dir)
    try:
        await service.start()
        yield service, warehouse
    finally:
        warehouse.release()
        try:
            await service.close()
        finally:
            await warehouse.close()
