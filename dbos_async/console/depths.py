"""Each queue's depth as the console saw it: a series sampled while the console serves.

The system database keeps no history of a queue's depth. The operator API works one back
(``get_queue_depth_history``) from the count now through the enqueues and starts since,
which cannot see a waiting workflow cancelled, deleted or put back in its queue since
(a resume or a recovery clears its start). So the console samples the depth itself: at
each read of its Metrics page and, served with a lifespan (``dbos-async console``, or the
app run on its own), every :data:`SAMPLE_SECONDS`. A minute it sampled is drawn as
measured (its last sample); the others keep the worked-back figure.
"""

from __future__ import annotations

from collections.abc import Mapping

from dbos_async._executor.observability import QueueDepth
from dbos_async._sysdb.statements.observability import MINUTE_MS
from dbos_async.statuses import WorkflowStatusString

_WAITING = (WorkflowStatusString.ENQUEUED, WorkflowStatusString.DELAYED)

SAMPLE_SECONDS = 15
"""How often the background sampler reads the depths: four samples a minute."""
KEEP_MINUTES = 24 * 60
"""The longest window the Metrics page draws (a day); older samples are dropped."""


class DepthSamples:
    """The sampled waiting count (ENQUEUED or DELAYED) per queue and minute."""

    def __init__(self) -> None:
        self._minutes: dict[str, dict[int, int]] = {}

    def record(self, depths: Mapping[str, Mapping[str, int]], now_ms: int) -> None:
        """Record ``depths`` (per queue, per status, as ``queue_depths()`` reads them) as
        seen at ``now_ms``; a queue seen before and absent now has none waiting."""
        minute = now_ms // MINUTE_MS
        for queue in set(depths) | set(self._minutes):
            counts = depths.get(queue, {})
            series = self._minutes.setdefault(queue, {})
            series[minute] = sum(counts.get(status, 0) for status in _WAITING)
            for old in [m for m in series if m <= minute - KEEP_MINUTES]:
                del series[old]

    def merged(self, history: list[QueueDepth]) -> list[tuple[QueueDepth, bool]]:
        """``history`` (worked back), each minute replaced by its sample where there is
        one; with each point, whether it was sampled."""
        out = []
        for point in history:
            sampled = self._minutes.get(point.queue_name, {}).get(
                point.minute_epoch_ms // MINUTE_MS)
            if sampled is None:
                out.append((point, False))
            else:
                out.append((QueueDepth(point.queue_name, point.minute_epoch_ms, sampled), True))
        return out
