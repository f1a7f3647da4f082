"""The one entry that runs a program's event loop: uvloop when it is installed (the ``speed``
extra) unless turned off, asyncio's own loop otherwise.

dbos_async is a library and does not own the loop; :func:`run` is what its command line, its
console and its examples run their coroutine through, and what a program may use in place
of :func:`asyncio.run` to get the same choice.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from dbos_async.errors import ConfigurationError

T = TypeVar("T")

UVLOOP_ENV = "DBOS_UVLOOP"
"""Environment variable read when :func:`run` is not told: false/0 turns uvloop off, true/1
requires it."""

_NO_UVLOOP = ("uvloop is not installed: pip install 'dbos_async[speed]', or leave "
              f"uvloop unset and {UVLOOP_ENV} unset (or false) to run on asyncio's loop")


def run(main: Coroutine[Any, Any, T], *, uvloop: bool | None = None) -> T:
    """Run ``main`` to completion on a new event loop and return its result, like
    :func:`asyncio.run`.

    ``uvloop=None`` (the default) reads ``DBOS_UVLOOP``: unset means uvloop if it is
    importable; false (``0``, ``no``, ``off``) means asyncio's loop; true (``1``, ``yes``,
    ``on``) requires uvloop. ``True`` and ``False`` decide without the environment.
    """
    factory = loop_factory(uvloop)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_factory(uvloop: bool | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What :func:`run` creates its loop with: uvloop's ``new_event_loop``, or None for
    asyncio's default loop. Raises :class:`ConfigurationError` when uvloop is required but
    missing, or ``DBOS_UVLOOP`` is not a boolean."""
    wanted = uvloop if uvloop is not None else _from_environment()
    if wanted is False:
        return None
    try:
        import uvloop as uvloop_module
    except ImportError:
        if wanted:
            raise ConfigurationError(_NO_UVLOOP) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop_module.new_event_loop
    return factory


def _from_environment() -> bool | None:
    """``DBOS_UVLOOP`` parsed like the other boolean ``DBOS_`` settings; None when unset."""
    raw = os.environ.get(UVLOOP_ENV, "").strip()
    if not raw:
        return None
    try:
        return TypeAdapter(bool).validate_python(raw)
    except ValidationError:
        raise ConfigurationError(
            f"{UVLOOP_ENV} must be a boolean (true/false, 1/0, yes/no, on/off), "
            f"not {raw!r}") from None
