"""One fetched record on its way to an answer, as every stage sees it: :class:`Work`, and the request it carries.

A :class:`Work` is made by the intake for every fetched record, in fetch order. Its states, the stage that moves
it along each arrow, and the fields that show each state::

    fetched --intake.Intake.decode--> decoded (request set)  ---------------------------+
       |                                                                                |
       +--intake--> decoded as a dead letter (error set, request None, answered True)   |
       +--intake--> a tombstone event (``tombstone``, request and error None, answered)  |
                                                                                        v
    queued: stages.Stages.queue puts it in the micro-batcher (batcher.MicroBatcher) by its request's shape
       |
       +--inference.BatchRunner--> inferred: result set (result_json_length for a binary answer),
       |                           or error set (bisection: inference_error; non_finite_output)
       v
    answered: at_least_once: delivery.publisher.Publisher.answered sets ``answered``; the answer is written once
       |      every earlier record of its partition is answered too (``order``: :class:`PartitionOrder`).
       |      exactly_once: the window writes a fetched chunk, in offset order, once all its micro-batches ran
       +--answers.ladder.SizeLadder-->   still answered, rewritten: ``solo`` (sent alone), then error
       |                                   result_too_large with ``reduced`` (the reduced dead letter)
       v
    acknowledged: the broker acknowledged its result or dead letter (``acked``; exactly_once: its transaction
       |          committed)
       v
    committed: ``offsets.done(offset)`` (delivery.at_least_once / delivery.exactly_once), then the committer
               (or the transaction's offsets) commits past it once every earlier offset is done too
               (:mod:`consumer.offsets`)

A revoke drops work of the partition that is not yet acknowledged (``PartitionOrder.live`` False): it is fetched
and answered again by the partition's next owner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from aiokafka import TopicPartition

from consumer.errors import RecordError

if TYPE_CHECKING:
    from consumer.offsets import PartitionOffsets

#: Longest correlation ID written to a log line, bytes (longer ones are cut and marked).
MAX_LOGGED_ID_BYTES = 128


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-record size limits, checked before parsing (bytes) and before allocating tensors (rows).

    Attributes:
        max_record_bytes: largest accepted record value, bytes.
        max_record_rows: largest accepted ``shape[0]``, rows.
        max_record_tokens: sequence models: largest accepted rows x length, tokens (a record is never split, so
            one above the batch budget runs alone at its size, and attention memory grows with rows x length^2).
    """

    max_record_bytes: int = 1_048_576
    max_record_rows: int = 1024
    max_record_tokens: int = 8192


ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]


class Datums(Protocol):
    """A chunk's decoded events, built one by one when asked for (:class:`consumer.events.avro.Datums`)."""

    def datum(self, i: int) -> dict[str, Any]:
        """Event ``i`` of the chunk."""


class Event:
    """A decoded domain event (``request_format`` json or avro), kept beside its tensors for the enriched result.

    Attributes:
        fields: the event as decoded (a JSON object, or the Avro record as fastavro reads it with logical types
            left raw: :mod:`consumer.events.avro`); built on first use where the decoder gave ``source`` and
            ``index`` instead (an Avro chunk whose tensors came from its number columns: nothing on the serving
            path reads the fields, the enriched result is spliced from ``raw``).
        raw: the event's own bytes: the JSON object (a registry's frame left out), or the Avro datum after the
            frame; an enriched result is spliced from them (:mod:`consumer.answers.enrich`).
        schema_id: Avro: the writer schema's ID in the registry; None for JSON.
    """

    __slots__ = ("_fields", "_index", "_source", "raw", "schema_id")

    def __init__(
        self,
        fields: dict[str, Any] | None,
        raw: bytes | memoryview = b"",
        schema_id: int | None = None,
        source: Datums | None = None,
        index: int = 0,
    ) -> None:
        if fields is None and source is None:
            raise ValueError("an event needs its fields or the chunk that builds them")
        self._fields = fields
        self.raw = raw
        self.schema_id = schema_id
        self._source = source
        self._index = index

    @property
    def fields(self) -> dict[str, Any]:
        """The event as decoded (built from ``source`` on first use)."""
        if self._fields is None:
            assert self._source is not None
            self._fields = self._source.datum(self._index)
            self._source = None
        return self._fields

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (self.fields, self.raw, self.schema_id) == (other.fields, other.raw, other.schema_id)

    __hash__ = None  # type: ignore[assignment]  # (mutable, compared by value)

    def __repr__(self) -> str:
        return f"Event(fields={self.fields!r}, raw={self.raw!r}, schema_id={self.schema_id!r})"


class DecodedRequest:
    """A validated request, ready to batch.

    Attributes:
        id: the request's ``id`` or None.
        inputs: model input name -> array already cast to the model's dtype, shape ``[rows, ...]``.
        rows: ``shape[0]`` shared by all inputs.
        outputs: requested output names, or None for all outputs.
        length: sequence models: the request's token length (axis 1); 0 otherwise.
        binary_output: answer in the binary data extension (``parameters.binary_data_output``).
        block: decoded by :func:`decode_chunk`: the arrays of every record of the chunk that declared the same
            inputs, rows one after another (``inputs`` are then views of them, made on first use); None otherwise.
        start: the first row of this request in ``block``.
        protobuf: the record was a protobuf ``ModelInferRequest`` (:mod:`consumer.oip.proto`).
        pending: image models: the request's images, not yet decoded (encoded bytes or ``[H, W, 3]`` uint8), until
            :meth:`consumer.model.vision.ImageEncoder.finish` calls :meth:`complete`; None otherwise.
        event: an event request (``request_format`` json or avro): the decoded event, kept for its enriched result;
            None for an OIP request.
    """

    __slots__ = (
        "_inputs",
        "_shape_key",
        "binary_output",
        "block",
        "event",
        "id",
        "length",
        "outputs",
        "pending",
        "protobuf",
        "rows",
        "start",
    )

    def __init__(
        self,
        id: str | None,
        inputs: dict[str, np.ndarray] | None,
        rows: int,
        outputs: tuple[str, ...] | None,
        length: int = 0,
        binary_output: bool = False,
        block: Mapping[str, np.ndarray] | None = None,
        start: int = 0,
        shape_key: ShapeKey | None = None,
    ) -> None:
        self.id = id
        self._inputs = inputs
        self.rows = rows
        self.outputs = outputs
        self.length = length
        self.binary_output = binary_output
        self.block = block
        self.start = start
        self._shape_key = shape_key
        self.protobuf = False  # a ModelInferRequest: answered with a ModelInferResponse (consumer.oip.proto)
        self.pending: list[Any] | None = None
        self.event: Event | None = None

    def complete(self, inputs: dict[str, np.ndarray]) -> None:
        """Image models: the preprocessed inputs ``[rows, ...]`` of a pending request."""
        self._inputs = inputs
        self.pending = None

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """Model input name -> array ``[rows, ...]`` of the model's dtype."""
        if self._inputs is None:
            assert self.block is not None
            start, end = self.start, self.start + self.rows
            self._inputs = {name: arr[start:end] for name, arr in self.block.items()}
        return self._inputs

    @property
    def shape_key(self) -> ShapeKey:
        """Non-batch shape of every input: requests are only stacked with requests of the same key."""
        if self._shape_key is None:
            self._shape_key = tuple((name, arr.shape[1:]) for name, arr in sorted(self.inputs.items()))
        return self._shape_key

    def __repr__(self) -> str:
        return f"DecodedRequest(id={self.id!r}, rows={self.rows}, shape_key={self.shape_key})"


class RecordLike(Protocol):
    """The fields of aiokafka's ``ConsumerRecord`` used here."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]


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


class Work:
    """One fetched record on its way to an answer.

    Attributes:
        record: the Kafka record (or an :class:`UndecodableRecord`).
        tp: its partition.
        offsets: its partition's offsets of this assignment; ``done`` once the answer is acknowledged.
        correlation_id: echoed on the answer, byte-for-byte.
        request: the validated request, or None for a record to dead-letter.
        error: why it is dead-lettered (set at decode by the intake, by inference, or by the size ladder).
        rows: rows it holds against ``max_in_flight_rows`` (a dead letter counts 1).
        result: the encoded response once inferred; None for a dead letter.
        result_json_length: binary data extension responses: the JSON part's length, bytes.
        enqueued_at: when it was decoded, ``clock()`` seconds.
        answered: its result or error is final; the publisher may write it once every earlier record of its
            partition is answered too.
        acked: the broker acknowledged its answer.
        solo: the broker refused a produce request holding it as too large: send it alone before judging it.
        reduced: write the reduced dead letter (the full one was too large).
        order: its partition's order in the publisher (:class:`PartitionOrder`), once registered; None before.
        tombstone: an event request with a null value: not scored, answered with a tombstone of the same key.
        held: the record's key, value and header bytes as :class:`consumer.budget.InFlight` counted them when it
            was held, bytes; -1 before.
    """

    __slots__ = (
        "acked",
        "answered",
        "correlation_id",
        "enqueued_at",
        "error",
        "held",
        "offsets",
        "order",
        "record",
        "reduced",
        "request",
        "result",
        "result_json_length",
        "rows",
        "solo",
        "tombstone",
        "tp",
    )

    def __init__(
        self,
        record: RecordLike,
        tp: TopicPartition,
        offsets: PartitionOffsets,
        correlation_id: bytes,
        request: DecodedRequest | None,
        error: RecordError | None,
        rows: int,
        enqueued_at: float,
    ) -> None:
        self.record = record
        self.tp = tp
        self.offsets = offsets
        self.correlation_id = correlation_id
        self.request = request
        self.error = error
        self.rows = rows
        self.enqueued_at = enqueued_at
        self.result: bytes | None = None
        self.result_json_length: int | None = None
        self.answered = request is None
        self.acked = False
        self.solo = False
        self.reduced = False
        self.order: PartitionOrder | None = None
        self.tombstone = False
        self.held = -1  # the record's bytes as the in-flight budget counted them (consumer.budget); -1: not yet

    @property
    def offset(self) -> int:
        """The record's offset."""
        return self.record.offset

    def __repr__(self) -> str:
        state = "result" if self.result is not None else (self.error.reason.value if self.error else "pending")
        return f"Work({self.tp.topic}:{self.tp.partition}:{self.record.offset} {state})"


def loggable(correlation_id: bytes) -> str:
    """A correlation ID for a log line: its text (bytes that are not UTF-8 as backslash escapes, control characters
    escaped), at most MAX_LOGGED_ID_BYTES bytes of it."""
    text = correlation_id[:MAX_LOGGED_ID_BYTES].decode("utf-8", "backslashreplace")
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    if len(correlation_id) <= MAX_LOGGED_ID_BYTES:
        return text
    return f"{text}...({len(correlation_id)} bytes)"


class PartitionOrder:
    """One request partition's records of one assignment, in fetch order, until the publisher releases them: a
    record's answer is written only once every earlier record of its partition is answered.

    Attributes:
        queue: the partition's registered records not yet released, in offset order.
        live: False once the partition was revoked (its late answers are ignored).
    """

    __slots__ = ("live", "queue")

    def __init__(self) -> None:
        self.queue: deque[Work] = deque()
        self.live = True

    def release_into(self, out: deque[Work]) -> None:
        """Move the answered prefix of ``queue`` to ``out``."""
        queue = self.queue
        while queue and queue[0].answered:
            out.append(queue.popleft())
