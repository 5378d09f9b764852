"""Which model answered during a rollout (harness/faults/rollout.py), from result values alone: counts per
model_version, the switch window and the partitions that went back to the old model."""

from __future__ import annotations

import orjson
import pytest

from harness.faults.rollout import Versions
from harness.faults.steps import PARTITIONS


def answer(version: str) -> bytes:
    return orjson.dumps({"id": "x", "model_name": "digits", "model_version": version, "outputs": []})


def test_counts_and_the_switch_window_follow_the_answers() -> None:
    v = Versions()
    for p in range(PARTITIONS):
        v.note(p, 0, 1.0 + p, answer("1"))
        v.note(p, 1, 10.0 + p, answer("2"))
    assert v.counts == {"1": PARTITIONS, "2": PARTITIONS}
    assert v.switch_s("1", "2") == 0.0  # the last version 1 answer (8.0 s) came before the first version 2 one
    v.note(0, 2, 12.5, answer("1"))  # an old member answered after the first new answer arrived at 10.0
    assert v.switch_s("1", "2") == pytest.approx(2.5)
    assert v.went_back("1", "2") == [0]
    assert not v.last_is("2")  # partition 0's last request was answered by version 1
    v.note(0, 3, 13.0, answer("2"))
    assert v.last_is("2")


def test_a_partition_without_answers_has_not_switched_and_bad_values_are_counted() -> None:
    v = Versions()
    for p in range(PARTITIONS - 1):
        v.note(p, 0, 1.0, answer("2"))
    assert not v.last_is("2")
    v.note(PARTITIONS - 1, 0, 1.0, b"\x00not json")
    assert v.unreadable == 1
    assert not v.last_is("2")
    assert v.went_back("1", "2") == []
    assert v.switch_s("1", "2") == 0.0  # no version 1 answer at all
