"""The Metrics page's queue depth: the measured minutes (the executors' samples, and the
count now) are drawn as their own stroke over the whole series, which elsewhere is worked
back from the enqueues and starts."""

from __future__ import annotations

from dbos_async._executor.observability import QueueDepth
from dbos_async.console.views import depth_charts

MINUTE = 60_000
T0 = 29_000_000 * MINUTE


def series(queue: str, *points: tuple[int, bool]) -> list[QueueDepth]:
    return [QueueDepth(queue, T0 + i * MINUTE, waiting, measured)
            for i, (waiting, measured) in enumerate(points)]


def test_measured_minutes_are_drawn_as_strokes_over_the_series() -> None:
    history = (series("jobs", (1, False), (5, True), (3, True), (1, False), (0, True))
               + series("other", *[(2, False)] * 5))

    jobs, other = depth_charts(history)
    assert (jobs.queue_name, jobs.measured, jobs.peak, jobs.now) == ("jobs", 3, 5, 0)
    assert len(jobs.points.split()) == 5
    # Two strokes: minutes 1-2, then minute 4 alone (a dot).
    strokes = jobs.measured_path.split("M")[1:]
    assert len(strokes) == 2 and strokes[0].count("L") == 1 and "L" not in strokes[1]
    assert (other.queue_name, other.measured, other.measured_path, other.peak) == (
        "other", 0, "", 2)
