"""Export and import of whole workflows between system databases, as JSON lines.

A source executor fills a database with workflows that use every kind of row (steps, a
child, messages consumed and not, events and their history, a stream, an error, a queue,
attributes, one still PENDING); the tests export them, import them into fresh databases,
and compare every table row for row, or run the imported workflows to their end.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import fetch, new_dbos

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    ExportedWorkflow,
    ImportSummary,
    SetWorkflowAttributes,
    SetWorkflowID,
    WorkflowImportConflictError,
    WorkflowImportError,
    migrate,
)
from dbos_async._sysdb.statements import EXPORT_COLUMNS

CLI = str(Path(sys.executable).with_name("dbos-async"))
PATIENCE = 30.0
WORKFLOW_TABLES = tuple(EXPORT_COLUMNS)
ORDER = {"notifications": "message_uuid", "workflow_events": "workflow_uuid, key",
         "workflow_events_history": "workflow_uuid, function_id, key",
         "streams": 'workflow_uuid, key, "offset"',
         "operation_outputs": "workflow_uuid, function_id"}


class Shop:
    """Workflows touching every table a workflow owns, on one executor."""

    def __init__(self, url: str, **settings: Any) -> None:
        self.dbos = dbos = new_dbos(url, **settings)
        self.queue = dbos.queue("exports-jobs")

        @dbos.step(name="price")
        async def price(item: str) -> int:
            return len(item) * 100

        @dbos.workflow(name="child")
        async def child(item: str) -> str:
            return f"packed {item}"

        @dbos.workflow(name="order")
        async def order(item: str) -> str:
            cents = await price(item)
            packed = await dbos.start_workflow(child, item)
            await dbos.set_event("state", "priced")
            await dbos.set_event("state", "packed")
            await dbos.write_stream("log", f"{item}:{cents}")
            await dbos.close_stream("log")
            note = await dbos.recv("note", timeout=PATIENCE)
            return f"{await packed.get_result()} for {cents} ({note})"

        @dbos.workflow(name="broken")
        async def broken(n: int) -> None:
            raise ValueError(f"bad {n}")

        @dbos.workflow(name="waiting")
        async def waiting(item: str) -> str:
            cents = await price(item)
            await dbos.set_event("state", "waiting")
            await dbos.write_stream("log", "started")
            go = await dbos.recv("go", timeout=PATIENCE)
            later = await dbos.recv("later", timeout=PATIENCE)
            return f"{item}:{cents}:{go}:{later}"

        self.order, self.broken, self.waiting = order, broken, waiting

    async def fill(self) -> None:
        """Finished workflows of every kind, one ENQUEUED on a queue nobody serves here, and
        ``wait-1`` PENDING in its first recv with a message it will take later waiting."""
        dbos = self.dbos
        with SetWorkflowID("order-1"), SetWorkflowAttributes({"tenant": "acme", "n": 1}):
            handle = await dbos.start_workflow(self.order, "lamp")
        await dbos.send("order-1", "gift", "note", idempotency_key="note-1")
        await handle.get_result()
        await dbos.send("order-1", "unread", "other")
        with SetWorkflowID("broken-1"):
            failed = await dbos.start_workflow(self.broken, 3)
        with pytest.raises(ValueError):
            await failed.get_result()
        with SetWorkflowID("wait-1"), SetWorkflowAttributes({"tenant": "globex"}):
            await dbos.start_workflow(self.waiting, "desk")
        await dbos.send("wait-1", "L", "later")
        await wait_for_event(dbos, "wait-1", "state", "waiting")


async def wait_for_event(dbos: DBOS, workflow_id: str, key: str, value: Any,
                         **address: Any) -> None:
    assert await dbos.get_event(workflow_id, key, timeout=PATIENCE, **address) == value


async def table_rows(url: str, sharded: bool = False) -> dict[str, list[str]]:
    """Every row of every per-workflow table, as JSON text in a stable order."""
    rows = {}
    for table in WORKFLOW_TABLES:
        order = ORDER.get(table, "workflow_uuid")
        if sharded:
            order = f"shard_key, {order}"
        found = await fetch(url, f"SELECT to_jsonb(t)::text AS row FROM dbos.{table} t "
                                 f"ORDER BY {order}")
        rows[table] = [r["row"] for r in found]
    return rows


async def fresh(create_database: Any, sharding: bool = False) -> str:
    """A new database holding an empty (migrated) system schema."""
    url: str = await create_database()
    await migrate(url, sharding=sharding)
    return url


async def export_all(url: str, **settings: Any) -> list[str]:
    async with DBOSClient(url, **settings) as client:
        return [w.to_json() async for w in client.export_workflows()]


async def import_lines(url: str, lines: list[str], **options: Any) -> ImportSummary:
    settings = {k: options.pop(k) for k in ("sharding",) if k in options}
    async with DBOSClient(url, **settings) as client:
        return await client.import_workflows(lines, **options)


@pytest.fixture
async def source(database_url: str) -> str:
    """A database filled by :meth:`Shop.fill`, its executor gone (``wait-1`` PENDING), and
    ``queued-1`` ENQUEUED by a client once it has gone (an executor serving the queue could
    start it at once)."""
    shop = Shop(database_url)
    async with shop.dbos:
        await shop.fill()
    async with DBOSClient(database_url) as client:
        await client.enqueue("exports-jobs", "order", "never", workflow_id="queued-1")
    return database_url


async def test_the_format_carries_every_column_of_the_schema(source: str) -> None:
    for table, columns in EXPORT_COLUMNS.items():
        stored = await fetch(source, """SELECT column_name FROM information_schema.columns
                                        WHERE table_schema = 'dbos' AND table_name = $1""",
                             table)
        keys = {"parent_shard_key", "child_shard_key"}
        assert {r["column_name"] for r in stored} == set(columns) - keys, table


async def test_round_trip_copies_every_row(source: str, create_database: Any) -> None:
    lines = await export_all(source)
    assert sorted(json.loads(line)["workflow_id"] for line in lines) == sorted(
        ["order-1", "order-1-1", "broken-1", "wait-1", "queued-1"])
    target = await fresh(create_database)
    assert await import_lines(target, lines) == ImportSummary(imported=5, unchanged=0)
    assert await table_rows(target) == await table_rows(source)
    # Every table had rows to compare, consumed and unconsumed messages included.
    rows = await table_rows(source)
    assert all(rows[table] for table in WORKFLOW_TABLES)
    consumed = {json.loads(r)["consumed"] for r in rows["notifications"]}
    assert consumed == {True, False}


async def test_reimport_changes_nothing(source: str, create_database: Any) -> None:
    lines = await export_all(source)
    target = await fresh(create_database)
    assert (await import_lines(target, lines)).imported == 5
    before = await table_rows(target)
    assert await import_lines(target, lines, batch_size=2) == ImportSummary(0, 5)
    assert await table_rows(target) == before
    # Objects from an export import like their lines.
    async with DBOSClient(source) as client:
        exported = [w async for w in client.export_workflows()]
    assert await import_lines(target, exported) == ImportSummary(0, 5)


async def test_a_different_workflow_with_the_same_id_is_a_conflict(
        source: str, create_database: Any) -> None:
    lines = await export_all(source, )
    target = await fresh(create_database)
    order = next(line for line in lines if json.loads(line)["workflow_id"] == "order-1")
    assert (await import_lines(target, [order])).imported == 1
    await fetch(target, "UPDATE dbos.workflow_status SET status = 'CANCELLED' "
                        "WHERE workflow_uuid = 'order-1'")
    before = await table_rows(target)
    with pytest.raises(WorkflowImportConflictError, match=r"'order-1'.*workflow_status") as e:
        await import_lines(target, lines)
    assert e.value.workflow_id == "order-1"
    # The batch held the others too: none of them was written.
    assert await table_rows(target) == before
    # The same ID twice in one import, with other rows, is refused too.
    changed = json.loads(order)
    changed["tables"]["workflow_status"][0]["recovery_attempts"] = 7
    other = await fresh(create_database)
    with pytest.raises(WorkflowImportConflictError, match="twice"):
        await import_lines(other, [order, json.dumps(changed)])
    assert (await table_rows(other))["workflow_status"] == []


async def test_export_takes_the_listing_filters(source: str) -> None:
    async with DBOSClient(source) as client:
        async def ids(**filters: Any) -> list[str]:
            return [w.workflow_id async for w in client.export_workflows(**filters)]

        assert await ids(status="ERROR") == ["broken-1"]
        assert await ids(name=["waiting", "child"]) == ["order-1-1", "wait-1"]
        assert await ids(attributes={"tenant": "acme"}) == ["order-1"]
        assert await ids(queue_name="exports-jobs", queues_only=True) == ["queued-1"]
        assert await ids(sort_desc=True, limit=2, batch_size=1) == ["queued-1", "wait-1"]
        assert await ids(workflow_id_prefix="order", offset=1) == ["order-1-1"]
        with pytest.raises(DBOSError, match="Unknown workflow filter"):
            client.export_workflows(colour="red")  # type: ignore[call-arg]
        with pytest.raises(DBOSError, match="batch_size"):
            await ids(batch_size=0)
        with pytest.raises(DBOSError, match="limit must be an integer from 0 to"):
            await ids(limit=-1)
        # A workflow's line: its status row, and its rows of every table.
        [wait] = [w async for w in client.export_workflows(workflow_ids=["wait-1"])]
        assert wait.status["status"] == "PENDING"
        assert wait.status["attributes"] == {"tenant": "globex"}
        assert [m["topic"] for m in wait.tables["notifications"]] == ["later"]
        assert ExportedWorkflow.from_json(wait.to_json()) == wait


async def test_export_reads_one_snapshot_without_locks(source: str) -> None:
    async with DBOSClient(source, pool_size=3) as client:
        exported = client.export_workflows(batch_size=1)
        first = await anext(exported)
        # While the export's transaction is open, a writer locks and deletes a row it
        # has yet to reach: nothing waits, and the export still sees the snapshot.
        conn = await asyncpg.connect(source)
        try:
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM dbos.workflow_status FOR UPDATE NOWAIT")
            await client.delete_workflow("queued-1")
        finally:
            await conn.close()
        rest = [w.workflow_id async for w in exported]
    assert "queued-1" in [first.workflow_id, *rest]
    assert len(rest) == 4


async def test_unsharded_to_sharded(source: str, create_database: Any) -> None:
    lines = await export_all(source)
    target = await fresh(create_database, sharding=True)
    tenants = {"order-1": "acme", "order-1-1": "acme", "wait-1": "globex"}

    def shard_key_of(workflow: ExportedWorkflow) -> str:
        return tenants.get(workflow.workflow_id, "misc")

    async with DBOSClient(target, sharding=True) as client:
        with pytest.raises(WorkflowImportError, match=r"has no shard key.*shard_key_of"):
            await client.import_workflows(lines)
        assert await client.import_workflows(lines, shard_key_of=shard_key_of,
                                             batch_size=2) == ImportSummary(5, 0)
        assert await client.import_workflows(lines, shard_key_of=shard_key_of
                                             ) == ImportSummary(0, 5)
        order = await client.retrieve_workflow("order-1", shard_key="acme")
        assert await order.get_result() == "packed lamp for 400 (gift)"
        assert await client.get_all_events("order-1", shard_key="acme") == {"state": "packed"}
        assert [v async for v in client.read_stream("order-1", "log",
                                                    shard_key="acme")] == ["lamp:400"]
        steps = await client.list_workflow_steps("order-1", shard_key="acme")
        [start_child] = [s for s in steps if s.child_workflow_id == "order-1-1"]
        assert start_child.child_shard_key == "acme"
        [kid] = await client.list_workflows(parent_workflow_id="order-1")
        assert (kid.shard_key, kid.parent_shard_key) == ("acme", "acme")
        assert await client.get_workflow_status("broken-1", shard_key="globex") is None
        assert (await client.get_workflow_status("broken-1", shard_key="misc")).status == "ERROR"

    # The PENDING workflow resumes under its new key: recovery replays its step, event
    # and stream from the imported checkpoints, and the message it had not read yet is
    # still there for it.
    shop = Shop(target, sharding=True)
    async with shop.dbos:
        await shop.dbos.send("wait-1", "G", "go", shard_key="globex")
        handle = await shop.dbos.retrieve_workflow("wait-1", shard_key="globex")
        assert await handle.get_result() == "desk:400:G:L"
        log = [v async for v in shop.dbos.read_stream("wait-1", "log", shard_key="globex")]
        assert log == ["started"]
        steps = await shop.dbos.list_workflow_steps("wait-1", shard_key="globex")
        assert [s.name for s in steps].count("price") == 1

    # Sharded to sharded keeps the keys the lines carry, row for row.
    again = await fresh(create_database, sharding=True)
    sharded_lines = await export_all(target, sharding=True)
    assert {json.loads(line)["shard_key"] for line in sharded_lines} == {
        "acme", "globex", "misc"}
    assert await import_lines(again, sharded_lines, sharding=True) == ImportSummary(5, 0)
    assert await table_rows(again, sharded=True) == await table_rows(target, sharded=True)


async def test_resume_an_imported_pending_workflow(source: str, create_database: Any) -> None:
    target = await fresh(create_database, sharding=True)
    await import_lines(target, await export_all(source), sharding=True,
                       shard_key_of=lambda _: "only")
    # An executor of another ID does not recover it; a resume runs it.
    shop = Shop(target, sharding=True, executor_id="elsewhere")
    async with shop.dbos:
        handle = await shop.dbos.resume_workflow("wait-1", shard_key="only")
        await shop.dbos.send("wait-1", "G", "go", shard_key="only")
        assert await handle.get_result() == "desk:400:G:L"


async def test_bad_input_is_refused_and_writes_nothing(source: str,
                                                       create_database: Any) -> None:
    lines = await export_all(source)
    target = await fresh(create_database)
    good = lines[0]
    data = json.loads(good)

    def variant(change: Any) -> str:
        copy = json.loads(good)
        change(copy)
        return json.dumps(copy)

    def wrong_type(d: dict[str, Any]) -> None:
        d["tables"]["workflow_status"][0]["created_at"] = "yesterday"

    def missing_column(d: dict[str, Any]) -> None:
        del d["tables"]["workflow_status"][0]["name"]

    def other_owner(d: dict[str, Any]) -> None:
        d["tables"]["workflow_status"][0]["workflow_uuid"] = "someone-else"

    cases = [
        ("{not json", r"line 2 is not JSON"),
        (json.dumps({"hello": 1}), r"line 2 is not an exported workflow"),
        (json.dumps({**data, "version": 99}),
         r"line 2 has export format version 99; this version of dbos_async reads version 1"),
        (variant(missing_column), r"line 2: a row of workflow_status .*missing: \['name'\]"),
        (variant(other_owner), r"line 2: a row of workflow_status belongs to 'someone-else'"),
        (variant(wrong_type), r"Cannot import the batch: .*bigint"),
    ]
    for bad, message in cases:
        with pytest.raises(WorkflowImportError, match=message):
            await import_lines(target, [lines[1], bad, *lines[2:]])
        assert all(rows == [] for rows in (await table_rows(target)).values()), message
    with pytest.raises(WorkflowImportError, match="not sharded"):
        await import_lines(target, lines, shard_key_of=lambda _: "k")
    sharded = await fresh(create_database, sharding=True)
    with pytest.raises(WorkflowImportError, match="invalid key"):
        await import_lines(sharded, lines, sharding=True, shard_key_of=lambda _: "")
    assert all(rows == [] for rows in (await table_rows(sharded, sharded=True)).values())


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120,
                          input=stdin, check=False)


async def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, *args, stdin=stdin)


async def test_cli_round_trip(source: str, create_database: Any, tmp_path: Path) -> None:
    target = await fresh(create_database)
    await cli("migrate", "--url", target)
    exported = tmp_path / "workflows.jsonl"
    result = await cli("export", "--url", source, "--output", str(exported))
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "Exported 5 workflow(s)\n")
    result = await cli("import", "--url", target, str(exported))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Imported 5 workflow(s); 0 already there unchanged\n"
    assert await table_rows(target) == await table_rows(source)
    # Through a pipe, filtered: standard output to standard input.
    piped = await cli("export", "--url", source, "--status", "ERROR")
    assert (piped.returncode, piped.stderr) == (0, "Exported 1 workflow(s)\n")
    assert [json.loads(line)["workflow_id"] for line in piped.stdout.splitlines()] == [
        "broken-1"]
    again = await cli("import", "--url", target, "-", stdin=piped.stdout)
    assert again.stdout == "Imported 0 workflow(s); 1 already there unchanged\n"
    # Onto a sharded database, every workflow under one key.
    sharded = await create_database()
    await cli("migrate", "--url", sharded, "--sharding")
    keyed = await cli("import", "--url", sharded, "--shard-key", "all", str(exported))
    assert keyed.returncode == 0, keyed.stderr
    keys = await fetch(sharded, "SELECT DISTINCT shard_key FROM dbos.workflow_status")
    assert [r["shard_key"] for r in keys] == ["all"]


async def test_cli_bad_file(source: str, create_database: Any, tmp_path: Path) -> None:
    target = await fresh(create_database)
    await cli("migrate", "--url", target)
    lines = (await cli("export", "--url", source)).stdout.splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([*lines, '{"format": "dbos_async.workflow", "version": 2}']))
    result = await cli("import", "--url", target, str(broken))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "Error: line 6 has export format version 2; this version of dbos_async reads "
        "version 1")
    assert all(rows == [] for rows in (await table_rows(target)).values())
