"""Shard-key binding, carried by context variables.

A sharded system database routes every per-workflow statement by a shard key. The key of a
workflow a statement names comes from :func:`bind_shard_keys`; statements that name no workflow
(a queue scan, a list) run under :func:`shard_key_scope`. The unsharded database accepts neither
and says so, so code written for one kind never silently runs unrouted on the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

_bound: ContextVar[Mapping[str, str]] = ContextVar("dbos_shard_keys", default=MappingProxyType({}))
_scope: ContextVar[str | None] = ContextVar("dbos_shard_key_scope", default=None)


@contextmanager
def bind_shard_keys(pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> Iterator[None]:
    """Route statements naming these workflow IDs by these keys, for the duration of the block."""
    merged = dict(_bound.get())
    merged.update(dict(pairs))
    token = _bound.set(MappingProxyType(merged))
    try:
        yield
    finally:
        _bound.reset(token)


@contextmanager
def shard_key_scope(key: str) -> Iterator[None]:
    """Confine statements that name no single workflow to the shard of ``key``."""
    token = _scope.set(key)
    try:
        yield
    finally:
        _scope.reset(token)


def bound_shard_key(workflow_id: str) -> str | None:
    """The key bound to this workflow ID in the current context, if any."""
    return _bound.get().get(workflow_id)


def current_scope() -> str | None:
    """The shard-key scope of the current context, if any."""
    return _scope.get()
