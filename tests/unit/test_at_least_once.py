"""at_least_once delivery logic over in-memory clients and a fake clock: order, commits, backpressure, stalls,
producer replacement, the size ladder, revokes."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, OutOfOrderSequenceNumber, RecordTooLargeError

from consumer.schema import ModelSignature
from tests.unit.fakes import FakeClock, Written
from tests.unit.harness import RESULTS, Harness, digits_value, source_of

pytestmark = pytest.mark.asyncio


def in_offset_order(answers: list[Written]) -> bool:
    """Every request partition's answers come in increasing offset order."""
    last: dict[int, int] = defaultdict(lambda: -1)
    for answer in answers:
        partition, offset = source_of(answer)
        if offset <= last[partition]:
            return False
        last[partition] = offset
    return True


def per_destination(answers: list[Written]) -> dict[tuple[str, int], list[Written]]:
    out: dict[tuple[str, int], list[Written]] = defaultdict(list)
    for answer in answers:
        out[(answer.topic, answer.partition)].append(answer)
    return out


async def test_answers_are_handed_over_in_offset_order_through_bisection_and_dead_letters(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock)
    h.session.fail_when = lambda feeds: bool((feeds["input"][:, 63] == 9).any()) and feeds["input"].shape[0] > 1
    await h.start()
    for partition in (0, 1):
        values = []
        for i in range(40):
            if i % 7 == 3:
                values.append(b"not json")  # answered at decode, before the batches ahead of it
            else:
                values.append(digits_value(rows=1 + i % 3, marker=9.0 if i % 11 == 5 else 0.0))
        h.send(partition, values)
    await h.until(lambda: len(h.results()) + len(h.dead_letters()) == 80)
    assert h.metrics.registry.get_sample_value("streaminfer_batch_failures_total") > 0  # bisected
    for answers in per_destination(h.handed_over()).values():  # results and dead letters, as handed over
        assert in_offset_order(answers)
    for answers in per_destination(h.results()).values():
        assert in_offset_order(answers)
    assert set(h.reasons().values()) == {"invalid_json", "inference_error"}
    assert {k for k, v in h.reasons().items() if v == "inference_error"} == {(0, 5), (0, 16), (1, 5), (1, 16)}
    assert h.metrics.registry.get_sample_value("streaminfer_retries_total", INFERENCE_OOM) is None  # not transient
    await h.until(lambda: h.committed(0) == 40 and h.committed(1) == 40)
    await h.stop()


INFERENCE_OOM = {"stage": "inference", "reason": "out_of_memory"}
#: The CUDA execution provider's message when a batch does not fit in GPU memory.
CUDA_OOM = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running MatMul node. "
    "CUDA failure 2: out of memory ; GPU=0"
)


async def test_an_out_of_memory_batch_is_run_again_after_a_backoff_and_answered_whole(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock, inference_retries=3, retry_backoff_ms=100, retry_backoff_max_ms=150)
    failures = iter([True, True])
    h.session.fail_when = lambda feeds: next(failures, False)
    h.session.fail_with = CUDA_OOM
    await h.start(partitions=(0,))
    started = clock()
    h.send(0, [digits_value() for _ in range(4)])
    await h.until_in_time(lambda: len(h.results()) == 4, step_ms=10)
    assert clock() - started >= 0.1 + 0.15  # 100 ms, then 200 ms capped at 150, on the injected clock
    assert h.session.batches == [4, 4, 4]  # the same batch, whole: no bisection
    assert h.dead_letters() == []
    assert h.metrics.registry.get_sample_value("streaminfer_retries_total", INFERENCE_OOM) == 2
    assert h.metrics.registry.get_sample_value("streaminfer_batch_failures_total") == 0
    assert all(in_offset_order(answers) for answers in per_destination(h.handed_over()).values())
    await h.stop()


async def test_a_record_that_keeps_running_out_of_memory_is_dead_lettered_alone_once_retries_are_spent(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock, inference_retries=1, retry_backoff_ms=10)
    h.session.fail_when = lambda feeds: bool((feeds["input"][:, 63] == 9).any())
    h.session.fail_with = CUDA_OOM
    await h.start(partitions=(0,))
    h.send(0, [digits_value(), digits_value(), digits_value(marker=9.0), digits_value()])
    await h.until_in_time(lambda: len(h.results()) + len(h.dead_letters()) == 4, step_ms=10)
    assert h.reasons() == {(0, 2): "inference_error"}
    assert len(h.results()) == 3
    # One retry at each level the culprit's batch failed: 4 rows, then its half, then alone.
    assert h.metrics.registry.get_sample_value("streaminfer_retries_total", INFERENCE_OOM) == 3
    assert all(in_offset_order(answers) for answers in per_destination(h.handed_over()).values())
    await h.stop()


async def test_commit_never_passes_the_first_unacknowledged_answer(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock)
    h.cluster.policy = "hold"
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(10)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 10)
    holds_3 = lambda batch: any(source_of(w) == (0, 3) for w in batch)  # noqa: E731
    assert h.cluster.settle(where=lambda batch: not holds_3(batch)) > 0
    await h.idle()
    committed = h.committed(0)
    assert committed is not None
    assert committed <= 3  # answers after offset 3 are acknowledged, 3 is not
    assert h.app.lag == 10 - h.committed(0)
    h.cluster.settle()
    await h.until(lambda: h.committed(0) == 10)
    await h.until(lambda: h.app.lag == 0)
    await h.stop()


async def test_backpressure_pauses_fetching_while_in_flight_rows_are_full(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock, max_in_flight_rows=8)
    h.cluster.policy = "hold"
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(20)])
    await h.until(lambda: h.app.in_flight_rows == 8)
    await h.idle()
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
    h = Harness(tmp_path, digits_signature, clock, stall_timeout_s=30)
    h.cluster.policy = "hold"  # nothing is acknowledged, so nothing is committed
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(5)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 5)
    assert h.app.liveness() == (True, "ok")
    clock.advance_ms(31_000)
    await h.idle()
    alive, reason = h.app.liveness()
    assert not alive
    assert reason.startswith("stalled: lag 5 records")
    h.cluster.settle()
    await h.until(lambda: h.committed(0) == 5)
    assert h.app.liveness() == (True, "ok")
    await h.stop()


async def test_a_broken_producer_is_replaced_and_everything_written_again_in_order(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock)
    failures = iter([OutOfOrderSequenceNumber()])

    def once(topic: str, partition: int, records: list[Written]) -> BaseException | None:
        return next(failures, None) if topic == RESULTS else None

    h.cluster.policy = once
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(12)])
    await h.until(lambda: len(h.clients.producers) == 2)  # the publisher's replacement
    await h.until_in_time(lambda: len({source_of(w) for w in h.results()}) == 12)
    for answers in per_destination(h.results()).values():
        assert in_offset_order(answers)  # what was written again follows in order
    assert h.clients.producers[0].stopped
    assert h.metrics.registry.get_sample_value("streaminfer_produce_retries_total") > 0
    await h.until(lambda: h.committed(0) == 12)
    await h.stop()


async def test_writes_failing_while_the_broker_is_away_are_retried_with_backoff(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock)
    h.cluster.policy = lambda topic, partition, records: KafkaTimeoutError()
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(6)])
    await h.until(lambda: h.metrics.registry.get_sample_value("streaminfer_produce_retries_total") >= 6)
    assert h.results() == []
    assert h.committed(0) is None
    by_reason = {"stage": "produce", "reason": "KafkaTimeoutError"}
    assert h.metrics.registry.get_sample_value("streaminfer_retries_total", by_reason) >= 6
    h.cluster.policy = "ack"  # the broker is back
    await h.until_in_time(lambda: len(h.results()) == 6)
    assert [source_of(w)[1] for w in sorted(h.results(), key=lambda w: source_of(w)[1])] == list(range(6))
    await h.until(lambda: h.committed(0) == 6)
    await h.stop()


async def test_an_answer_the_broker_refuses_as_too_large_is_sent_alone_then_dead_lettered(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock)

    def refuse_the_big_one(topic: str, partition: int, records: list[Written]) -> BaseException | None:
        big = topic == RESULTS and any(len(w.value or b"") > 2000 for w in records)
        return RecordTooLargeError() if big else None

    h.cluster.policy = refuse_the_big_one
    await h.start(partitions=(0,))
    h.send(0, [digits_value(), digits_value(), digits_value(rows=100), digits_value(), digits_value()])
    await h.until_in_time(lambda: len({source_of(w) for w in h.results()}) == 4 and len(h.dead_letters()) == 1)
    assert h.reasons() == {(0, 2): "result_too_large"}
    assert {source_of(w)[1] for w in h.results()} == {0, 1, 3, 4}
    assert any(len(batch) == 1 and len(batch[0].value or b"") > 2000 for batch in h.cluster.batches)  # sent alone
    assert len(h.clients.producers) >= 2  # a refused batch breaks the idempotent producer's sequence
    await h.until(lambda: h.committed(0) == 5)
    await h.stop()


async def test_a_result_over_the_producer_limit_becomes_a_dead_letter_before_it_is_sent(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock, producer_max_request_bytes=2048)
    await h.start(partitions=(0,))
    h.send(0, [digits_value(), digits_value(rows=100), b"\xff" * 4000])
    await h.until(lambda: len(h.results()) + len(h.dead_letters()) == 3)
    assert h.reasons() == {(0, 1): "result_too_large", (0, 2): "invalid_json"}
    reduced = next(w for w in h.dead_letters() if source_of(w) == (0, 2))
    assert reduced.value is None  # the full dead letter (4000-byte value) did not fit: reduced
    assert len(h.clients.producers) == 1
    await h.stop()


async def test_revoke_drops_queued_records_and_waits_for_those_in_flight(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(
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
    await h.idle()
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
    h = Harness(tmp_path, digits_signature, clock, revoke_timeout_ms=2000)
    h.cluster.policy = "hold"
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(4)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 4)
    revoke = asyncio_task(h.consumer.revoke({TopicPartition("requests", 0)}))
    await h.idle()
    assert not revoke.done()
    clock.advance_ms(2000)
    await h.until(revoke.done)
    assert h.committed(0) is None  # nothing acknowledged, nothing committed: the new owner answers it all
    h.cluster.settle()  # late acknowledgements land on the forgotten partition: still nothing committed
    await h.idle()
    await h.stop()
    assert h.committed(0) is None


async def test_stop_drains_answers_and_commits(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock, max_batch_delay_ms=50)
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(3)])  # less than a batch: waits for its deadline
    await h.until(lambda: h.app.in_flight_rows == 3)
    await h.stop()  # flushes the batcher, publishes, commits
    assert len(h.results()) == 3
    assert h.committed(0) == 3
    assert not h.consumer.started


def asyncio_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.ensure_future(coro)


@pytest.mark.parametrize("flush", [True, False])
async def test_a_lone_record_is_not_held_for_the_batch_delay_once_the_fetch_caught_up(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock, flush: bool
) -> None:
    h = Harness(tmp_path, digits_signature, clock, max_batch_delay_ms=60_000, flush_when_caught_up=flush)
    await h.start(partitions=(0,))
    h.send(0, [digits_value()])
    await h.idle()
    assert len(h.results()) == (1 if flush else 0)  # no time passed: only a release can have flushed it
    await h.stop()
    assert len(h.results()) == 1


async def test_a_fetch_that_left_records_behind_does_not_release_the_batcher(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Harness(tmp_path, digits_signature, clock, max_batch_delay_ms=60_000, max_batch_size=64, fetch_max_records=2)
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

    h = Harness(tmp_path, digits_signature, clock)
    h.consumer.existing = {"results", "dlq"}
    start = asyncio.ensure_future(h.app.start())
    await h.idle()
    assert not start.done()  # a topic made a moment ago may not be in the metadata yet: it waits a little
    clock.advance_ms(2_000)
    await h.idle()
    h.consumer.existing = {"requests", "results", "dlq"}  # created meanwhile: start-up goes on
    clock.advance_ms(250)
    await h.until(start.done)
    await h.stop()
    late = Harness(tmp_path, digits_signature, clock)
    late.consumer.existing = {"results", "dlq"}
    start = asyncio.ensure_future(late.app.start())
    for _ in range(30):  # 7.5 s of fake time, past the 5 s wait
        clock.advance_ms(250)
        await late.idle(20)
    with pytest.raises(TopicMissingError, match="requests_topic 'requests' does not exist"):
        await start
    # answers need their topics as much: a missing results or dead-letter topic stops start-up too, named
    for gone, setting in (("results", "results_topic 'results'"), ("dlq", "dead_letter_topic 'dlq'")):
        other = Harness(tmp_path, digits_signature, clock)
        other.consumer.existing = {"requests", "results", "dlq"} - {gone}
        start = asyncio.ensure_future(other.app.start())
        for _ in range(30):
            clock.advance_ms(250)
            await other.idle(20)
        with pytest.raises(TopicMissingError, match=f"^{setting} does not exist"):
            await start
    none = Harness(tmp_path, digits_signature, clock)
    none.consumer.existing = set()
    start = asyncio.ensure_future(none.app.start())
    for _ in range(30):
        clock.advance_ms(250)
        await none.idle(20)
    all_three = "requests_topic 'requests', results_topic 'results', dead_letter_topic 'dlq' do not exist"
    with pytest.raises(TopicMissingError, match=f"^{all_three} on the cluster: create them"):
        await start
    allowed = Harness(tmp_path, digits_signature, clock, allow_auto_create_topics=True)
    allowed.consumer.existing = {"requests", "results"}
    with caplog.at_level(logging.WARNING, logger="consumer.kafka.source"):
        await allowed.start()  # asked for: starts, and says what is missing
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["dead_letter_topic 'dlq' does not exist yet"]
    await allowed.stop()
