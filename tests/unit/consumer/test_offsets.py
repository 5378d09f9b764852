from __future__ import annotations

import pytest

from consumer.offsets import OffsetTracker, PartitionOffsets


def test_commit_position_stops_at_first_gap() -> None:
    p = PartitionOffsets()
    for off in (10, 11, 12, 13):
        p.track(off)
    p.done(12)
    p.done(13)
    assert p.commit_position is None  # 10 and 11 unanswered
    p.done(10)
    assert p.commit_position == 11
    assert p.unfinished == 1  # only 11 is unanswered
    assert p.pending == 3  # 12 and 13 are done but wait behind 11
    p.done(11)
    assert p.commit_position == 14
    assert p.pending == 0
    assert p.unfinished == 0


def test_offsets_with_holes_from_compaction() -> None:
    p = PartitionOffsets()
    for off in (3, 7, 8):
        p.track(off)
    p.done(7)
    assert p.commit_position is None
    p.done(3)
    assert p.commit_position == 8
    p.done(8)
    assert p.commit_position == 9


def test_track_out_of_order_raises() -> None:
    p = PartitionOffsets()
    p.track(5)
    with pytest.raises(ValueError, match="out of order"):
        p.track(5)


def test_tracker_commits_only_moved_partitions() -> None:
    t = OffsetTracker()
    a, b = t.partition("a"), t.partition("b")
    a.track(0)
    b.track(0)
    a.done(0)
    assert t.committable() == {"a": 1}
    t.mark_committed({"a": 1})
    assert t.committable() == {}
    b.done(0)
    assert t.committable() == {"b": 1}
    assert t.committable(only={"a"}) == {}


def test_forgotten_partition_ignores_late_completions() -> None:
    t = OffsetTracker()
    old = t.partition("p")
    old.track(0)
    t.forget({"p"})
    new = t.partition("p")
    assert new is not old
    new.track(0)
    old.done(0)  # a late answer from the revoked assignment
    assert t.committable() == {}
    assert t.pending == 1


def test_rewind_keeps_the_committed_position() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    p = t.partition("p")
    for off in (0, 1, 2):
        p.track(off)
    p.done(0)
    t.mark_committed(t.committable())
    t.rewind("p")
    again = t.partition("p")
    assert again is not p
    assert again.committed == 1
    assert again.unanswered_from == 1
    assert t.committable() == {}
    again.track(1)  # re-read from the committed position
    again.done(1)
    assert t.committable() == {"p": 2}
