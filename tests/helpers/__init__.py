"""Shared helpers of the executor tests: DBOS instances for tests, and reads of the system DB.

Everything here reads the database directly with asyncpg, so the tests check what was really
written, not what the executor believes it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from dbos_async import DBOS, DBOSClient
from dbos_async._database_url import Host, parse_database_url
from dbos_async._sysdb.notifications import (
    WORKFLOW_COMPLETION_CHANNEL,
    WORKFLOW_COMPLETIONS_CHANNEL,
)

EXECUTOR_ID = "test-executor"
APP_VERSION = "test-version-1"


def unique_name(prefix: str) -> str:
    """A name no other test (or xdist worker) uses, e.g. for ``connection_name``."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def new_dbos(url: str, **settings: Any) -> DBOS:
    """A DBOS instance for a test: its own connection name, a fixed executor and version.

    An instance created with the same ``executor_id`` and ``application_version`` as one that
    has exited recovers its PENDING workflows, which is what the recovery tests rely on (one
    created while the other lives claims ``<executor_id>-2`` instead).
    """
    defaults: dict[str, Any] = {
        "system_database_url": url,
        "executor_id": EXECUTOR_ID,
        "application_version": APP_VERSION,
        "connection_name": unique_name("dbos_test"),
        "shutdown_grace_period": 5.0,
        "result_poll_interval": 0.05,
        "connect_timeout": 10.0,
        "pool_size": 4,
    }
    defaults.update(settings)
    return DBOS(**defaults)


def messaging_settings(listen: bool = True, **settings: Any) -> dict[str, Any]:
    """The settings of the messaging, events and notification tests, for :func:`new_dbos`.

    Notifications over LISTEN/NOTIFY when ``listen``, else by polling (every 0.1 s unless
    ``notification_poll_interval`` says otherwise); a short shutdown grace period; the
    default pool size (these tests hold many waits at once).
    """
    return {"use_listen_notify": listen, "notification_poll_interval": 0.1,
            "shutdown_grace_period": 1, "application_version": "messaging-v1",
            "pool_size": 10, **settings}


async def worker_urls(url: str) -> list[str]:
    """The URLs of ``url``'s database on each worker node of its Citus cluster."""
    conn = await asyncpg.connect(url)
    try:
        nodes = await conn.fetch("SELECT nodename, nodeport FROM pg_dist_node "
                                 "WHERE groupid <> 0 AND noderole = 'primary' ORDER BY groupid")
    finally:
        await conn.close()
    parsed = parse_database_url(url)
    return [parsed.with_server(Host(n["nodename"], n["nodeport"])) for n in nodes]


async def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def fetchval(url: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def execute(url: str, sql: str, *args: Any) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


@dataclass(frozen=True)
class StepRow:
    function_id: int
    function_name: str
    output: Any
    error: dict[str, Any] | None
    child_workflow_id: str | None


async def step_rows(url: str, workflow_id: str) -> list[StepRow]:
    """The workflow's ``dbos.operation_outputs`` rows, by function_id, JSON decoded."""
    rows = await fetch(
        url,
        """SELECT function_id, function_name, output, error, child_workflow_id
           FROM dbos.operation_outputs WHERE workflow_uuid = $1 ORDER BY function_id""",
        workflow_id,
    )
    return [
        StepRow(
            r["function_id"],
            r["function_name"],
            json.loads(r["output"]) if r["output"] is not None else None,
            json.loads(r["error"]) if r["error"] is not None else None,
            r["child_workflow_id"],
        )
        for r in rows
    ]


async def workflow_row(url: str, workflow_id: str) -> asyncpg.Record | None:
    """The ``dbos.workflow_status`` row, with the stored output and error."""
    rows = await fetch(
        url,
        """SELECT ws.*, COALESCE(wo.output, ws.output) AS stored_output,
                  COALESCE(wo.error, ws.error) AS stored_error
           FROM dbos.workflow_status ws
           LEFT JOIN dbos.workflow_output wo USING (workflow_uuid)
           WHERE ws.workflow_uuid = $1""",
        workflow_id,
    )
    return rows[0] if rows else None


async def advisory_lock_holder(url: str, key: int) -> int | None:
    """The backend pid holding the session advisory lock ``key`` (e.g. an executor ID's)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    pid = await fetchval(url, """
        SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND classid::bigint = $1 AND objid::bigint = $2""", unsigned >> 32,
        unsigned & 0xFFFF_FFFF)
    return int(pid) if pid is not None else None


async def take_executor_id_away(url: str, dbos: DBOS) -> None:
    """Make an entered executor's process look dead to the others while it runs, as a
    network partition does: its ID lock's session ends while another session is queued on
    the lock, so the executor cannot re-acquire its ID (it is lost for good); then that
    session lets the ID go, free for failover to find."""
    key = dbos._system_database.sql.executor_lock_key(dbos._current_runtime.executor_id)
    holder = await advisory_lock_holder(url, key)
    assert holder is not None
    taker = await asyncpg.connect(url)
    try:
        waiting = asyncio.ensure_future(taker.execute("SELECT pg_advisory_lock($1)", key))

        async def queued() -> bool:
            return bool(await fetchval(url, """SELECT count(*) FROM pg_locks
                WHERE locktype = 'advisory' AND NOT granted AND pid = $1""",
                taker.get_server_pid()))

        await wait_until(queued, what="the taker to queue on the executor ID's lock")
        await execute(url, "SELECT pg_terminate_backend($1::integer, 10000::bigint)", holder)
        await asyncio.wait_for(waiting, 30)
        lock = dbos._current_runtime.executor_lock
        assert lock is not None

        async def lost() -> bool:
            return lock.state == "lost"

        await wait_until(lost, what="the executor to find its ID taken")
    finally:
        await taker.close()


async def _system_pools(sysdb: Any) -> list[Any]:
    """The system database's pools: its own and, on Citus, every node's routed and shard
    pools (opened here, so that the first batch a node runs is logged too)."""
    pools = [sysdb.pool]
    shards = await sysdb._current_shard_map()
    if shards is not None:
        for node_pools in (sysdb._node_pools, sysdb._shard_pools):
            for node in {shard.node for shard in shards.shards}:
                pools.append(await node_pools.pool_for(node))
    return pools


async def _each_connection(pools: list[Any], action: Callable[[Any], None]) -> None:
    """``action`` on every connection of ``pools`` (each pool filled to its size)."""
    for pool in pools:
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        for conn in held:
            action(conn)
        for conn in held:
            await pool.release(conn)


@contextlib.asynccontextmanager
async def pool_statements(dbos: DBOS | DBOSClient) -> Any:
    """The statements (text and arguments) the executor's (or client's) pools send inside
    the block, as a list filled in as they go (on Citus, the nodes' pools too)."""
    logged: list[tuple[str, tuple[Any, ...]]] = []

    def log(record: Any) -> None:
        logged.append((record.query, tuple(record.args)))

    sysdb = dbos._system_database if isinstance(dbos, DBOS) else dbos._peer().system_database
    pools = await _system_pools(sysdb)
    await _each_connection(pools, lambda conn: conn.add_query_logger(log))
    try:
        yield logged
    finally:
        await _each_connection(pools, lambda conn: conn.remove_query_logger(log))


async def count_workflows(url: str) -> int:
    return int(await fetchval(url, "SELECT count(*) FROM dbos.workflow_status"))


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, patience: float = 30.0, interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` until it holds; fail after a generous ``patience`` (not a timing test)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {patience}s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_for_steps(url: str, workflow_id: str, count: int, *, patience: float = 30.0) -> None:
    """Wait until at least ``count`` steps of the workflow are recorded."""

    async def recorded() -> bool:
        return len(await step_rows(url, workflow_id)) >= count

    await wait_until(recorded, patience=patience, what=f"{count} steps of {workflow_id}")


async def connections_named(url: str, name: str) -> int:
    """How many server connections carry ``application_name = name``."""
    return int(
        await fetchval(
            url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
        )
    )


async def wait_no_connections(url: str, name: str, *, patience: float = 15.0) -> None:
    # A closed client connection disappears from pg_stat_activity once its backend has
    # exited, which is asynchronous to the client's close: wait for it, generously.
    async def gone() -> bool:
        return await connections_named(url, name) == 0

    await wait_until(gone, patience=patience, interval=0.05, what=f"connections {name!r} to close")


def other_tasks() -> set[asyncio.Task[Any]]:
    """Every task of the running loop except the current one."""
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[arg-type]


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (Linux only): what a
    stopped server must not leave behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in cmdline and int(entry.name) != os.getpid():
                found.append(int(entry.name))
    return found


async def listen_for_completions(conn: asyncpg.Connection, heard: Callable[[str], None]) -> None:
    """LISTEN on ``conn`` as another process does for workflow completions: ``heard`` gets
    each workflow's key, whether announced alone or packed with others ending together."""

    def alone(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        heard(str(payload))

    def packed(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        for key in json.loads(str(payload)):
            heard(key)

    await conn.add_listener(WORKFLOW_COMPLETION_CHANNEL, alone)
    await conn.add_listener(WORKFLOW_COMPLETIONS_CHANNEL, packed)
