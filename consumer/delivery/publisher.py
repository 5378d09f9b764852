"""at_least_once's publisher: answers released in each request partition's offset order, writes recovered.

:class:`Publisher` registers every fetched record in its partition's order, releases answers to the writer
(:class:`consumer.delivery.writer.AnswerWriter`, shared with exactly_once) only once every earlier record of the
partition is answered (several batches in flight, bisection and dead letters answered at decode cannot reorder them),
acknowledges them to the committer, and recovers from failed writes: it stops writing, waits until every batch in
flight settled, replaces a broken producer, and writes again, in the original order, every answer from the first
failed batch of each destination partition on. So each results partition holds each request partition's results in
offset order; after a failure the answers written again (and any acknowledged after the failed batch) follow in
order, as after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from consumer import fate
from consumer.delivery.writer import AnswerWriter, Sent
from consumer.errors import NotSentError
from consumer.kafka.clients import Clients, ProducerClient
from consumer.ops.metrics import Metrics
from consumer.timeouts import Backoff
from consumer.work import PartitionOrder, Work

log = logging.getLogger(__name__)

#: Longest wait to close a broken producer, seconds (a broker that is gone must not hold the publisher).
CLOSE_TIMEOUT_S = 2.0
#: Writes (each one producer batch per destination partition) handed to the client and not yet settled, at most:
#: the client sends a partition's next batch only once its previous one was acknowledged (one produce request in
#: flight per broker), so a third write would only wait; answers released meanwhile wait here instead and go out
#: together, in fuller batches: fewer produce requests, socket writes and acknowledgements per record.
WRITES_IN_FLIGHT = 2

Sleep = Callable[[float], Awaitable[None]]


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
        self._rounds: dict[int, int] = {}  # per write handed over: its batches not yet settled
        self._round = 0
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
            if not self._unsent or len(self._rounds) >= WRITES_IN_FLIGHT:
                if not self._unsent and not self._unsettled:
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
            self._round += 1
            if batches:
                self._rounds[self._round] = len(batches)
            for entry in batches:
                self._sent.append(entry)
                self._unsettled += 1
                entry.future.add_done_callback(functools.partial(self._settled, entry, self._round))

    def _settled(self, entry: Sent, round_: int, future: asyncio.Future[Any]) -> None:
        entry.settled = True
        self._unsettled -= 1
        left = self._rounds.pop(round_) - 1
        if left:
            self._rounds[round_] = left
        elif self._unsent and not self._failed and not self._writing:
            self._wakeup.set()  # a write in flight settled: what waited for it goes now
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
            action = self._writer.judge(entry.works, error)  # a too-large refusal climbs the ladder
            if action is not fate.Action.RESEND:
                self._metrics.retries.labels("produce", type(error).__name__).inc(len(entry.works))
            if fate.needs_new_producer(error) and broken is None:
                broken = error
            if action not in (fate.Action.SIZE_LADDER, fate.Action.RESEND):
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
                if fate.of_connect(exc) is not fate.Action.WAIT:  # every Kafka error is waited out
                    raise
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
