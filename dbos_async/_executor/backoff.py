"""The wait of a background poll that backs off while it finds nothing.

A poll exists for writers that send no notification (another SDK, raw SQL): whatever this
project writes wakes its readers at once. So a poll that keeps finding nothing may wait
longer and longer (doubling, up to ``idle_poll_max_interval``), and snaps back to its fast
interval as soon as it finds something or a notification shows activity. An idle executor
then costs a statement per source every cap, and a non-notifying writer's work is picked up
within the cap.
"""

from __future__ import annotations


class IdleBackoff:
    """The current interval of one poll: ``fast`` while it finds work, doubling after each
    empty poll up to ``cap``."""

    def __init__(self, fast: float, cap: float) -> None:
        self.fast = fast
        self.cap = max(cap, fast)
        self.interval = fast
        self.polls = 0
        """Polls recorded so far (for diagnostics and tests)."""
        self.empty_polls = 0
        """Polls in a row that found nothing."""

    @property
    def backed_off(self) -> bool:
        """Whether the interval has reached its cap."""
        return self.interval >= self.cap

    def polled(self, found: bool) -> float:
        """Record a poll's outcome; returns the interval until the next one."""
        self.polls += 1
        if found:
            self.reset()
        else:
            self.empty_polls += 1
            self.interval = min(self.interval * 2, self.cap)
        return self.interval

    def reset(self) -> bool:
        """Back to the fast interval; True if it was slower (the waiting poll may want to
        come sooner)."""
        slower = self.interval > self.fast
        self.interval = self.fast
        self.empty_polls = 0
        return slower
