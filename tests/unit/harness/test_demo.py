"""The demo's figures describe the consumer (harness/demo.py since_resume): latencies and throughput from the moment
the paused consumer was resumed with the whole burst on the topic, not from when the demo's producer sent it."""

from __future__ import annotations

import math

from harness.demo import since_resume
from producer_tools.readers import Answer
from producer_tools.results import Report


def report_of(appended_ms: list[int], sent_ms: int) -> Report:
    answers = {
        f"id-{i}": Answer(f"id-{i}", "result", float(ts - sent_ms), ts, sent_ms) for i, ts in enumerate(appended_ms)
    }
    return Report(
        len(answers), len(answers), 0, [], 0, None, [], [a.latency_ms or 0.0 for a in answers.values()], 1.0, answers
    )


def test_figures_count_from_the_resume() -> None:
    # sent 2 s before the resume (the consumer was paused); answered 10, 20, 30 and 40 ms after it
    report = since_resume(report_of([100_010, 100_020, 100_030, 100_040], sent_ms=98_000), resumed_ms=100_000.0)
    assert report.latencies_ms == [10.0, 20.0, 30.0, 40.0]
    assert report.percentile_ms(50) == 25.0
    assert report.throughput_rps == 4 / 0.040
    assert report.sent == report.results == 4  # the counts are the collector's


def test_no_answers_keeps_the_report() -> None:
    empty = report_of([], sent_ms=0)
    assert since_resume(empty, 5.0) is empty
    assert math.isnan(since_resume(report_of([100], sent_ms=0), resumed_ms=100.0).throughput_rps)
