"""Answers out: results and dead letters into producer batches, in each request partition's offset order.

Three pieces, from the bottom up:

- :class:`SizeLadder`: what happens to an answer too large to write, written once for both delivery modes. The
  client's own limit (``producer_max_request_bytes``) is checked before a record is appended: a result over it
  becomes a ``result_too_large`` dead letter, a dead letter over it a *reduced* one. A produce request the broker
  refuses as too large may have held other records, so each of its records climbs one rung per refusal: 1 = sent
  alone, 2 = shrunk once (result -> dead letter, or dead letter -> reduced), 3 = shrunk twice. Rungs are kept per
  record (topic, partition, offset) until the record's answer is acknowledged, so exactly_once, which answers a
  chunk again after an aborted transaction, resumes where the last try stopped.
- :class:`AnswerWriter`: appends answers, in order, to one producer batch per destination partition (the
  partition ``send`` would pick: murmur2 of the key) and hands each full batch to the client, so a chunk of answers
  waits on a few futures instead of one per record. Used by both delivery modes.
- :class:`Publisher` (at_least_once): registers every fetched record in its partition's order, releases answers to
  the writer only once every earlier record of the partition is answered (several batches in flight, bisection and
  dead letters answered at decode cannot reorder them), acknowledges them to the committer, and recovers from
  failed writes: it stops writing, waits until every batch in flight settled, replaces a broken producer, and
  writes again, in the original order, every answer from the first failed batch of each destination partition on.
  So each results partition holds each request partition's results in offset order; after a failure the answers
  written again (and any acknowledged after the failed batch) follow in order, as after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from consumer import fate
from consumer.errors import TOO_LARGE, DeadLetterReason, NotSentError, RecordError
from consumer.kafka.clients import BatchLike, Clients, ProducerClient
from consumer.kafka.partitioner import partitions_for_keys
from consumer.oip.records import AnswerRecord, AnswerRecords
from consumer.ops.metrics import Metrics
from consumer.timeouts import Backoff
from consumer.work import PartitionOrder, Work, loggable

log = logging.getLogger(__name__)

#: Longest wait to close a broken producer, seconds (a broker that is gone must not hold the publisher).
CLOSE_TIMEOUT_S = 2.0

Sleep = Callable[[float], Awaitable[None]]


# ------------------------------------------------------------------------------------------------ the size ladder
class SizeLadder:
    """The too-large ladder (see the module docstring), shared by both delivery modes.

    Args:
        max_request_bytes: the producer's ``max_request_size``, bytes: a record estimated above it is shrunk
            before it is appended.
    """

    def __init__(self, max_request_bytes: int) -> None:
        self._max_request_bytes = max_request_bytes
        self._rungs: dict[tuple[str, int, int], int] = {}

    def fits(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> bool:
        """Whether the client would accept the record (aiokafka's own estimate, as ``send`` checks it)."""
        if len(value or b"") + len(key or b"") < self._max_request_bytes // 2 and len(headers) <= 3:
            return True  # a result far below the limit: our three headers cannot make up the rest
        return bool(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers) <= self._max_request_bytes)

    def refused(self, work: Work, exc: BaseException) -> None:
        """The broker refused a produce request holding ``work`` as too large: one rung up."""
        key = (work.tp.topic, work.tp.partition, work.record.offset)
        rung = self._rungs[key] = self._rungs.get(key, 0) + 1
        if rung == 1:
            work.solo = True
        else:
            shrink(work, exc)

    def resume(self, work: Work) -> None:
        """A record fetched again (exactly_once, after an aborted transaction): climb the rungs it reached."""
        rung = self._rungs.get((work.tp.topic, work.tp.partition, work.record.offset), 0)
        if rung >= 1:
            work.solo = True
        for _ in range(rung - 1):
            shrink(work, RecordError(DeadLetterReason.RESULT_TOO_LARGE, "the broker refused the response as too large"))

    def forget(self, works: Iterable[Work]) -> None:
        """The answers of ``works`` were acknowledged: their rungs are no longer needed."""
        if self._rungs:
            for work in works:
                self._rungs.pop((work.tp.topic, work.tp.partition, work.record.offset), None)


def shrink(work: Work, exc: BaseException) -> None:
    """An answer was too large: a result (or a request not run yet) becomes a result_too_large dead letter, a dead
    letter a reduced one."""
    if work.error is None:
        size = f"response of {len(work.result)} bytes" if work.result is not None else "response"
        work.error = RecordError(DeadLetterReason.RESULT_TOO_LARGE, f"{size}: {exc!r}")
        work.result = None
        work.result_json_length = None
        work.request = None
    else:
        work.reduced = True


# ------------------------------------------------------------------------------------------------ the writer
@dataclass(slots=True)
class Sent:
    """One producer batch handed to the client: its answers, in order, and the future of its acknowledgement.

    Attributes:
        destination: (topic, partition) written to; None for answers that were not attempted.
    """

    destination: tuple[str, int] | None
    works: list[Work]
    future: asyncio.Future[Any]
    error: BaseException | None = None
    settled: bool = False


@dataclass(slots=True)
class _Open:
    builder: BatchLike
    works: list[Work] = field(default_factory=list)


def failed_future(exc: BaseException) -> asyncio.Future[Any]:
    """A future that already failed with ``exc``."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future


class AnswerWriter:
    """Appends answers to producer batches (one per destination partition) and hands them to a producer.

    Args:
        records: builds each answer's record.
        ladder: the size ladder (the client limit is checked here, refusals are judged by the caller).
        metrics: ``streaminfer_stage_seconds_total{stage="produce"}``: the write's own time, without the time the
            client makes it wait for a partition's previous batch to be sent.
        clock: monotonic seconds.
        wall_clock: epoch seconds (record timestamps, ms).
    """

    def __init__(
        self,
        records: AnswerRecords,
        ladder: SizeLadder,
        metrics: Metrics,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.records = records
        self.ladder = ladder
        self._metrics = metrics.stage_seconds.labels("produce")
        self._clock = clock
        self._wall_clock = wall_clock
        self._waited = 0.0  # of the current write: time the client made us wait, seconds

    async def write(self, producer: ProducerClient, works: Sequence[Work]) -> list[Sent]:
        """Append ``works``' answers in order and hand every batch to ``producer``. A ``solo`` answer travels in a
        produce request of its own: it is awaited before the next answer is appended, and if it fails the rest is
        not attempted (returned as one :class:`Sent` whose future failed with :class:`NotSentError`).

        Never raises for a failed write: a batch the client refuses at once gets a failed future.

        Returns:
            The batches in the order they were handed over (the client keeps that order per partition).
        """
        sent: list[Sent] = []
        started = self._clock()
        self._waited = 0.0
        try:
            answers = [self._fit(work) for work in works]
            try:
                destinations = await self._destinations(producer, answers)
            except KafkaError as exc:  # no metadata (broker unreachable): this round is retried
                return [Sent(None, list(works), failed_future(exc))]
            timestamp_ms = int(self._wall_clock() * 1000)
            open_batches: dict[tuple[str, int], _Open] = {}
            for index, (work, (_, key, value, headers), destination) in enumerate(
                zip(works, answers, destinations, strict=True)
            ):
                if work.solo:
                    await self._flush(producer, open_batches, sent)
                    alone = _Open(producer.create_batch())
                    alone.builder.append(timestamp=timestamp_ms, key=key, value=value, headers=headers)
                    alone.works.append(work)
                    lone = await self._send(producer, destination, alone)
                    sent.append(lone)
                    waiting = self._clock()
                    await asyncio.wait([lone.future])
                    self._waited += self._clock() - waiting
                    if lone.future.exception() is not None:
                        rest = list(works[index + 1 :])
                        if rest:
                            sent.append(Sent(None, rest, failed_future(NotSentError("an earlier write failed"))))
                        return sent
                    continue
                slot = open_batches.get(destination)
                if slot is None:
                    slot = open_batches[destination] = _Open(producer.create_batch())
                if slot.builder.append(timestamp=timestamp_ms, key=key, value=value, headers=headers) is None:
                    sent.append(await self._send(producer, destination, slot))
                    slot = open_batches[destination] = _Open(producer.create_batch())
                    slot.builder.append(timestamp=timestamp_ms, key=key, value=value, headers=headers)
                slot.works.append(work)
            await self._flush(producer, open_batches, sent)
        finally:
            self._metrics.inc(max(0.0, self._clock() - started - self._waited))
        return sent

    @staticmethod
    async def _destinations(producer: ProducerClient, answers: list[AnswerRecord]) -> list[tuple[str, int]]:
        """(topic, partition) of every answer record: the partition ``send`` would choose for its key.

        Raises:
            aiokafka.errors.KafkaError: a topic's metadata cannot be had.
        """
        by_topic: dict[str, list[int]] = {}
        for i, answer in enumerate(answers):
            by_topic.setdefault(answer[0], []).append(i)
        out: list[tuple[str, int]] = [("", 0)] * len(answers)
        for topic, index in by_topic.items():
            partitions = sorted(await producer.partitions_for(topic))
            for i, partition in zip(
                index, partitions_for_keys([answers[i][1] for i in index], partitions), strict=True
            ):
                out[i] = (topic, partition)
        return out

    def _fit(self, work: Work) -> AnswerRecord:
        """The answer's record, shrunk (result -> dead letter -> reduced) while the client would refuse it."""
        while True:
            answer = self.records.of(work)
            if work.reduced or self.ladder.fits(answer[1], answer[2], answer[3]):
                return answer
            shrink(work, MessageSizeTooLargeError(f"{len(answer[2] or b'')} bytes exceed producer_max_request_bytes"))

    async def _flush(
        self, producer: ProducerClient, open_batches: dict[tuple[str, int], _Open], sent: list[Sent]
    ) -> None:
        for destination, slot in open_batches.items():
            sent.append(await self._send(producer, destination, slot))
        open_batches.clear()

    async def _send(self, producer: ProducerClient, destination: tuple[str, int], slot: _Open) -> Sent:
        handed = self._clock()
        try:
            future = await producer.send_batch(slot.builder, destination[0], partition=destination[1])
        except (KafkaError, *TOO_LARGE) as exc:
            future = failed_future(exc)
        except Exception as exc:  # noqa: BLE001 (aiokafka's IllegalOperation after fencing is not a KafkaError)
            future = failed_future(exc)
        finally:
            self._waited += self._clock() - handed  # the client waits for the partition's previous batch to go
        return Sent(destination, slot.works, future)


# ------------------------------------------------------------------------------------------------ metrics
def count_answers(metrics: Metrics, works: Sequence[Work], now_ms: float) -> None:
    """Metrics of acknowledged answers (once per batch) and the log line of each dead letter."""
    dead = [w for w in works if w.error is not None]
    tombstones = sum(1 for w in works if w.tombstone)
    if tombstones:
        metrics.records.labels("tombstone").inc(tombstones)
    if len(dead) + tombstones < len(works):
        metrics.records.labels("result").inc(len(works) - len(dead) - tombstones)
    if dead:
        metrics.records.labels("dead_letter").inc(len(dead))
        for work in dead:
            error = work.error
            assert error is not None
            metrics.dead_letters.labels(error.reason.value).inc()
            log.warning(
                "dead-lettered correlation_id=%s reason=%s: %s",
                loggable(work.correlation_id),
                error.reason.value,
                error,
            )
    ages = [max(0.0, now_ms - w.record.timestamp) / 1000.0 for w in works if w.record.timestamp >= 0]
    metrics.record_age_seconds.observe_many(ages)


# ------------------------------------------------------------------------------------------------ the publisher
class Publisher:
    """at_least_once: ordered, retried writes of every answer through one idempotent producer.

    Args:
        clients: opens the producer (and its replacements).
        writer: appends answers to producer batches.
        metrics: produce retries.
        on_acked: called with the answers the broker acknowledged (each once), in acknowledgement order.
        client_id: the producer's client id.
        sleep: ``asyncio.sleep`` or a fake (retry backoff).
        backoff: pause between rounds of retried writes, and between attempts to start a new producer.
    """

    def __init__(
        self,
        clients: Clients,
        writer: AnswerWriter,
        metrics: Metrics,
        on_acked: Callable[[list[Work]], None],
        *,
        client_id: str,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
    ) -> None:
        self._backoff = backoff or Backoff()
        self._clients = clients
        self._writer = writer
        self._metrics = metrics
        self._on_acked = on_acked
        self._client_id = client_id
        self._sleep = sleep
        self.producer: ProducerClient | None = None
        self._orders: dict[TopicPartition, PartitionOrder] = {}
        self._unsent: deque[Work] = deque()
        self._sent: deque[Sent] = deque()  # handed to the client, in order, until settled (all of them on failure)
        self._unsettled = 0
        self._failed = False
        self._attempt = 0  # rounds of retried writes since the last acknowledgement
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writing = False

    async def start(self) -> None:
        """Open the producer.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        self.producer = await self._clients.producer(self._client_id)

    async def close(self) -> None:
        """Close the producer (what it still holds is not acknowledged, so not committed)."""
        if self.producer is not None:
            with contextlib.suppress(KafkaError, TimeoutError, OSError):
                await asyncio.wait_for(self.producer.stop(), CLOSE_TIMEOUT_S)

    # -- order
    def track(self, works: Iterable[Work]) -> None:
        """Register fetched records, in fetch order per partition: their answers are released in that order."""
        orders = self._orders
        for work in works:
            order = orders.get(work.tp)
            if order is None:
                order = orders[work.tp] = PartitionOrder()
            work.order = order
            order.queue.append(work)

    def answered(self, works: Iterable[Work]) -> None:
        """``works`` have their result or dead letter: release every partition's answered prefix to the writer."""
        touched: set[PartitionOrder | None] = set()  # None: never registered (not in the order)
        for work in works:
            work.answered = True
            touched.add(work.order)
        unsent = self._unsent
        before = len(unsent)
        for order in touched:
            if order is not None and order.live:
                order.release_into(unsent)
        if len(unsent) != before:
            self._idle.clear()
            self._wakeup.set()

    def cut(self, tp: TopicPartition, from_offset: int) -> list[Work]:
        """Never release ``tp``'s records at or after ``from_offset`` (revoke: they were dropped unanswered).

        Returns:
            The records taken out of the order (not yet released).
        """
        order = self._orders.get(tp)
        dropped: list[Work] = []
        if order is not None:
            while order.queue and order.queue[-1].record.offset >= from_offset:
                dropped.append(order.queue.pop())
        return dropped

    def forget(self, tps: Iterable[TopicPartition]) -> list[Work]:
        """Drop revoked partitions: records not yet released never will be; late answers are ignored.

        Returns:
            The records dropped.
        """
        dropped: list[Work] = []
        for tp in tps:
            order = self._orders.pop(tp, None)
            if order is not None:
                order.live = False
                dropped.extend(order.queue)
                order.queue.clear()
        return dropped

    def unreleased(self, tp: TopicPartition) -> int:
        """Records of ``tp`` registered and not yet released."""
        order = self._orders.get(tp)
        return len(order.queue) if order is not None else 0

    # -- the task
    async def run(self) -> None:
        """Write released answers until cancelled; never raises for a failed write (it is retried)."""
        while True:
            if self._failed:
                if self._unsettled:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._recover()
                continue
            if not self._unsent:
                if not self._unsettled:
                    self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            works = list(self._unsent)
            self._unsent.clear()
            assert self.producer is not None
            self._writing = True
            try:
                batches = await self._writer.write(self.producer, works)
            finally:
                self._writing = False
            for entry in batches:
                self._sent.append(entry)
                self._unsettled += 1
                entry.future.add_done_callback(functools.partial(self._settled, entry))

    def _settled(self, entry: Sent, future: asyncio.Future[Any]) -> None:
        entry.settled = True
        self._unsettled -= 1
        if future.cancelled():
            entry.error = NotSentError("the write was cancelled")
        else:
            entry.error = future.exception()
        if entry.error is None:
            fresh = [w for w in entry.works if not w.acked]
            for work in fresh:
                work.acked = True
            if fresh:
                self._on_acked(fresh)
            if not self._failed:
                self._attempt = 0
                while self._sent and self._sent[0].settled and self._sent[0].error is None:
                    self._sent.popleft()
        else:
            self._failed = True
        if (self._failed and not self._unsettled) or (not self._unsettled and not self._unsent and not self._writing):
            self._wakeup.set()

    async def _recover(self) -> None:
        """Every batch in flight has settled and one failed: judge the failures, replace a broken producer, and
        queue again, in order, every answer from the first failed batch of each destination on."""
        entries = list(self._sent)
        self._sent.clear()
        first_failure: dict[tuple[str, int] | None, int] = {}
        for i, entry in enumerate(entries):
            if entry.error is not None and entry.destination not in first_failure:
                first_failure[entry.destination] = i
        again: list[Work] = []
        failed = 0
        broken: BaseException | None = None
        for i, entry in enumerate(entries):
            start = first_failure.get(entry.destination)
            if start is None or i < start:
                continue
            again.extend(entry.works)
            error = entry.error
            if error is None:
                continue
            failed += len(entry.works)
            action = fate.of_write(error)
            if action is not fate.Action.RESEND:
                self._metrics.retries.labels("produce", type(error).__name__).inc(len(entry.works))
            if fate.needs_new_producer(error) and broken is None:
                broken = error
            if action is fate.Action.SIZE_LADDER:
                for work in entry.works:
                    self._writer.ladder.refused(work, error)
            elif action is not fate.Action.RESEND:
                log.warning(
                    "write of %d answers to %s failed, retrying: %r", len(entry.works), entry.destination, error
                )
        self._metrics.produce_retries.inc(failed)
        if broken is not None:
            await self._replace_producer(broken)
        await self._sleep(self._backoff.delay(self._attempt))
        self._attempt += 1
        self._unsent.extendleft(reversed(again))
        self._failed = False

    async def _replace_producer(self, cause: BaseException) -> None:
        """The idempotent producer's sequence state broke (e.g. the broker refused a batch as too large, and the
        batches behind it get OutOfOrderSequenceNumber forever): start a new one, retrying while the broker is
        unreachable."""
        log.warning("replacing the producer after %r", cause)
        await self.close()
        attempt = 0
        while True:
            try:
                self.producer = await self._clients.producer(self._client_id)
                return
            except KafkaError as exc:
                delay = self._backoff.delay(attempt)
                log.warning("cannot start a new producer (%r); retrying in %.1f s", exc, delay)
                await self._sleep(delay)
                attempt += 1

    async def drain(self) -> None:
        """Wait until every released answer is acknowledged."""
        while not (self._idle.is_set() and not self._unsent and not self._unsettled and not self._failed):
            self._idle.clear()
            self._wakeup.set()
            await self._idle.wait()

    @property
    def unsettled(self) -> int:
        """Producer batches handed to the client and not yet acknowledged or failed."""
        return self._unsettled
