"""The Metrics page's queue depth: the minutes the console sampled replace the figures
worked back from the enqueues and starts (which miss a waiting workflow cancelled or
re-enqueued since), and are drawn as their own stroke."""

from __future__ import annotations

from dbos_async._executor.observability import QueueDepth
from dbos_async.console.depths import KEEP_MINUTES, DepthSamples
from dbos_async.console.views import depth_charts

MINUTE = 60_000
T0 = 29_000_000 * MINUTE


def worked_back(queue: str, *waiting: int) -> list[QueueDepth]:
    return [QueueDepth(queue, T0 + i * MINUTE, w) for i, w in enumerate(waiting)]


def test_sampled_minutes_replace_the_worked_back_ones() -> None:
    samples = DepthSamples()
    samples.record({"jobs": {"ENQUEUED": 4, "DELAYED": 1, "PENDING": 7}}, T0 + MINUTE + 5)
    samples.record({"jobs": {"ENQUEUED": 2}}, T0 + 2 * MINUTE + 10)
    samples.record({"jobs": {"ENQUEUED": 3}}, T0 + 2 * MINUTE + 50_000)  # the minute's last
    samples.record({}, T0 + 4 * MINUTE)  # none waiting any more: the queue reads 0
    history = worked_back("jobs", 1, 1, 1, 1, 0) + worked_back("other", 2, 2, 2, 2, 2)

    merged = samples.merged(history)
    assert [(p.waiting, sampled) for p, sampled in merged if p.queue_name == "jobs"] == [
        (1, False), (5, True), (3, True), (1, False), (0, True)]
    assert [sampled for p, sampled in merged if p.queue_name == "other"] == [False] * 5

    jobs, other = depth_charts(merged)
    assert (jobs.queue_name, jobs.sampled, jobs.peak, jobs.now) == ("jobs", 3, 5, 0)
    assert len(jobs.points.split()) == 5
    # Two strokes: minutes 1-2, then minute 4 alone.
    strokes = jobs.sampled_path.split("M")[1:]
    assert len(strokes) == 2 and strokes[0].count("L") == 1 and "L" not in strokes[1]
    assert (other.sampled, other.sampled_path) == (0, "")


def test_samples_older_than_the_longest_window_are_dropped() -> None:
    samples = DepthSamples()
    samples.record({"jobs": {"ENQUEUED": 9}}, T0)
    samples.record({"jobs": {"ENQUEUED": 1}}, T0 + KEEP_MINUTES * MINUTE)
    merged = samples.merged([*worked_back("jobs", 0),
                             QueueDepth("jobs", T0 + KEEP_MINUTES * MINUTE, 0)])
    assert [(p.waiting, sampled) for p, sampled in merged] == [(0, False), (1, True)]
