"""Statement text built once per shape (dbos_async/_sysdb/writes/templates.py): every row
of a shape gets exactly the statement its builder would have built for it, and a builder
that branches on a value it was not told about is refused on first use."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from dbos_async._sysdb.shard_keys import WorkflowAddress
from dbos_async._sysdb.statements import Statements
from dbos_async._sysdb.statements.base import Checkpoint, NewWorkflow, Query
from dbos_async._sysdb.statements.sharded import ShardedStatements
from dbos_async._sysdb.writes.templates import MAX_TEMPLATES, StatementTemplates

KINDS = {"unsharded": Statements, "sharded": ShardedStatements}


def statements(kind: str, app_name: str | None) -> Statements:
    sql = KINDS[kind]('"dbos"')
    sql.app_name = app_name
    return sql


def new_workflows(key: str | None) -> list[NewWorkflow]:
    """Starts of every shape the group commit writes, two of each with other values."""
    rows = []
    for n, (status, queue, attributes) in enumerate(itertools.product(
            ("PENDING", "ENQUEUED"), (None, "q"), (None, '{"a": 1}'))):
        for copy in range(2):
            rows.append(NewWorkflow(
                workflow_id=f"wf-{n}-{copy}", name=f"name-{copy}", status=status,
                inputs=f'["in-{copy}"]', executor_id=f"exec-{copy}",
                application_version=None if copy else "v1", created_at_ms=1000 + n + copy,
                timeout_ms=None if copy else 60_000, priority=copy, shard_key=key,
                queue_name=queue, attributes=attributes, is_debounced=bool(copy),
                deduplication_id=None, delay_until_epoch_ms=5 if queue and copy else None))
    return rows


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("app_name", [None, "app"])
def test_a_start_is_the_statement_its_builder_makes(kind: str, app_name: str | None) -> None:
    sql = statements(kind, app_name)
    templates = StatementTemplates()
    key = "tenant-1" if kind == "sharded" else None
    for wf in new_workflows(key) * 2:  # the second round only hits cached templates
        for creator in ("creator-a", "creator-b"):
            assert templates.query("start", sql.insert_workflow, wf, creator,
                                   exact=("status",)) == _listed(sql.insert_workflow(wf, creator))


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_checkpoint_is_the_statement_its_builder_makes(kind: str) -> None:
    sql = statements(kind, "app")
    templates = StatementTemplates()

    def record_step(key: str | None, r: Checkpoint) -> Query:
        with WorkflowAddress(r.workflow_id, key).routed():
            return sql.record_step(r.workflow_id, r.function_id, r.function_name,
                                   r.owner_xid, r.output, r.error, r.started_at_ms,
                                   r.completed_at_ms, r.child_workflow_id, r.child_shard_key,
                                   r.serialization)

    rows = [Checkpoint(f"wf-{n}", n, f"step-{n}", f"owner-{n}",
                       output=None if n % 2 else f'"out-{n}"',
                       error=f'"error-{n}"' if n % 2 else None,
                       started_at_ms=10 * n, completed_at_ms=10 * n + 1,
                       child_workflow_id=f"child-{n}" if n % 3 == 0 else None,
                       child_shard_key=(f"child-key-{n}" if kind == "sharded" else None)
                       if n % 3 == 0 else None,
                       serialization="pickle" if n % 4 == 0 else "portable_json")
            for n in range(12)]
    for n, r in enumerate(rows * 2):
        key = f"tenant-{n % 3}" if kind == "sharded" else None
        assert templates.query("record_step", record_step, key, r) == _listed(record_step(key, r))


def test_a_builder_branching_on_an_undeclared_value_is_refused() -> None:
    """insert_workflow writes an owner only for a PENDING start: its status is exact."""
    sql = statements("unsharded", None)
    templates = StatementTemplates()
    wf = new_workflows(None)[0]
    assert wf.status == "PENDING"
    with pytest.raises(RuntimeError, match="depends on more than its shape"):
        templates.query("start", sql.insert_workflow, wf, "creator")


def test_a_value_computed_into_a_parameter_is_refused() -> None:
    templates = StatementTemplates()

    def suffixed(workflow_id: str) -> Query:
        return Query("SELECT $1", [workflow_id + ":suffix"])

    with pytest.raises(RuntimeError, match="computed from a value"):
        templates.query("suffixed", suffixed, "wf")


def test_values_the_text_does_not_depend_on_are_never_constants() -> None:
    """A boolean cannot be stood in for: it is part of the shape, so rows differing in it
    get their own templates, each with its value."""
    templates = StatementTemplates()

    def flagged(row: Flag) -> Query:
        return Query("SELECT $1, $2", [row.name, row.flag])

    for flag in (True, False, True):
        assert templates.query("flagged", flagged, Flag("x", flag)).params == ("x", flag)


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str
    flag: bool


def _listed(query: Query) -> Query:
    """A built query with its parameters as the templates give them (a tuple)."""
    return Query(query.sql, tuple(query.params))


def test_the_oldest_shapes_make_way_past_the_bound() -> None:
    """Shapes beyond the bound replace the oldest, which is built again when it returns."""
    templates = StatementTemplates()
    builds: list[int] = []

    def shaped(row: Shaped) -> Query:
        builds.append(row.width)
        return Query(f"SELECT {row.width}, $1", [row.name])

    for width in [*range(MAX_TEMPLATES + 1), 0, MAX_TEMPLATES]:
        assert templates.query("shaped", shaped, Shaped("x", width),
                               exact=("width",)).sql == f"SELECT {width}, $1"
    # Each new shape is built twice (stand-ins, then checked directly); the first shape
    # again after it was dropped, the newest not.
    assert len(builds) == 2 * (MAX_TEMPLATES + 2)


@dataclasses.dataclass(frozen=True)
class Shaped:
    name: str
    width: int
