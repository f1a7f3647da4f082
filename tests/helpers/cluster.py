"""A private PostgreSQL server that a test stops and starts again on its port (an outage)."""

from __future__ import annotations

import pwd
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dbos_async.testing import servers


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
