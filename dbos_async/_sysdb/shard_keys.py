"""Shard-key binding, carried by context variables.

A sharded system database routes every per-workflow statement by a shard key. The key of a
workflow a statement names comes from :func:`bind_shard_keys`; statements that name no workflow
(a queue scan, a list) run under :func:`shard_key_scope`. The unsharded database accepts neither
and says so, so code written for one kind never silently runs unrouted on the other. Workflow
IDs are unique only per key, so a binding is what tells two same-ID workflows apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from dbos_async._validation import check_identifier, check_lookup

_UNBOUND: Mapping[str, str] = MappingProxyType({})
_bound: ContextVar[Mapping[str, str]] = ContextVar("dbos_shard_keys", default=_UNBOUND)
_scope: ContextVar[str | None] = ContextVar("dbos_shard_key_scope", default=None)


def validate_shard_key(shard_key: object) -> None:
    """Refuse a key that is not None or a non-empty string the database can store (see
    :func:`~dbos_async._validation.check_identifier`)."""
    check_identifier(shard_key, "shard key", optional=True)


def _checked_bindings(pairs: Mapping[str, str | None]) -> dict[str, str]:
    """The workflow IDs and keys of ``pairs`` to bind (those with a key), every one checked."""
    for workflow_id in pairs:
        check_lookup(workflow_id, "workflow ID")
    given = {workflow_id: key for workflow_id, key in pairs.items() if key is not None}
    for key in given.values():
        validate_shard_key(key)
    return given


@contextmanager
def bind_shard_keys(pairs: Mapping[str, str | None]) -> Iterator[None]:
    """Route statements naming these workflow IDs by these keys, for the duration of the
    block (None values bind nothing). Every operation naming workflows passes here, so the
    IDs are checked here too."""
    given = _checked_bindings(pairs)
    if not given:
        yield
        return
    token = _bound.set(MappingProxyType({**_bound.get(), **given}))
    try:
        yield
    finally:
        _bound.reset(token)


@contextmanager
def shard_key_scope(key: str | None) -> Iterator[None]:
    """Confine statements that name no single workflow to the shard of ``key`` (None: no
    scope, every key)."""
    validate_shard_key(key)
    token = _scope.set(key)
    try:
        yield
    finally:
        _scope.reset(token)


@contextmanager
def cleared_shard_keys() -> Iterator[None]:
    """No binding and no scope inside the block: a background task or a workflow body
    binds the keys it needs itself, never inheriting its starter's."""
    bound, scope = _bound.set(_UNBOUND), _scope.set(None)
    try:
        yield
    finally:
        _scope.reset(scope)
        _bound.reset(bound)


def bound_shard_key(workflow_id: str) -> str | None:
    """The key bound to this workflow ID in the current context, if any."""
    return _bound.get().get(workflow_id)


def current_scope() -> str | None:
    """The shard-key scope of the current context, if any."""
    return _scope.get()


T = TypeVar("T")


def by_key(pairs: Iterable[tuple[str | None, T]]) -> dict[str | None, list[T]]:
    """Values grouped by shard key, keys in order of first appearance: a statement names one
    key, so a batch goes as one statement per group."""
    groups: dict[str | None, list[T]] = {}
    for key, value in pairs:
        groups.setdefault(key, []).append(value)
    return groups


class WorkflowAddress(NamedTuple):
    """A workflow and its shard key (None unsharded): what tells two same-ID workflows apart."""

    workflow_id: str
    shard_key: str | None

    def routed(self) -> AbstractContextManager[None]:
        """Statements naming this workflow's ID route by its key alone inside the block,
        whatever the surrounding context bound to the same ID: cleared, then bound to
        this workflow's key alone (both at once: a workflow's body runs in this block)."""
        _checked_bindings({self.workflow_id: self.shard_key})
        return routed_as_stored(self.workflow_id, self.shard_key)


def routed_as_stored(workflow_id: str, shard_key: str | None) -> AbstractContextManager[None]:
    """:meth:`WorkflowAddress.routed` of a workflow whose row holds this ID and key (an
    execution's own), which are then valid: nothing to check (every workflow run enters
    one)."""
    return _Routed(_UNBOUND if shard_key is None else MappingProxyType({workflow_id: shard_key}))


class _Routed:
    """The block of :meth:`WorkflowAddress.routed`: a plain class, cheaper to enter than a
    generator's context manager (every workflow run enters one)."""

    __slots__ = ("_bound", "_given", "_scope")

    def __init__(self, given: Mapping[str, str]) -> None:
        self._given = given

    def __enter__(self) -> None:
        # Each set only when it changes (a set allocates): unsharded, a run's context
        # usually binds nothing already.
        self._bound = None if _bound.get() is self._given else _bound.set(self._given)
        self._scope = None if _scope.get() is None else _scope.set(None)

    def __exit__(self, *exc: object) -> None:
        if self._scope is not None:
            _scope.reset(self._scope)
        if self._bound is not None:
            _bound.reset(self._bound)
