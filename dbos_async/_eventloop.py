"""The one entry that runs a program's event loop: uvloop when it is installed (the ``speed``
extra) unless turned off, asyncio's own loop otherwise; and the cyclic garbage collector's
first threshold raised for the run.

Thousands of workflows in flight allocate many short-lived containers (futures, tasks,
records); at Python's default threshold (700 allocations) the collector runs hundreds of
times a second and walks every object still alive in the young generations, which is most
of them. A threshold of 20,000 cut a 3,000-workflow burst's time by about a quarter here;
cycles live a little longer before they are freed, which costs next to nothing.

dbos_async is a library and does not own the loop; :func:`run` is what its command line, its
console and its examples run their coroutine through, and what a program may use in place
of :func:`asyncio.run` to get the same choice.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from dbos_async.errors import ConfigurationError

T = TypeVar("T")

UVLOOP_ENV = "DBOS_UVLOOP"
"""Environment variable read when :func:`run` is not told: false/0 turns uvloop off, true/1
requires it."""

GC_THRESHOLD_ENV = "DBOS_GC_THRESHOLD"
"""Environment variable read when :func:`run` is not told: the collector's first threshold
during the run; 0 keeps the process's own."""

DEFAULT_GC_THRESHOLD = 20_000

_NO_UVLOOP = ("uvloop is not installed: pip install 'dbos_async[speed]', or leave "
              f"uvloop unset and {UVLOOP_ENV} unset (or false) to run on asyncio's loop")


def run(main: Coroutine[Any, Any, T], *, uvloop: bool | None = None,
        gc_threshold: int | None = None) -> T:
    """Run ``main`` to completion on a new event loop and return its result, like
    :func:`asyncio.run`.

    ``uvloop=None`` (the default) reads ``DBOS_UVLOOP``: unset means uvloop if it is
    importable; false (``0``, ``no``, ``off``) means asyncio's loop; true (``1``, ``yes``,
    ``on``) requires uvloop. ``True`` and ``False`` decide without the environment.

    ``gc_threshold``: the garbage collector's first threshold while ``main`` runs (the
    previous thresholds come back after); ``None`` reads ``DBOS_GC_THRESHOLD``, and without
    it 20,000; 0 leaves the collector as it is.
    """
    factory = loop_factory(uvloop)
    threshold = _gc_threshold(gc_threshold)
    previous = gc.get_threshold()
    if threshold:
        gc.set_threshold(threshold, *previous[1:])
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    finally:
        gc.set_threshold(*previous)


def _gc_threshold(given: int | None) -> int:
    """The threshold :func:`run` sets; raises :class:`ConfigurationError` for a negative
    one or a ``DBOS_GC_THRESHOLD`` that is not a whole number."""
    if given is None:
        raw = os.environ.get(GC_THRESHOLD_ENV, "").strip()
        if not raw:
            return DEFAULT_GC_THRESHOLD
        try:
            given = int(raw)
        except ValueError:
            raise ConfigurationError(
                f"{GC_THRESHOLD_ENV} must be a whole number of allocations (0 keeps "
                f"Python's threshold), not {raw!r}") from None
    if isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise ConfigurationError(
            f"gc_threshold must be a whole number >= 0 (0 keeps Python's threshold), "
            f"not {given!r}")
    return given


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
