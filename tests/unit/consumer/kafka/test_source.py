"""The requests source (consumer/kafka/source.py) in a consumer wired to fakes: backpressure pauses fetching, lag
without progress, a lone record released at once, a missing topic stops start-up."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from consumer.kafka.source import LAG_REFRESH_S
from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock
from tests.unit.wired import Wired, digits_value


async def test_backpressure_pauses_fetching_while_in_flight_rows_are_full(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, max_in_flight_rows=8)
    h.cluster.policy = "hold"
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(20)])
    await h.until(lambda: h.app.in_flight_rows == 8)
    await h.quiet()
    assert h.app.in_flight_rows == 8  # fetched no further
    assert h.consumer.paused() == {TopicPartition("requests", 0)}
    assert h.metrics.registry.get_sample_value("streaminfer_partitions_paused") == 1
    fetches = h.consumer.fetches
    clock.advance_ms(h.settings.fetch_timeout_ms)  # fetch calls go on while paused: the member stays
    await h.until(lambda: h.consumer.fetches > fetches)
    h.cluster.policy = "ack"
    h.cluster.settle()
    await h.until(lambda: len(h.results()) == 20)
    assert h.consumer.paused() == set()
    assert h.metrics.registry.get_sample_value("streaminfer_partitions_paused") == 0
    await h.until(lambda: h.committed(0) == 20)
    await h.stop()


async def test_a_lagging_consumer_without_progress_is_not_alive(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, stall_timeout_s=30)
    h.cluster.policy = "hold"  # nothing is acknowledged, so nothing is committed
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(5)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 5)
    assert h.app.liveness() == (True, "ok")
    clock.advance_ms(31_000)
    await h.quiet()
    alive, reason = h.app.liveness()
    assert not alive
    assert reason.startswith("stalled: lag 5 records")
    h.cluster.settle()
    await h.until(lambda: h.committed(0) == 5)
    assert h.app.liveness() == (True, "ok")
    await h.stop()


@pytest.mark.parametrize("flush", [True, False])
async def test_a_lone_record_is_not_held_for_the_batch_delay_once_the_fetch_caught_up(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock, flush: bool
) -> None:
    h = Wired(tmp_path, digits_signature, clock, max_batch_delay_ms=60_000, flush_when_caught_up=flush)
    await h.start(partitions=(0,))
    h.send(0, [digits_value()])
    await h.quiet()
    assert len(h.results()) == (1 if flush else 0)  # no time passed: only a release can have flushed it
    await h.stop()
    assert len(h.results()) == 1


async def test_a_fetch_that_left_records_behind_does_not_release_the_batcher(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, max_batch_delay_ms=60_000, max_batch_size=64, fetch_max_records=2)
    await h.start(partitions=(0,))
    source = h.app.stages.source if h.app.stages is not None else None
    assert source is not None
    tp = TopicPartition("requests", 0)
    h.send(0, [digits_value() for _ in range(3)])
    fetched = {tp: [type("R", (), {"offset": 1})()]}
    assert not source.caught_up(fetched, asked=1)  # as many as asked: the client may hold more
    assert not source.caught_up(fetched, asked=5)  # offset 1 of 3: the broker holds more
    assert source.caught_up({tp: [type("R", (), {"offset": 2})()]}, asked=5)
    await h.until(lambda: len(h.results()) == 3)  # fetched 2, then the last 1 (caught up): all released
    await h.stop()


async def test_a_topic_that_does_not_exist_stops_start_up(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    from consumer.errors import TopicMissingError

    h = Wired(tmp_path, digits_signature, clock)
    h.consumer.existing = {"results", "dlq"}
    start = asyncio.ensure_future(h.app.start())
    await h.quiet()
    assert not start.done()  # a topic made a moment ago may not be in the metadata yet: it waits a little
    clock.advance_ms(2_000)
    await h.quiet()
    h.consumer.existing = {"requests", "results", "dlq"}  # created meanwhile: start-up goes on
    clock.advance_ms(250)
    await h.until(start.done)
    await h.stop()
    late = Wired(tmp_path, digits_signature, clock)
    late.consumer.existing = {"results", "dlq"}
    start = asyncio.ensure_future(late.app.start())
    for _ in range(30):  # 7.5 s of fake time, past the 5 s wait
        clock.advance_ms(250)
        await late.quiet()
    with pytest.raises(TopicMissingError, match="requests_topic 'requests' does not exist"):
        await start
    # answers need their topics as much: a missing results or dead-letter topic stops start-up too, named
    for gone, setting in (("results", "results_topic 'results'"), ("dlq", "dead_letter_topic 'dlq'")):
        other = Wired(tmp_path, digits_signature, clock)
        other.consumer.existing = {"requests", "results", "dlq"} - {gone}
        start = asyncio.ensure_future(other.app.start())
        for _ in range(30):
            clock.advance_ms(250)
            await other.quiet()
        with pytest.raises(TopicMissingError, match=f"^{setting} does not exist"):
            await start
    none = Wired(tmp_path, digits_signature, clock)
    none.consumer.existing = set()
    start = asyncio.ensure_future(none.app.start())
    for _ in range(30):
        clock.advance_ms(250)
        await none.quiet()
    all_three = "requests_topic 'requests', results_topic 'results', dead_letter_topic 'dlq' do not exist"
    with pytest.raises(TopicMissingError, match=f"^{all_three} on the cluster: create them"):
        await start
    allowed = Wired(tmp_path, digits_signature, clock, allow_auto_create_topics=True)
    allowed.consumer.existing = {"requests", "results"}
    with caplog.at_level(logging.WARNING, logger="consumer.kafka.source"):
        await allowed.start()  # asked for: starts, and says what is missing
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["dead_letter_topic 'dlq' does not exist yet"]
    await allowed.stop()


async def test_the_fetch_loop_refreshes_the_lag_at_most_every_lag_refresh_s(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock)
    h.cluster.policy = "hold"  # nothing is committed: the lag is every record fetched
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(5)])
    await h.until(lambda: h.app.lag == 5)
    h.send(0, [digits_value() for _ in range(3)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 8)
    await h.quiet()
    assert h.app.lag == 5  # fetched, but no time passed since the last refresh
    clock.advance_ms(LAG_REFRESH_S * 1000)
    await h.until(lambda: h.app.lag == 8)
    h.cluster.settle()
    await h.until(lambda: h.committed(0) == 8)
    assert h.app.lag == 0  # a commit refreshes it at once
    await h.stop()


class _Assignments:
    """The client calls throttle() makes, with aiokafka's assignment: one frozenset per rebalance."""

    def __init__(self, partitions: range) -> None:
        self.assigned = frozenset(TopicPartition("requests", p) for p in partitions)
        self.held: set[TopicPartition] = set()
        self.paused_reads = 0

    def assignment(self) -> frozenset[TopicPartition]:
        return self.assigned

    def paused(self) -> set[TopicPartition]:
        self.paused_reads += 1
        return set(self.held)

    def pause(self, *tps: TopicPartition) -> None:
        self.held |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.held -= set(tps)


def test_throttle_pauses_what_a_rebalance_assigned_meanwhile_and_never_walks_the_paused_set() -> None:
    import time

    from prometheus_client import CollectorRegistry

    from consumer.kafka.source import Source
    from consumer.offsets import OffsetTracker
    from consumer.ops.metrics import Metrics
    from consumer.ops.progress import Progress

    client = _Assignments(range(4))
    metrics = Metrics(CollectorRegistry())
    source = Source(
        client,  # type: ignore[arg-type]
        "requests",
        OffsetTracker(),
        metrics,
        Progress(time.monotonic),
        fetch_timeout_ms=100,
        clock=time.monotonic,
    )
    paused_gauge = "streaminfer_partitions_paused"
    source.throttle(True)
    assert client.held == client.assigned
    assert metrics.registry.get_sample_value(paused_gauge) == 1
    client.held.clear()  # (nothing resumes behind its back; a fresh call on the same assignment does not look)
    source.throttle(True)
    assert client.held == set()
    client.assigned = frozenset(TopicPartition("requests", p) for p in range(2, 8))  # a rebalance while throttled
    source.throttle(True)
    assert client.held == client.assigned
    source.throttle(False)
    assert client.held == set()
    assert metrics.registry.get_sample_value(paused_gauge) == 0
    source.throttle(False)
    source.throttle(True)
    assert client.held == client.assigned
    assert client.paused_reads == 0
