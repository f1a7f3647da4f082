"""The one parser of listing filters (``dbos_async._web.filters``): the command line, the
console and the web routes speak one vocabulary, ``list_workflows``' own keyword names, and
refuse bad input alike, naming the filter. No database: these are the parsers alone."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
from click.testing import CliRunner
from starlette.datastructures import QueryParams

from dbos_async._web.filters import FILTERS, listing_filters
from dbos_async.cli.workflows import filter_options
from dbos_async.console.app import ConsoleError, workflow_filters
from dbos_async.errors import InvalidRequestError

ATTRIBUTES = '{"tenant": "acme"}'
EXPECTED = {
    "status": ["ERROR", "CANCELLED"], "queue_name": ["jobs"], "workflow_id_prefix": ["job-"],
    "start_time": 1767225600000, "is_fork": True, "has_parent": False, "queues_only": True,
    "attributes": {"tenant": "acme"}, "shard_key": ["acme"],
}


@click.command()
@filter_options
def echo(filters: dict[str, Any]) -> None:
    """What the command line's filter options hand a command."""
    click.echo(json.dumps(filters))


def cli_filters(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(echo, list(args))
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.output)
    return parsed


def test_the_command_line_the_console_and_the_web_routes_read_filters_alike() -> None:
    from_cli = cli_filters("--status", "error", "--status", "CANCELLED", "--queue", "jobs",
                           "--prefix", "job-", "--start-time", "2026-01-01T00:00:00Z",
                           "--is-fork", "--no-has-parent", "--queued",
                           "--attribute", "tenant=acme", "--shard-key", "acme")
    query = [("status", "error"), ("status", "CANCELLED"), ("queue_name", "jobs"),
             ("workflow_id_prefix", "job-"), ("start_time", "2026-01-01T00:00:00Z"),
             ("is_fork", "true"), ("has_parent", "false"), ("queues_only", "yes"),
             ("attributes", ATTRIBUTES), ("shard_key", "acme")]
    from_console = workflow_filters(QueryParams([*query, ("page", "2"), ("name", "")]))
    from_web = listing_filters(query, paging=True)
    assert from_cli == from_console == from_web == EXPECTED


def test_an_empty_value_is_no_filter() -> None:
    """What an empty form field sends."""
    assert listing_filters([(name, "") for name in sorted(FILTERS)]) == {}
    assert cli_filters() == {}


def test_bad_filters_are_refused_naming_them() -> None:
    with pytest.raises(InvalidRequestError, match=r"Unknown filter 'queue'; known: .*queue_name"):
        listing_filters([("queue", "jobs")])
    with pytest.raises(InvalidRequestError, match="Unknown filter 'limit'"):
        listing_filters([("limit", "5")])  # the page is the web routes' alone
    assert listing_filters([("limit", "5")], paging=True) == {"limit": 5}
    with pytest.raises(InvalidRequestError, match="'limit' must be an integer from 1 to 1000"):
        listing_filters([("limit", "0")], paging=True)
    with pytest.raises(InvalidRequestError, match="'start_time' may be given once"):
        listing_filters([("start_time", "1"), ("start_time", "2")])
    with pytest.raises(InvalidRequestError, match="'end_time' is not an ISO 8601 time"):
        listing_filters([("end_time", "yesterday")])
    with pytest.raises(InvalidRequestError, match="'attributes' must be a JSON object"):
        listing_filters([("attributes", "[1]")])
    deep = '{"a": ' + "[" * 40 + "]" * 40 + "}"
    with pytest.raises(InvalidRequestError, match="'attributes' must nest at most 32"):
        listing_filters([("attributes", deep)])


def test_each_edge_reports_a_bad_filter_in_its_own_way() -> None:
    with pytest.raises(ConsoleError, match="Unknown status 'DONE': choose from PENDING"):
        workflow_filters(QueryParams("status=done"))
    result = CliRunner().invoke(echo, ["--end-time", "yesterday"])
    assert result.exit_code == 2
    assert "'end_time' is not an ISO 8601 time" in result.output
