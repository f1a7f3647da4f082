"""Log lines of retry loops without a flood: a line that repeats the previous one of its
loop is logged again only once the time since it first appeared has doubled (after 1 s,
then 2 s, 4 s, ...), the way the retries themselves back off. The repeats in between go to
DEBUG."""

from __future__ import annotations

import logging
import time

FIRST_REPEAT_AFTER = 1.0
"""Seconds after its first appearance at which a repeated line is logged again."""


class Repeats:
    """The last line one retry loop logged, and when it may log it again."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._line: str | None = None
        self._first = 0.0
        self._next = 0.0

    def log(self, level: int, message: str, *args: object, exc_info: bool = False) -> None:
        """Log ``message % args`` at ``level`` (``exc_info``: with the exception being
        handled), or at DEBUG when it repeats the previous line before its next doubling
        is due."""
        line = message % args if args else message
        now = time.monotonic()
        if line != self._line:
            self._line, self._first, self._next = line, now, now + FIRST_REPEAT_AFTER
        elif now >= self._next:
            self._next = now + max(now - self._first, FIRST_REPEAT_AFTER)
        else:
            level = logging.DEBUG
        self._logger.log(level, "%s", line, exc_info=exc_info)

    def reset(self) -> None:
        """The loop succeeded: its next failure is news again."""
        self._line = None
