"""The ordered publisher (consumer/delivery/publisher.py) in a consumer wired to fakes (tests/unit/wired.py): offset
order through bisection and dead letters, a broken producer replaced, writes retried while the broker is away, the
size ladder."""

from __future__ import annotations

from pathlib import Path

from aiokafka.errors import KafkaTimeoutError, OutOfOrderSequenceNumber, RecordTooLargeError

from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock, Written
from tests.unit.wired import INFERENCE_OOM, RESULTS, Wired, digits_value, in_offset_order, per_destination, source_of


async def test_answers_are_handed_over_in_offset_order_through_bisection_and_dead_letters(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock)
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


async def test_a_broken_producer_is_replaced_and_everything_written_again_in_order(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock)
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
    h = Wired(tmp_path, digits_signature, clock)
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
    h = Wired(tmp_path, digits_signature, clock)

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
    h = Wired(tmp_path, digits_signature, clock, producer_max_request_bytes=2048)
    await h.start(partitions=(0,))
    h.send(0, [digits_value(), digits_value(rows=100), b"\xff" * 4000])
    await h.until(lambda: len(h.results()) + len(h.dead_letters()) == 3)
    assert h.reasons() == {(0, 1): "result_too_large", (0, 2): "invalid_json"}
    reduced = next(w for w in h.dead_letters() if source_of(w) == (0, 2))
    assert reduced.value is None  # the full dead letter (4000-byte value) did not fit: reduced
    assert len(h.clients.producers) == 1
    await h.stop()
