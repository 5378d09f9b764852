"""The rebalance listener times each phase on the injected clock: metrics and one log line per rebalance."""

from __future__ import annotations

import logging

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from consumer.kafka.rebalance import RebalanceListener
from consumer.ops.metrics import Metrics
from tests.unit.fakes import FakeClock


def tps(*partitions: int) -> set[TopicPartition]:
    return {TopicPartition("requests", p) for p in partitions}


async def test_each_phase_is_timed_counted_and_logged_once(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer.kafka.rebalance")
    metrics = Metrics(CollectorRegistry())
    calls: list[tuple[str, int]] = []

    async def on_revoked(revoked: set[TopicPartition]) -> None:
        calls.append(("revoked", len(revoked)))
        clock.advance_ms(250)  # finishing the revoked partitions' work

    async def on_assigned(assigned: set[TopicPartition]) -> None:
        calls.append(("assigned", len(assigned)))
        listener.note("producers: 1 kept, 2 opened")
        clock.advance_ms(40)  # opening producers

    listener = RebalanceListener(on_revoked, on_assigned, metrics, clock)
    await listener.on_partitions_revoked(tps(0, 1))
    clock.advance_ms(1200)  # JoinGroup and SyncGroup: waiting for the other members
    await listener.on_partitions_assigned(tps(0, 2, 3))
    assert calls == [("revoked", 2), ("assigned", 3)]

    def observed(phase: str) -> float | None:
        return metrics.registry.get_sample_value("streaminfer_rebalance_seconds_sum", {"phase": phase})

    assert observed("revoke") == pytest.approx(0.25)
    assert observed("join") == pytest.approx(1.2)
    assert observed("assign") == pytest.approx(0.04)
    assert metrics.registry.get_sample_value("streaminfer_rebalances_total") == 1
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rebalance:")]
    assert lines == [
        "rebalance: revoke 0.250 s (2 partitions), join 1.200 s, assign 0.040 s "
        "(3 partitions; producers: 1 kept, 2 opened)"
    ]

    await listener.on_partitions_revoked(set())  # the next rebalance starts afresh: no notes, its own phases
    await listener.on_partitions_assigned(tps(1))
    assert metrics.registry.get_sample_value("streaminfer_rebalance_seconds_count", {"phase": "join"}) == 2
    assert caplog.records[-1].getMessage() == (
        "rebalance: revoke 0.250 s (0 partitions), join 0.000 s, assign 0.040 s (1 partitions; producers: 1 kept, "
        "2 opened)"
    )
