"""Kafka out: results to the results topic, poison records to the dead-letter topic.

Result record: key = the request's key; value = OIP inference response (JSON); headers::

    correlation_id                      the correlation ID, byte-for-byte
    content-type                        application/json (application/octet-stream for a binary-extension response)
    inference-header-content-length     binary-extension responses only: the JSON part's length, bytes
    streaminfer.request.timestamp_ms    the request record's timestamp, ms since the epoch (decimal text)

Dead-letter record: the request's key, value and headers unchanged (null header values stay null; a record
with neither key nor value gets an empty value, since Kafka clients need one of them), followed by these headers
(decimal text for numbers; the ``__connect.errors.*`` names are Kafka Connect's, so DLQ tooling reads them)::

    correlation_id                          the correlation ID (also when the request had none: topic:partition:offset)
    streaminfer.error.reason                one of DeadLetterReason (machine-readable)
    __connect.errors.exception.message      readable message
    __connect.errors.exception.class.name   exception class, e.g. consumer.errors.ValidationError
    __connect.errors.topic                  source topic
    __connect.errors.partition              source partition
    __connect.errors.offset                 source offset
    streaminfer.source.timestamp_ms         source record timestamp, ms since the epoch
    streaminfer.consumer.group              consumer group id

When that record would exceed the producer's max request size, a *reduced* dead letter is written instead: no
value (header ``streaminfer.error.original_value_bytes`` gives its size), the key and header keys and values cut to
1024 bytes, so a poison record can never block its partition.

A record whose value the consumer never kept (above ``max_record_bytes``) or a compressed batch it never unpacked
(above ``max_batch_unpacked_bytes``; see :mod:`consumer.kafka.unpack`) is dead-lettered ``too_large`` without a value:
a record's gets ``streaminfer.error.original_value_bytes``; a batch's stands for all its offsets (the offset header
is its last) and gets::

    streaminfer.source.first_offset         the batch's first offset (its last is __connect.errors.offset)
    streaminfer.source.last_offset          the batch's last offset
    streaminfer.error.compressed_bytes      its compressed payload, bytes
    streaminfer.error.unpacked_bytes_over   the cap it passed (it unpacks to more), bytes

Enriched results (events, ``result_format=enrich``): key = the request's key; value = the event with the model's
outputs (:mod:`consumer.answers.enrich`); headers = the request's own, in order, but for the registry serializers'
``__key_schema_id`` / ``__value_schema_id`` (a reader would decode the result with the request's schema) and the
two below, which come first::

    correlation_id                      the correlation ID, byte-for-byte
    streaminfer.request.timestamp_ms    the request record's timestamp, ms since the epoch (decimal text)

A tombstone (an event request with a null value) is answered with a tombstone: the request's key, a null value and
the same headers, so a compacted results topic forgets the key too (a keyless one gets an empty value: Kafka clients
need a key or a value).

Records are only built here; :mod:`consumer.delivery.publisher` appends them to producer batches.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple

from consumer.answers.headers import CORRELATION_HEADER
from consumer.errors import DeadLetterReason, RecordError
from consumer.kafka.unpack import Dropped
from consumer.oip.proto import answer_headers
from consumer.oip.wire import BINARY_HEADER
from consumer.ops.tracing import TRACE_CONTEXT_HEADERS
from consumer.work import RecordLike, Work

Headers = list[tuple[str, bytes | None]]
#: A record to append, as :meth:`AnswerRecords.many` builds it: (topic, key, value, headers); an
#: :class:`AnswerRecord` is one too.
Answer = tuple[str, bytes | None, bytes | None, Headers]


class AnswerRecord(NamedTuple):
    """What is appended to a producer batch: one result or dead letter."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers


REASON_HEADER = "streaminfer.error.reason"
MESSAGE_HEADER = "__connect.errors.exception.message"
CLASS_HEADER = "__connect.errors.exception.class.name"
TOPIC_HEADER = "__connect.errors.topic"
PARTITION_HEADER = "__connect.errors.partition"
OFFSET_HEADER = "__connect.errors.offset"
TIMESTAMP_HEADER = "streaminfer.source.timestamp_ms"
GROUP_HEADER = "streaminfer.consumer.group"
REQUEST_TIMESTAMP_HEADER = "streaminfer.request.timestamp_ms"

VALUE_DROPPED_HEADER = "streaminfer.error.original_value_bytes"
#: Dead letters of a record batch that was not unpacked (:mod:`consumer.kafka.unpack`): the offsets it spans (the
#: ``__connect.errors.offset`` header is its last), its compressed size and the cap it passed, bytes.
FIRST_OFFSET_HEADER = "streaminfer.source.first_offset"
LAST_OFFSET_HEADER = "streaminfer.source.last_offset"
COMPRESSED_BYTES_HEADER = "streaminfer.error.compressed_bytes"
UNPACKED_OVER_HEADER = "streaminfer.error.unpacked_bytes_over"

_NAME = operator.itemgetter(0)
_JSON = ("content-type", b"application/json")
_OCTET_STREAM = ("content-type", b"application/octet-stream")

#: Request headers an enriched result does not copy: they describe the request's own serialization.
NOT_COPIED = frozenset({CORRELATION_HEADER, REQUEST_TIMESTAMP_HEADER, "__key_schema_id", "__value_schema_id"})

#: Longest message written to a dead letter's message header, characters.
MAX_MESSAGE_CHARS = 1000
#: In a reduced dead letter (the full one is too large to produce), each header value is cut to this, bytes.
MAX_REDUCED_HEADER_BYTES = 1024


def dropped_headers(dropped: Dropped) -> Headers:
    """The headers that describe what a stand-in record dropped: its value's size (one record), or the batch's
    offsets, compressed size and cap (a batch that was not unpacked)."""
    if dropped.compressed_bytes is None:
        return [(VALUE_DROPPED_HEADER, str(dropped.unpacked_bytes).encode())]
    headers: Headers = [
        (FIRST_OFFSET_HEADER, str(dropped.first_offset).encode()),
        (LAST_OFFSET_HEADER, str(dropped.last_offset).encode()),
        (COMPRESSED_BYTES_HEADER, str(dropped.compressed_bytes).encode()),
    ]
    if dropped.error is None:
        headers.append((UNPACKED_OVER_HEADER, str(dropped.unpacked_bytes).encode()))
    return headers


class AnswerRecords:
    """Builds the result or dead-letter record of a :class:`~consumer.work.Work`.

    Args:
        results_topic: topic for responses.
        dead_letter_topic: topic for dead letters.
        group_id: consumer group, written into dead letters.
        enrich: results are enriched events (the request's headers kept).
    """

    def __init__(self, *, results_topic: str, dead_letter_topic: str, group_id: str, enrich: bool = False) -> None:
        self.results_topic = results_topic
        self.dead_letter_topic = dead_letter_topic
        self._group = group_id.encode()
        self._enrich = enrich
        # the last timestamp written and its header: a backlog's records come in runs of one millisecond
        self._stamp: tuple[int, tuple[str, bytes]] = (-1, (REQUEST_TIMESTAMP_HEADER, b"-1"))

    def many(self, works: Sequence[Work]) -> tuple[list[Answer], int]:
        """The record answering each of ``works``, in order (each what :meth:`of` gives), built in one loop for the
        common cases (an OIP JSON result, an enriched event) without a record object per answer.

        Returns:
            The records, and the key and value bytes of the largest when every one has at most three headers (the
            size ladder's quick check, :meth:`~consumer.answers.ladder.SizeLadder.all_fit`); else -1.
        """
        out: list[Answer] = []
        append = out.append
        topic = self.results_topic
        of = self.of
        json_header = _JSON
        correlation = CORRELATION_HEADER
        trace = TRACE_CONTEXT_HEADERS
        not_copied = NOT_COPIED
        last, stamp = self._stamp
        largest = 0  # key and value bytes of the largest answer; -1: one has more than three headers
        enrich = self._enrich
        for work in works:
            result = work.result
            request = work.request
            if (
                result is None
                or work.error is not None
                or work.tombstone
                or (not enrich and (work.result_json_length is not None or (request is not None and request.protobuf)))
            ):
                answer = of(work)
                append(answer)
                last, stamp = self._stamp
                if len(answer[3]) > 3:
                    largest = -1
                elif largest >= 0:
                    largest = max(largest, len(answer[1] or b"") + len(answer[2] or b""))
                continue
            record = work.record
            timestamp = record.timestamp
            if timestamp != last:
                last, stamp = timestamp, (REQUEST_TIMESTAMP_HEADER, str(timestamp).encode())
                self._stamp = (last, stamp)
            key = record.key
            request_headers = record.headers
            headers: Headers
            if enrich:  # an enriched event: kept_headers
                headers = [(correlation, work.correlation_id), stamp]
                for header in request_headers or ():  # a loop: cheaper than a set operation for a header or two
                    if header[0] not in not_copied:
                        headers += [h for h in request_headers if h[0] not in not_copied]
                        if len(headers) > 3:
                            largest = -1
                        break
            else:  # an OIP JSON response: result
                headers = [(correlation, work.correlation_id), json_header, stamp]
                for header in request_headers or ():
                    if header[0] in trace:  # rare: the request's trace context goes along
                        headers += [h for h in request_headers if h[0] in trace]
                        largest = -1
                        break
            if largest >= 0:
                size = len(result) + len(key) if key is not None else len(result)
                if size > largest:
                    largest = size
            append((topic, key, result, headers))
        return out, largest

    def of(self, work: Work) -> AnswerRecord:
        """The record answering ``work``: its result (a tombstone's tombstone), or else its dead letter (reduced when
        ``work.reduced``)."""
        if work.tombstone:  # keyless, it gets an empty value: Kafka clients need a key or a value
            value = None if work.record.key is not None else b""
            return AnswerRecord(
                self.results_topic, work.record.key, value, self.kept_headers(work.record, work.correlation_id)
            )
        if work.error is None and work.result is not None:
            if self._enrich:
                return AnswerRecord(
                    self.results_topic,
                    work.record.key,
                    work.result,
                    self.kept_headers(work.record, work.correlation_id),
                )
            protobuf = work.request is not None and work.request.protobuf
            return self.result(work.record, work.correlation_id, work.result, work.result_json_length, protobuf)
        error = work.error or RecordError(DeadLetterReason.INFERENCE_ERROR, "no result was produced")
        return self.dead_letter(work.record, work.correlation_id, error, reduced=work.reduced)

    def result(
        self,
        record: RecordLike,
        correlation_id: bytes,
        value: bytes,
        json_length: int | None = None,
        protobuf: bool = False,
    ) -> AnswerRecord:
        """The response record for ``record``, with the request's trace context headers.

        Args:
            json_length: a binary data extension response: the JSON part's length, bytes; None for JSON.
            protobuf: ``value`` is a ``ModelInferResponse`` (headers of :func:`consumer.oip.proto.answer_headers`).
        """
        stamp = self._timestamp(record.timestamp)
        if protobuf:
            headers: Headers = [(CORRELATION_HEADER, correlation_id), *answer_headers(), stamp]
        elif json_length is None:
            headers = [(CORRELATION_HEADER, correlation_id), _JSON, stamp]
        else:
            headers = [
                (CORRELATION_HEADER, correlation_id),
                _OCTET_STREAM,
                stamp,
                (BINARY_HEADER, str(json_length).encode()),
            ]
        request_headers = record.headers
        if request_headers and not TRACE_CONTEXT_HEADERS.isdisjoint(map(_NAME, request_headers)):
            headers += [h for h in request_headers if h[0] in TRACE_CONTEXT_HEADERS]
        return AnswerRecord(self.results_topic, record.key, value, headers)

    def _timestamp(self, timestamp: int) -> tuple[str, bytes]:
        """The request timestamp's header (decimal text), the last one's text reused: a backlog's records come in
        runs of one millisecond."""
        last, stamp = self._stamp
        if timestamp != last:
            stamp = (REQUEST_TIMESTAMP_HEADER, str(timestamp).encode())
            self._stamp = (timestamp, stamp)
        return stamp

    def kept_headers(self, record: RecordLike, correlation_id: bytes) -> Headers:
        """An enriched result's (or a tombstone's) headers: the correlation ID and the request's timestamp, then the
        request's own headers but for :data:`NOT_COPIED`."""
        headers: Headers = [(CORRELATION_HEADER, correlation_id), self._timestamp(record.timestamp)]
        request_headers = record.headers
        if request_headers and not NOT_COPIED.issuperset(map(_NAME, request_headers)):
            headers += [h for h in request_headers if h[0] not in NOT_COPIED]
        return headers

    def dead_letter(
        self, record: RecordLike, correlation_id: bytes, error: RecordError, *, reduced: bool = False
    ) -> AnswerRecord:
        """``record`` unchanged, plus the error headers, for the dead-letter topic.

        Args:
            reduced: a dead letter that always fits: no value (its size goes to header
                ``streaminfer.error.original_value_bytes``), the key and every header key and value cut to 1024
                bytes. Used when the full dead letter is larger than the producer's max request size.
        """
        message = str(error)[:MAX_MESSAGE_CHARS]
        cls = type(error)
        headers: Headers = list(record.headers)
        key, value = record.key, record.value
        if type(value) is Dropped:  # never fetched whole: say what was dropped instead
            headers += dropped_headers(value)
            value = None
        if reduced:
            cap = MAX_REDUCED_HEADER_BYTES
            headers = [(k[:cap], v[:cap] if v is not None else None) for k, v in headers]
            correlation_id = correlation_id[:cap]
            key = record.key[:cap] if record.key is not None else None
            size = len(value) if value is not None else -1
            headers.append((VALUE_DROPPED_HEADER, str(size).encode()))
            value = None
        headers += [
            (CORRELATION_HEADER, correlation_id),
            (REASON_HEADER, error.reason.value.encode()),
            (MESSAGE_HEADER, message.encode("utf-8", "backslashreplace")),
            (CLASS_HEADER, f"{cls.__module__}.{cls.__qualname__}".encode()),
            (TOPIC_HEADER, record.topic.encode()),
            (PARTITION_HEADER, str(record.partition).encode()),
            (OFFSET_HEADER, str(record.offset).encode()),
            (TIMESTAMP_HEADER, str(record.timestamp).encode()),
            (GROUP_HEADER, self._group),
        ]
        if value is None and key is None:
            value = b""  # Kafka clients need a key or a value; an empty value stands for "none"
        return AnswerRecord(self.dead_letter_topic, key, value, headers)
