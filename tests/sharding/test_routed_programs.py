"""Routed writes (the programs Citus runs in one call, see dbos_async/_sysdb/writes/routed.py), run
by ``run_routed`` on plain PostgreSQL with the sharded schema: the function is the same on
both, so its semantics are checked where every test run has a server."""

from __future__ import annotations

import json

import asyncpg
import pytest

from dbos_async._sysdb.migrations import LATEST_VERSION, migrate
from dbos_async._sysdb.statements import Params, Query
from dbos_async._sysdb.statements.sharded import ShardedStatements
from dbos_async._sysdb.writes.routed import Step, encode, ran_whole


@pytest.fixture
async def db(conn: asyncpg.Connection) -> asyncpg.Connection:
    assert await migrate(conn, sharded=True) == LATEST_VERSION
    await conn.execute("CREATE TABLE scratch (k text, n integer, flag boolean, "
                       "tags text[], big bigint)")
    return conn


def insert(k: str, n: int | None, flag: bool | None, tags: list[str | None] | None,
           big: int, returning: bool = False) -> Query:
    p = Params()
    sql = (f"INSERT INTO public.scratch VALUES ({p(k, 'text')}, {p(n, 'integer')}, "
           f"{p(flag, 'boolean')}, {p(tags, 'text[]')}, {p(big, 'bigint')})")
    return Query(sql + (" RETURNING k, n, flag, tags, big" if returning else ""), p.values)


def gate(go: bool | None) -> Query:
    p = Params()
    return Query(f"SELECT {p(go, 'boolean')} AS go WHERE {p(go, 'boolean')} IS NOT NULL",
                 p.values)


async def run(db: asyncpg.Connection, steps: list[Step]) -> list[dict[str, object] | None]:
    sql = ShardedStatements('"dbos"').run_routed("k", encode(steps))
    results: list[dict[str, object] | None] = json.loads(await db.fetchval(sql.sql, *sql.params))
    return results


async def test_parameters_reach_the_statement_as_the_values_they_were(db: asyncpg.Connection
                                                                       ) -> None:
    tags = ['a "quoted" one', "back\\slash", None, "comma, {brace}", "", "ünï"]
    [row] = await run(db, [Step(insert("k", -7, True, tags, 2**62, returning=True), rows=True)])
    assert row == {"k": "k", "n": -7, "flag": True, "tags": tags, "big": 2**62}
    [none] = await run(db, [Step(insert("k", None, None, None, 0))])
    assert none is None
    stored = await db.fetch("SELECT n, flag, tags FROM scratch ORDER BY big")
    assert [tuple(r) for r in stored] == [(None, None, None), (-7, True, tags)]


async def test_a_gate_that_does_not_pass_stops_the_write(db: asyncpg.Connection) -> None:
    program = [Step(gate(True), rows=True, gate=True),
               Step(insert("a", 1, None, None, 1)),
               Step(gate(False), rows=True, gate=True),
               Step(insert("b", 2, None, None, 2))]
    results = await run(db, program)
    assert results == [{"go": True}, None, {"go": False}]
    assert not ran_whole(program, results)
    no_row = [Step(gate(None), rows=True, gate=True), Step(insert("c", 3, None, None, 3))]
    results = await run(db, no_row)
    assert results == [None] and not ran_whole(no_row, results)
    assert [r["k"] for r in await db.fetch("SELECT k FROM scratch")] == ["a"]
    whole = [Step(gate(True), rows=True, gate=True), Step(insert("d", 4, None, None, 4))]
    assert ran_whole(whole, await run(db, whole))


async def test_a_failing_statement_writes_nothing_of_its_program(db: asyncpg.Connection
                                                                 ) -> None:
    p = Params()
    failing = Query(f"SELECT 1 / {p(0, 'integer')}", p.values)
    with pytest.raises(asyncpg.DivisionByZeroError):
        await run(db, [Step(insert("a", 1, None, None, 1)), Step(failing, rows=True)])
    assert await db.fetchval("SELECT count(*) FROM scratch") == 0


async def test_many_programs_run_in_one_statement_in_order(db: asyncpg.Connection) -> None:
    sql = ShardedStatements('"dbos"').run_routed_many(
        ["x", "y", "z"],
        [encode([Step(insert(k, i, None, None, i, returning=True), rows=True)])
         for i, k in enumerate("xyz")],
        [None, None, None])
    rows = await db.fetch(sql.sql, *sql.params)
    assert [json.loads(r["r"])[0]["k"] for r in rows] == ["x", "y", "z"]
