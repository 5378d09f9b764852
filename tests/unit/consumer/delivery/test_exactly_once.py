"""exactly_once delivery logic over in-memory clients and a fake clock: windows, aborts and re-reads, fencing,
the size ladder across re-reads, revokes."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, RecordTooLargeError

from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock, FakeProducer, Written
from tests.unit.wired import RESULTS, Wired, digits_value, source_of

pytestmark = pytest.mark.asyncio

WINDOW_MS = 100


def eos(tmp_path: Path, signature: ModelSignature, clock: FakeClock, **settings: object) -> Wired:
    return Wired(tmp_path, signature, clock, delivery="exactly_once", commit_interval_ms=WINDOW_MS, **settings)


async def open_window(h: Wired, rows: int) -> None:
    """Let the window take and answer ``rows`` records, until it waits for more (fake time) with them in its open
    transactions."""
    await h.until(lambda: h.app.in_flight_rows >= rows)
    await h.quiet()


def txn_producer(h: Wired, partition: int) -> FakeProducer:
    name = f"streaminfer-txn-{partition}"
    return [p for p in h.clients.producers if p.name == name][-1]


async def test_a_window_commits_its_answers_with_the_next_offsets(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    await h.start()
    assert {p.transactional_id for p in h.clients.producers} == {
        "streaminfer-g-requests-0",
        "streaminfer-g-requests-1",
    }  # opened on assignment: this fences any zombie of the partitions
    h.send(0, [digits_value(), b"not json", digits_value(rows=2)])
    h.send(1, [digits_value() for _ in range(5)])
    await h.until(lambda: h.app.in_flight_rows >= 9)
    await h.quiet()  # the window holds the chunk's answers in its open transactions, and waits for more
    assert h.results() == []  # nothing visible yet
    assert h.committed(0) is None
    await h.until_in_time(lambda: h.committed(0) == 3 and h.committed(1) == 5, step_ms=WINDOW_MS)
    assert len(h.results()) == 7
    assert h.reasons() == {(0, 1): "invalid_json"}
    # the chunk was routed once, each answer then written by its own partition's transactional producer
    assert all(w.producer == f"streaminfer-txn-{source_of(w)[0]}" for w in h.results() + h.dead_letters())
    assert txn_producer(h, 0).transactions == ["commit"]
    assert h.app.in_flight_rows == 0
    await h.stop()


async def test_a_window_hands_each_destination_its_answers_in_full_batches_across_chunks(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    """The chunks of one window append to the same open producer batches (4 records each in the fakes): a
    destination gets ceil(answers / 4) batches in the window, not one or more per chunk."""
    h = eos(tmp_path, digits_signature, clock)
    await h.start(partitions=(0,))
    for chunk in range(1, 4):
        h.send(0, [digits_value() for _ in range(3)])
        await open_window(h, 3 * chunk)  # each send its own chunk, all in one window
    assert h.cluster.batches == []  # nothing handed over before the window ends
    await h.until_in_time(lambda: h.committed(0) == 9, step_ms=WINDOW_MS)
    assert txn_producer(h, 0).transactions == ["commit"]
    answers = Counter(w.partition for w in h.results())
    batches = Counter(batch[0].partition for batch in h.cluster.batches if batch and batch[0].topic == RESULTS)
    assert sum(answers.values()) == 9
    assert batches == {p: -(-n // 4) for p, n in answers.items()}
    assert sorted(source_of(w)[1] for w in h.results()) == list(range(9))
    await h.stop()


async def test_a_failed_transaction_is_aborted_and_its_window_answered_again_exactly_once(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    failures = iter([KafkaTimeoutError()])

    def once(topic: str, partition: int, records: list[Written]) -> BaseException | None:
        return next(failures, None) if topic == RESULTS else None

    h.cluster.policy = once
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(6)])
    await h.until_in_time(lambda: h.committed(0) == 6, step_ms=WINDOW_MS)
    assert txn_producer(h, 0).transactions == ["abort", "commit"]
    assert sorted(source_of(w)[1] for w in h.results()) == list(range(6))  # each answer once
    assert h.metrics.registry.get_sample_value("streaminfer_produce_retries_total") == 6
    assert h.metrics.registry.get_sample_value("streaminfer_records_total", {"outcome": "result"}) == 6
    await h.stop()


async def test_a_producer_that_cannot_abort_is_replaced_and_the_window_answered_once(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    failures = iter([KafkaTimeoutError()])

    def once(topic: str, partition: int, records: list[Written]) -> BaseException | None:
        error = next(failures, None) if topic == RESULTS else None
        if error is not None:
            broken.fatal = True  # its sender failed: aiokafka refuses the abort with an AssertionError
        return error

    h.cluster.policy = once
    await h.start(partitions=(0,))
    broken = txn_producer(h, 0)
    h.send(0, [digits_value() for _ in range(6)])
    await h.until_in_time(lambda: h.committed(0) == 6, step_ms=WINDOW_MS)
    assert broken.stopped
    assert txn_producer(h, 0) is not broken
    assert sorted(source_of(w)[1] for w in h.results()) == list(range(6))  # each answer once
    assert h.app.in_flight_rows == 0
    await h.stop()


async def test_a_fenced_producer_drops_the_window_and_a_new_producer_answers_it(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(3)])
    await open_window(h, 3)
    zombie = txn_producer(h, 0)
    zombie.fenced = True  # another producer with its transactional.id started
    await h.until_in_time(lambda: h.committed(0) == 3, step_ms=WINDOW_MS)
    assert zombie.stopped
    assert txn_producer(h, 0) is not zombie
    assert sorted(source_of(w)[1] for w in h.results()) == [0, 1, 2]
    await h.stop()


async def test_a_commit_that_never_finishes_is_given_up_and_a_new_producer_answers_the_window_once(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock, producer_request_timeout_ms=5_000)
    await h.start(partitions=(0,))
    stuck = txn_producer(h, 0)
    stuck.hang = True
    h.send(0, [digits_value() for _ in range(3)])
    await open_window(h, 3)
    started = clock()
    await h.until_in_time(lambda: h.committed(0) == 3, step_ms=WINDOW_MS)
    assert clock() - started >= 5.0  # given up after producer_request_timeout_ms, not before
    assert stuck.stopped
    assert stuck.transactions == []
    assert txn_producer(h, 0) is not stuck
    assert sorted(source_of(w)[1] for w in h.results()) == [0, 1, 2]  # the stuck one's writes never became visible
    await h.stop()


async def test_a_producer_that_cannot_begin_is_replaced(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    await h.start(partitions=(0,))
    h.send(0, [digits_value()])
    await h.until_in_time(lambda: h.committed(0) == 1, step_ms=WINDOW_MS)
    broken = txn_producer(h, 0)
    broken.fatal = True  # its sender failed between two windows
    h.send(0, [digits_value(), digits_value()])
    await h.until_in_time(lambda: h.committed(0) == 3, step_ms=WINDOW_MS)
    assert broken.stopped
    assert txn_producer(h, 0) is not broken
    assert sorted(source_of(w)[1] for w in h.results()) == [0, 1, 2]
    assert h.app.failed is None  # the loop went on
    await h.stop()


async def test_a_revoke_that_gives_up_on_a_stuck_window_drops_it_and_the_next_owner_answers_once(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock, revoke_timeout_ms=1_000, producer_request_timeout_ms=600_000)
    await h.start(partitions=(0,))
    stuck = txn_producer(h, 0)
    stuck.hang = True
    h.send(0, [digits_value() for _ in range(4)])
    await open_window(h, 4)
    tp = TopicPartition("requests", 0)
    revoke = asyncio.ensure_future(h.consumer.revoke({tp}))
    started = clock()
    await h.until_in_time(revoke.done, step_ms=100)
    assert clock() - started < 2.0  # revoke_timeout_ms, far below the commit's own limit
    assert stuck.stopped
    await h.consumer.assign({tp})  # the group hands it back (the same member after a partition heals)
    await h.until_in_time(lambda: h.committed(0) == 4, step_ms=WINDOW_MS)
    assert txn_producer(h, 0) is not stuck
    assert sorted(source_of(w)[1] for w in h.results()) == [0, 1, 2, 3]
    await h.stop()


async def test_the_size_ladder_survives_the_aborted_windows(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)

    def refuse_the_big_one(topic: str, partition: int, records: list[Written]) -> BaseException | None:
        big = topic == RESULTS and any(len(w.value or b"") > 2000 for w in records)
        return RecordTooLargeError() if big else None

    h.cluster.policy = refuse_the_big_one
    await h.start(partitions=(0,))
    h.send(0, [digits_value(), digits_value(rows=100), digits_value()])
    await h.until_in_time(lambda: h.committed(0) == 3, step_ms=WINDOW_MS)
    assert h.reasons() == {(0, 1): "result_too_large"}
    assert sorted(source_of(w)[1] for w in h.results()) == [0, 2]
    assert txn_producer(h, 0).transactions[-1] == "commit"
    await h.stop()


async def test_revoke_ends_the_open_window_at_once_though_the_fetch_waits_for_the_rebalance(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """aiokafka's fetch waits for the new assignment once a rebalance began, and the rebalance waits for the revoke:
    the revoke must cut the window's fetch short, not wait revoke_timeout_ms for it."""
    h = eos(tmp_path, digits_signature, clock, revoke_timeout_ms=5_000)
    await h.start()
    h.send(0, [digits_value() for _ in range(4)])
    await open_window(h, 4)  # answered into the open window's transaction
    revoke = asyncio.ensure_future(h.consumer.revoke({TopicPartition("requests", 0), TopicPartition("requests", 1)}))
    await h.until(revoke.done)  # no time passes
    assert h.committed(0) == 4  # the window committed before the partitions went
    assert "did not finish in time" not in caplog.text
    await h.stop()


async def test_a_rebalance_keeps_the_producers_of_partitions_given_back_and_closes_the_others(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    await h.start()
    h.send(0, [digits_value() for _ in range(4)])
    await open_window(h, 4)
    lost, kept = txn_producer(h, 0), txn_producer(h, 1)
    await h.consumer.revoke({TopicPartition("requests", 0), TopicPartition("requests", 1)})  # eager: all of them
    assert h.committed(0) == 4
    assert not lost.stopped
    assert not kept.stopped
    await h.consumer.assign({TopicPartition("requests", 1), TopicPartition("requests", 2)})
    assert lost.stopped
    assert not kept.stopped
    assert txn_producer(h, 1) is kept
    assert len(h.clients.producers) == 3  # 0 and 1 at the start, 2 now
    registry = h.metrics.registry
    assert [
        registry.get_sample_value("streaminfer_transactional_producers_total", {"event": e})
        for e in ("kept", "opened", "closed")
    ] == [1, 3, 1]  # fmt: skip  (opened: 0 and 1 at the start, then 2)
    h.send(1, [digits_value() for _ in range(2)])
    h.send(2, [digits_value() for _ in range(3)])
    await h.until_in_time(lambda: h.committed(1) == 2 and h.committed(2) == 3, step_ms=WINDOW_MS)
    assert kept.transactions == ["commit"]
    await h.stop()


async def test_a_kept_producer_fenced_meanwhile_is_replaced_and_its_window_answered_once(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    """Out of the group for a while, this member's partition had another owner, whose producer fenced ours."""
    h = eos(tmp_path, digits_signature, clock)
    await h.start(partitions=(0,))
    tp = TopicPartition("requests", 0)
    await h.consumer.revoke({tp})
    kept = txn_producer(h, 0)
    kept.fenced = True
    await h.consumer.assign({tp})
    assert txn_producer(h, 0) is kept
    h.send(0, [digits_value() for _ in range(3)])
    await h.until_in_time(lambda: h.committed(0) == 3, step_ms=WINDOW_MS)
    assert kept.stopped
    assert txn_producer(h, 0) is not kept
    assert sorted(source_of(w)[1] for w in h.results()) == [0, 1, 2]
    await h.stop()


async def test_the_new_partitions_producers_start_concurrently(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    await h.app.start()
    h.clients.start_gate = asyncio.Event()  # every InitProducerId waits here until the test sets it
    assigning = asyncio.ensure_future(h.consumer.assign({TopicPartition("requests", p) for p in range(3)}))
    await h.until(lambda: h.clients.starting == 3)  # all three at once, not one after another
    h.clients.start_gate.set()
    await h.until(assigning.done)
    assert h.app.joined
    await h.stop()


async def test_a_new_owner_reads_its_partitions_from_the_offsets_committed_once_its_producer_fenced_the_old_one(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    """The broker applies a transaction's offsets once its commit markers are written, after the old owner's
    commit_transaction returned. aiokafka reads the committed offsets at the assignment, before the handler runs
    (no require_stable), and so can read the offset before the old owner's last window; the new owner's
    InitProducerId waits for that transaction to complete."""
    h = eos(tmp_path, digits_signature, clock)
    await h.app.start()
    tp = TopicPartition("requests", 0)
    h.send(0, [digits_value() for _ in range(6)])
    h.cluster.committed[tp] = 0  # what the group coordinator answers at the assignment: the old owner's last
    # transaction (records 0-3) is committed but its offsets are not applied yet
    h.clients.start_gate = asyncio.Event()  # InitProducerId: CONCURRENT_TRANSACTIONS until its markers are written
    assigning = asyncio.ensure_future(h.consumer.assign({tp}))
    await h.until(lambda: h.clients.starting == 1)
    await h.quiet()  # whatever fetches and windows can run meanwhile do
    h.cluster.committed[tp] = 4  # the old owner's transaction completes: its offsets apply, its producer is fenced
    h.clients.start_gate.set()
    await h.until(assigning.done)
    await h.until_in_time(lambda: h.committed(0) == 6, step_ms=WINDOW_MS)
    assert sorted(source_of(w)[1] for w in h.results()) == [4, 5]  # 0-3 were the old owner's answers
    await h.stop()


async def test_a_member_given_its_partition_back_resumes_after_its_own_last_commit_though_the_read_lags(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    """The revoke committed the window (records 0-3); the kept producer starts no InitProducerId that would wait
    for its markers, and the coordinator still answers the offset before it."""
    h = eos(tmp_path, digits_signature, clock)
    await h.start(partitions=(0,))
    tp = TopicPartition("requests", 0)
    h.send(0, [digits_value() for _ in range(4)])
    await open_window(h, 4)
    await h.consumer.revoke({tp})
    assert h.committed(0) == 4
    h.cluster.committed[tp] = 0  # its offsets not applied yet when the assignment reads them (and again after)
    await h.consumer.assign({tp})
    assert txn_producer(h, 0).transactions == ["commit"]  # kept
    h.send(0, [digits_value() for _ in range(2)])
    await h.until_in_time(lambda: h.committed(0) == 6, step_ms=WINDOW_MS)
    assert sorted(source_of(w)[1] for w in h.results()) == [0, 1, 2, 3, 4, 5]
    await h.stop()


async def test_a_partition_whose_producer_was_fenced_is_read_again_from_the_offset_committed_after_a_new_one(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    """Out of the group for a while, this member's partition had another owner, who answered records 0-2 and
    fenced our kept producer: the window it fails is read again from what the other committed, not from its
    own first offset."""
    h = eos(tmp_path, digits_signature, clock)
    await h.start(partitions=(0,))
    tp = TopicPartition("requests", 0)
    await h.consumer.revoke({tp})
    kept = txn_producer(h, 0)
    await h.consumer.assign({tp})
    h.send(0, [digits_value() for _ in range(5)])
    await open_window(h, 5)
    kept.fenced = True
    h.cluster.committed[tp] = 3  # the other owner's transaction, applied once our new producer fenced it
    await h.until_in_time(lambda: h.committed(0) == 5, step_ms=WINDOW_MS)
    assert txn_producer(h, 0) is not kept
    assert sorted(source_of(w)[1] for w in h.results()) == [3, 4]
    await h.stop()


async def test_a_partition_whose_committed_offset_cannot_be_read_waits_paused_until_it_can(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    await h.app.start()
    tp = TopicPartition("requests", 0)
    h.send(0, [digits_value() for _ in range(5)])
    h.consumer.committed_error = KafkaTimeoutError()  # the group coordinator does not answer
    await h.consumer.assign({tp})
    assert h.app.joined  # the assignment went on
    assert tp in h.consumer.paused()
    await h.until_in_time(lambda: h.consumer.committed_reads >= 3, step_ms=WINDOW_MS)  # each window tries again
    assert h.results() == []  # nothing read from the offset aiokafka had
    h.cluster.committed[tp] = 2
    h.consumer.committed_error = None
    await h.until_in_time(lambda: h.committed(0) == 5, step_ms=WINDOW_MS)
    assert tp not in h.consumer.paused()
    assert sorted(source_of(w)[1] for w in h.results()) == [2, 3, 4]
    await h.stop()


async def test_a_producer_that_cannot_start_at_assignment_is_started_by_its_first_window(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock)
    await h.app.start()
    h.clients.producer_error = KafkaTimeoutError()  # the transaction coordinator does not answer
    await h.consumer.assign({TopicPartition("requests", 0)})
    assert h.app.joined  # the assignment went on
    h.clients.producer_error = None
    h.send(0, [digits_value() for _ in range(2)])
    await h.until_in_time(lambda: h.committed(0) == 2, step_ms=WINDOW_MS)
    await h.stop()


async def test_a_window_ends_once_max_in_flight_rows_are_held(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = eos(tmp_path, digits_signature, clock, max_in_flight_rows=4, fetch_max_records=3)
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(10)])
    await h.until(lambda: h.committed(0) == 8)  # no time passes: these windows are cut by the rows they hold
    assert txn_producer(h, 0).transactions == ["commit", "commit"]
    await h.until_in_time(lambda: h.committed(0) == 10, step_ms=WINDOW_MS)  # the last one by its deadline
    await h.stop()
