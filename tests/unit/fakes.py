"""In-memory stand-ins for the Kafka clients (``consumer.kafka.clients``' interfaces), a fake ONNX session and a fake
clock, so the delivery modes run in unit tests without a broker, a model file or real time.

- :class:`FakeCluster` holds topic logs (offset order per partition) and committed group offsets.
- :class:`FakeConsumer` serves scripted records of the partitions it is assigned, honours pause/resume/seek,
  records commits and drives rebalances through the subscribed listener (:meth:`FakeConsumer.assign`,
  :meth:`FakeConsumer.revoke`). Its fetch waits for records or for the fake clock, never for real time; as
  aiokafka's, from a revoke until the next assignment it waits for that assignment, however long.
- :class:`FakeProducer` collects batches; each batch's future is resolved by the cluster's policy: acknowledge
  at once (the default), hold until :meth:`FakeCluster.settle`, or fail with a scripted error. Transactional
  producers keep their writes apart until they commit.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import ProducerFenced
from aiokafka.structs import ConsumerRecord

from consumer.model.runner import OnnxRunner
from consumer.signature import ModelSignature


class FakeClock:
    """A monotonic clock that moves only when told to (seconds); ``sleep`` waits for it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._count = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has been advanced past now + ``seconds`` (at once for <= 0)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._count), future))
        await future

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000.0
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())


@dataclass
class Written:
    """One record a producer wrote."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    producer: str


@dataclass
class FakeCluster:
    """Topic logs and group offsets shared by the fake clients.

    Attributes:
        partitions: partitions of every topic the producers write.
        policy: what happens to a sent batch: ``"ack"`` (acknowledged at once), ``"hold"`` (until
            :meth:`settle`), or a callable ``(topic, partition, records) -> exception | None``.
    """

    partitions: int = 4
    policy: Any = "ack"
    logs: dict[tuple[str, int], list[Written]] = field(default_factory=lambda: defaultdict(list))
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    held: list[tuple[asyncio.Future[Any], Callable[[], None], list[Written]]] = field(default_factory=list)
    producers_started: int = 0
    batches: list[list[Written]] = field(default_factory=list)

    def settle(self, error: BaseException | None = None, where: Callable[[list[Written]], bool] | None = None) -> int:
        """Resolve held batches (those ``where`` picks, default all): acknowledged (written) or failed with
        ``error``. Returns how many."""
        kept = []
        count = 0
        for future, write, written in self.held:
            if where is not None and not where(written):
                kept.append((future, write, written))
                continue
            count += 1
            if error is None:
                write()
                future.set_result(None)
            else:
                future.set_exception(error)
        self.held = kept
        return count

    def records(self, topic: str) -> list[Written]:
        """Everything written to ``topic`` (committed, for transactions), partition by partition."""
        return [w for (t, _), log in sorted(self.logs.items()) if t == topic for w in log]


class FakeBatch:
    """aiokafka's ``BatchBuilder``: full after ``capacity`` records."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []

    def append(
        self, *, timestamp: int | None, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]
    ) -> object | None:
        if self.records and len(self.records) >= self.capacity:
            return None
        self.records.append((key, value, list(headers)))
        return object()

    def record_count(self) -> int:
        return len(self.records)


class FakeProducer:
    """A producer writing into the cluster (transactional when given a ``transactional_id``)."""

    def __init__(self, cluster: FakeCluster, name: str, batch_records: int, transactional_id: str | None) -> None:
        self.cluster = cluster
        self.name = name
        self.batch_records = batch_records
        self.transactional_id = transactional_id
        self.in_transaction = False
        self.fenced = False
        self.fatal = False  # begin/abort_transaction refuse, as aiokafka does from FATAL_ERROR
        self.hang = False  # commit_transaction never returns (a coordinator behind a network partition)
        self.pending: list[Written] = []
        self.offsets: dict[TopicPartition, int] = {}
        self.stopped = False
        self.transactions: list[str] = []

    async def start(self) -> None:
        self.cluster.producers_started += 1

    async def stop(self) -> None:
        self.stopped = True

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.batch_records)

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.cluster.partitions))

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        if self.fenced:
            raise ProducerFenced()
        written = [Written(topic, partition, k, v, h, self.name) for k, v, h in batch.records]
        self.cluster.batches.append(written)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def write() -> None:
            if self.transactional_id is not None:
                self.pending.extend(written)
            else:
                self.cluster.logs[(topic, partition)].extend(written)

        policy = self.cluster.policy
        if policy == "hold":
            self.cluster.held.append((future, write, written))
            return future
        error = policy(topic, partition, written) if callable(policy) else None
        if error is None:
            write()
            future.set_result(None)
        else:
            future.set_exception(error)
        return future

    async def begin_transaction(self) -> None:
        if self.fenced:
            raise ProducerFenced()
        if self.fatal:
            raise AssertionError("Invalid state transition TransactionState.FATAL_ERROR -> IN_TRANSACTION")
        assert not self.in_transaction
        self.in_transaction = True

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group_id: str) -> None:
        self.offsets.update(offsets)

    async def commit_transaction(self) -> None:
        if self.fenced:
            raise ProducerFenced()
        if self.hang:
            await asyncio.get_running_loop().create_future()  # aiokafka shields its wait: cancelling it is safe
        for w in self.pending:
            self.cluster.logs[(w.topic, w.partition)].append(w)
        self.cluster.committed.update(self.offsets)
        self.pending, self.offsets, self.in_transaction = [], {}, False
        self.transactions.append("commit")

    async def abort_transaction(self) -> None:
        if self.fatal:  # aiokafka's transaction manager after its sender failed unexpectedly
            raise AssertionError("Invalid state transition TransactionState.FATAL_ERROR -> ABORTING_TRANSACTION")
        self.pending, self.offsets, self.in_transaction = [], {}, False
        self.transactions.append("abort")


def record(
    topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    key: bytes | None = None,
    extra: list[tuple[str, bytes]] | None = None,
) -> ConsumerRecord:
    """A fetched record as aiokafka makes it (timestamp 0, headers: the correlation ID, then ``extra``)."""
    cid = key or f"{topic}:{partition}:{offset}".encode()
    headers = [("correlation_id", cid), *(extra or [])]
    return ConsumerRecord(topic, partition, offset, 0, 0, key, value, None, 0, len(value or b""), headers)


class FakeConsumer:
    """The group member: scripted records, assignment and commits, all in memory."""

    def __init__(self, cluster: FakeCluster, clock: FakeClock) -> None:
        self.cluster = cluster
        self.clock = clock
        self.records: dict[TopicPartition, list[ConsumerRecord]] = defaultdict(list)
        self.positions: dict[TopicPartition, int] = {}
        self._assigned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        self.listener: ConsumerRebalanceListener | None = None
        self.commits: list[dict[TopicPartition, int]] = []
        self.commit_error: BaseException | None = None
        self.pause_calls = 0
        self.resume_calls = 0
        self.fetches = 0
        #: ``committed()`` calls (fresh OffsetFetch requests).
        self.committed_reads = 0
        #: Raised by ``committed()`` while set: the group coordinator does not answer.
        self.committed_error: BaseException | None = None
        self._changed = asyncio.Event()
        self._joined = asyncio.Event()  # cleared from a revoke until the next assignment (aiokafka's reassignment)
        self._joined.set()
        self.started = False
        #: The topics the cluster has (``topics()``): the harness's requests, results and dead-letter topics unless a
        #: test removes one.
        self.existing: set[str] = {"requests", "results", "dlq"}
        #: Raised by ``topics()`` (a metadata request) while set: the cluster does not answer.
        self.topics_error: BaseException | None = None

    # -- test controls
    def add(
        self,
        tp: TopicPartition,
        values: list[bytes],
        keys: list[bytes] | None = None,
        headers: list[list[tuple[str, bytes]]] | None = None,
    ) -> None:
        """Append records to ``tp``'s log (``headers``: each one's extra headers)."""
        log = self.records[tp]
        for i, value in enumerate(values):
            key = keys[i] if keys is not None else None
            log.append(record(tp.topic, tp.partition, len(log), value, key, headers[i] if headers else None))
        self._changed.set()

    async def assign(self, tps: set[TopicPartition]) -> None:
        """The group hands us ``tps``: fetch from their committed offsets."""
        for tp in tps:
            self.positions[tp] = self.cluster.committed.get(tp, 0)
        self._assigned |= tps
        self._joined.set()
        assert self.listener is not None
        await self.listener.on_partitions_assigned(set(tps))
        self._changed.set()

    async def revoke(self, tps: set[TopicPartition]) -> None:
        """The group takes ``tps`` away (after the listener ran). As in aiokafka, a rebalance has begun: fetches
        wait for the next :meth:`assign`, the listener's call included."""
        self._joined.clear()
        assert self.listener is not None
        await self.listener.on_partitions_revoked(set(tps))
        self._assigned -= tps
        self._paused -= tps

    # -- ConsumerClient
    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None:
        self.listener = listener

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]:
        self.fetches += 1
        await self._joined.wait()  # aiokafka's fetched_records: wait_for_assignment() while reassigning, no timeout
        while True:
            out = self._take(partitions, max_records)
            if out:
                await asyncio.sleep(0)
                return out
            self._changed.clear()
            waiter = asyncio.ensure_future(self._changed.wait())
            timer = asyncio.ensure_future(self.clock.sleep(timeout_ms / 1000.0))
            done, _ = await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            timer.cancel()
            if timer in done:
                return {}

    def _take(self, partitions: tuple[TopicPartition, ...], max_records: int | None) -> dict[TopicPartition, list[Any]]:
        budget = max_records or 10**9
        out: dict[TopicPartition, list[Any]] = {}
        for tp in sorted(partitions or self._assigned, key=lambda t: t.partition):
            if tp not in self._assigned or tp in self._paused or budget <= 0:
                continue
            position = self.positions.get(tp, 0)
            got = self.records[tp][position : position + budget]
            if got:
                out[tp] = got
                self.positions[tp] = position + len(got)
                budget -= len(got)
        return out

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, *partitions: TopicPartition) -> None:
        self.pause_calls += 1
        self._paused |= set(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.resume_calls += 1
        self._paused -= set(partitions)
        self._changed.set()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.positions[partition] = offset
        self._changed.set()

    async def position(self, partition: TopicPartition) -> int:
        return self.positions.get(partition, 0)

    async def committed(self, partition: TopicPartition) -> int | None:
        self.committed_reads += 1
        await asyncio.sleep(0)  # a request to the group coordinator
        if self.committed_error is not None:
            raise self.committed_error
        return self.cluster.committed.get(partition)

    async def topics(self) -> set[str]:
        if self.topics_error is not None:
            raise self.topics_error
        return set(self.existing)

    def highwater(self, partition: TopicPartition) -> int | None:
        return len(self.records[partition])

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append(dict(offsets))
        self.cluster.committed.update(offsets)


class FakeClients:
    """Makes the fake consumer (one) and producers (a new one per call, as after a replacement)."""

    def __init__(self, cluster: FakeCluster, clock: FakeClock, batch_records: int = 16) -> None:
        self.cluster = cluster
        self.consumer_ = FakeConsumer(cluster, clock)
        self.batch_records = batch_records
        self.producers: list[FakeProducer] = []
        self.producer_error: BaseException | None = None
        #: While set to an unset event, every producer start (InitProducerId) waits for it.
        self.start_gate: asyncio.Event | None = None
        #: Producer starts waiting at the gate now.
        self.starting = 0

    def consumer(self) -> FakeConsumer:
        return self.consumer_

    async def producer(self, client_id: str, **options: Any) -> FakeProducer:
        if self.producer_error is not None:
            raise self.producer_error
        producer = FakeProducer(self.cluster, client_id, self.batch_records, options.get("transactional_id"))
        if self.start_gate is not None:
            self.starting += 1
            try:
                await self.start_gate.wait()
            finally:
                self.starting -= 1
        await producer.start()
        self.producers.append(producer)
        return producer


class FakeSession:
    """An ONNX Runtime session for the digits signature: label = argmax, probabilities = the first 10 inputs.

    ``fail_when(feeds)`` may say a batch fails (e.g. when a marked row is in it), with ``fail_with`` as ONNX
    Runtime's message.
    """

    def __init__(self, fail_when: Callable[[dict[str, np.ndarray]], bool] | None = None) -> None:
        self.fail_when = fail_when
        self.fail_with = "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : the fake model refuses this batch"
        self.batches: list[int] = []

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = input_feed["input"]
        self.batches.append(int(x.shape[0]))
        if self.fail_when is not None and self.fail_when(input_feed):
            raise RuntimeError(self.fail_with)
        probabilities = np.ascontiguousarray(x[:, :10], dtype=np.float32)
        return [probabilities.argmax(axis=1).astype(np.int64), probabilities]


def fake_runner(signature: ModelSignature, session: FakeSession | None = None, inline: bool = True) -> OnnxRunner:
    """An OnnxRunner over a fake session (no model file, no ORT); ``inline``: as a model whose batches compute in
    microseconds, run on the event loop (else in the inference thread)."""
    runner = OnnxRunner(session or FakeSession(), signature)
    runner.batch_seconds = 0.0 if inline else 1.0
    return runner
