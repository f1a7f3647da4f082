"""Round trips from this process to PostgreSQL, counted at asyncpg's public calls.

:func:`install` wraps, in this process only, the methods of ``asyncpg.Connection`` that send
something to the server and wait for its answer: ``execute``, ``executemany``, ``fetch``,
``fetchrow``, ``fetchval``, ``fetchmany`` and the ``copy_*`` methods, each one round trip
(``executemany`` and ``fetchmany`` send all their rows at once); and a transaction's
``BEGIN``, ``COMMIT`` and ``ROLLBACK`` (``asyncpg.transaction.Transaction``), each one round
trip too. A pool's methods and a pool connection's proxy call the connection's, so they are
counted there, once. A call made from inside a counted one (a transaction's ``BEGIN`` is
sent with ``execute``) is not counted again.

Beside the calls, the statements asyncpg had to prepare first (a statement not in the
connection's statement cache is parsed and described in a round trip of its own before it
runs) are counted as ``prepares``: not part of the calls, printed apart.

Counting costs a dictionary increment per call; statements are classified afterwards.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from asyncpg.transaction import Transaction

STATEMENT_METHODS = ("execute", "executemany", "fetch", "fetchrow", "fetchval", "fetchmany",
                     "copy_from_table", "copy_from_query", "copy_to_table",
                     "copy_records_to_table")
TRANSACTION_METHODS = {"start": "BEGIN", "_Transaction__commit": "COMMIT",
                       "_Transaction__rollback": "ROLLBACK"}
"""Transaction's methods that send one statement each, by what they send (the last two
are the name-mangled private methods its ``commit``/``rollback`` and ``async with`` call)."""

_inside: ContextVar[bool] = ContextVar("_inside_counted_call", default=False)
"""A counted call is in progress on this task: the calls it makes are part of it."""
_paused: ContextVar[bool] = ContextVar("_counting_paused", default=False)
"""The task is in :func:`not_counted`: its prepares are not counted either."""


@dataclass
class RoundTripCounter:
    """Counts by (kind of call, statement text); ``transactions`` by BEGIN/COMMIT/ROLLBACK."""

    statements: Counter[tuple[str, str]] = field(default_factory=Counter)
    transactions: Counter[str] = field(default_factory=Counter)
    prepares: int = 0

    def snapshot(self) -> RoundTripCounter:
        return RoundTripCounter(Counter(self.statements), Counter(self.transactions),
                                self.prepares)

    def since(self, before: RoundTripCounter) -> RoundTripCounter:
        return RoundTripCounter(self.statements - before.statements,
                                self.transactions - before.transactions,
                                self.prepares - before.prepares)

    @property
    def statement_count(self) -> int:
        return sum(self.statements.values())

    @property
    def round_trips(self) -> int:
        """Statement calls and transaction control, the prepares not included."""
        return self.statement_count + sum(self.transactions.values())

    def by_kind(self) -> Counter[str]:
        kinds: Counter[str] = Counter()
        for (method, text), count in self.statements.items():
            kinds[classify(method, text)] += count
        for what, count in self.transactions.items():
            kinds[what] += count
        return kinds


COUNTER = RoundTripCounter()
"""What this process sent since :func:`install`."""

_FIRST_TABLE = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|FROM)\s+([\w.\"]+)",
                          re.IGNORECASE)
_FOR_UPDATE = re.compile(r"\bFOR\s+(NO\s+KEY\s+)?UPDATE\b", re.IGNORECASE)


def classify(method: str, text: str) -> str:
    """A statement's kind for the report: the verb and table of its first write or read
    (schema dropped; a ``SELECT ... FOR UPDATE`` marked), else its first words;
    ``executemany``/``fetchmany`` marked as batches."""
    match = _FIRST_TABLE.search(text)
    if match is None:
        kind = " ".join(text.split())[:50]
    else:
        verb = match.group(1).split()[0].upper()
        verb = "SELECT" if verb == "FROM" else verb
        kind = f"{verb} {match.group(2).rsplit('.', 1)[-1].strip(chr(34))}"
        if verb == "SELECT" and _FOR_UPDATE.search(text):
            kind += " FOR UPDATE"
    if method in ("executemany", "fetchmany"):
        kind += f" ({method})"
    elif method.startswith("copy_"):
        kind = f"{method} {kind}"
    return kind


def _counting_statement(method: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _inside.get():
            return await original(self, *args, **kwargs)
        query = args[0] if args and isinstance(args[0], str) else ""
        COUNTER.statements[method, query] += 1
        token = _inside.set(True)
        try:
            return await original(self, *args, **kwargs)
        finally:
            _inside.reset(token)

    return counted


def _counting_transaction(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _inside.get():
            return await original(self, *args, **kwargs)
        COUNTER.transactions[what] += 1
        token = _inside.set(True)
        try:
            return await original(self, *args, **kwargs)
        finally:
            _inside.reset(token)

    return counted


def _counting_prepares(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def counted(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("use_cache", True):
            record_class = kwargs.get("record_class") or self._protocol.get_record_class()
            key = (query, record_class, kwargs.get("ignore_custom_codec", False))
            if self._stmt_cache.get(key) is None and not _paused.get():
                COUNTER.prepares += 1
        elif not _paused.get():
            COUNTER.prepares += 1
        return await original(self, query, *args, **kwargs)

    return counted


_installed = False


def install() -> None:
    """Count every call of this process from now on (once; later calls do nothing)."""
    global _installed
    if _installed:
        return
    _installed = True
    for method in STATEMENT_METHODS:
        setattr(asyncpg.Connection, method,
                _counting_statement(method, getattr(asyncpg.Connection, method)))
    for method, what in TRANSACTION_METHODS.items():
        setattr(Transaction, method, _counting_transaction(what, getattr(Transaction, method)))
    asyncpg.Connection._get_statement = _counting_prepares(  # type: ignore[attr-defined]
        asyncpg.Connection._get_statement)  # type: ignore[attr-defined]


@contextmanager
def not_counted() -> Iterator[None]:
    """The calls of the current task inside the block are not counted (the benchmark's own
    readings); other tasks' still are."""
    inside, paused = _inside.set(True), _paused.set(True)
    try:
        yield
    finally:
        _inside.reset(inside)
        _paused.reset(paused)
