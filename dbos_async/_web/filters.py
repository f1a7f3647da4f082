"""The one parser of workflow-listing filters, for the command line, the console and the web
routes alike.

Each hands over (name, value) pairs of text in ``list_workflows``' own vocabulary: its
keyword names, a name repeated for several values. This turns them into its keyword
arguments, or raises :class:`~dbos_async.errors.InvalidRequestError` naming the filter and
what it takes. An empty value is no filter (what an empty form field sends).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from dbos_async._executor.management.control import epoch_ms
from dbos_async.errors import DBOSError, InvalidRequestError
from dbos_async.statuses import WorkflowStatusString

MAX_LIMIT = 1000
"""The largest page a listing returns at once."""
MAX_ATTRIBUTE_DEPTH = 32
"""How deeply an attributes filter may nest its objects and arrays: the JSON parser
recurses once per level."""

# Filters that take one value or several (the name repeated): a workflow matching any.
LIST_FILTERS = frozenset({
    "workflow_ids", "status", "name", "queue_name", "parent_workflow_id", "forked_from",
    "executor_id", "application_version", "authenticated_user", "workflow_id_prefix",
    "application_name", "shard_key", "parent_shard_key", "schedule_name",
})
FLAGS = frozenset({"was_forked_from", "is_fork", "has_parent", "queues_only"})
TIME_BOUNDS = frozenset({"start_time", "end_time", "completed_after", "completed_before",
                         "dequeued_after", "dequeued_before"})
FILTERS = LIST_FILTERS | FLAGS | TIME_BOUNDS | {"attributes"}
"""Every filter's name."""
PAGING = frozenset({"limit", "offset", "sort_desc", "load_input", "load_output"})
"""What a page of the web routes may also say: its size and start, order and contents."""

Pairs = Iterable[tuple[str, str]]


def listing_filters(pairs: Pairs, paging: bool = False) -> dict[str, Any]:
    """The keyword arguments of ``list_workflows`` these (name, value) pairs ask for.

    Args:
        pairs: Filter names and their values as text; a name repeated for a list.
        paging: Whether the pairs may also name the page (:data:`PAGING`).

    Returns:
        The keyword arguments, values parsed; empty values left out.

    Raises:
        InvalidRequestError: A name not known, a value not valid, or a single-valued
            name given twice; the message names it.
    """
    known = FILTERS | PAGING if paging else FILTERS
    values: dict[str, list[str]] = {}
    for name, value in pairs:
        if name not in known:
            raise InvalidRequestError(
                f"Unknown filter {name!r}; known: {', '.join(sorted(known))}")
        if value:
            values.setdefault(name, []).append(value)
    filters: dict[str, Any] = {}
    for name, given in values.items():
        if name in LIST_FILTERS:
            filters[name] = statuses(given) if name == "status" else given
            continue
        if len(given) > 1:
            raise InvalidRequestError(f"Filter {name!r} may be given once")
        filters[name] = _PARSERS[name](name, given[0])
    return filters


def statuses(values: Iterable[str]) -> list[str]:
    """Workflow statuses named in any case (empty values skipped); one that is not a
    :class:`~dbos_async.WorkflowStatusString` raises :class:`InvalidRequestError` naming it
    and the choices."""
    chosen = [value.upper() for value in values if value]
    for status in chosen:
        if status not in WorkflowStatusString.__members__:
            raise InvalidRequestError(f"Unknown status {status!r}: choose from "
                                      f"{', '.join(WorkflowStatusString)}")
    return chosen


def flag(name: str, value: str) -> bool:
    """A yes-or-no value; anything but true or false (1 or 0, yes or no) raises
    :class:`InvalidRequestError` naming it."""
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidRequestError(f"{name!r} must be true or false, got {value!r}")


def _count(name: str, value: str, low: int, high: int | None) -> int:
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low or (high is not None and number > high):
        upper = f" to {high}" if high is not None else " or more"
        raise InvalidRequestError(
            f"{name!r} must be an integer from {low}{upper}, got {value!r}")
    return number


def _limit(name: str, value: str) -> int:
    return _count(name, value, 1, MAX_LIMIT)


def _offset(name: str, value: str) -> int:
    return _count(name, value, 0, None)


def _bound(name: str, value: str) -> int:
    """A time bound, in epoch milliseconds: given as such, or as ISO 8601."""
    try:
        bound = epoch_ms(int(value) if value.isdigit() else value, f"Filter {name!r}")
    except DBOSError as error:
        raise InvalidRequestError(str(error)) from None
    assert bound is not None
    return bound


def _attributes(name: str, value: str) -> dict[str, Any]:
    """A JSON object, its depth measured before parsing (the parser recurses per level)."""
    if _nesting(value) > MAX_ATTRIBUTE_DEPTH:
        raise InvalidRequestError(f"{name!r} must nest at most {MAX_ATTRIBUTE_DEPTH} levels "
                                  "of objects and arrays")
    try:
        attributes = json.loads(value)
    except ValueError:
        attributes = None
    if not isinstance(attributes, dict):
        raise InvalidRequestError(f"{name!r} must be a JSON object, got {value[:40]!r}")
    return attributes


def _nesting(text: str) -> int:
    """How deeply the JSON ``text`` nests objects and arrays (brackets in strings aside)."""
    deepest = depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    **dict.fromkeys(FLAGS | {"sort_desc", "load_input", "load_output"}, flag),
    **dict.fromkeys(TIME_BOUNDS, _bound),
    "limit": _limit, "offset": _offset, "attributes": _attributes,
}
