"""Multi-table writes of one shard key, run on Citus as one task on the key's node.

Citus's router sends a statement to one shard as one task only when it writes a single
table at its top level. The system database's hot writes are single statements over
several tables of one workflow (a checkpoint with its event, a status with its output, a
consumed message with the step that records it); Citus plans each of their parts as a task
of its own, one coordinator-to-node round trip each. Those statements are marked with their
key (:attr:`~dbos_async.sysdb.statements.base.Query.shard_task_key`), and here rewritten
into a call of the schema's ``shard_task`` function, which Citus distributes by its key
argument: the coordinator forwards the whole call to the key's node, which runs the
statement next to its shard.

The statement keeps its own text and values: its values travel as one text array, whose
elements the function passes back as the statement's parameters, each cast in the statement
to the type PostgreSQL inferred for it; its result columns are declared with their types, so
callers read the same rows either way. A statement with more parameters than the function
passes on is sent as it is. The types come from
describing the statement once (a parse, no execution); shapes are few, so they are cached.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from dbos_async.sysdb.statements import Query

# How many parameters shard_task passes on to its statement (sql/sharded/0125_03_functions.sql).
MAX_PARAMETERS = 100
# A quoted identifier or string literal (skipped whole), or a parameter reference.
_TOKEN = re.compile(r'"(?:[^"]|"")*"|\'(?:[^\']|\'\')*\'|\$(\d+)')
_MAX_SHAPES = 512


@dataclass(frozen=True)
class _Shape:
    """A statement's call through ``shard_task``: the call and the inner statement."""

    call: str
    statement: str


def _qualified(t: Any) -> str:
    return f'"{t.schema}".{t.name}'


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def as_text(value: Any) -> str | None:
    """``value`` in PostgreSQL's text input form, for the statement's text-array argument."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        items = []
        for item in value:
            text = as_text(item)
            items.append("NULL" if text is None else
                         '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
        return "{" + ",".join(items) + "}"
    raise TypeError(f"No text form for a statement parameter of type {type(value).__name__}")


class ShardTasks:
    """Rewrites marked statements into ``shard_task`` calls, for one Citus schema."""

    def __init__(self, quoted_schema: str) -> None:
        self._function = f"{quoted_schema}.shard_task"
        self._shapes: OrderedDict[str, _Shape] = OrderedDict()

    @staticmethod
    async def available(pool: asyncpg.Pool, quoted_schema: str) -> bool:
        """Whether the schema's ``shard_task`` is distributed here (a sharded schema on
        Citus, migrated by a release that creates it)."""
        if not await pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')"):
            return False  # plain PostgreSQL: no pg_dist_object to ask
        return bool(await pool.fetchval(
            """SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object
                              WHERE objid = pg_catalog.to_regprocedure($1)
                                AND distribution_argument_index IS NOT NULL)""",
            f"{quoted_schema}.shard_task(text, text, text[])"))

    async def call_of(self, pool: asyncpg.Pool, query: Query) -> Query:
        """``query`` as one call of ``shard_task`` under its marked key."""
        assert query.shard_task_key is not None
        if len(query.params) > MAX_PARAMETERS:
            return query
        shape = self._shapes.get(query.sql)
        if shape is None:
            shape = await self._describe(pool, query.sql)
            self._shapes[query.sql] = shape
            if len(self._shapes) > _MAX_SHAPES:
                self._shapes.popitem(last=False)
        else:
            self._shapes.move_to_end(query.sql)
        args = [as_text(value) for value in query.params]
        return replace(query, sql=shape.call,
                       params=(query.shard_task_key, shape.statement, args),
                       shard_task_key=None)

    async def _describe(self, pool: asyncpg.Pool, sql: str) -> _Shape:
        async with pool.acquire() as conn:
            prepared = await conn.prepare(sql)
            types: Sequence[Any] = prepared.get_parameters()
            attributes: Sequence[Any] = prepared.get_attributes()

        def element(match: re.Match[str]) -> str:
            if match.group(1) is None:
                return match.group(0)
            n = int(match.group(1))
            return f"(${n})::{_qualified(types[n - 1])}"

        columns = ", ".join(f"{_quote(a.name)} {_qualified(a.type)}"
                            for a in attributes)
        return _Shape(call=f"SELECT * FROM {self._function}($1, $2, $3) AS task({columns})",
                      statement=_TOKEN.sub(element, sql))
