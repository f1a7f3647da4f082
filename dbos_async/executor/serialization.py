"""DBOS portable JSON, with values coerced back to the annotated types.

Inputs are stored as ``{"positionalArgs": [...], "namedArgs": {...}}`` and results as plain
JSON, so DBOS clients in other languages can read and write them (errors: see
:mod:`dbos_async.executor.recorded_errors`). On the way back, pydantic validates each value
against its parameter's or return annotation: a workflow taking an ``Order`` model gets an
``Order`` on recovery.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from functools import cached_property
from typing import Any, get_type_hints

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from dbos_async.errors import SerializationError
from dbos_async.sysdb.statements import PORTABLE_JSON
from dbos_async.validation import check_serialized


def to_json_value(value: Any, what: str) -> Any:
    """``value`` as plain JSON data; ``what`` names it in the error."""
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError) as error:
        raise SerializationError(
            f"Cannot serialize {what} ({type(value).__name__}) as portable JSON: {error}"
        ) from None


def dumps(data: Any, what: str) -> str:
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as error:  # NaN and infinities have no JSON form.
        raise SerializationError(f"Cannot serialize {what} as portable JSON: {error}") from None
    check_serialized(text, what)
    return text


def to_json(value: Any, what: str) -> str:
    return dumps(to_json_value(value, what), what)


def check_serialization(serialization: str | None, what: str) -> None:
    if serialization not in (PORTABLE_JSON, None):
        raise SerializationError(
            f"{what} was stored with serialization {serialization!r}; dbos_async reads only "
            f"{PORTABLE_JSON!r}"
        )


def from_json(text: str | None, serialization: str | None, what: str) -> Any:
    check_serialization(serialization, what)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise SerializationError(f"{what} is not valid JSON: {error}") from None


class Signature:
    """A function's parameters and return type, for serializing calls and coercing results."""

    def __init__(self, fn: Callable[..., Any], skip_first: bool = False) -> None:
        self.qualname = getattr(fn, "__qualname__", repr(fn))
        self._fn = fn
        self._signature = inspect.signature(fn)
        parameters = list(self._signature.parameters.values())
        self.parameters = parameters[1:] if skip_first else parameters
        self.skip_first = skip_first

    @cached_property
    def _hints(self) -> dict[str, Any]:
        try:
            return get_type_hints(self._fn)
        except Exception:
            # Unresolvable annotations (a forward reference to a local class): values come
            # back as plain JSON rather than failing the workflow.
            return {}

    def _adapter(self, name: str) -> TypeAdapter[Any] | None:
        hint = self._hints.get(name)
        if hint is None or hint is Any:
            return None
        adapters: dict[str, TypeAdapter[Any]] = self.__dict__.setdefault("_adapters", {})
        if name not in adapters:
            adapters[name] = TypeAdapter(hint)
        return adapters[name]

    def coerce(self, name: str, value: Any, what: str) -> Any:
        adapter = self._adapter(name)
        if adapter is None:
            return value
        try:
            return adapter.validate_python(value)
        except ValidationError as error:
            raise SerializationError(f"{what} does not match its annotation: {error}") from None

    def serialize_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        try:
            self._signature.bind(*((None,) if self.skip_first else ()), *args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self.qualname}(): {error}") from None
        positional = [to_json_value(a, f"argument {i} of {self.qualname}")
                      for i, a in enumerate(args)]
        named = {k: to_json_value(v, f"argument {k!r} of {self.qualname}")
                 for k, v in kwargs.items()}
        return dumps({"positionalArgs": positional, "namedArgs": named},
                     f"the arguments of {self.qualname}")

    def deserialize_inputs(
        self, text: str | None, serialization: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        what = f"the inputs of {self.qualname}"
        data = from_json(text, serialization, what)
        if not isinstance(data, dict):
            raise SerializationError(f"{what} are not a JSON object")
        positional = data.get("positionalArgs") or []
        named = data.get("namedArgs") or {}
        args: list[Any] = []
        params = iter(self.parameters)
        current: inspect.Parameter | None = None
        for index, value in enumerate(positional):
            if current is None or current.kind is not inspect.Parameter.VAR_POSITIONAL:
                current = next(params, None)
            name = current.name if current is not None else ""
            args.append(self.coerce(name, value, f"argument {index} of {self.qualname}"))
        by_name = {p.name: p for p in self.parameters}
        var_keyword = next((p.name for p in self.parameters
                            if p.kind is inspect.Parameter.VAR_KEYWORD), "")
        kwargs = {
            k: self.coerce(k if k in by_name else var_keyword, v,
                           f"argument {k!r} of {self.qualname}")
            for k, v in named.items()
        }
        return tuple(args), kwargs

    def serialize_result(self, value: Any) -> str:
        return to_json(value, f"the result of {self.qualname}")

    def deserialize_result(self, text: str | None, serialization: str | None) -> Any:
        what = f"the result of {self.qualname}"
        return self.coerce("return", from_json(text, serialization, what), what)
