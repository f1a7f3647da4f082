"""The CPU time a PostgreSQL server on this machine spends, read from /proc.

A server is a process tree: the postmaster and its children (one backend per connection,
the checkpointer, the WAL writer, Citus's maintenance daemon, ...), each of them a direct
child. Its CPU time at a moment is the postmaster's own user and system time, plus that of
its children it has reaped (``cutime``, ``cstime``: what a backend that exited used), plus
the user and system time of each child still alive. Read before and after a window, the
difference is what the whole server used in it, backends that came and went included.

The postmaster is found from a connection: ``SELECT pg_backend_pid()`` names the backend,
whose parent (``PPid`` in /proc/<pid>/status) is the postmaster. That holds only when the
server runs on this machine (in the same PID namespace): a PID from another machine may name
an unrelated local process. So the backend is recognised first: a process named
``postgres`` whose title shows the client port the server sees for this connection
(``... 127.0.0.1(54321) idle``; over a Unix socket, ``[local]``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessTimes:
    """The fields of /proc/<pid>/stat a server's CPU time is read from (in clock ticks)."""

    pid: int
    parent: int
    started: int
    """Start time since boot, in ticks: with the PID, names one process even when PIDs are
    reused."""
    user: int
    system: int
    children_user: int
    children_system: int

    @property
    def own(self) -> int:
        return self.user + self.system

    @property
    def with_reaped_children(self) -> int:
        return self.own + self.children_user + self.children_system


def parse_stat(text: str) -> ProcessTimes:
    """One /proc/<pid>/stat line. The command name (field 2) is in parentheses and may hold
    spaces and parentheses itself, so the fields are counted from its last ``)``."""
    pid = int(text[:text.index(" ")])
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): field n of proc(5) is fields[n - 3].
    return ProcessTimes(pid=pid, parent=int(fields[1]), started=int(fields[19]),
                        user=int(fields[11]), system=int(fields[12]),
                        children_user=int(fields[13]), children_system=int(fields[14]))


def read_process(pid: int, proc: Path = PROC) -> ProcessTimes | None:
    """The times of process ``pid``, or None when it is gone or unreadable."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def all_processes(proc: Path = PROC) -> list[ProcessTimes]:
    """Every process /proc shows (those that end while it is read left out)."""
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            times = read_process(int(entry.name), proc)
            if times is not None:
                found.append(times)
    return found


@dataclass(frozen=True)
class TreeReading:
    """A server's CPU time at one moment, in ticks, and the children it counted by
    (pid, start time), each with its own time."""

    postmaster: int
    total: int
    children: Mapping[tuple[int, int], int]


def read_trees(postmasters: Iterable[int], proc: Path = PROC) -> dict[int, TreeReading]:
    """The CPU time of each postmaster's process tree, from one pass over /proc (a
    postmaster gone or unreadable is left out)."""
    wanted = set(postmasters)
    roots = {pid: read_process(pid, proc) for pid in wanted}
    children: dict[int, dict[tuple[int, int], int]] = {pid: {} for pid in wanted}
    for process in all_processes(proc):
        if process.parent in wanted:
            children[process.parent][(process.pid, process.started)] = process.own
    return {pid: TreeReading(pid, root.with_reaped_children + sum(children[pid].values()),
                             children[pid])
            for pid, root in roots.items() if root is not None}


def seconds_between(before: TreeReading, after: TreeReading) -> float:
    """CPU seconds the whole tree used between two readings."""
    return (after.total - before.total) / TICKS_PER_SECOND


def children_seconds_between(before: TreeReading, after: TreeReading,
                             pids: Iterable[int]) -> float:
    """CPU seconds that the children with these PIDs, alive at ``after``, used since
    ``before`` (all of their time when they started after it)."""
    wanted = set(pids)
    ticks = 0
    for key, used in after.children.items():
        if key[0] in wanted:
            ticks += used - before.children.get(key, 0)
    return ticks / TICKS_PER_SECOND


def postmaster_of(backend_pid: int, client_port: int | None,
                  proc: Path = PROC) -> int | None:
    """The postmaster of backend ``backend_pid`` when that backend is a local process serving
    the connection from ``client_port`` (None: over a Unix socket), else None."""
    try:
        status = (proc / str(backend_pid) / "status").read_text()
        title = (proc / str(backend_pid) / "cmdline").read_bytes()
    except OSError:
        return None
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    if fields.get("Name", "").strip() != "postgres":
        return None
    marker = b"[local]" if client_port is None else f"({client_port})".encode()
    if marker not in title:
        return None
    return int(fields["PPid"])


BACKEND = "SELECT pg_backend_pid() AS pid, inet_client_port() AS client_port"
"""The connection's backend, and the client port it sees (NULL over a Unix socket)."""


async def local_postmaster(conn: Any) -> int | None:
    """The postmaster of the server ``conn`` (an asyncpg connection) is connected to, when
    that server runs on this machine; else None."""
    backend = await conn.fetchrow(BACKEND)
    return postmaster_of(backend["pid"], backend["client_port"])
