"""Errors as the system database records them, and as every caller gets them.

A failure is stored as DBOS portable JSON, ``{"name", "message", "code", "data"}``, which
DBOS readers in every language understand. A caller gets the error back as a
:class:`~dbos_async.RecordedError` made from that record, on the first run (the original
exception chained as ``__cause__``, see :func:`recorded_error`) as on a replay or in
another process, so the two read the same.

Where the recorded type can be found again, the RecordedError is also an instance of it:
a builtin exception or one of dbos_async's errors by name; any other class by the
``"module:qualname"`` path recorded under :data:`PYTHON_CLASS` in ``data``, looked up among
the modules this process has already imported (never importing one: the path comes from a
shared database). The public scalar fields of such an exception are kept in ``data`` too and
set again on the error read back.
"""

from __future__ import annotations

import builtins
import json
import sys
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from dbos_async import errors as library_errors
from dbos_async._executor.serialization import Formats
from dbos_async._sysdb.statements import PORTABLE_JSON
from dbos_async.errors import DBOSError, RecordedError

# Where no peer is at hand (an error recorded for a workflow whose own format is unknown):
# the portable form every reader has.
PORTABLE_ONLY = Formats()

# The key of ``data`` naming the class of an exception that is neither a builtin nor one of
# ours. Inside ``data`` because readers in other languages treat ``data`` as free-form
# details, while an extra top-level key fails the Java reader (its parser rejects unknown
# fields of the error object).
PYTHON_CLASS = "python_class"


def recorded_error(error: Exception, formats: Formats,
                   serialization: str | None = None) -> tuple[str, RecordedError]:
    """``error`` as the system database records it (the text to store, in format
    ``serialization``, by default the peer's own) and as the caller gets it: the
    RecordedError a replay reads back from that text, caused by ``error``."""
    text = serialize_error(error, formats, serialization)
    if isinstance(error, RecordedError):
        return text, error  # Replayed already: it reads back as itself.
    recorded = _from_payload(json.loads(_portable_text(error)))
    recorded.__cause__ = error
    return text, recorded


def serialize_error(error: BaseException, formats: Formats,
                    serialization: str | None = None) -> str:
    """Record an exception as a portable error object, encoded in format ``serialization``
    (by default the peer's own); a replayed :class:`RecordedError` keeps its name, message,
    code and data."""
    if (serialization or formats.name) == PORTABLE_JSON:
        return _portable_text(error)
    return formats.encode_as(serialization, _payload(error), "a recorded error").text


def deserialize_error(text: str | None, serialization: str | None,
                      formats: Formats) -> RecordedError:
    """A recorded error as every caller gets it. An exception object (what the ``dbos``
    package pickles, with ``allow_pickle``) is read through its portable form."""
    decoded = formats.decode(text, serialization, "a recorded error")
    if isinstance(decoded, BaseException):
        decoded = _payload(decoded)
    return _from_payload(decoded)


def _portable_text(error: BaseException) -> str:
    return json.dumps(_payload(error), separators=(",", ":"), ensure_ascii=False, default=str)


# ---- Writing ----


def _payload(error: BaseException) -> dict[str, Any]:
    if isinstance(error, RecordedError):
        name, message, code, data = error.name, error.message, error.code, error.data
    else:
        name, message, code = type(error).__name__, str(error), _error_code(error)
        data = _details(error)
    try:
        data = to_jsonable_python(data)
    except (PydanticSerializationError, TypeError, ValueError):
        data = repr(data)
    return {"name": name, "message": message, "code": code, "data": data}


def _error_code(error: BaseException) -> int | str | None:
    for attribute in ("code", "error_code", "errno", "status_code"):
        value = getattr(error, attribute, None)
        if isinstance(value, int | str) and not isinstance(value, bool):
            return value
    return None


def _details(error: BaseException) -> dict[str, Any] | None:
    """What a replay needs besides the name and message to rebuild ``error``: nothing for a
    builtin; the fields of one of ours (``step_id``, ``recorded``, ...); the fields and the
    class path of any other exception."""
    cls = type(error)
    if _known_exception(cls.__name__) is cls:
        return _fields(error) if isinstance(error, DBOSError) else None
    fields = _fields(error)
    if "<" not in cls.__qualname__:  # Not a class defined inside a function.
        fields[PYTHON_CLASS] = f"{cls.__module__}:{cls.__qualname__}"
    return fields or None


def _fields(error: BaseException) -> dict[str, Any]:
    """The public scalar attributes of an exception, and its lists of exceptions (the
    attempts of a step whose retries ran out) as lists of portable errors."""
    fields: dict[str, Any] = {}
    for key, value in getattr(error, "__dict__", {}).items():
        if key.startswith("_"):
            continue
        if isinstance(value, str | int | float | bool | None):
            fields[key] = value
        elif (isinstance(value, list) and value
              and all(isinstance(item, BaseException) for item in value)):
            fields[key] = [_payload(item) for item in value]
    return fields


# ---- Reading ----


def _from_payload(payload: Any) -> RecordedError:
    if not isinstance(payload, dict):
        return RecordedError("Error", str(payload))
    name = str(payload.get("name") or "Error")
    message = str(payload.get("message") or "")
    code = payload.get("code")
    if not isinstance(code, int | str) or isinstance(code, bool):
        code = None
    data = payload.get("data")
    original = _original_class(name, data)
    cls = _recorded_type(original)
    try:
        error = cls(name, message, code, data)
    except Exception:
        error = RecordedError(name, message, code, data)
    if type(error) is RecordedError:
        error.add_note(_not_rebuilt(name, data))
    elif original is not None and not _is_builtin(original) and isinstance(data, dict):
        _restore_fields(error, data)
    return error


def _not_rebuilt(name: str, data: Any) -> str:
    """The note a traceback shows under an error whose recorded type is not found again."""
    path = data.get(PYTHON_CLASS) if isinstance(data, dict) else None
    if isinstance(path, str):
        why = f"its class {path} is not in a module this process has imported"
    else:
        why = ("its class is not a builtin, a dbos_async error or a module-level class "
               "(defined inside a function, or by a program in another language)")
    return (f"Recorded as {name!r}, read back as a RecordedError: {why}. "
            "Its .name, .message, .code and .data are the recorded ones.")


def _original_class(name: str, data: Any) -> type[Exception] | None:
    """The class the error was raised as, if this process has it."""
    path = data.get(PYTHON_CLASS) if isinstance(data, dict) else None
    if isinstance(path, str):
        found = _imported_class(path)
        if found is not None and found.__name__ == name:
            return found
    return _known_exception(name)


def _imported_class(path: str) -> type[Exception] | None:
    """The exception class at ``module:qualname``, if that module is already imported."""
    module_name, _, qualname = path.partition(":")
    found: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if found is not None and qualname else ():
        found = getattr(found, part, None)
    return found if _is_exception_class(found) else None


def _known_exception(name: str) -> type[Exception] | None:
    """The builtin or dbos_async exception class called ``name``, if there is one."""
    for namespace in (builtins, library_errors):
        known = getattr(namespace, name, None)
        if _is_exception_class(known):
            return known
    return None


def _is_exception_class(value: Any) -> bool:
    return (isinstance(value, type) and issubclass(value, Exception)
            and not issubclass(value, RecordedError))


def _is_builtin(cls: type[Exception]) -> bool:
    return cls.__module__ == "builtins"


_recorded_types: dict[type[Exception], type[RecordedError]] = {}


def _recorded_type(original: type[Exception] | None) -> type[RecordedError]:
    """A RecordedError subclass that is also ``original``, so ``except ValueError`` or
    ``except MyError`` catches the error whether it was raised here or read back."""
    if original is None:
        return RecordedError
    if original not in _recorded_types:
        try:
            # The original's module and name, so a traceback reads ``ValueError: ...`` or
            # ``shop.PaymentDeclined: ...`` as it would have without the checkpoint.
            cls: type[RecordedError] = type(original.__name__, (RecordedError, original), {
                "__module__": original.__module__, "__qualname__": original.__qualname__})
        except Exception:
            cls = RecordedError  # A class whose layout or hooks refuse the mix.
        _recorded_types[original] = cls
    return _recorded_types[original]


def _restore_fields(error: RecordedError, data: dict[str, Any]) -> None:
    """Set the recorded fields of one of our errors or of a found class on ``error``."""
    for key, value in data.items():
        if (not isinstance(key, str) or key == PYTHON_CLASS or hasattr(RecordedError, key)
                or key in vars(error)):
            continue
        try:
            setattr(error, key, _field_value(value))
        except (AttributeError, TypeError):
            continue  # A read-only property of the class: its value stays computed.


def _field_value(value: Any) -> Any:
    if (isinstance(value, list) and value
            and all(isinstance(item, dict) and isinstance(item.get("name"), str)
                    and "message" in item for item in value)):
        return [_from_payload(item) for item in value]
    return value
