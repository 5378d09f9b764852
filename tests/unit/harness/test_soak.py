"""The soak's summary figures from its samples (no broker): growth against the baseline after the first minute."""

from __future__ import annotations

import math
import re

from harness.soak import Sample, Soak

LINE = re.compile(
    r"^soak: minutes=\S+ rss_growth_pct=-?[\d.]+ fds_growth=-?\d+ tasks_growth=-?\d+ "
    r"p99_ms_first=[\d.]+ p99_ms_last=[\d.]+ lost=\d+$"
)


def samples(rss: list[float], fds: list[int], p99: list[float]) -> list[Sample]:
    return [
        Sample(10.0 * (i + 1), r, f, 20, 170, 3000, p) for i, (r, f, p) in enumerate(zip(rss, fds, p99, strict=True))
    ]


def test_growth_is_measured_from_the_first_sample_after_a_minute() -> None:
    soak = Soak(minutes=2, rate=100, max_rps=200, sent=12_000, answered=12_000)
    # warm-up growth in the first minute does not count; what follows does
    rss = [50, 70, 80, 90, 95, 100, 100, 101, 102, 103, 104, 105]
    soak.samples = samples(
        rss, [9, 10, 12, 12, 12, 12, 12, 12, 12, 13, 13, 14], [500] + [40] * 10 + [60]
    )  # a warm-up spike first
    s = soak.summary()
    assert soak.baseline().t_s == 60.0
    assert math.isclose(s["rss_growth_pct"], 5.0)
    assert s["fds_growth"] == 2
    assert s["tasks_growth"] == 0
    assert (s["p99_ms_first"], s["p99_ms_last"]) == (40, 60)
    assert LINE.match(soak.line()), soak.line()
    assert soak.line().endswith("lost=0")


def test_lost_counts_requests_without_an_answer_and_a_short_run_uses_its_middle() -> None:
    soak = Soak(minutes=1, rate=100, max_rps=math.nan, sent=6_000, answered=5_990)
    soak.samples = samples([80, 81, 82, 83, 84, 85], [10] * 6, [30] * 6)
    assert soak.lost == 10
    assert soak.baseline().t_s == 30.0
    assert soak.line().endswith("lost=10")
