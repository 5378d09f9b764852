"""The stages both delivery modes are made of, built once from the settings (:func:`build_stages`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient

from consumer import fate
from consumer.answers.enrich import EnrichedAnswers
from consumer.answers.ladder import SizeLadder
from consumer.answers.outputs import Answers
from consumer.answers.records import AnswerRecords
from consumer.batcher import MicroBatcher
from consumer.config import Settings
from consumer.delivery.writer import AnswerWriter, count_answers
from consumer.events.decode import EventDecoder
from consumer.events.mapping import InputMapping, load_mapping
from consumer.events.registry import Schemas, client_config, value_subject
from consumer.inference import BatchRunner
from consumer.intake import Intake
from consumer.kafka.clients import Clients
from consumer.kafka.source import Source
from consumer.model.record import RangeCheck, load_record
from consumer.model.runner import OnnxRunner
from consumer.model.sequence import TextEncoder
from consumer.model.vision import ImageEncoder
from consumer.offsets import OffsetTracker
from consumer.ops.metrics import Metrics
from consumer.ops.progress import Progress
from consumer.ops.tracing import Tracing
from consumer.shadow.candidate import load_candidate
from consumer.shadow.scorer import ShadowScorer, build_shadow
from consumer.timeouts import Backoff, within
from consumer.work import Limits, Work

log = logging.getLogger(__name__)

#: Longest wait for each of the final commit, leaving the group and closing the producers, seconds.
SHUTDOWN_STEP_TIMEOUT_S = 2.0

Sleep = Callable[[float], Awaitable[None]]
Fail = Callable[[BaseException, str], None]


@dataclass
class Stages:
    """What a delivery mode composes.

    Attributes:
        settings: the consumer settings.
        metrics: every stage's metrics.
        clients: makes the Kafka clients.
        source: the requests consumer.
        intake: fetched records -> work items.
        inference: micro-batches -> results.
        writer: answers -> producer batches (with the size ladder).
        tracker: what may be committed, per assigned partition.
        progress: when records were last fetched or offsets committed.
        clock: monotonic seconds (deadlines, stage times).
        wall_clock: epoch seconds (record age against Kafka timestamps, record timestamps).
        sleep: ``asyncio.sleep`` or a fake that a test's clock resolves.
        fail: reports a failed background task (the process then stops with exit code 1).
        tracing: OpenTelemetry spans (:mod:`consumer.ops.tracing`), or None when traces are off.
        schemas: Avro events: the schema registry's writer and result schemas; None otherwise.
        shadow: ``shadow_model_path``: the candidate's scorer, offered each micro-batch once its answers were
            handed over (:mod:`consumer.shadow`); None otherwise.
    """

    settings: Settings
    metrics: Metrics
    clients: Clients
    source: Source
    intake: Intake
    inference: BatchRunner
    writer: AnswerWriter
    tracker: OffsetTracker[TopicPartition]
    progress: Progress
    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    sleep: Sleep
    fail: Fail
    tracing: Tracing | None = None
    schemas: Schemas | None = None
    shadow: ShadowScorer | None = None
    #: Whether the group was joined once (the "serving" line is logged then, not before).
    served: bool = False

    def assigned(self, assigned: set[TopicPartition]) -> None:
        """Log an assignment; the first one says the consumer now serves."""
        names = sorted(str(tp) for tp in assigned)
        if self.served:
            log.info("partitions assigned: %s", names)
            return
        self.served = True
        log.info("serving: joined group %r, partitions assigned: %s", self.settings.group_id, names)

    @property
    def max_in_flight_rows(self) -> int:
        """Rows the consumer may hold: ``max_in_flight_rows``, for an image model no more than
        ``max_in_flight_images`` (an image is a row, and holds its preprocessed tensor)."""
        s = self.settings
        if self.intake.images is None:
            return s.max_in_flight_rows
        return min(s.max_in_flight_rows, s.max_in_flight_images)

    def batcher(self, delay_ms: float) -> MicroBatcher[Work]:
        """A micro-batcher with the settings' limits (tokens too, for a sequence model); a static-batch model's
        micro-batches hold at most its N rows (one ONNX Runtime run, padded to N), a solo model's one request."""
        s = self.settings
        signature = self.inference.runner.signature
        static = signature.static_batch
        rows = 1 if signature.solo else s.max_batch_size if static is None else min(s.max_batch_size, static)
        return MicroBatcher(rows, delay_ms, self.clock, max_batch_tokens=self.inference.batch_tokens, sleep=self.sleep)

    def queue(self, batcher: MicroBatcher[Work], works: list[Work]) -> None:
        """Put decoded requests in their batching lanes (:meth:`~consumer.inference.BatchRunner.lane`)."""
        lane = self.inference.lane
        entries = []
        for work in works:
            assert work.request is not None
            key, tokens = lane(work.request)
            entries.append((work, work.rows, key, tokens))
        batcher.put_many(entries)

    async def start_shadow(self) -> None:
        """Start the shadow scorer's thread and producer, if any (:mod:`consumer.shadow`).

        Raises:
            aiokafka.errors.KafkaError: ``shadow_results_topic``'s producer cannot reach the broker.
        """
        if self.shadow is not None:
            await self.shadow.start()

    async def stop_shadow(self) -> None:
        """Stop the shadow scorer, if any, once the served answers are done with (started or not)."""
        if self.shadow is not None:
            await self.shadow.stop()

    def mine(self, works: list[Work], fetched: Collection[TopicPartition] | None = None) -> list[Work]:
        """``works`` but for the records of partitions revoked while their chunk was decoded (dropped: the fate
        table's ``partition_revoked``; their tracker entries are forgotten): the same for both delivery modes.

        Args:
            fetched: the partitions of the chunk ``works`` were decoded from (a superset of theirs), if known: while
                all of them are still assigned, no record's partition is looked at.
        """
        assigned = self.source.consumer.assignment()
        if fetched is not None and assigned.issuperset(fetched):
            return works
        stale = {w.tp for w in works} - assigned
        if not stale:
            return works
        self.tracker.forget(stale)
        return [w for w in works if fate.of_partition(w.tp, stale) is not fate.Action.DROP]

    def done(self, works: Sequence[Work]) -> None:
        """The answers of ``works`` were acknowledged (at_least_once) or their transaction committed (exactly_once):
        their offsets are done, they are counted (and traced when traces are on), their size-ladder rungs
        forgotten. The same for both delivery modes; each then commits its own way."""
        for work in works:
            work.offsets.done(work.record.offset)
        count_answers(self.metrics, works, self.wall_clock() * 1000.0)
        if self.tracing is not None:
            self.tracing.answered(works, self.clock())
        self.writer.ladder.forget(works)

    async def within(self, step: Awaitable[object], seconds: float, unless: asyncio.Event | None = None) -> bool:
        """:func:`consumer.timeouts.within` on the injected ``sleep``: whether ``step`` finished in ``seconds``
        (and before ``unless`` was set)."""
        return await within(step, seconds, self.sleep, unless)

    async def quietly(self, what: str, step: Awaitable[None]) -> None:
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


def build_stages(
    settings: Settings,
    runner: OnnxRunner,
    metrics: Metrics,
    clients: Clients,
    *,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    sleep: Sleep,
    fail: Fail,
    tracing: Tracing | None = None,
    mapping: InputMapping | None = None,
    candidate: OnnxRunner | None = None,
) -> Stages:
    """Every stage, wired to one tracker and one progress mark.

    Args:
        mapping: events (``request_format`` json or avro): the input mapping (:func:`consumer.events.mapping.
            load_mapping`, checked when the model was loaded); None: loaded here.
        candidate: ``shadow_model_path``'s model, loaded and checked (:func:`consumer.shadow.candidate.
            load_candidate`); None: loaded here when the setting is set.

    Raises:
        consumer.errors.ModelError: the tokenizer cannot be loaded, the model cannot be fed from events as mapped,
            or the shadow candidate cannot be loaded.
        consumer.errors.ConfigError: ``validation_record`` cannot be read; the shadow candidate is refused.
    """
    s = settings
    sequence = runner.signature.sequence
    text = (
        TextEncoder(s.tokenizer_path, sequence, s.text_input_name)
        if s.tokenizer_path is not None and sequence is not None
        else None
    )
    prep = runner.signature.image
    images = (
        ImageEncoder(
            prep,
            s.image_input_name,
            max_pixels=s.image_max_pixels,
            threads=s.image_threads,
            max_images=s.max_in_flight_images,
            observe=metrics.image_seconds.observe_many,
        )
        if prep is not None
        else None
    )
    limits = Limits(s.max_record_bytes, s.max_record_rows, s.max_record_tokens)
    events, enriched, schemas = _events(s, runner, metrics, limits, mapping, clock, sleep)  # before any client
    tracker: OffsetTracker[TopicPartition] = OffsetTracker()
    progress = Progress(clock)
    source = Source(
        clients.consumer(),
        s.requests_topic,
        tracker,
        metrics,
        progress,
        fetch_timeout_ms=s.fetch_timeout_ms,
        fetch_is_progress=s.delivery == "at_least_once",
        clock=clock,
        auto_create=s.allow_auto_create_topics,
        required={"results_topic": s.results_topic, "dead_letter_topic": s.dead_letter_topic},
        sleep=sleep,
    )
    ranges = (
        RangeCheck(load_record(s.validation_record).ranges, metrics.input_out_of_range)
        if s.validation_record is not None
        else None
    )
    intake = Intake(runner.signature, limits, text, metrics, clock, images, events, ranges)
    records = AnswerRecords(
        results_topic=s.results_topic, dead_letter_topic=s.dead_letter_topic, group_id=s.group_id, enrich=s.enrich
    )
    writer = AnswerWriter(records, SizeLadder(s.producer_max_request_bytes), metrics, clock, wall_clock)
    candidate = candidate or load_candidate(s, runner)
    shadow = build_shadow(s, candidate, runner.signature, metrics.registry, clients, clock) if candidate else None
    return Stages(
        settings=s,
        metrics=metrics,
        clients=clients,
        source=source,
        intake=intake,
        inference=BatchRunner(
            runner,
            metrics,
            clock,
            s.max_batch_tokens,
            retries=s.inference_retries,
            backoff=backoff(s),
            sleep=sleep,
            tracing=tracing,
            answers=Answers(runner.signature, enriched),
        ),
        writer=writer,
        tracker=tracker,
        progress=progress,
        clock=clock,
        wall_clock=wall_clock,
        sleep=sleep,
        fail=fail,
        tracing=tracing,
        schemas=schemas,
        shadow=shadow,
    )


def _events(
    s: Settings,
    runner: OnnxRunner,
    metrics: Metrics,
    limits: Limits,
    mapping: InputMapping | None,
    clock: Callable[[], float],
    sleep: Sleep,
) -> tuple[EventDecoder | None, EnrichedAnswers | None, Schemas | None]:
    """Events (``request_format`` json or avro): the decoder, the enriched answers' encoder (``result_format``
    enrich) and, for Avro, the schema registry's schemas; (None, None, None) for OIP requests."""
    if s.request_format == "oip":
        return None, None, None
    signature = runner.signature
    mapping = mapping or load_mapping(signature, s.input_mapping, s.enrich)
    schemas = None
    if s.request_format == "avro":
        schemas = Schemas(
            AsyncSchemaRegistryClient(client_config(s)),
            mapping,
            signature,
            value_subject(s.results_topic) if s.enrich else None,
            register=s.register_result_schema,
            unknown_retries=s.unknown_schema_retries,
            backoff=backoff(s),
            clock=clock,
            sleep=sleep,
            reachable=lambda ok: metrics.schema_registry_reachable.set(1 if ok else 0),
            url=s.schema_registry_url or "",
        )
    result_fields = [name for _, name in mapping.outputs] if s.enrich else []
    decoder = EventDecoder(s.request_format, mapping, limits, schemas, result_fields)
    enriched = EnrichedAnswers(signature, mapping, s.request_format, schemas) if s.enrich else None
    return decoder, enriched, schemas


def backoff(s: Settings) -> Backoff:
    """The retry backoff of the settings (``retry_backoff_ms`` doubling up to ``retry_backoff_max_ms``)."""
    return Backoff(s.retry_backoff_ms / 1000.0, s.retry_backoff_max_ms / 1000.0)


async def wait_until(
    done: Callable[[], bool], event: asyncio.Event, deadline: float, clock: Callable[[], float], sleep: Sleep
) -> bool:
    """Wait until ``done()`` (re-checked whenever ``event`` is set) or ``clock()`` reaches ``deadline``.

    Returns:
        ``done()`` at the end.
    """
    while not done() and (remaining := deadline - clock()) > 0:
        event.clear()
        waiter = asyncio.ensure_future(event.wait())
        timer = asyncio.ensure_future(sleep(remaining))
        try:
            await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            timer.cancel()
    return done()
