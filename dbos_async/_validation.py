"""The checks every public entry point runs on the names and durations it is given.

Workflow IDs, names, keys and topics end up in indexed text columns, and durations become
epoch milliseconds in bigint columns: a value PostgreSQL cannot store (a NUL character, a
lone surrogate, an index row over its size limit, an infinite or NaN duration) is refused
here, with an error naming the argument, before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Real

from dbos_async.errors import DBOSError, InvalidArgumentError, SerializationError

MAX_IDENTIFIER_BYTES = 400
"""The longest workflow ID, name, key or topic, in bytes of UTF-8 (so 400 ASCII characters).

The widest index of the system database holds five such values in one row (the sharded
queue-partition index: shard key, queue, partition key, workflow ID, application); a child
workflow's derived ID may hold its parent's ID and shard key. At 400 bytes each that row
stays below PostgreSQL's b-tree limit of 2704 bytes."""

MAX_SECONDS = 1_000_000_000.0
"""The longest timeout, delay or interval, in seconds (about 31 years): its deadline in
epoch milliseconds stays far inside a bigint."""


def text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` in a text column (None: it can)."""
    if "\x00" in text:
        return f"contains a NUL character at position {text.index(chr(0))}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (f"contains a lone surrogate ({text[error.start]!r}) at position "
                f"{error.start}, which UTF-8 cannot encode")
    return None


def check_identifier(value: object, argument: str, *, optional: bool = False,
                     empty_ok: bool = False) -> None:
    """Refuse a workflow ID, name, key or topic the system database cannot store.

    ``optional`` accepts None (the argument's default); ``empty_ok`` accepts "" where an
    empty string has always been a valid value (an event key, a topic)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        kind = "string" if empty_ok else "non-empty string"
        raise InvalidArgumentError(argument, f"must be a {kind}, got {type(value).__name__}")
    if not value and not empty_ok:
        raise InvalidArgumentError(argument, "must be a non-empty string, got ''")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidArgumentError(argument, f"{problem}; {_shown(value)}")
    size = len(value.encode("utf-8"))
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidArgumentError(
            argument, f"is {size} bytes of UTF-8, over the limit of {MAX_IDENTIFIER_BYTES}; "
            f"{_shown(value)}")


def check_lookup(value: object, argument: str) -> None:
    """Refuse an ID, name or key to look up (a handle, a filter, an event to wait for)
    that no row can hold: a non-string, a NUL character, a lone surrogate. No length
    limit: a derived child ID may be longer than a given one, and a long value finds
    nothing rather than failing."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidArgumentError(argument, f"must be a string, got {type(value).__name__}")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidArgumentError(argument, f"{problem}; {_shown(value)}")


def check_lookups(values: object, argument: str) -> None:
    """:func:`check_lookup` for a value or a sequence of them (a listing filter)."""
    if values is None or isinstance(values, str):
        check_lookup(values, argument)
        return
    if not isinstance(values, list | tuple | set | frozenset):
        raise InvalidArgumentError(argument, "must be a string or a sequence of strings, "
                                   f"got {type(values).__name__}")
    for value in values:
        check_lookup(value, argument)


def check_seconds(value: object, argument: str, *, optional: bool = True,
                  positive: bool = False) -> None:
    """Refuse a timeout, delay or interval that is not a finite, non-negative number of
    seconds up to :data:`MAX_SECONDS` (``positive``: above zero). None passes when
    ``optional`` (no timeout)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidArgumentError(argument, f"must be a number of seconds, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds):
        raise InvalidArgumentError(argument, "is NaN; give a number of seconds")
    if math.isinf(seconds) and seconds > 0:
        instead = "None (no limit)" if optional else f"at most {MAX_SECONDS:.0f} seconds"
        raise InvalidArgumentError(argument, f"is infinite; give {instead}")
    if seconds < 0 or (positive and seconds == 0):
        bound = "positive" if positive else "zero or more"
        raise InvalidArgumentError(argument, f"must be {bound} seconds, got {value!r}")
    if seconds > MAX_SECONDS:
        raise InvalidArgumentError(
            argument, f"must be at most {MAX_SECONDS:.0f} seconds, got {value!r}")


def check_flag(value: object, argument: str) -> None:
    """Refuse an on/off option that is not a bool (a string such as ``"false"`` is true)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(argument, f"must be True or False, got {value!r}")


def check_offset(value: object, argument: str = "stream offset") -> None:
    """Refuse a position that is not a non-negative integer (a stream offset)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(argument, f"must be an integer >= 0, got {value!r}")


@contextmanager
def reported_as(error_type: type[DBOSError]) -> Iterator[None]:
    """Raise the checks' errors in the block as ``error_type``: where an API reports every
    problem of a definition as one type (a queue's :class:`ConfigurationError`, a
    schedule's :class:`ScheduleError`)."""
    try:
        yield
    except InvalidArgumentError as error:
        raise error_type(str(error)) from None


def check_serialized(text: str, what: str) -> None:
    """Refuse serialized text (JSON) that PostgreSQL cannot store: a lone surrogate in one
    of its strings (JSON escapes NUL characters, so only surrogates remain)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise SerializationError(
            f"Cannot serialize {what}: a string in it contains a lone surrogate "
            f"({text[error.start]!r}), which UTF-8 cannot encode") from None


def check_jsonb(value: object, argument: str) -> None:
    """Refuse JSON data that a jsonb column cannot hold: a NUL character or a lone
    surrogate in one of its strings or keys (plain JSON text escapes and stores both)."""
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise InvalidArgumentError(argument, f"a string in it {problem}")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_jsonb(key, argument)
            check_jsonb(item, argument)
    elif isinstance(value, list | tuple):
        for item in value:
            check_jsonb(item, argument)


def _shown(value: str) -> str:
    """``value`` for a message: its start, escaped, and its length."""
    start = value if len(value) <= 40 else value[:40] + "..."
    return f"got {start!r} ({len(value)} characters)"
