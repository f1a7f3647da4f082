"""Start-up against a server that refuses connections, in real processes.

A URL whose server never answered (connection refused) is almost always a wrong host or
port: entering fails within ``startup_wait`` (3 s by default) with one error line, without
retry warnings. An explicit ``startup_wait`` keeps waiting for a server that starts
later, and its retries log no line more than once per backoff doubling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from dbos_async._database_url import Host, parse_database_url

CHILD = textwrap.dedent(
    """
    import asyncio, logging, sys, time
    from dbos_async import DBOS, DatabaseUnavailableError

    logging.basicConfig(level=logging.DEBUG, format="LOG %(levelname)s %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)

    async def main(url, wait):
        started = time.monotonic()
        try:
            async with DBOS(name="refused", system_database_url=url, startup_wait=wait):
                print("ENTERED", flush=True)
        except DatabaseUnavailableError as error:
            print(f"ERROR DatabaseUnavailableError: {error}", flush=True)
        print(f"ELAPSED {time.monotonic() - started:.2f}", flush=True)

    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
    """
)


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_child(url: str, wait: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.Popen([sys.executable, "-c", CHILD, url, str(wait)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(child: subprocess.Popen[str]) -> tuple[list[str], list[str]]:
    out, err = child.communicate(timeout=120)
    return out.splitlines(), [line for line in err.splitlines() if line.startswith("LOG ")]


def test_a_closed_port_fails_within_seconds_with_one_error_line(database_url: str) -> None:
    """It used to retry for 60 s (db_retry_timeout), warning as it went."""
    port = closed_port()
    url = parse_database_url(database_url).with_server(Host("127.0.0.1", port))
    wait = 3.0  # the default startup_wait
    out, logs = finish(start_child(url, wait))
    errors = [line for line in out if line.startswith("ERROR")]
    assert len(errors) == 1, out
    assert errors[0].startswith("ERROR DatabaseUnavailableError: Cannot connect to the "
                                "system database") and f"127.0.0.1:{port}" in errors[0]
    assert "ConnectionRefusedError" in errors[0] and "startup_wait" in errors[0]
    # The wait, and time to spare on a loaded machine: far from the 60 s it took.
    assert float(out[-1].split()[1]) < wait + 4.0
    assert [line for line in logs if not line.startswith("LOG DEBUG")] == []


@contextlib.asynccontextmanager
async def forwarder(port: int, target: Host) -> AsyncIterator[None]:
    """A TCP forwarder from 127.0.0.1:``port`` to ``target``: the server 'starts' there."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(target.address,
                                                                         target.port)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(pipe(reader, upstream_writer))
            tasks.create_task(pipe(upstream_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        yield


async def test_an_explicit_startup_wait_waits_for_a_server_that_starts_later(
        database_url: str) -> None:
    port = closed_port()
    parsed = parse_database_url(database_url)
    child = start_child(parsed.with_server(Host("127.0.0.1", port)), 60.0)
    # Refused for longer than the default startup_wait before the server comes.
    with pytest.raises(subprocess.TimeoutExpired):
        await asyncio.to_thread(child.wait, timeout=4.0)
    async with forwarder(port, parsed.hosts[0]):
        out, logs = await asyncio.to_thread(finish, child)
    assert "ENTERED" in out, out
    repeated = Counter(line.split(" ", 2)[2] for line in logs
                       if not line.startswith("LOG DEBUG"))
    assert all(count == 1 for count in repeated.values()), repeated
