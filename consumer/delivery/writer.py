"""The writer both delivery modes share: answers, in order, into producer batches, and what a failed batch means.

:class:`AnswerWriter` appends answers, in order, to one producer batch per destination partition (the partition
``send`` would pick: murmur2 of the key) and hands each full batch to the client, so a chunk of answers waits on a few
futures instead of one per record; a failed batch is judged once (:meth:`AnswerWriter.judge`: the fate table, and the
size ladder for a too-large refusal). :func:`count_answers` counts acknowledged answers. at_least_once
(:mod:`consumer.delivery.publisher`) adds ordered release and write recovery, exactly_once
(:mod:`consumer.delivery.exactly_once`) a transaction per partition and window.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from consumer import fate
from consumer.answers.ladder import SizeLadder, shrink
from consumer.answers.records import Answer, AnswerRecords
from consumer.errors import TOO_LARGE, NotSentError
from consumer.kafka.clients import BatchLike, ProducerClient
from consumer.kafka.partitioner import partitions_for_keys
from consumer.ops.metrics import Metrics
from consumer.work import Work, loggable

log = logging.getLogger(__name__)

_TOPIC = operator.itemgetter(0)
_KEY = operator.itemgetter(1)
_ERROR = operator.attrgetter("error")
_TOMBSTONE = operator.attrgetter("tombstone")
_TIMESTAMP = operator.attrgetter("record.timestamp")


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


@dataclass(slots=True)
class Routed:
    """:meth:`AnswerWriter.route`'s answers: each one's record and destination (topic, partition), in order, or the
    error that left them without destinations (no metadata)."""

    answers: list[Answer]
    destinations: list[tuple[str, int]]
    error: BaseException | None = None

    def slice(self, start: int, end: int) -> Routed:
        """The answers ``start`` to ``end`` (exclusive)."""
        if self.error is not None:
            return Routed([], [], self.error)
        return Routed(self.answers[start:end], self.destinations[start:end])


class OpenBatches:
    """Producer batches kept open across :meth:`AnswerWriter.write` calls (exactly_once: one transaction's, until
    :meth:`AnswerWriter.flush` before its commit): a partition's answers of a whole window travel in as few, as full
    batches as fit, so one produce request per destination and window instead of one per fetched chunk."""

    __slots__ = ("batches",)

    def __init__(self) -> None:
        #: destination (topic, partition) -> its open batch.
        self.batches: dict[tuple[str, int], _Open] = {}

    def __len__(self) -> int:
        return len(self.batches)


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
        self._produce_seconds = metrics.stage_seconds.labels("produce")
        self._clock = clock
        self._wall_clock = wall_clock
        self._waited = 0.0  # of the current write: time the client made us wait, seconds

    async def route(self, producer: ProducerClient, works: Sequence[Work]) -> Routed:
        """Every answer's record (fitted to the size ladder) and destination, for :meth:`write` (exactly_once routes a
        fetched chunk once, then writes it partition by partition: on many partitions the partitioner's per-call
        cost, not its per-key one, would otherwise dominate). Never raises: a failure is kept in the result."""
        started = self._clock()
        try:
            answers = self._fit_all(works)
            try:
                return Routed(answers, await self._destinations(producer, answers))
            except KafkaError as exc:  # no metadata (broker unreachable)
                return Routed(answers, [], exc)
        finally:
            self._produce_seconds.inc(max(0.0, self._clock() - started))

    async def write(
        self,
        producer: ProducerClient,
        works: Sequence[Work],
        keep: OpenBatches | None = None,
        routed: Routed | None = None,
    ) -> list[Sent]:
        """Append ``works``' answers in order and hand every batch to ``producer``. A ``solo`` answer travels in a
        produce request of its own: it is awaited before the next answer is appended, and if it fails the rest is
        not attempted (returned as one :class:`Sent` whose future failed with :class:`NotSentError`).

        With ``keep``, batches that are not full stay open in it (appended to by the next write with the same
        ``keep``) until :meth:`flush`; only full ones (and a ``solo`` answer, after every open batch) are handed over.
        With ``routed`` (:meth:`route` of exactly these ``works``, or a slice of one), the records and destinations are
        not computed again.

        Never raises for a failed write: a batch the client refuses at once gets a failed future.

        Returns:
            The batches in the order they were handed over (the client keeps that order per partition).
        """
        sent: list[Sent] = []
        started = self._clock()
        self._waited = 0.0
        try:
            if routed is None:
                answers = self._fit_all(works)
                try:
                    destinations = await self._destinations(producer, answers)
                except KafkaError as exc:  # no metadata (broker unreachable): this round is retried
                    return [Sent(None, list(works), failed_future(exc))]
            elif routed.error is not None:
                return [Sent(None, list(works), failed_future(routed.error))]
            else:
                answers, destinations = routed.answers, routed.destinations
            timestamp_ms = int(self._wall_clock() * 1000)
            open_batches: dict[tuple[str, int], _Open] = {} if keep is None else keep.batches
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
            if keep is None:
                await self._flush(producer, open_batches, sent)
        finally:
            self._produce_seconds.inc(max(0.0, self._clock() - started - self._waited))
        return sent

    async def flush(self, producer: ProducerClient, keep: OpenBatches) -> list[Sent]:
        """Hand every batch still open in ``keep`` to ``producer`` (emptying it); never raises for a failed write.

        Returns:
            The batches in the order they were handed over.
        """
        sent: list[Sent] = []
        started = self._clock()
        self._waited = 0.0
        try:
            await self._flush(producer, keep.batches, sent)
        finally:
            self._produce_seconds.inc(max(0.0, self._clock() - started - self._waited))
        return sent

    def judge(self, works: Sequence[Work], error: BaseException) -> fate.Action:
        """A producer batch holding ``works`` failed with ``error``: its action (:func:`consumer.fate.of_write`);
        a too-large refusal climbs each record's size ladder here, for both delivery modes."""
        action = fate.of_write(error)
        if action is fate.Action.SIZE_LADDER:
            for work in works:
                self.ladder.refused(work, error)
        return action

    @staticmethod
    async def _destinations(producer: ProducerClient, answers: list[Answer]) -> list[tuple[str, int]]:
        """(topic, partition) of every answer record: the partition ``send`` would choose for its key.

        Raises:
            aiokafka.errors.KafkaError: a topic's metadata cannot be had.
        """
        topics = set(map(_TOPIC, answers))
        if len(topics) == 1:  # the common case (every answer a result, or every one a dead letter): no regrouping
            (topic,) = topics
            partitions = sorted(await producer.partitions_for(topic))
            destination = {partition: (topic, partition) for partition in partitions}
            return list(map(destination.__getitem__, partitions_for_keys(list(map(_KEY, answers)), partitions)))
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

    def _fit_all(self, works: Sequence[Work]) -> list[Answer]:
        """Every answer's record, in order, each as :meth:`_fit` gives it (built in bulk, checked against the size
        ladder at once when they are all far below the limit)."""
        answers, largest = self.records.many(works)
        if not self.ladder.all_fit(largest):
            fits = self.ladder.fits
            for i, (work, (_, key, value, headers)) in enumerate(zip(works, answers, strict=True)):
                if not (work.reduced or fits(key, value, headers)):
                    answers[i] = self._fit(work)
        return answers

    def _fit(self, work: Work) -> Answer:
        """The answer's record, shrunk (result -> dead letter -> reduced) while the client would refuse it."""
        while True:
            answer = self.records.of(work)
            if work.reduced or self.ladder.fits(answer.key, answer.value, answer.headers):
                return answer
            shrink(
                work, MessageSizeTooLargeError(f"{len(answer.value or b'')} bytes exceed producer_max_request_bytes")
            )

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


def count_answers(metrics: Metrics, works: Sequence[Work], now_ms: float) -> None:
    """Metrics of acknowledged answers (once per batch: the records' fields read in bulk, their ages observed as one
    array) and the log line of each dead letter."""
    dead = len(works) - list(map(_ERROR, works)).count(None)
    tombstones = sum(map(_TOMBSTONE, works))
    if tombstones:
        metrics.records.labels("tombstone").inc(tombstones)
    if dead + tombstones < len(works):
        metrics.records.labels("result").inc(len(works) - dead - tombstones)
    if dead:
        metrics.records.labels("dead_letter").inc(dead)
        for work in works:
            error = work.error
            if error is None:
                continue
            metrics.dead_letters.labels(error.reason.value).inc()
            log.warning(
                "dead-lettered correlation_id=%s reason=%s: %s",
                loggable(work.correlation_id),
                error.reason.value,
                error,
            )
    stamps = np.fromiter(map(_TIMESTAMP, works), dtype=np.float64, count=len(works))
    stamps = stamps[stamps >= 0]
    metrics.record_age_seconds.observe_many(np.maximum(0.0, now_ms - stamps) / 1000.0)
