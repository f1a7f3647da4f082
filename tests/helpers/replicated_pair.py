"""A primary and its streaming standby, made with the machine's own PostgreSQL programs,
for the primary-failover tests.

The primary is a throwaway cluster as the test-server finder's ``local`` branch makes one
(:class:`dbos_async.testing.servers.LocalBinaries`); the standby is its ``pg_basebackup -R``
copy, streaming from it, and optionally its synchronous standby (a commit on the primary
returns once the standby has flushed it). Then the faults of a primary failover:

- :meth:`ReplicatedPair.kill_primary`: SIGKILL of the primary's postmaster, as a crash;
- :meth:`ReplicatedPair.promote_standby`: ``pg_ctl promote``, as an HA manager does; the
  promoted standby starts a new timeline and requires no synchronous standby itself;
- :meth:`ReplicatedPair.restart_old_primary`: the old primary back up as it was, writable,
  on its own (older) timeline with its stale data: the split brain a missing fencing
  causes.

Each server listens on its own free port of 127.0.0.1. :meth:`ReplicatedPair.stop` stops
both and removes their files (with an ``atexit`` hook as a backstop).
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from dbos_async.testing import servers
from dbos_async.testing.servers import LocalBinaries
from tests.helpers.cluster import clear_killed_server, kill_postmaster

STANDBY_NAME = "standby"
# Durable commits: an acknowledged commit must survive the primary's death (fsync stays
# off: the machine itself does not crash).
DURABLE = ["synchronous_commit=on"]


def postgres_url(ports: list[int], database: str, form: str = "query") -> str:
    """A URL of ``database`` on the servers at ``ports`` of 127.0.0.1, in this order,
    choosing the writable one: in the ``query`` form (``?host=...&port=...``) or the
    ``comma`` form (``host1:port1,host2:port2``), both libpq's and asyncpg's."""
    if len(ports) == 1:
        return f"postgresql://postgres@127.0.0.1:{ports[0]}/{database}"
    if form == "comma":
        servers = ",".join(f"127.0.0.1:{port}" for port in ports)
        return f"postgresql://postgres@{servers}/{database}?target_session_attrs=read-write"
    hosts = ",".join("127.0.0.1" for _ in ports)
    listed = ",".join(str(port) for port in ports)
    return (f"postgresql://postgres@/{database}?host={hosts}&port={listed}"
            "&target_session_attrs=read-write")


@dataclass
class ReplicatedPair:
    """The two servers of a pair: ``primary_port`` was the primary at the start,
    ``standby_port`` its standby (the primary once promoted)."""

    binaries: LocalBinaries
    base: Path
    primary_port: int
    standby_port: int

    @property
    def primary_data(self) -> Path:
        return self.base / "primary"

    @property
    def standby_data(self) -> Path:
        return self.base / "standby"

    @classmethod
    def start(cls, *, synchronous: bool = True) -> ReplicatedPair:
        """A running primary and its streaming standby (synchronous when ``synchronous``);
        raises :class:`dbos_async.testing.servers.Unavailable` without the programs."""
        binaries = LocalBinaries(*servers._check_local())
        base = binaries.make_dir()
        pair = cls(binaries, base, 0, 0)
        atexit.register(pair.stop)  # a backstop, if the test never calls stop()
        try:
            binaries.initdb(pair.primary_data)
            pair.primary_port = binaries.start(pair.primary_data,
                                               [*DURABLE, "wal_level=replica"])
            done = binaries.run("pg_basebackup", "-D", pair.standby_data, "-R", "-X", "stream",
                                "--checkpoint=fast", "--no-sync", "-h", "127.0.0.1",
                                "-p", str(pair.primary_port), "-U", "postgres", cwd=base)
            if done.returncode != 0:
                raise RuntimeError(f"pg_basebackup failed: {done.stderr.strip()}")
            # The standby's walreceiver reports its cluster_name as its application_name,
            # the name synchronous_standby_names lists.
            pair.standby_port = binaries.start(pair.standby_data,
                                               [*DURABLE, f"cluster_name={STANDBY_NAME}"])
            servers.run_sync(pair._wait_streaming(synchronous))
        except BaseException:
            pair.stop()
            raise
        return pair

    def url(self, database: str, ports: list[int] | None = None, form: str = "query") -> str:
        """A URL of ``database`` on the servers at ``ports`` (default: primary, standby),
        in the multi-host ``form`` given (see :func:`postgres_url`)."""
        return postgres_url(ports or [self.primary_port, self.standby_port], database, form)

    async def _wait_streaming(self, synchronous: bool) -> None:
        """Make the standby synchronous if asked (on the primary only: ALTER SYSTEM writes
        the primary's own postgresql.auto.conf, which the standby's copy predates), and wait
        until it streams (and is the synchronous one)."""
        conn = await asyncpg.connect(self.url("postgres", [self.primary_port]), timeout=10)
        try:
            if synchronous:
                await conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = "
                                   f"'{STANDBY_NAME}'")
                await conn.execute("SELECT pg_reload_conf()")
            wanted = "sync" if synchronous else "async"
            deadline = time.monotonic() + 30
            while await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 "
                    "AND state = 'streaming' AND sync_state = $2", STANDBY_NAME, wanted) != 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby is not streaming ({wanted}) after 30s")
                await asyncio.sleep(0.02)
        finally:
            await conn.close()

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster, as a crash does, and wait until its server
        processes (which notice their postmaster's death) are gone too."""
        kill_postmaster(self.primary_data)

    def promote_standby(self) -> float:
        """``pg_ctl promote`` the standby and wait until it is out of recovery; returns when
        that happened (``time.time()``)."""
        done = self.binaries.run("pg_ctl", "-D", self.standby_data, "-w", "-t", "30",
                                 "promote", cwd=self.base)
        assert done.returncode == 0, f"pg_ctl promote: {done.stdout}{done.stderr}"
        return servers.run_sync(self._wait_writable(self.standby_port))

    async def _wait_writable(self, port: int) -> float:
        conn = await asyncpg.connect(self.url("postgres", [port]), timeout=10)
        try:
            deadline = time.monotonic() + 30
            while await conn.fetchval("SELECT pg_is_in_recovery()"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"127.0.0.1:{port} is still in recovery after 30s")
                await asyncio.sleep(0.01)
            return time.time()
        finally:
            await conn.close()

    def restart_old_primary(self) -> None:
        """Start the killed old primary again on its port, as it was: writable, on its old
        timeline, with its stale data. Without a synchronous standby (its own is gone), so
        that writes to it return, as they do once an old primary is back on its own."""
        clear_killed_server(self.primary_data, self.base, self.primary_port)
        self.binaries.start(self.primary_data, [*DURABLE, "synchronous_standby_names=''"],
                            port=self.primary_port)
        servers.run_sync(self._wait_writable(self.primary_port))

    def stop(self) -> None:
        """Stop both servers and remove their files. Idempotent."""
        atexit.unregister(self.stop)
        for data in (self.primary_data, self.standby_data):
            self.binaries.stop(data)
        shutil.rmtree(self.base, ignore_errors=True)
