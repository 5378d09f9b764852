"""The intake's chunk boundary: records of a partition revoked (or rewound) while their chunk waited are not tracked
in the new assignment (a registry outage long enough to lose the group membership once tracked them there, and the
client's re-read from the committed offset then failed with "offset 5 tracked out of order (last 12)")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from consumer.errors import DeadLetterReason, DecodeError
from consumer.intake import Intake
from consumer.offsets import OffsetTracker
from consumer.ops.metrics import Metrics
from consumer.signature import ModelSignature
from consumer.work import Limits
from tests.unit.fakes import record

KEPT = TopicPartition("events", 0)
LOST = TopicPartition("events", 1)


class RebalancingEvents:
    """An events decoder whose registry wait lets ``during_wait`` run (a rebalance, a rewind), as a real wait does."""

    def __init__(self, during_wait: Callable[[], None]) -> None:
        self.during_wait = during_wait

    async def prepare(self, values: list[bytes | None], idle: Callable[[float], Awaitable[None]] | None) -> None:
        await asyncio.sleep(0)
        self.during_wait()

    def decode(self, values: list[Any]) -> list[Any]:
        return [DecodeError(DeadLetterReason.UNDECODABLE_RECORD, "not an event") for _ in values]


def decode(
    signature: ModelSignature, tracker: OffsetTracker[TopicPartition], during_wait: Callable[[], None]
) -> list[Any]:
    events: Any = RebalancingEvents(during_wait)
    intake = Intake(signature, Limits(), None, Metrics(CollectorRegistry()), lambda: 0.0, events=events)
    fetched = {KEPT: [record("events", 0, 7, b"x")], LOST: [record("events", 1, o, b"x") for o in (10, 11, 12)]}
    return asyncio.run(intake.decode(fetched, tracker))


def test_a_partition_revoked_and_assigned_back_during_the_wait_is_dropped_untracked(
    digits_signature: ModelSignature,
) -> None:
    tracker: OffsetTracker[TopicPartition] = OffsetTracker()
    works = decode(digits_signature, tracker, lambda: tracker.forget({LOST}))
    assert [(w.tp, w.record.offset) for w in works] == [(KEPT, 7)]
    assert tracker.partition(LOST).pending == 0
    tracker.partition(LOST).track(5)  # the client's re-read from the committed offset is tracked in order


def test_a_rewind_during_the_wait_drops_that_partition_too(digits_signature: ModelSignature) -> None:
    tracker: OffsetTracker[TopicPartition] = OffsetTracker()
    works = decode(digits_signature, tracker, lambda: tracker.rewind(LOST))
    assert {w.tp for w in works} == {KEPT}


def test_without_a_rebalance_every_record_is_tracked(digits_signature: ModelSignature) -> None:
    tracker: OffsetTracker[TopicPartition] = OffsetTracker()
    works = decode(digits_signature, tracker, lambda: None)
    assert [(w.tp.partition, w.record.offset) for w in works] == [(0, 7), (1, 10), (1, 11), (1, 12)]
    assert tracker.partition(LOST).pending == 3


def test_the_correlation_id_is_the_rules_whatever_the_headers(digits_signature: ModelSignature) -> None:
    """The intake reads the common header layout (correlation_id first) without the call; every other layout gets
    correlation_id's rules: the first non-null header, else the request id, else the key, else the coordinates."""
    value = orjson.dumps({"id": "req", "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                                    "data": [0.0] * 64}]})  # fmt: skip
    layouts: list[tuple[list[tuple[str, bytes | None]], bytes | None, bytes]] = [
        ([("correlation_id", b"first")], None, b"first"),
        ([("correlation_id", None), ("correlation_id", b"second")], None, b"second"),
        ([("traceparent", b"t"), ("correlation_id", b"later")], None, b"later"),
        ([("correlation_id", None)], b"key", b"req"),
        ([], b"key", b"req"),
    ]
    intake = Intake(digits_signature, Limits(), None, Metrics(CollectorRegistry()), lambda: 0.0)
    recs = []
    for offset, (headers, key, _) in enumerate(layouts):
        rec = record("requests", 0, offset, value, key)
        rec.headers = headers
        recs.append(rec)
    works = asyncio.run(intake.decode({KEPT: recs}, OffsetTracker()))
    assert [w.correlation_id for w in works] == [want for _, _, want in layouts]
