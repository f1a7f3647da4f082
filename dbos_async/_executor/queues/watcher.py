"""The queue watcher: one poll, for every idle claim loop and for DELAYED workflows.

A claim loop whose round found nothing to start goes idle: it sleeps until a notification
for its queue, or until this watcher finds work on it. The watcher's one statement per
round (``SystemDatabase.poll_queues``) makes due DELAYED workflows ENQUEUED (announcing
their queues, as an enqueue does) and names the idle queues that hold startable work,
written by a writer that sends no notification (another SDK, raw SQL); their claim loops
are woken. It wakes at the next due time, on a notification of a delayed enqueue, or when
its interval runs out: the fastest polling interval of the queues while it finds work,
doubling after each round that finds nothing, up to ``idle_poll_max_interval``. Work
started by a claim loop, or a notification on the enqueue channel, snaps it back to the
fast interval (waking it at once, unless it polled less than that interval ago: under load
it polls once per fast interval, not once per claim). So an idle executor sends one
statement per ``idle_poll_max_interval`` for all of its queues, and nothing written is left
unclaimed for longer than that.
"""

from __future__ import annotations

import logging
import time

from dbos_async._executor.backoff import IdleBackoff
from dbos_async._executor.queues.enqueue import DELAYED_KEY
from dbos_async._executor.runtime import Runtime
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL, Waiter

logger = logging.getLogger("dbos_async")


class QueueWatcher:
    """The poll shared by the idle claim loops of one runtime and the delayed promoter."""

    def __init__(self, runtime: Runtime, backoff: IdleBackoff, queue_names: set[str]) -> None:
        self.runtime = runtime
        self.backoff = backoff
        self._queue_names = queue_names
        # Queues whose claim loop sleeps until a notification or this watcher wakes it.
        self._idle: set[str] = set()
        # Whether a claim loop went back to claiming since the last look (see worked()).
        self._woke = False
        self._waiter: Waiter | None = None
        self._last_poll = float("-inf")
        """When the latest poll began (monotonic seconds)."""

    def idle(self, queue_name: str) -> None:
        """The claim loop of ``queue_name`` found nothing: poll for it from now on."""
        self._idle.add(queue_name)

    def busy(self, queue_name: str) -> None:
        """The claim loop of ``queue_name`` claims again by itself."""
        self._idle.discard(queue_name)
        self._woke = True

    def worked(self) -> bool:
        """Whether a queue has had work since the last call: one claims by itself now, or
        one that was idle was woken meanwhile (the depth sampler's question, once a minute).
        """
        worked = self._woke or len(self._idle) < len(self._queue_names)
        self._woke = False
        return worked

    def activity(self) -> None:
        """Work started, or a notification arrived: back to the fast interval, at once.
        Under load every claim is activity, so a watcher that polled less than a fast
        interval ago is not woken again: it polls at most once per fast interval."""
        if not self.backoff.reset() or self._waiter is None:
            return
        if time.monotonic() - self._last_poll >= self.backoff.fast:
            self._waiter.wake()

    def on_notification(self, key: str) -> None:
        """A notification on the enqueue channel: activity if it names one of its queues
        (an enqueue, a freed slot; here or elsewhere)."""
        if key in self._queue_names:
            self.activity()

    async def run(self) -> None:
        sysdb = self.runtime.system_database
        notifications = sysdb.notifications
        assert notifications is not None
        with notifications.register(ENQUEUE_CHANNEL, DELAYED_KEY) as waiter:
            self._waiter = waiter
            try:
                while True:
                    next_due = await self._poll_once()
                    # The poll's backoff is real time; a delay falls due on the clock.
                    if await waiter.wait(self.backoff.interval, until_ms=next_due,
                                         polled=True):
                        self.backoff.reset()
            finally:
                self._waiter = None

    async def _poll_once(self) -> int | None:
        """One round; returns when the next DELAYED workflow is due (epoch ms), if known."""
        runtime = self.runtime
        sysdb = runtime.system_database
        notifications = sysdb.notifications
        assert notifications is not None
        self._last_poll = time.monotonic()
        try:
            poll = await sysdb.poll_queues(sorted(self._idle),
                                           names=list(runtime.registry.workflows),
                                           application_version=runtime.application_version)
        except Exception:
            logger.exception("Polling the queues failed")
            return None
        # First: the wake-ups below find the interval fast already, and leave it.
        self.backoff.polled(bool(poll.promoted or poll.enqueued))
        for name in poll.promoted:  # wakes the claim loops here and elsewhere
            notifications.notify(ENQUEUE_CHANNEL, name)
        for name in poll.enqueued:  # written without a notification: wake ours
            notifications.wake(ENQUEUE_CHANNEL, name)
        return poll.next_due_ms
