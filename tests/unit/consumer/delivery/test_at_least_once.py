"""at_least_once delivery logic over in-memory clients and a fake clock: order, commits, backpressure, stalls,
producer replacement, the size ladder, revokes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock
from tests.unit.wired import Wired, digits_value, source_of

pytestmark = pytest.mark.asyncio


async def test_revoke_drops_queued_records_and_waits_for_those_in_flight(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(
        tmp_path, digits_signature, clock, max_batch_delay_ms=50, revoke_timeout_ms=5000, flush_when_caught_up=False
    )
    h.cluster.policy = "hold"
    await h.start()
    h.send(0, [digits_value() for _ in range(4)])  # a full batch: runs, written, held in flight
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 4)
    h.send(1, [digits_value() for _ in range(4)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 8)
    h.send(0, [digits_value() for _ in range(2)])  # waits in the batcher for the 50 ms deadline
    await h.until(lambda: h.app.in_flight_rows == 10)

    tp0 = TopicPartition("requests", 0)
    revoke = asyncio_task(h.consumer.revoke({tp0}))
    await h.quiet()
    assert not revoke.done()  # waiting for the four in flight
    h.cluster.settle()
    await h.until(revoke.done)
    assert h.committed(0) == 4  # what was acknowledged is committed before the partition goes
    assert h.metrics.registry.get_sample_value("streaminfer_revoked_records_dropped_total") == 2
    clock.advance_ms(50)
    await h.until(lambda: h.committed(1) == 4)
    assert {source_of(w) for w in h.results()} == {(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)}
    assert h.app.in_flight_rows == 0
    await h.stop()


async def test_revoke_gives_up_after_revoke_timeout(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, revoke_timeout_ms=2000)
    h.cluster.policy = "hold"
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(4)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 4)
    revoke = asyncio_task(h.consumer.revoke({TopicPartition("requests", 0)}))
    await h.quiet()
    assert not revoke.done()
    clock.advance_ms(2000)
    await h.until(revoke.done)
    assert h.committed(0) is None  # nothing acknowledged, nothing committed: the new owner answers it all
    h.cluster.settle()  # late acknowledgements land on the forgotten partition: still nothing committed
    await h.quiet()
    await h.stop()
    assert h.committed(0) is None


async def test_stop_drains_answers_and_commits(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, max_batch_delay_ms=50)
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(3)])  # less than a batch: waits for its deadline
    await h.until(lambda: h.app.in_flight_rows == 3)
    await h.stop()  # flushes the batcher, publishes, commits
    assert len(h.results()) == 3
    assert h.committed(0) == 3
    assert not h.consumer.started


def asyncio_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.ensure_future(coro)
