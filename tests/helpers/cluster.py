"""A private PostgreSQL server that a test stops and starts again on its port (an outage);
and what the tests' other private servers share to kill one and start it again."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dbos_async._sysdb.embedded import pid_alive
from dbos_async.testing import servers


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _wait_gone(pids: list[int], patience: float = 30.0) -> None:
    deadline = time.monotonic() + patience
    while any(pid_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {[p for p in pids if pid_alive(p)]} outlived "
                                 f"{patience}s")
        time.sleep(0.02)


def kill_postmaster(data: Path) -> None:
    """SIGKILL the postmaster of the cluster in ``data``, as a crash does, and wait until its
    server processes (which notice their postmaster's death) are gone too."""
    pid = servers.postmaster_pid(data)
    assert pid is not None and pid_alive(pid), f"no server runs in {data}"
    children = _children(pid)
    os.kill(pid, signal.SIGKILL)
    _wait_gone([pid, *children])


def clear_killed_server(data: Path, socket_dir: Path, port: int) -> None:
    """Remove the lock files a killed server left in ``data`` and ``socket_dir``, as after a
    machine's crash, so that it can start again on ``port``: its PID may still exist as a
    zombie (no init process reaps it here), which would make the new postmaster think the old
    one still runs."""
    pid = servers.postmaster_pid(data)
    if pid is not None and not pid_alive(pid):
        for lock in (data / "postmaster.pid", socket_dir / f".s.PGSQL.{port}.lock"):
            lock.unlink(missing_ok=True)


class Cluster:
    """A throwaway cluster from local binaries that can be stopped and started again on
    its port."""

    def __init__(self) -> None:
        try:
            bindir, self._user = servers._check_local()
        except servers.Unavailable as why:
            pytest.skip(f"no local PostgreSQL binaries: {why}")
        self._bindir = bindir
        self.server = servers.start_local_cluster(bindir, self._user)
        assert self.server.base_dir is not None
        self._base = self.server.base_dir
        self.port = urlsplit(self.server.url).port

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _pg_ctl(self, *args: str) -> None:
        user: pwd.struct_passwd | None = self._user
        kwargs: dict[str, Any] = {} if user is None else {
            "user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        subprocess.run([str(self._bindir / "pg_ctl"), "-D", str(self._base / "data"), *args],
                       cwd=self._base, capture_output=True, text=True, check=True, timeout=60,
                       **kwargs)

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 "
                   f"-c unix_socket_directories={self._base}")
        self._pg_ctl("-l", str(Path(self._base) / "server.log"), "-w", "-o", options, "start")

    def remove(self) -> None:
        self.server.stop()
