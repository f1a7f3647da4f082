"""Statement text built once per shape, for the single-row writes of group commit.

A step's checkpoint, a workflow's start and its outcome go, one per workflow, thousands a
second (sharded, one statement per key of a batch). Building such a statement costs more
client time than sending it: the seam resolves and checks keys, every parameter is
numbered, the text is joined. Yet its text depends only on the row's shape: which optional
values are present, and the few values a builder branches on (a start's status). So the
statement is built once per shape with stand-ins in place of the row's values; the text is
kept with where each parameter comes from, and every later row of that shape only fills its
values in. The first row of each shape is also built the ordinary way and must match, so a
builder that starts branching on a value it was not told about fails at once, in the tests,
instead of writing a wrong row.
"""

from __future__ import annotations

import dataclasses
import operator
import uuid
from collections.abc import Callable, Collection, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from dbos_async._sysdb.statements.base import Query

_TEXT_MARK = f"dbos-stand-in-{uuid.uuid4().hex}-"
"""Stand-in strings: no real value or constant of a statement starts with it."""

_INT_BASE = -(2**62)
"""Stand-in integers count up from here, far from any constant or real value."""


MAX_TEMPLATES = 1024
"""The most shapes kept: far more than a workload's starts and steps take (optional fields
present or not), a bound on what an unusual one can grow."""


class _Template:
    """A statement's text and each parameter's origin: an index into the row's values
    followed by ``constants``."""

    def __init__(self, sql: str, constants: list[Any], sources: list[int]) -> None:
        self.sql = sql
        self._constants = constants
        self._pick = operator.itemgetter(*sources) if len(sources) > 1 else (
            lambda values: tuple(values[i] for i in sources))

    def fill(self, values: list[Any]) -> Query:
        values += self._constants
        return Query(self.sql, self._pick(values))


@dataclass(frozen=True)
class _Layout:
    """How the arguments of one statement break into scalar values: a dataclass or named
    tuple argument into its fields, in order (read by one ``attrgetter``), any other as
    itself."""

    getters: tuple[Callable[[Any], tuple[Any, ...]] | None, ...]
    replaceable: tuple[bool, ...]
    """Per value: whether a stand-in may take its place (it is not exact)."""
    exact: Callable[[list[Any]], Any]
    """The exact values among a row's values: they are part of its shape."""

    @classmethod
    def of(cls, args: tuple[Any, ...], exact: Collection[str]) -> _Layout:
        getters: list[Callable[[Any], tuple[Any, ...]] | None] = []
        names: list[str] = []
        values: list[Any] = []
        for position, arg in enumerate(args):
            fields = _fields_of(arg)
            if fields is not None:
                getters.append(operator.attrgetter(*fields))
                names += fields
                values += (getattr(arg, name) for name in fields)
            else:
                getters.append(None)
                names.append(f"#{position}")
                values.append(arg)
        # A boolean cannot be stood in for: its value is part of the shape.
        exact_at = [i for i, (n, v) in enumerate(zip(names, values, strict=True))
                    if n in exact or type(v) is bool]
        return cls(tuple(getters), tuple(i not in exact_at for i in range(len(names))),
                   operator.itemgetter(*exact_at) if exact_at else lambda values: ())

    def values(self, args: tuple[Any, ...]) -> list[Any]:
        values: list[Any] = []
        for getter, arg in zip(self.getters, args, strict=True):
            if getter is None:
                values.append(arg)
            else:
                values += getter(arg)
        return values


def _fields_of(arg: Any) -> list[str] | None:
    """The fields of a dataclass or named tuple argument, in order; None for a scalar."""
    if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
        return [f.name for f in dataclasses.fields(arg)]
    if isinstance(arg, tuple) and hasattr(arg, "_fields"):
        return list(arg._fields)
    return None


def _replaced(arg: Any, values: Iterator[Any]) -> Any:
    """A dataclass or named tuple argument with its fields, in order, taken from
    ``values``."""
    changes = {name: next(values) for name in _fields_of(arg) or ()}
    if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
        return dataclasses.replace(arg, **changes)
    return arg._replace(**changes)  # a named tuple


def _stand_in(value: Any, index: int, name: str) -> Any:
    """What takes the place of a row's value while its template is built."""
    kind = type(value)
    if kind is str:
        return f"{_TEXT_MARK}{index}"
    if kind is int:
        return _INT_BASE + index
    if value is not None:
        raise RuntimeError(f"Statement {name!r}: a {kind.__name__} cannot be stood in for; "
                           "name its field as exact")
    return None


class StatementTemplates:
    """The templates of one statements object (its schema and application are constants
    of every text)."""

    def __init__(self) -> None:
        self._layouts: dict[str, _Layout] = {}
        self._templates: dict[Hashable, _Template] = {}

    def query(self, name: str, build: Callable[..., Query], *args: Any,
              exact: Collection[str] = ()) -> Query:
        """``build(*args)``, from the template of ``name`` for the shape of ``args``.

        ``build`` must be a function of ``args`` alone (anything else it reads becomes a
        constant of the text); ``args`` are scalars or dataclasses (or named tuples) of
        scalars, and ``exact`` names the fields whose value, not only presence, the
        builder branches on."""
        layout = self._layouts.get(name)
        if layout is None:
            layout = self._layouts[name] = _Layout.of(args, exact)
        values = layout.values(args)
        # A value's type (None's included) and the exact values: what the text depends on.
        shape = (name, *map(type, values), layout.exact(values))
        template = self._templates.get(shape)
        if template is None:
            if len(self._templates) >= MAX_TEMPLATES:
                del self._templates[next(iter(self._templates))]  # the oldest
            template = self._templates[shape] = _built(name, build, args, layout, values)
        return template.fill(values)


def _built(name: str, build: Callable[..., Query], args: tuple[Any, ...], layout: _Layout,
           values: list[Any]) -> _Template:
    stand_ins = iter([_stand_in(v, i, name) if layout.replaceable[i] else v
                      for i, v in enumerate(values)])
    stood = tuple(
        next(stand_ins) if getter is None else _replaced(arg, stand_ins)
        for getter, arg in zip(layout.getters, args, strict=True))
    query = build(*stood)
    constants: list[Any] = []
    sources = []
    for param in query.params:
        index = _value_index(param, len(values))
        if index is None:
            index = len(values) + len(constants)
            constants.append(param)
        sources.append(index)
    template = _Template(query.sql, constants, sources)
    filled, direct = template.fill(list(values)), build(*args)
    if _TEXT_MARK in query.sql or filled.sql != direct.sql \
            or list(filled.params) != list(direct.params):
        raise RuntimeError(f"Statement {name!r} depends on more than its shape: name the "
                           "values it branches on as exact")
    return template


def _value_index(param: Any, count: int) -> int | None:
    """Which of the row's values a built parameter is the stand-in of; None: a constant."""
    if type(param) is str and _TEXT_MARK in param:
        index = param.removeprefix(_TEXT_MARK)
        if not index.isdigit():
            raise RuntimeError("A statement parameter was computed from a value, not passed "
                               "on: name the value as exact")
        return int(index)
    if type(param) is int and _INT_BASE <= param < _INT_BASE + count:
        return param - _INT_BASE
    return None
