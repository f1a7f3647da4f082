"""How values are stored: DBOS portable JSON by default, or a serializer of the user's;
values coerced back to the annotated types.

Inputs are stored as ``{"positionalArgs": [...], "namedArgs": {...}}`` and results as plain
JSON, so DBOS clients in other languages can read and write them (errors: see
:mod:`dbos_async._executor.recorded_errors`). On the way back, pydantic validates each value
against its parameter's or return annotation: a workflow taking an ``Order`` model gets an
``Order`` on recovery.

An executor or client given ``serializer=`` writes every value it stores (inputs, results,
step outputs, events, messages, stream values) with it and records its name in the
``serialization`` column; every reader picks the format by that column. Python pickle
(``py_pickle``, what the ``dbos`` package writes by default) is read only with
``allow_pickle=True``: unpickling runs code chosen by whoever wrote the value.
"""

from __future__ import annotations

import base64
import inspect
import json
import pickle
from collections.abc import Callable, Collection
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, get_type_hints

from pydantic import PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from dbos_async._sysdb.statements import PORTABLE_JSON, Payload
from dbos_async._validation import check_serialized
from dbos_async.errors import InvalidArgumentError, SerializationError

if TYPE_CHECKING:
    from dbos_async.config import DBOSConfig

PY_PICKLE = "py_pickle"
"""The ``dbos`` package's default format: base64 of a Python pickle."""


# Values that are JSON data as they are (what ``to_jsonable_python`` returns unchanged):
# checked by exact type, as a subclass (an enum, a bool) may serialize otherwise.
_JSON_SCALARS = frozenset((str, int, float, bool, type(None)))
# The text of the values whose JSON cannot fail or need checking, as ``json.dumps`` writes it.
_JSON_CONSTANTS = {None: "null", True: "true", False: "false"}
# ``json.dumps`` with these options builds this encoder at each call; it keeps no state.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_DECODER = json.JSONDecoder()


def to_json_value(value: Any, what: str) -> Any:
    """``value`` as plain JSON data; ``what`` names it in the error."""
    if type(value) in _JSON_SCALARS:
        return value
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError) as error:
        raise SerializationError(
            f"Cannot serialize {what} ({type(value).__name__}) as portable JSON: {error}"
        ) from None


def dumps(data: Any, what: str) -> str:
    try:
        text = _ENCODER.encode(data)
    except ValueError as error:  # NaN and infinities have no JSON form.
        raise SerializationError(f"Cannot serialize {what} as portable JSON: {error}") from None
    check_serialized(text, what)
    return text


def to_json(value: Any, what: str) -> str:
    kind = type(value)
    if kind is int:
        return int.__repr__(value)  # what the encoder writes for an int
    if kind is bool or value is None:
        return _JSON_CONSTANTS[value]
    return dumps(to_json_value(value, what), what)


class Serializer(Protocol):
    """A format for stored values, named by what ``name()`` returns (recorded in the
    ``serialization`` column). The ``dbos`` package's ``Serializer`` has this shape, so one
    written for it serves here too. Workflow inputs reach ``serialize`` as
    ``{"args": (...), "kwargs": {...}}`` (the ``dbos`` package's shape) and recorded errors
    as their portable object (``{"name", "message", "code", "data"}``)."""

    def name(self) -> str: ...

    def serialize(self, data: Any) -> str: ...

    def deserialize(self, serialized_data: str) -> Any: ...


class PortableJSON:
    """DBOS portable JSON: what every DBOS SDK reads."""

    def name(self) -> str:
        return PORTABLE_JSON

    def serialize(self, data: Any) -> str:
        return to_json(data, "a value")

    def deserialize(self, serialized_data: str) -> Any:
        # The decoder's own scan, without json.loads's checks around it (a third of its
        # cost on a workflow's inputs); text it does not take whole (surrounding
        # whitespace, or not JSON) goes to json.loads, which reads it or says why not.
        try:
            value, end = _DECODER.raw_decode(serialized_data)
        except ValueError:
            return json.loads(serialized_data)
        if end != len(serialized_data):
            return json.loads(serialized_data)
        return value


class PythonPickle:
    """The ``dbos`` package's ``py_pickle``: read (and, for a workflow stored so, its result
    written) only when ``allow_pickle`` trusts whoever can write the system database."""

    def name(self) -> str:
        return PY_PICKLE

    def serialize(self, data: Any) -> str:
        return base64.b64encode(pickle.dumps(data)).decode("ascii")

    def deserialize(self, serialized_data: str) -> Any:
        return pickle.loads(base64.b64decode(serialized_data, validate=True))


PORTABLE = PortableJSON()


def _capitalized(what: str) -> str:
    return what[:1].upper() + what[1:]

_PICKLE_REFUSED = (
    "{what} was stored with serialization 'py_pickle' (Python pickle, the dbos package's "
    "default); unpickling runs code chosen by whoever can write the system database, so it "
    "is read only with allow_pickle=True (DBOS_ALLOW_PICKLE=true), which trusts them"
)


class WorkflowSerializationFormat(StrEnum):
    """The format one call writes its values in, whatever the configured serializer (the
    ``dbos`` package's names; None, its ``DEFAULT``, keeps the configured one)."""

    PORTABLE = "portable"
    """DBOS portable JSON, which every DBOS SDK reads."""
    NATIVE = "native"
    """Python pickle (``py_pickle``, the ``dbos`` package's own format): needs
    ``allow_pickle=True`` to be written here, as to be read."""


SerializationType = WorkflowSerializationFormat | str | None
"""A call's ``serialization_type``: a :class:`WorkflowSerializationFormat`, its value, or
None (the configured format)."""


def check_serialization_type(choice: object) -> WorkflowSerializationFormat | None:
    """``choice`` as a format, or None; anything else is refused."""
    if choice is None:
        return None
    try:
        return WorkflowSerializationFormat(choice if isinstance(choice, str) else "")
    except ValueError:
        raise InvalidArgumentError(
            "serialization_type",
            f"expected None, 'portable' or 'native', got {choice!r}") from None


class Formats:
    """The formats a peer (an executor or a client) writes values in, and those it reads:
    portable JSON always, its own serializer, and ``py_pickle`` when ``allow_pickle``."""

    def __init__(self, serializer: Serializer | None = None, allow_pickle: bool = False) -> None:
        self.writer: Serializer = serializer if serializer is not None else PORTABLE
        self.allow_pickle = allow_pickle
        self._readers: dict[str, Serializer] = {PORTABLE_JSON: PORTABLE,
                                                self.writer.name(): self.writer}
        if allow_pickle:
            self._readers[PY_PICKLE] = PythonPickle()

    @classmethod
    def of(cls, config: DBOSConfig) -> Formats:
        return cls(config.serializer, config.allow_pickle)

    @property
    def name(self) -> str:
        """The format this peer writes (its ``serialization`` column value)."""
        return self.writer.name()

    def _format(self, serialization: str | None, what: str) -> Serializer:
        # NULL: rows written before the column existed, in portable JSON.
        name = serialization if serialization is not None else PORTABLE_JSON
        found = self._readers.get(name)
        if found is not None:
            return found
        if name == PY_PICKLE:
            raise SerializationError(_PICKLE_REFUSED.format(what=_capitalized(what)))
        raise SerializationError(
            f"{_capitalized(what)} was stored with serialization {name!r}, which "
            f"this process does not read (it reads {sorted(self._readers)}): configure "
            f"serializer= with the serializer named {name!r}"
        )

    def chosen(self, serialization_type: object) -> str | None:
        """The ``serialization`` name a call's ``serialization_type`` writes (None: this
        peer's own)."""
        choice = check_serialization_type(serialization_type)
        if choice is None:
            return None
        if choice is WorkflowSerializationFormat.PORTABLE:
            return PORTABLE_JSON
        if not self.allow_pickle:
            raise InvalidArgumentError(
                "serialization_type", "'native' writes Python pickle, which this process "
                "writes and reads only with allow_pickle=True")
        return PY_PICKLE

    def encode_as(self, serialization: str | None, value: Any, what: str) -> Payload:
        """``value`` in format ``serialization`` (None: this peer's own)."""
        fmt = self.writer if serialization is None else self._format(serialization, what)
        if fmt is PORTABLE:
            return Payload(to_json(value, what))
        try:
            text = fmt.serialize(value)
        except Exception as error:
            raise SerializationError(
                f"Cannot serialize {what} ({type(value).__name__}) with serializer "
                f"{fmt.name()!r}: {type(error).__name__}: {error}") from None
        if not isinstance(text, str):
            raise SerializationError(f"Serializer {fmt.name()!r} returned "
                                     f"{type(text).__name__} for {what}, not a str")
        return Payload(text, fmt.name())

    def encode(self, value: Any, what: str) -> Payload:
        """``value`` in this peer's format."""
        return self.encode_as(None, value, what)

    def decode(self, text: str | None, serialization: str | None, what: str) -> Any:
        if text is None:
            return None
        fmt = self._format(serialization, what)
        try:
            return fmt.deserialize(text)
        except Exception as error:
            raise SerializationError(
                f"{_capitalized(what)} cannot be read as {fmt.name()!r}: "
                f"{type(error).__name__}: {error}") from None

    def encode_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                      what: str, serialization: str | None = None) -> Payload:
        """A call's arguments in format ``serialization`` (None: this peer's): portable
        JSON's ``{"positionalArgs", "namedArgs"}``, or ``{"args", "kwargs"}`` for any
        other."""
        fmt = self.writer if serialization is None else self._format(serialization, what)
        if fmt is PORTABLE:
            positional = [to_json_value(a, f"argument {i} of {what}")
                          for i, a in enumerate(args)]
            named = {k: to_json_value(v, f"argument {k!r} of {what}") for k, v in kwargs.items()}
            return Payload(dumps({"positionalArgs": positional, "namedArgs": named},
                                 f"the arguments of {what}"))
        return self.encode_as(fmt.name(), {"args": tuple(args), "kwargs": dict(kwargs)},
                              f"the arguments of {what}")

    def decode_inputs(self, text: str | None, serialization: str | None,
                      what: str) -> tuple[list[Any], dict[str, Any]]:
        """The positional and named arguments of stored inputs."""
        label = f"the inputs of {what}"
        data = self.decode(text, serialization, label)
        portable = serialization in (None, PORTABLE_JSON)
        positional_key, named_key = ("positionalArgs", "namedArgs") if portable \
            else ("args", "kwargs")
        if not isinstance(data, dict):
            raise SerializationError(f"{_capitalized(label)} are not an object "
                                     f"with {positional_key!r} and {named_key!r}")
        positional = data.get(positional_key) or []
        named = data.get(named_key) or {}
        if not isinstance(positional, list | tuple) or not isinstance(named, dict):
            raise SerializationError(f"{_capitalized(label)} have malformed "
                                     f"{positional_key!r} or {named_key!r}")
        return list(positional), dict(named)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else repr(hint).replace("typing.", "")


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Signature:
    """A function's parameters and return type, for serializing calls and coercing results."""

    def __init__(self, fn: Callable[..., Any], skip_first: bool = False) -> None:
        self.qualname = getattr(fn, "__qualname__", repr(fn))
        self._fn = fn
        self._signature = inspect.signature(fn)
        parameters = list(self._signature.parameters.values())
        self.parameters = parameters[1:] if skip_first else parameters
        self.skip_first = skip_first
        self._result_label = f"the result of {self.qualname}"
        # How many positional arguments bind, when the parameters take nothing else: a call
        # with only positional arguments is then checked by counting them.
        self._positional_counts: tuple[int, int] | None = None
        if all(p.kind in _POSITIONAL for p in self.parameters):
            required = sum(p.default is inspect.Parameter.empty for p in self.parameters)
            self._positional_counts = (required, len(self.parameters))

    @cached_property
    def _hints(self) -> dict[str, Any]:
        try:
            return get_type_hints(self._fn)
        except Exception:
            # Unresolvable annotations (a forward reference to a local class): values come
            # back as plain JSON rather than failing the workflow.
            return {}

    @cached_property
    def _adapters(self) -> dict[str, TypeAdapter[Any] | None]:
        """The adapter of each annotated name looked up so far (None: not checked)."""
        return {}

    def _adapter(self, name: str) -> TypeAdapter[Any] | None:
        hint = self._hints.get(name)
        if hint is None or hint is Any:
            return None
        adapters = self._adapters
        if name not in adapters:
            try:
                adapters[name] = TypeAdapter(hint)
            except PydanticUserError:
                # A type pydantic has no schema for (a lock, a connection): its values
                # are neither checked nor coerced.
                adapters[name] = None
        return adapters[name]

    def coerce(self, name: str, value: Any, what: str) -> Any:
        """``value`` validated against the annotation of ``name`` (``what`` names it in
        the error)."""
        adapter = self._adapter(name)
        if adapter is None:
            return value
        try:
            return adapter.validate_python(value)
        except ValidationError as error:
            raise SerializationError(f"{what} does not match its annotation: {error}") from None

    @cached_property
    def _checks_arguments(self) -> bool:
        """Whether any parameter has an annotation a value is checked against."""
        return any(self._adapter(p.name) is not None for p in self.parameters)

    def _parameter_names(self, positional: int, named: Collection[str]
                         ) -> tuple[list[str], dict[str, str]]:
        """The parameter each of ``positional`` arguments and each ``named`` one binds to
        ("" for none): the annotation its value is checked against."""
        known: dict[int, list[str]] = self.__dict__.setdefault("_positional_names", {})
        if not named and positional in known:  # the common call: the same arguments again
            return known[positional], {}
        names: list[str] = []
        params = iter(self.parameters)
        current: inspect.Parameter | None = None
        for _ in range(positional):
            if current is None or current.kind is not inspect.Parameter.VAR_POSITIONAL:
                current = next(params, None)
            names.append(current.name if current is not None else "")
        by_name = {p.name for p in self.parameters
                   if p.kind is not inspect.Parameter.VAR_POSITIONAL}
        var_keyword = next((p.name for p in self.parameters
                            if p.kind is inspect.Parameter.VAR_KEYWORD), "")
        if not named:
            known[positional] = names
        return names, {k: k if k in by_name else var_keyword for k in named}

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments of a call as the function receives them: checked against its
        parameters (:class:`TypeError` for a call that does not bind) and validated against
        their annotations, as a recovery reads stored inputs back (pydantic's lax mode: a
        model given as a dict arrives as the model, ``"3"`` for an ``int`` as ``3``).

        Raises:
            InvalidArgumentError: an argument does not match its annotation.
        """
        counts = self._positional_counts
        if kwargs or counts is None or not counts[0] <= len(args) <= counts[1]:
            try:
                self._signature.bind(*((None,) if self.skip_first else ()), *args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self.qualname}(): {error}") from None
        if not self._checks_arguments:
            return args, kwargs
        positional, named = self._parameter_names(len(args), kwargs)
        return (tuple([self._check(positional[index], v) for index, v in enumerate(args)]),
                {k: self._check(named[k], v) for k, v in kwargs.items()})

    def _check(self, name: str, value: Any) -> Any:
        adapter = self._adapter(name)
        if adapter is None:
            return value
        try:
            return adapter.validate_python(value)
        except ValidationError as error:
            problems = "; ".join(e["msg"] for e in error.errors())
            raise InvalidArgumentError(
                f"argument {name!r} of {self.qualname}",
                f"expected {_type_name(self._hints[name])}, got {type(value).__name__} "
                f"{_short(value)} ({problems})") from None

    def serialize_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                         formats: Formats, serialization: str | None = None) -> Payload:
        """Arguments :meth:`bind` returned, in ``formats`` (format ``serialization``;
        None: the peer's own)."""
        return formats.encode_inputs(args, kwargs, self.qualname, serialization)

    def deserialize_inputs(
        self, text: str | None, serialization: str | None, formats: Formats
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        positional, named = formats.decode_inputs(text, serialization, self.qualname)
        if not self._checks_arguments:  # nothing to coerce: no parameter to look up
            return tuple(positional), named
        names, keywords = self._parameter_names(len(positional), named)
        label = self.qualname
        args = tuple([self.coerce(names[index], value, f"argument {index} of {label}")
                      for index, value in enumerate(positional)])
        kwargs = {k: self.coerce(keywords[k], v, f"argument {k!r} of {label}")
                  for k, v in named.items()}
        return args, kwargs

    def serialize_result(self, value: Any, formats: Formats,
                         serialization: str | None = None) -> Payload:
        """The result in format ``serialization`` (a workflow's: its row's), else the
        peer's own."""
        return formats.encode_as(serialization, value, self._result_label)

    def deserialize_result(self, text: str | None, serialization: str | None,
                           formats: Formats) -> Any:
        what = self._result_label
        return self.coerce("return", formats.decode(text, serialization, what), what)
