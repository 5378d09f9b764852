"""Wiring: Kafka in -> decode/validate -> micro-batch -> ONNX Runtime -> Kafka out -> commit.

at_least_once tasks (created in :meth:`StreamInferApp.start`, cancelled and drained in :meth:`StreamInferApp.stop`)::

    fetch   getmany() -> decode + validate each record -> batcher (or straight to dead letters); every assigned
            partition is paused while in-flight rows >= max_in_flight_rows (fetch calls go on: the member stays)
    batch   batcher.next_batch() -> ORT in the inference thread -> split -> one publish task per batch;
            a failing batch is bisected until the culprit is alone
    publish send every answer (result or dead letter), await the broker's acks, retry failures with backoff,
            then mark the records done in the offset tracker
    commit  commits each partition's highest contiguous done offset, at most every commit_interval_ms

An offset is committed only after the answer of that record and of every record before it in its partition was
acknowledged (acks=all, idempotent producer). A crash replays what was not committed: duplicates are possible,
losses are not.

exactly_once runs one task instead: fetch a chunk, answer it, and per partition write the answers and the next
offset in one transaction of that partition's transactional producer (:mod:`consumer.transactions`).

Shutdown (:meth:`StreamInferApp.stop`, on SIGTERM/SIGINT): stop fetching, flush the batcher, finish and publish
the batches in flight (exactly_once: finish the open transaction), commit, leave the group; all within
``shutdown_grace_s``. What does not finish in time is not committed and will be redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    IllegalOperation,
    InvalidProducerEpoch,
    KafkaError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RecordTooLargeError,
    UnknownProducerId,
)

from consumer.batcher import MicroBatcher
from consumer.codec import (
    DecodedRequest,
    Limits,
    binary_header_length,
    correlation_id,
    decode_request,
    encode_response,
    encode_response_binary,
)
from consumer.config import Settings
from consumer.errors import DeadLetterReason, DecodeError, InferenceError, RecordError
from consumer.metrics import Metrics
from consumer.offsets import OffsetTracker, PartitionOffsets
from consumer.runner import OnnxRunner, non_finite_outputs, split
from consumer.security import kafka_security_kwargs
from consumer.sequence import BatchBuffers, TextEncoder, bucket, length_buckets
from consumer.sink import RecordLike, Sink, open_sink
from consumer.transactions import PartitionTransactions

log = logging.getLogger(__name__)

#: Producer errors that mean "this record is too large": retrying the same bytes can never succeed.
TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)
#: Errors after which the idempotent producer's sequence state is broken: only a new producer can write again.
#: A batch the broker refused as too large leaves it so too.
BROKEN_PRODUCER = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch, *TOO_LARGE)


class NotSentError(KafkaError):  # type: ignore[misc]
    """A write that was not attempted because an earlier one of the same round failed; it is simply retried."""


#: Longest correlation ID written to a log line, bytes (longer ones are cut and marked).
MAX_LOGGED_ID_BYTES = 128

#: First and largest pause between retries of a failed result or dead-letter write, seconds.
RETRY_BACKOFF_FIRST_S = 0.1
RETRY_BACKOFF_MAX_S = 5.0
#: Longest wait for each of the final commit, leaving the group and closing the producers, seconds. The drain
#: gets shutdown_grace_s minus SHUTDOWN_RESERVE_S, so the whole stop fits in shutdown_grace_s.
SHUTDOWN_STEP_TIMEOUT_S = 2.0
SHUTDOWN_RESERVE_S = 3 * SHUTDOWN_STEP_TIMEOUT_S


#: Records read one by one per partition while isolating an undecodable record, at most.
ISOLATION_STEP_LIMIT = 10_000
#: Micro-batches in flight at once: one running in the ONNX Runtime thread while the next is assembled into the
#: other set of input buffers and the previous one's responses are encoded on the event loop.
PIPELINE_DEPTH = 2


@dataclass(frozen=True, slots=True)
class UndecodableRecord:
    """Stands in for a record the Kafka client could not parse: only its coordinates are known."""

    topic: str
    partition: int
    offset: int
    error: str
    timestamp: int = -1
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def loggable(correlation_id: bytes) -> str:
    """A correlation ID for a log line: repr of at most MAX_LOGGED_ID_BYTES bytes."""
    if len(correlation_id) <= MAX_LOGGED_ID_BYTES:
        return repr(correlation_id)
    return f"{correlation_id[:MAX_LOGGED_ID_BYTES]!r}...({len(correlation_id)} bytes)"


@dataclass(slots=True)
class Work:
    """One fetched record on its way to an answer."""

    record: RecordLike
    tp: TopicPartition
    offsets: PartitionOffsets
    correlation_id: bytes
    request: DecodedRequest | None = None
    error: RecordError | None = None
    result: bytes | None = None
    result_json_length: int | None = None  # binary data extension: the JSON part's length, bytes
    enqueued_at: float = 0.0  # clock() seconds
    rows: int = field(default=0)
    reduced: bool = False  # the full dead letter was too large: write the reduced one
    solo: bool = False  # the broker refused its produce request as too large: send it alone before judging it


class StreamInferApp:
    """The consumer service.

    Args:
        settings: validated settings.
        runner: a loaded (and warmed) ONNX runner.
        metrics: metrics on an injected registry.
        clock: monotonic clock in seconds (batch deadlines, stage timings).
        wall_clock: epoch clock in seconds (record age against Kafka timestamps only).
    """

    def __init__(
        self,
        settings: Settings,
        runner: OnnxRunner,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._limits = Limits(settings.max_record_bytes, settings.max_record_rows, settings.max_batch_tokens)
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._sequence = runner.signature.sequence
        self._buckets = length_buckets(self._sequence.max_length) if self._sequence is not None else ()
        self._per_token = {o.name for o in runner.signature.outputs if len(o.shape) >= 2 and o.shape[1] is None}
        self._text = (
            TextEncoder(settings.tokenizer_path, self._sequence, settings.text_input_name)
            if settings.tokenizer_path is not None and self._sequence is not None
            else None
        )
        self._batcher: MicroBatcher[Work] = self._new_batcher(settings.max_batch_delay_ms)
        dtypes = {spec.name: spec.dtype for spec in runner.signature.inputs}
        pads = self._sequence.pad_values if self._sequence is not None else None
        #: Input buffers of the batches in flight (PIPELINE_DEPTH) and of exactly_once's sequential batches.
        self._slots: asyncio.Queue[BatchBuffers] = asyncio.Queue()
        for _ in range(PIPELINE_DEPTH):
            self._slots.put_nowait(BatchBuffers(dtypes, pads))
        self._serial_buffers = BatchBuffers(dtypes, pads)
        self._batches: set[asyncio.Task[None]] = set()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._sink: Sink | None = None
        self._executor: ThreadPoolExecutor | None = None
        #: the decode/validate/tokenize thread
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streaminfer-decode")
        self._tasks: list[asyncio.Task[None]] = []
        self._publishing: set[asyncio.Task[None]] = set()
        self._in_flight_rows = 0
        self._exactly_once = settings.delivery == "exactly_once"
        self._txns: PartitionTransactions | None = None
        self._chunk_lock = asyncio.Lock()  # exactly_once: a rebalance waits for the chunk in its transaction
        self._stop_requested = asyncio.Event()
        self._crashed = asyncio.Event()
        self._producer_lock = asyncio.Lock()
        self._solo_lock = asyncio.Lock()
        self._producer_generation = 0
        #: exactly_once: (topic, partition, offset) -> times the broker refused the record as too large.
        self._size_verdicts: dict[tuple[str, int, int], int] = {}
        self._answered = asyncio.Event()  # set whenever a publish task finished (revoke waits on it)
        self._commit_wanted = asyncio.Event()
        self._stopping = False
        self._last_progress = clock()
        metrics.seconds_since_progress.set_function(lambda: self._clock() - self._last_progress)
        self._lag_total = 0
        self.joined = False
        self.failed: BaseException | None = None

    # ----------------------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Connect the producer, join the group and start the background tasks.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        s = self.settings
        security = kafka_security_kwargs(s)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streaminfer-ort")
        try:
            await self._open_producer(security)
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        self._consumer = AIOKafkaConsumer(
            **security,
            bootstrap_servers=s.bootstrap_servers,
            group_id=s.group_id,
            group_instance_id=s.group_instance_id,
            client_id=f"{s.client_id}-consumer",
            enable_auto_commit=False,
            auto_offset_reset=s.auto_offset_reset,
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
            isolation_level="read_committed" if self._exactly_once else "read_uncommitted",
        )
        if self._exactly_once:
            self._txns = PartitionTransactions(s, security)
        self._consumer.subscribe([s.requests_topic], listener=_Rebalance(self))
        try:
            await self._consumer.start()
        except BaseException:
            await self._consumer.stop()
            if self._producer is not None:
                await self._producer.stop()
            self._executor.shutdown(wait=False)
            raise
        if self._exactly_once:
            self._tasks = [asyncio.create_task(self._transactional_loop(), name="streaminfer-transactional")]
        else:
            self._tasks = [
                asyncio.create_task(self._fetch_loop(), name="streaminfer-fetch"),
                asyncio.create_task(self._batch_loop(), name="streaminfer-batch"),
                asyncio.create_task(self._commit_loop(), name="streaminfer-commit"),
            ]
        for task in self._tasks:
            task.add_done_callback(self._on_task_done)

    async def _open_producer(self, security: dict[str, Any]) -> None:
        """Start the shared idempotent producer (acks=all) and its sink.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        self._sink = await open_sink(self.settings, security, f"{self.settings.client_id}-producer")
        self._producer = self._sink.producer
        self._producer_generation += 1

    async def _replace_producer(self, generation: int, cause: BaseException) -> None:
        """The idempotent producer's sequence state broke (e.g. the broker refused a batch as too large, and
        the batches behind it get OutOfOrderSequenceNumber forever): start a new producer, once per breakage."""
        async with self._producer_lock:
            if generation != self._producer_generation:
                return  # another publish task already replaced it
            log.warning("replacing the producer after %r", cause)
            old = self._producer
            await self._open_producer(kafka_security_kwargs(self.settings))
            if old is not None:
                closing: Awaitable[None] = old.stop()
                await self._quietly("closing the broken producer", closing)

    async def run(self, stop: asyncio.Event) -> int:
        """Start, serve until ``stop`` is set or a task fails, then stop. Returns the process exit code."""
        await self.start()
        stop_task = asyncio.create_task(stop.wait())
        crash_task = asyncio.create_task(self._crashed.wait())
        try:
            await asyncio.wait([stop_task, crash_task, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_task.cancel()
            crash_task.cancel()
            await self.stop()
        return 1 if self.failed is not None else 0

    async def stop(self) -> None:
        """Stop fetching, drain batches and publishes within ``shutdown_grace_s``, commit, leave the group."""
        if self._stopping:
            return
        self._stopping = True
        if self._exactly_once:
            await self._stop_transactional()
            return
        fetch, batch, commit = self._tasks or (None, None, None)
        if fetch is not None:
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        self._batcher.close()
        try:
            await asyncio.wait_for(self._drain(batch), timeout=self._drain_budget_s())
        except TimeoutError:
            log.warning(
                "shutdown grace of %.1f s exceeded; unanswered records stay uncommitted and will be redelivered",
                self.settings.shutdown_grace_s,
            )
        rest = [t for t in (batch, commit) if t is not None] + list(self._batches) + list(self._publishing)
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        if self._consumer is not None:
            await self._quietly("final commit", self._commit())
        await self._close_clients()

    async def _close_clients(self) -> None:
        """Leave the group, close the producers and the inference thread."""
        if self._txns is not None:
            await self._quietly("closing the transactional producers", self._txns.close_all())
        if self._consumer is not None:
            await self._quietly("leaving the group", self._consumer.stop())
        if self._producer is not None:
            await self._quietly("closing the producer", self._producer.stop())
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._decoder.shutdown(wait=True, cancel_futures=True)
        log.info("stopped")

    def _drain_budget_s(self) -> float:
        """The part of shutdown_grace_s for draining; the rest is kept for commit, leaving and closing."""
        return max(0.5, self.settings.shutdown_grace_s - SHUTDOWN_RESERVE_S)

    async def _quietly(self, what: str, step: Awaitable[None]) -> None:
        """Run a shutdown step with a time limit; a broker that is gone must not turn a stop into a crash."""
        try:
            await asyncio.wait_for(step, timeout=SHUTDOWN_STEP_TIMEOUT_S)
        except (KafkaError, TimeoutError, OSError) as exc:
            log.warning("%s failed during shutdown: %r", what, exc)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves
            log.warning("%s was cancelled inside the Kafka client during shutdown", what)

    async def _stop_transactional(self) -> None:
        """exactly_once: let the chunk in its transaction finish (within the grace), then close everything."""
        self._stop_requested.set()
        if self._tasks:
            loop_task = self._tasks[0]
            try:
                await asyncio.wait_for(asyncio.shield(loop_task), timeout=self._drain_budget_s())
            except TimeoutError:
                log.warning("shutdown grace exceeded; the open transaction is aborted, its records redelivered")
            except Exception as exc:  # noqa: BLE001 (the loop's own failure is already recorded)
                log.debug("transactional loop ended with %r", exc)
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
        await self._close_clients()

    async def _drain(self, batch: asyncio.Task[None] | None) -> None:
        if batch is not None:
            await batch
        while self._publishing:
            await asyncio.gather(*list(self._publishing))

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """A main task must never end, a publish task never raise: either is a bug, and the process exits 1
        (uncommitted records are redelivered after the restart)."""
        if task.cancelled() or self._stopping:
            return
        exc = task.exception()
        if exc is None and task not in self._tasks:
            return  # a publish task that finished
        self.failed = exc or RuntimeError(f"task {task.get_name()} ended")
        self._crashed.set()
        log.error("background task %s failed: %r", task.get_name(), self.failed, exc_info=exc)

    @property
    def ready(self) -> bool:
        """Warm (the runner is warmed before start), joined and not stopping."""
        return self.joined and not self._stopping and self.failed is None

    def liveness(self) -> tuple[bool, str]:
        """(alive, reason): False when a background task died, or when the consumer lags but has neither fetched
        nor committed for ``stall_timeout_s``. Reads plain attributes only: safe from the HTTP thread."""
        if self.failed is not None:
            return False, f"background task failed: {self.failed!r}"
        idle_s = self._clock() - self._last_progress
        if self._lag_total > 0 and idle_s > self.settings.stall_timeout_s:
            return False, f"stalled: lag {self._lag_total} records, no fetch or commit for {idle_s:.0f} s"
        return True, "ok"

    @property
    def lag(self) -> int:
        """Sum of the per-partition lag last computed, records."""
        return self._lag_total

    @property
    def in_flight_rows(self) -> int:
        """Rows fetched and not yet answered."""
        return self._in_flight_rows

    # ----------------------------------------------------------------------------------------------- fetch
    def _new_batcher(self, delay_ms: float) -> MicroBatcher[Work]:
        tokens = self.settings.max_batch_tokens if self._sequence is not None else None
        return MicroBatcher(self.settings.max_batch_size, delay_ms, self._clock, max_batch_tokens=tokens)

    def _queue(self, batcher: MicroBatcher[Work], work: Work) -> None:
        """Put a decoded request in its batching group: its non-batch shape, or for a sequence model its length
        bucket (cost: rows x the bucket's length in tokens)."""
        request = work.request
        assert request is not None
        if self._sequence is None:
            batcher.put(work, work.rows, request.shape_key)
            return
        bound = bucket(request.length, self._buckets)
        batcher.put(work, work.rows, bound, tokens=work.rows * bound)

    async def _fetch_loop(self) -> None:
        assert self._consumer is not None
        s = self.settings
        while True:
            self._backpressure()
            # Every record holds at least one row: fetch no more records than rows are free.
            room = max(1, s.max_in_flight_rows - self._in_flight_rows)
            try:
                fetched = await self._consumer.getmany(
                    timeout_ms=s.fetch_timeout_ms, max_records=min(s.fetch_max_records, room)
                )
            except UnicodeDecodeError as exc:  # the client cannot parse a record: find it and dead-letter it
                fetched = await self._isolate_undecodable(exc)
            if fetched:
                self._last_progress = self._clock()
            await self._ingest(fetched)
            self._update_lag()

    async def _parse_all(self, fetched: dict[TopicPartition, list[Any]]) -> list[DecodedRequest | RecordError]:
        """Decode and validate every fetched record. Text is tokenized in the decode thread (the Rust tokenizer
        releases the GIL), so a chunk of large texts never holds up the event loop (heartbeats, publishes,
        /healthz's loop check). Tensor requests are decoded inline: a thread hop per chunk costs a pure-Python
        pipeline about half its throughput in GIL hand-overs (digits bench: 8.9k against 17.2k records/s)."""
        records = [rec for recs in fetched.values() for rec in recs]
        if self._text is None or not records:
            return [self._parse(rec) for rec in records]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decoder, lambda: [self._parse(rec) for rec in records])

    async def _ingest(self, fetched: dict[TopicPartition, list[Any]]) -> None:
        """Decode fetched records: requests go to the batcher, poison straight to a publish task."""
        parsed = iter(await self._parse_all(fetched))
        dead: list[Work] = []
        for tp, records in fetched.items():
            offsets = self._tracker.partition(tp)
            for rec in records:
                work = self._decode(rec, offsets, next(parsed))
                if work.request is None:
                    dead.append(work)
                else:
                    self._queue(self._batcher, work)
                self._add_rows(work.rows)
        if dead:
            self._spawn_publish(dead)

    def _parse(self, rec: RecordLike) -> DecodedRequest | RecordError:
        """Decode and validate one record (thread-safe: reads only the signature, limits and tokenizer)."""
        started = self._clock()
        try:
            if isinstance(rec, UndecodableRecord):
                raise DecodeError(DeadLetterReason.UNDECODABLE_RECORD, rec.error)
            return decode_request(
                rec.value,
                self.runner.signature,
                self._limits,
                json_length=binary_header_length(rec.headers),
                text=self._text,
            )
        except RecordError as err:
            return err
        finally:
            self.metrics.preprocess_seconds.observe(self._clock() - started)

    def _decode(self, rec: RecordLike, offsets: PartitionOffsets, parsed: DecodedRequest | RecordError) -> Work:
        """Track one record and turn its parse outcome into a Work holding either a request or the error to
        dead-letter. A dead letter counts one row against ``max_in_flight_rows``: it holds memory until
        acknowledged too. Runs on the event loop (the offset tracker is not thread-safe)."""
        offsets.track(rec.offset)
        if isinstance(parsed, RecordError):
            work = self._work(rec, offsets, None)
            work.error = parsed
            work.rows = 1
            return work
        work = self._work(rec, offsets, parsed)
        work.rows = parsed.rows
        return work

    async def _isolate_undecodable(self, exc: Exception) -> dict[TopicPartition, list[Any]]:
        """The Kafka client raised while parsing a fetched batch (e.g. a header key that is not UTF-8), without
        saying which record. Rewind every partition to the first offset not yet seen, then read the partitions
        one at a time, one record at a time, until the culprit raises again; it becomes an
        :class:`UndecodableRecord` (dead-lettered as ``undecodable_record``) and the partition skips it.

        Returns:
            The records read meanwhile, the stand-in included, to be answered as usual.
        """
        assert self._consumer is not None
        consumer = self._consumer
        log.error("the Kafka client cannot decode a fetched record (%r); isolating it", exc)
        assigned = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
        for tp in assigned:
            resume_at = self._tracker.partition(tp).next_offset
            if resume_at is not None:
                consumer.seek(tp, resume_at)  # what the failed fetch swallowed is read again
        was_paused = consumer.paused()
        consumer.pause(*assigned)
        found: dict[TopicPartition, list[Any]] = {}
        try:
            for tp in assigned:
                consumer.resume(tp)
                try:
                    for _ in range(ISOLATION_STEP_LIMIT):
                        got = await consumer.getmany(tp, timeout_ms=self.settings.fetch_timeout_ms, max_records=1)
                        if not got:
                            break
                        found.setdefault(tp, []).extend(got.get(tp, []))
                except UnicodeDecodeError as bad:
                    offset = await consumer.position(tp)
                    stand_in = UndecodableRecord(tp.topic, tp.partition, offset, error=f"{type(bad).__name__}: {bad}")
                    found.setdefault(tp, []).append(stand_in)
                    consumer.seek(tp, offset + 1)
                    log.error("record %s:%d cannot be decoded by the Kafka client; dead-lettering it", tp, offset)
                    return found
                finally:
                    consumer.pause(tp)
            return found
        finally:
            consumer.resume(*(set(assigned) - was_paused))

    def _backpressure(self) -> None:
        """Pause every assigned partition while in-flight rows are at the limit; resume below it. Fetch calls go
        on while paused, so the member stays in the group however slow the model is."""
        assert self._consumer is not None
        full = self._in_flight_rows >= self.settings.max_in_flight_rows
        if full:
            unpaused = self._consumer.assignment() - self._consumer.paused()
            if unpaused:
                self._consumer.pause(*unpaused)
                self.metrics.paused.set(1)
        elif self._consumer.paused():
            self._consumer.resume(*self._consumer.paused())
            self.metrics.paused.set(0)

    def _update_lag(self) -> None:
        """Lag per partition: the high watermark from the last fetch minus the first uncommitted offset."""
        assert self._consumer is not None
        total = 0
        for tp, offsets in self._tracker.items():
            highwater = self._consumer.highwater(tp)
            position = offsets.unanswered_from
            if highwater is None or position is None:
                continue
            lag = max(0, highwater - position)
            total += lag
            self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
        self._lag_total = total

    def _work(self, rec: RecordLike, offsets: PartitionOffsets, request: DecodedRequest | None) -> Work:
        cid = correlation_id(
            rec.headers, request.id if request else None, rec.key, f"{rec.topic}:{rec.partition}:{rec.offset}"
        )
        return Work(rec, TopicPartition(rec.topic, rec.partition), offsets, cid, request, enqueued_at=self._clock())

    def _add_rows(self, rows: int) -> None:
        self._in_flight_rows += rows
        self.metrics.in_flight_rows.set(self._in_flight_rows)

    # ----------------------------------------------------------------------------------------------- batch
    async def _batch_loop(self) -> None:
        """Take due micro-batches and keep up to PIPELINE_DEPTH of them in flight (each holds a set of input
        buffers until ONNX Runtime is done with it); when closed and empty, wait for the last ones."""
        while (batch := await self._batcher.next_batch()) is not None:
            self.metrics.batch_queue_wait_seconds.observe(self._clock() - batch[0].enqueued_at)
            buffers = await self._slots.get()
            task = asyncio.create_task(self._run_batch(batch, buffers), name="streaminfer-batch-run")
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)
            task.add_done_callback(self._on_task_done)
        while self._batches:
            await asyncio.gather(*list(self._batches))

    async def _run_batch(self, batch: list[Work], buffers: BatchBuffers) -> None:
        try:
            await self._infer(batch, buffers)
        finally:
            self._slots.put_nowait(buffers)
        self._spawn_publish(batch)

    def _assemble(self, requests: Sequence[DecodedRequest], buffers: BatchBuffers) -> tuple[dict[str, Any], int, int]:
        """Feeds for ONNX Runtime: the requests copied into ``buffers`` (fixed shapes stacked; sequences padded to
        the longest). A lone request is fed as it is. Returns (feeds, rows, padded length in tokens or 0)."""
        if self._sequence is None:
            if len(requests) == 1:
                return dict(requests[0].inputs), requests[0].rows, 0
            feeds, rows = buffers.stack([r.inputs for r in requests])
            return feeds, rows, 0
        if len(requests) == 1:
            feeds, rows, length = dict(requests[0].inputs), requests[0].rows, requests[0].length
        else:
            feeds, rows, length = buffers.pad([r.inputs for r in requests])
        real = sum(r.rows * r.length for r in requests)
        self.metrics.batch_padding_ratio.observe(rows * length / max(1, real))
        return feeds, rows, length

    async def _infer(self, batch: Sequence[Work], buffers: BatchBuffers) -> None:
        """Run ``batch`` and set each item's ``result`` or ``error``. A failing batch is bisected so that only
        the culprit is dead-lettered (inference_error) and its neighbours get results."""
        requests = [w.request for w in batch if w.request is not None]
        feeds, rows, length = self._assemble(requests, buffers)
        started = self._clock()
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self.runner.run, feeds, rows)
        except InferenceError as err:
            if len(batch) == 1:
                batch[0].error = err
                log.warning("inference failed for correlation_id=%s: %s", loggable(batch[0].correlation_id), err)
                return
            # Bisect: halves that run get their results; only a record that fails alone is dead-lettered.
            # A model whose batch axis is declared dynamic but only runs at batch 1 ends up answered record
            # by record.
            self.metrics.batch_failures.inc()
            mid = len(batch) // 2
            await self._infer(batch[:mid], buffers)
            await self._infer(batch[mid:], buffers)
            return
        self.metrics.inference_seconds.observe(self._clock() - started)
        self.metrics.batch_rows.observe(rows)
        names = self.runner.signature.output_names
        for work, request, part in zip(batch, requests, split(outputs, [r.rows for r in requests]), strict=True):
            chosen = [(n, self._unpad(n, part[n], length, request.length)) for n in (request.outputs or names)]
            bad = non_finite_outputs(dict(chosen))
            if bad:
                work.error = InferenceError(
                    DeadLetterReason.NON_FINITE_OUTPUT, f"outputs {bad} hold NaN or Inf for this record"
                )
                continue
            response_id = work.correlation_id.decode("utf-8", "backslashreplace")
            try:
                if request.binary_output:
                    work.result, work.result_json_length = encode_response_binary(
                        response_id, self.runner.signature, chosen
                    )
                else:
                    work.result = encode_response(response_id, self.runner.signature, chosen)
            except (KeyError, TypeError, ValueError) as exc:  # an output dtype OIP JSON cannot carry
                work.error = InferenceError(
                    DeadLetterReason.INFERENCE_ERROR, f"response cannot be encoded: {type(exc).__name__}: {exc}"
                )

    def _unpad(self, name: str, arr: Any, padded: int, length: int) -> Any:
        """A per-token output (axis 1 dynamic in the graph and equal to the padded length, e.g. token embeddings
        ``[rows, sequence, dim]``) cut back to the request's own length."""
        if not padded or length >= padded or arr.ndim < 2 or arr.shape[1] != padded:
            return arr
        return arr[:, :length] if name in self._per_token else arr

    # ----------------------------------------------------------------------------------------------- publish
    def _spawn_publish(self, items: list[Work]) -> None:
        task = asyncio.create_task(self._publish(items), name="streaminfer-publish")
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)
        task.add_done_callback(self._on_task_done)

    async def _publish(self, items: list[Work]) -> None:
        """Send every answer, retry failed sends with backoff until acknowledged, then mark the offsets done."""
        pending = items
        backoff = RETRY_BACKOFF_FIRST_S
        while pending:
            generation = self._producer_generation
            acks = await self._send_all(pending)
            broken = next((a for a in acks if isinstance(a, BROKEN_PRODUCER)), None)
            if broken is not None:
                await self._replace_producer(generation, broken)
            failed: list[Work] = []
            now_ms = self._wall_clock() * 1000.0
            for work, ack in zip(pending, acks, strict=True):
                if isinstance(ack, TOO_LARGE):
                    self._judge_size(work, ack)
                    failed.append(work)
                    continue
                if isinstance(ack, BaseException):
                    log.warning("write for correlation_id=%s failed, retrying: %r", loggable(work.correlation_id), ack)
                    failed.append(work)
                    continue
                work.offsets.done(work.record.offset)
                self._count_answer(work, now_ms)
            pending = failed
            if pending:
                self.metrics.produce_retries.inc(len(pending))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
        self._add_rows(-sum(w.rows for w in items))
        self._answered.set()
        self._commit_wanted.set()

    async def _send_all(self, works: Sequence[Work], sink: Sink | None = None) -> list[Any]:
        """Send ``works``; each ``solo`` one is awaited before the next is queued, so it travels in a produce
        request of its own. Returns each write's acknowledgement or exception, in order."""
        futures: list[asyncio.Future[Any]] = []
        halted = False
        for work in works:
            if halted:  # a lone write failed: the producer is suspect, the rest waits for the next round
                future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                future.set_exception(NotSentError("an earlier write of this round failed"))
            elif work.solo:  # one lone write at a time across all publish tasks: two never share a batch
                async with self._solo_lock:
                    future = await self._send(work, sink)
                    await asyncio.wait([future])
                halted = future.exception() is not None
            else:
                future = await self._send(work, sink)
            futures.append(future)
        return await asyncio.gather(*futures, return_exceptions=True)

    def _judge_size(self, work: Work, exc: BaseException) -> None:
        """The broker refused a produce request as too large. That request may have held other records too, so
        the record is first sent alone; refused alone, it is shrunk (result -> dead letter -> reduced)."""
        if work.solo:
            self._shrink(work, exc)
        else:
            work.solo = True

    def _count_answer(self, work: Work, now_ms: float) -> None:
        """Metrics and the per-record log line of an acknowledged answer."""
        if work.error is None:
            self.metrics.records.labels("result").inc()
        else:
            self.metrics.records.labels("dead_letter").inc()
            self.metrics.dead_letters.labels(work.error.reason.value).inc()
            log.warning(
                "dead-lettered correlation_id=%s reason=%s: %s",
                loggable(work.correlation_id),
                work.error.reason.value,
                work.error,
            )
        if work.record.timestamp >= 0:  # a stand-in for an undecodable record has no timestamp
            self.metrics.record_age_seconds.observe(max(0.0, now_ms - work.record.timestamp) / 1000.0)

    async def _send(self, work: Work, sink: Sink | None = None) -> asyncio.Future[Any]:
        """Queue one answer on ``sink`` (default: the shared one); a result too large for the producer becomes a
        dead letter. Never raises: a send that fails at once yields a failed future so the caller retries it."""
        sink = sink or self._sink
        assert sink is not None
        try:
            if work.error is None and work.result is not None:
                try:
                    return await sink.send_result(
                        work.record, work.correlation_id, work.result, work.result_json_length
                    )
                except TOO_LARGE as exc:
                    self._shrink(work, exc)
            if work.error is None:  # unreachable by construction: every item gets a result or an error
                work.error = RecordError(DeadLetterReason.INFERENCE_ERROR, "no result was produced")
            error = work.error
            if not work.reduced:
                try:
                    return await sink.send_dead_letter(work.record, work.correlation_id, error.reason, error)
                except TOO_LARGE:
                    work.reduced = True
            return await sink.send_dead_letter(work.record, work.correlation_id, error.reason, error, reduced=True)
        except KafkaError as exc:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    @staticmethod
    def _shrink(work: Work, exc: BaseException) -> None:
        """A write was too large: a result becomes a result_too_large dead letter, a dead letter a reduced one."""
        if work.error is None and work.result is not None:
            work.error = RecordError(
                DeadLetterReason.RESULT_TOO_LARGE, f"response of {len(work.result)} bytes: {exc!r}"
            )
            work.result = None
            work.result_json_length = None
        else:
            work.reduced = True

    # ----------------------------------------------------------------------------------------------- exactly once
    async def _transactional_loop(self) -> None:
        """exactly_once: fetch a chunk, answer it, and commit each partition's answers with its offset in one
        transaction; then fetch the next chunk."""
        assert self._consumer is not None
        s = self.settings
        while not self._stop_requested.is_set():
            try:
                fetched = await self._consumer.getmany(timeout_ms=s.fetch_timeout_ms, max_records=s.fetch_max_records)
            except UnicodeDecodeError as exc:
                fetched = await self._isolate_undecodable(exc)
            if fetched:  # progress is counted on committed transactions only: a chunk can fail again and again
                async with self._chunk_lock:
                    await self._transactional_chunk(fetched)
            self._update_lag()

    async def _transactional_chunk(self, fetched: dict[TopicPartition, list[Any]]) -> None:
        batcher = self._new_batcher(0)
        chunk: dict[TopicPartition, list[Work]] = {}
        parsed = iter(await self._parse_all(fetched))
        for tp, records in fetched.items():
            offsets = self._tracker.partition(tp)
            works = chunk[tp] = [self._decode(rec, offsets, next(parsed)) for rec in records]
            for work in works:
                self._apply_size_verdict(work)
                if work.request is not None:
                    self._queue(batcher, work)
        batcher.close()
        while (batch := batcher.pop_ready(self._clock())) is not None:
            await self._infer(batch, self._serial_buffers)
        await asyncio.gather(*(self._commit_transaction(tp, works) for tp, works in chunk.items()))

    async def _commit_transaction(self, tp: TopicPartition, works: list[Work]) -> None:
        """Answers of ``works`` (one partition, in offset order) and the partition's next offset, atomically.
        A fenced producer means the partition has a new owner: drop it. Any other failure aborts and rewinds
        the partition to the chunk's first offset, so the chunk is fetched and answered again."""
        assert self._txns is not None
        assert self._consumer is not None
        try:
            await self._txns.open(tp)
            producer = self._txns.producer(tp)
            await producer.begin_transaction()
            # _send shrinks what the producer refuses as too large before it is queued; a write that fails later
            # puts the transaction in error, so it is aborted and the chunk answered again (a record the broker
            # refuses as too large is remembered: sent alone next time, then shrunk).
            acks = await self._send_all(works, self._txns.sink(tp))
            for work, ack in zip(works, acks, strict=True):
                if isinstance(ack, TOO_LARGE):
                    key = (tp.topic, tp.partition, work.record.offset)
                    self._size_verdicts[key] = self._size_verdicts.get(key, 0) + 1
            failure = next((a for a in acks if isinstance(a, BaseException)), None)
            if failure is not None:
                raise failure
            next_offset = works[-1].record.offset + 1
            await producer.send_offsets_to_transaction({tp: next_offset}, self.settings.group_id)
            await producer.commit_transaction()
        except (ProducerFenced, InvalidProducerEpoch, IllegalOperation) as exc:
            # IllegalOperation: aiokafka's answer to sends after its producer was fenced (not a KafkaError).
            # Another producer with this transactional.id exists: the partition's new owner (we are about to be
            # revoked) or a restarted instance. Nothing of this chunk became visible; if the partition is still
            # ours, rewind so a fresh producer answers it again.
            log.warning("producer of %s fenced: %r", tp, exc)
            await self._txns.close(tp)
            self._rewind(tp, works[0].record.offset)
            return
        except KafkaError as exc:
            log.warning("transaction for %s failed, aborting and re-reading %d records: %r", tp, len(works), exc)
            self.metrics.produce_retries.inc(len(works))
            try:
                if isinstance(exc, BROKEN_PRODUCER):
                    raise exc  # its sequence state is lost: only a new producer (which aborts the txn) helps
                await self._txns.producer(tp).abort_transaction()
            except (KafkaError, KeyError) as abort_exc:
                log.warning("abort for %s failed (%r); restarting its producer", tp, abort_exc)
                with contextlib.suppress(KafkaError):
                    await self._txns.reopen(tp)
            self._rewind(tp, works[0].record.offset)
            await asyncio.sleep(RETRY_BACKOFF_FIRST_S)
            return
        now_ms = self._wall_clock() * 1000.0
        offsets = works[0].offsets
        for work in works:
            offsets.done(work.record.offset)
            self._count_answer(work, now_ms)
            self._size_verdicts.pop((tp.topic, tp.partition, work.record.offset), None)
        self._tracker.mark_committed({tp: next_offset})
        self.metrics.commits.inc()
        self._last_progress = self._clock()

    def _rewind(self, tp: TopicPartition, offset: int) -> None:
        """Answer ``tp`` again from ``offset`` (if it is still ours); its committed position, and so its lag and
        the stall check, stay as they were."""
        assert self._consumer is not None
        if tp in self._consumer.assignment():
            self._tracker.rewind(tp)
            self._consumer.seek(tp, offset)
        else:
            self._tracker.forget({tp})

    def _apply_size_verdict(self, work: Work) -> None:
        """exactly_once: what earlier tries of this record's transaction learnt about its size (see _judge_size):
        1 = send alone, 2 = a request becomes a result_too_large dead letter (a dead letter: reduced), 3 = reduced."""
        level = self._size_verdicts.get((work.tp.topic, work.tp.partition, work.record.offset), 0)
        if level == 0:
            return
        work.solo = True
        if level >= 2 and work.request is not None:
            work.error = RecordError(DeadLetterReason.RESULT_TOO_LARGE, "the broker refused the response as too large")
            work.request = None
            level -= 1
        if level >= 2:
            work.reduced = True

    # ----------------------------------------------------------------------------------------------- commit
    async def _commit_loop(self) -> None:
        interval_s = self.settings.commit_interval_ms / 1000.0
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted.clear()
            await self._commit()
            if interval_s:
                await asyncio.sleep(interval_s)  # throttle: at most one commit per interval

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit the committable positions; failures (a rebalance in progress) are counted, never fatal."""
        assert self._consumer is not None
        offsets = self._tracker.committable(only)
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            self.metrics.commit_failures.labels(type(exc).__name__).inc()
            log.warning("commit of %s failed: %r", offsets, exc)
            return
        self._tracker.mark_committed(offsets)
        self.metrics.commits.inc()
        self._last_progress = self._clock()
        self._update_lag()

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Rebalance: drop queued work of revoked partitions (their new owner answers it), give work already
        running or publishing ``revoke_timeout_ms`` to be acknowledged, commit what is done, forget the rest."""
        self.joined = False  # not ready while the group rebalances
        if not revoked:
            return
        gone = set(revoked)
        if self._exactly_once:
            await self._revoke_transactional(gone)
            return
        dropped = self._batcher.discard(lambda w: w.tp in gone)
        if dropped:
            self._add_rows(-sum(w.rows for w in dropped))
            self.metrics.revoked_dropped.inc(len(dropped))
        deadline = self._clock() + self.settings.revoke_timeout_ms / 1000.0
        while self._unanswered(gone, dropped) and (remaining := deadline - self._clock()) > 0:
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), remaining)
        await self._commit(gone)
        self._tracker.forget(gone)
        for tp in gone:
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(tp.topic, str(tp.partition))
        log.info("partitions revoked: %s (%d queued records dropped)", sorted(str(tp) for tp in gone), len(dropped))

    async def _revoke_transactional(self, gone: set[TopicPartition]) -> None:
        """exactly_once: wait (within revoke_timeout_ms) for the chunk in its transaction, then close the revoked
        partitions' producers. Whatever was not committed is fenced by the new owner and answered by it."""
        assert self._txns is not None
        try:
            await asyncio.wait_for(self._chunk_lock.acquire(), self.settings.revoke_timeout_ms / 1000.0)
        except TimeoutError:
            log.warning("revoke: the current transaction did not finish in time; the new owner fences it")
        else:
            self._chunk_lock.release()
        for tp in gone:
            await self._txns.close(tp)
        self._tracker.forget(gone)
        log.info("partitions revoked: %s", sorted(str(tp) for tp in gone))

    def _unanswered(self, tps: set[TopicPartition], dropped: list[Work]) -> bool:
        """Whether records of ``tps`` are still running or publishing (dropped ones never will be)."""
        never = Counter(w.tp for w in dropped)
        return any(self._tracker.partition(tp).unfinished > never[tp] for tp in tps)

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Count the rebalance and mark the group joined. exactly_once: start the new partitions' transactional
        producers first, which fences any zombie still writing for them."""
        if self._txns is not None:
            for tp in assigned:
                await self._txns.open(tp)
        self.metrics.rebalances.inc()
        self.joined = True
        log.info("partitions assigned: %s", sorted(str(tp) for tp in assigned))


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, app: StreamInferApp) -> None:
        self._app = app

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._app.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._app.on_assigned(assigned)
