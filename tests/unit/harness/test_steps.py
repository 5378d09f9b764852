"""The scale-step figures (harness/faults/steps.py) from receipt times alone: gaps overall and per partition, p99,
and the targets each step is judged by."""

from __future__ import annotations

import pytest

from harness.faults.steps import PARTITIONS, Figures, Mark, Receipts, figures, longest_gap, rows_of, target_s


def test_the_longest_gap_counts_from_the_start_and_to_the_end() -> None:
    assert longest_gap([1.0, 1.1, 3.1, 3.2], 0.5, 4.0) == pytest.approx(2.0)  # between 1.1 and 3.1
    assert longest_gap([1.0, 1.1], 0.0, 4.0) == pytest.approx(2.9)  # nothing after 1.1 until the step ended
    assert longest_gap([], 0.0, 2.5) == pytest.approx(2.5)  # nothing at all
    assert longest_gap([0.1, 5.0], 1.0, 2.0) == pytest.approx(1.0)  # receipts outside the step do not count


def test_a_stalled_partition_shows_though_the_others_answer() -> None:
    r = Receipts()
    for p in range(PARTITIONS):
        r.times[p] = [i / 10 for i in range(100)]  # every 0.1 s for 10 s
    r.times[3] = [t for t in r.times[3] if not 4.0 < t < 7.5]  # partition 3 stops for 3.5 s
    r.latencies = [(int(t * 1000), 50.0) for t in r.times[0]] + [(4_100 + i, 3_400.0) for i in range(5)]
    f = figures(r, "scale_in", 1.0, 10.0, 1, 0.6)
    assert f.gap_s == pytest.approx(0.1)  # some answer every 0.1 s overall
    assert f.partition_gap_s == pytest.approx(3.5)  # from 4.0 to 7.5
    assert f.partition == 3
    assert f.p99_ms > 1000  # the stalled request is in the step's p99
    late = figures(r, "scale_in", 1.0, 5.0, 1, 0.6)  # a request sent in the step's last second is the next's
    assert late.p99_ms == pytest.approx(50.0)


def test_each_marks_window_ends_where_the_next_begins_and_steady_is_not_judged() -> None:
    r = Receipts()
    for p in range(PARTITIONS):
        r.times[p] = [i / 10 for i in range(100) if not 3.0 < i / 10 < 5.0]  # every 0.1 s but from 3.0 to 5.0
    marks: list[Mark] = [("steady", 0.0, 0, 0.0), ("rolling", 2.0, None, 1.5), ("scale_in", 6.0, 2, 0.4)]
    judged: list[str] = []

    def judge(f: Figures) -> None:
        judged.append(f.step)
        f.met = f.step != "rolling"

    steady, rolling, scale_in = rows_of(r, marks, 9.0, judge)
    assert judged == ["rolling", "scale_in"]
    assert steady.gap_s == pytest.approx(0.1)  # 0.0 to 2.0: before the stall
    assert steady.met
    assert rolling.gap_s == pytest.approx(2.0)  # 2.0 to 6.0: the stall is in it
    assert not rolling.met
    assert (rolling.rebalances, rolling.action_s) == (None, 1.5)
    assert scale_in.gap_s == pytest.approx(0.1)
    assert (scale_in.rebalances, scale_in.action_s) == (2, 0.4)
    assert scale_in.partition_gap_s == pytest.approx(0.1)  # 6.0 to 9.0 (ended), receipts up to 9.9 do not count


def test_targets_follow_the_issue() -> None:
    assert target_s("at_least_once", "dynamic", "scale_in", 6.0, 0.5) == 1.0
    assert target_s("exactly_once", "dynamic", "scale_out", 6.0, 1.0) == 2.0
    assert target_s("exactly_once", "dynamic", "kill9", 6.0, 1.0) == 11.0  # session timeout + 5 s
    assert target_s("exactly_once", "static", "kill9", 45.0, 1.2) == pytest.approx(3.2)  # the restart + 2 s
    assert target_s("exactly_once", "static", "scale_in", 45.0, 0.5) == 2.0  # it leaves: as fast as dynamic
    assert target_s("exactly_once", "statefulset", "scale_in", 45.0, 0.5) == 50.0  # it waits out its session
    assert target_s("exactly_once", "statefulset", "rolling", 45.0, 1.5) == pytest.approx(3.5)
    assert target_s("exactly_once", "statefulset", "scale_out", 45.0, 1.0) is None
