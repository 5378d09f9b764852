"""Stages.mine (consumer/delivery/stages.py): the records of a partition revoked while their chunk was decoded are
dropped and the partition forgotten; with the chunk's partitions given, the same."""

from __future__ import annotations

from types import SimpleNamespace

from aiokafka import TopicPartition

from consumer.delivery.stages import Stages
from consumer.offsets import OffsetTracker
from consumer.work import Work
from tests.unit.fakes import record

TPS = [TopicPartition("requests", p) for p in range(3)]


def chunk(tracker: OffsetTracker[TopicPartition]) -> list[Work]:
    works = []
    for tp in TPS:
        offsets = tracker.partition(tp)
        for offset in range(2):
            offsets.track(offset)
            works.append(Work(record(tp.topic, tp.partition, offset, b"v"), tp, offsets, b"c", None, None, 1, 0.0))
    return works


def test_mine_drops_the_records_of_a_partition_revoked_meanwhile_with_or_without_the_chunks_partitions() -> None:
    for fetched in (None, set(TPS)):
        tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        works = chunk(tracker)
        consumer = SimpleNamespace(assignment=lambda: frozenset(TPS[:2]))
        stages = SimpleNamespace(source=SimpleNamespace(consumer=consumer), tracker=tracker)
        kept = Stages.mine(stages, works, fetched)  # type: ignore[arg-type]
        assert [(w.tp.partition, w.offset) for w in kept] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert tracker.epoch(TPS[2]) == 1  # forgotten
        assert tracker.epoch(TPS[0]) == 0


def test_mine_keeps_every_record_while_the_chunks_partitions_are_all_assigned() -> None:
    tracker: OffsetTracker[TopicPartition] = OffsetTracker()
    works = chunk(tracker)
    consumer = SimpleNamespace(assignment=lambda: frozenset(TPS))
    stages = SimpleNamespace(source=SimpleNamespace(consumer=consumer), tracker=tracker)
    assert Stages.mine(stages, works, {w.tp for w in works}) is works  # type: ignore[arg-type]
    assert all(tracker.epoch(tp) == 0 for tp in TPS)
