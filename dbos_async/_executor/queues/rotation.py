"""Turns for the keys of a queue: where a claim round's walk over them starts, and how
much of the worker budget each key takes.

A claim round walks a queue's partitions (and, on a sharded database, its shard keys) one
after another, each taking part of what is left of the executor's worker budget. Walked
from the first key every time, and each key taking all it could, the keys that sort first
would fill the budget whenever it binds, and a tenant whose key sorts last would wait until
every earlier backlog is gone. So each walk starts just after the last key that started work
and wraps around to it, and each key takes at most an even share of the room left: while the
budget binds, busy keys take turns (round robin): after any number of starts the counts of
any two busy keys differ by at most one, whatever order the workflows finish in, unless a
key's own limit (partition concurrency) makes it skip its turn. When the budget does not
bind, every key gets all it can each round.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class Rotation:
    """The turn of one walk: the last key that started work (None: from the first)."""

    def __init__(self) -> None:
        self.last: str | None = None

    def order(self, keys: Iterable[str]) -> list[str]:
        """``keys`` in the order of the next walk: sorted, from just after the last key
        served, wrapping around (the SQL walks of partitions follow the same rule)."""
        ordered = sorted(keys)
        if self.last is None:
            return ordered
        cut = bisect.bisect_right(ordered, self.last)
        return ordered[cut:] + ordered[:cut]

    def served(self, key: str) -> None:
        """``key`` started work: the next walk starts after it."""
        self.last = key


def fair_share(room: int | None, keys_left: int) -> int | None:
    """What the next key of a walk may take of the ``room`` left for the ``keys_left``
    keys still to visit: an even split, rounded up (None: no limit). Without it the first
    key of a walk would fill the budget alone."""
    if room is None:
        return None
    return -(-room // max(keys_left, 1))
