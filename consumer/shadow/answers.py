"""``shadow_results_topic``: the candidate's answers, through a producer of their own.

Each answer is the candidate's OIP response (its own ``model_name`` and ``model_version``) with the request's key,
correlation ID, request timestamp and trace headers, as a served result has. Delivery is **at-least-once and
outside exactly_once's transactions**: the producer is idempotent (``acks=all``) but not transactional, nothing it
writes is committed with the requests' offsets, and it never commits offsets; a request redelivered after a
restart or a rebalance (or an aborted transaction) is scored and answered again, and a batch shed under pressure
(the scorer's or this producer's queue full) has no shadow answer. The served results never wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence

from aiokafka.errors import KafkaError

from consumer.answers.records import AnswerRecord
from consumer.kafka.clients import Clients, ProducerClient
from consumer.kafka.partitioner import partitions_for_keys
from consumer.shadow.metrics import ShadowMetrics

log = logging.getLogger(__name__)


class ShadowAnswers:
    """Sends the candidate's answers to ``shadow_results_topic``, each to the partition its key hashes to.

    Args:
        clients: makes the producer (``client_id`` ``<client_id>-shadow``).
        topic: ``shadow_results_topic``.
        metrics: counts answers acked, failed and shed.
        max_pending: batches of answers waiting for the producer, at most; one more is shed (counted).
        client_id: the Kafka client ID.
    """

    def __init__(
        self, clients: Clients, topic: str, metrics: ShadowMetrics, *, max_pending: int, client_id: str
    ) -> None:
        self.topic = topic
        self._clients = clients
        self._metrics = metrics
        self._max_pending = max_pending
        self._client_id = client_id
        self._queue: asyncio.Queue[list[AnswerRecord]] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: ProducerClient | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the producer and start sending.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        self._loop = asyncio.get_running_loop()
        self._producer = await self._clients.producer(self._client_id)
        self._task = asyncio.create_task(self._run(), name="streaminfer-shadow-answers")

    async def stop(self) -> None:
        """Stop sending and close the producer (it flushes what it holds within its request timeout)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._producer is not None:
            try:
                await self._producer.stop()
            except KafkaError as exc:
                log.warning("shadow: closing the shadow_results_topic producer failed: %r", exc)

    def put(self, answers: list[AnswerRecord]) -> None:
        """Queue a batch of answers; callable from any thread (the scorer's)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._put, answers)

    def _put(self, answers: list[AnswerRecord]) -> None:
        if self._queue.qsize() >= self._max_pending:
            self._metrics.answers.labels("shed").inc(len(answers))
            return
        self._queue.put_nowait(answers)

    async def _run(self) -> None:
        while True:
            answers = await self._queue.get()
            await self.send(answers)

    async def send(self, answers: Sequence[AnswerRecord]) -> None:
        """Send one batch of answers and wait for the broker; a failure is counted and logged, never raised."""
        producer = self._producer
        assert producer is not None
        try:
            partitions = sorted(await producer.partitions_for(self.topic))
            by_partition: dict[int, list[AnswerRecord]] = defaultdict(list)
            for answer, partition in zip(
                answers, partitions_for_keys([a.key for a in answers], partitions), strict=True
            ):
                by_partition[partition].append(answer)
            sent: list[tuple[int, asyncio.Future[object]]] = []
            for partition, records in by_partition.items():
                batch = producer.create_batch()
                count = 0
                for a in records:
                    if batch.append(timestamp=None, key=a.key, value=a.value, headers=a.headers) is None:
                        sent.append((count, await producer.send_batch(batch, self.topic, partition=partition)))
                        batch, count = producer.create_batch(), 0
                        batch.append(timestamp=None, key=a.key, value=a.value, headers=a.headers)
                    count += 1
                sent.append((count, await producer.send_batch(batch, self.topic, partition=partition)))
            outcomes = await asyncio.gather(*(future for _, future in sent), return_exceptions=True)
        except KafkaError as exc:
            self._metrics.answers.labels("failed").inc(len(answers))
            log.warning("shadow: %d answers to %s failed: %r", len(answers), self.topic, exc)
            return
        for (count, _), outcome in zip(sent, outcomes, strict=True):
            ok = not isinstance(outcome, BaseException)
            self._metrics.answers.labels("acked" if ok else "failed").inc(count)
            if not ok:
                log.warning("shadow: %d answers to %s failed: %r", count, self.topic, outcome)
