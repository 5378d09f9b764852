"""Errors raised by streaminfer, as data.

Hierarchy::

    StreamInferError                  base of everything raised on purpose here
    ├── ConfigError                   a bad setting or flag; raised at start-up, names the setting
    ├── ModelError                    the ONNX model cannot be served (missing file, no batch axis, provider)
    └── RecordError                   one record cannot be answered; carries a DeadLetterReason and is
        │                             dead-lettered, never raised past the consumer loop
        ├── DecodeError               the bytes are not a valid Open Inference Protocol request
        ├── ValidationError           a well-formed request that does not fit the model's input schema
        └── InferenceError            ONNX Runtime failed, or its output broke the contract, for this record

``RecordError.retriable`` is False for every reason in this set: a poison record is the same poison on the
next try; only an :class:`InferenceError` whose failure is ``transient`` (out of memory) is retriable. What each
class leads to (retry, wait, dead-letter, drop, the size ladder) is decided in one table: :mod:`consumer.fate`.
Transport errors (the broker, the network) are aiokafka's own: the client retries them itself, and a write that still
fails is retried by the publisher (:mod:`consumer.delivery.publisher`) with backoff. Two classes of
them change what is retried:

- :data:`TOO_LARGE`: the broker (or the client's own ``max_request_size`` check) refused a write as too large;
  the same bytes never succeed, so the answer climbs the size ladder (sent alone, then shrunk);
- :data:`BROKEN_PRODUCER`: the idempotent producer's sequence state is lost; only a new producer writes again.

:class:`NotSentError` marks writes that were never attempted because an earlier one of the same round failed.
"""

from __future__ import annotations

from enum import StrEnum

from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    RecordTooLargeError,
    UnknownProducerId,
)


class DeadLetterReason(StrEnum):
    """The fixed, documented set of machine-readable dead-letter reasons.

    The value is written to the dead letter's ``streaminfer.error.reason`` header (the readable message and the
    exception class go to Kafka Connect's ``__connect.errors.exception.message`` and ``.class.name``:
    :mod:`consumer.answers.records`). New reasons are added here, with their action in :data:`consumer.fate.REASONS`,
    and in the reasons table of docs/record-contract.md, which names the function that assigns each (a doc test
    checks all three).
    """

    INVALID_JSON = "invalid_json"
    """The value is absent, empty, not UTF-8, or not JSON (NaN/Infinity tokens included)."""
    NOT_AN_OBJECT = "not_an_object"
    """The value is JSON but not a JSON object."""
    INVALID_REQUEST = "invalid_request"
    """The object is not an OIP inference request: ``inputs`` missing or not a list, an input without
    ``name``/``shape``/``datatype``/``data``, a non-string ``id``, a duplicated input name, a bad ``outputs``."""
    MISSING_INPUT = "missing_input"
    """A model input is not in the request (an empty ``inputs`` list included)."""
    UNKNOWN_INPUT = "unknown_input"
    """The request names an input the model does not have."""
    UNKNOWN_OUTPUT = "unknown_output"
    """``outputs`` asks for an output the model does not have."""
    DATATYPE_MISMATCH = "datatype_mismatch"
    """The declared datatype is unknown or cannot be cast losslessly to the model's, or the data holds values
    of another type (strings, booleans, fractions for an integer input)."""
    OUT_OF_RANGE = "out_of_range"
    """A value does not fit the model's datatype (integer overflow, float beyond float32, non-finite)."""
    SHAPE_MISMATCH = "shape_mismatch"
    """Rank, a static dimension, an empty batch, or the element count disagrees with the shape."""
    RAGGED = "ragged"
    """Nested ``data`` whose rows have different lengths."""
    NULL_VALUE = "null_value"
    """``data`` contains JSON null."""
    TOO_LARGE = "too_large"
    """The value exceeds ``max_record_bytes`` or the request exceeds ``max_record_rows``; for sequence models, a
    sequence longer than the model's ``max_sequence_length`` or rows x length above ``max_record_tokens``."""
    UNDECODABLE_RECORD = "undecodable_record"
    """The Kafka client could not parse the record (e.g. a header key that is not UTF-8); the dead letter carries
    only its topic, partition and offset (no key, value or headers)."""
    INFERENCE_ERROR = "inference_error"
    """ONNX Runtime raised for the batch holding this record, or an output's first dimension did not match
    the batch's rows."""
    RESULT_TOO_LARGE = "result_too_large"
    """The encoded response exceeds the producer's ``producer_max_request_bytes``; the request is dead-lettered."""
    NON_FINITE_OUTPUT = "non_finite_output"
    """The model produced NaN or Inf for this record; JSON cannot carry them, so it is dead-lettered rather
    than written as null."""
    INVALID_IMAGE = "invalid_image"
    """Image models: an image's bytes are not an image Pillow can decode (unknown or unsupported format,
    truncated, empty, corrupt); an image above ``image_max_pixels`` is ``too_large`` instead."""
    MISSING_FIELD = "missing_field"
    """Events (``request_format`` json or avro): a field the input mapping needs is absent or null and the mapping
    gives it no default; with Avro, also every record of a writer schema that lacks such a field."""
    WRONG_TYPE = "wrong_type"
    """Events: a field's value cannot feed its model input losslessly (a string for a number, a fraction or a
    boolean for an integer, a number for a string input, an object or array where a scalar is needed, an array of
    the wrong length, a value out of the input's range); with Avro, also every record of a writer schema whose
    field type cannot (decimal, bytes, a record or map where a scalar is needed)."""
    UNKNOWN_CATEGORY = "unknown_category"
    """Events: a field with a lookup table holds a value that is not in it, and the mapping gives no ``unknown``
    code."""
    FIELD_CLASH = "field_clash"
    """Events, enriched results: the event already has a field named like a model output, which the result would
    overwrite; with Avro, every record of a writer schema that has one."""
    NOT_IN_WIRE_FORMAT = "not_in_wire_format"
    """Avro events: the value is not in the schema registry's wire format (magic byte 0, a 4-byte big-endian
    schema ID, then the payload), e.g. plain JSON or too short."""
    UNKNOWN_SCHEMA_ID = "unknown_schema_id"
    """Avro events: the schema registry does not know the record's schema ID (asked ``unknown_schema_retries``
    times with backoff: a registry follower may not know a new ID for a moment). A registry that does not answer
    is waited out instead: never a dead letter."""
    INVALID_AVRO = "invalid_avro"
    """Avro events: the payload does not decode with its writer schema (truncated, trailing bytes, corrupt)."""
    RESULT_SCHEMA_REFUSED = "result_schema_refused"
    """Avro events, enriched results: the result schema of the record's writer schema is not under the results
    topic's subject and registering it was refused or is turned off (``register_result_schema``)."""


class StreamInferError(Exception):
    """Base class of streaminfer's own errors."""


class ConfigError(StreamInferError):
    """A setting or flag is invalid. The message starts with the setting's name."""


class TopicMissingError(ConfigError):
    """The requests topic does not exist on the cluster (and ``allow_auto_create_topics`` is off)."""


class ModelError(StreamInferError):
    """The model cannot be loaded or served as configured (file, schema, execution provider)."""


class RecordError(StreamInferError):
    """One record cannot be answered and must be dead-lettered.

    Args:
        reason: the machine-readable reason, one of :class:`DeadLetterReason`.
        message: a human-readable explanation naming the input, value or limit at fault.
    """

    def __init__(self, reason: DeadLetterReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def retriable(self) -> bool:
        """Whether the same record may pass on a retry (read by :func:`consumer.fate.of_inference`): never, but for
        a transient :class:`InferenceError`."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason.value!r}, {self.message!r})"


class DecodeError(RecordError):
    """The record's bytes are not a decodable OIP request."""


class ValidationError(RecordError):
    """The request does not fit the model's input schema."""


class InferenceError(RecordError):
    """Inference failed for this record or broke the output contract.

    Attributes:
        transient: why the failure may pass on a retry (one of :data:`TRANSIENT_PATTERNS`' reasons), or None.
    """

    transient: str | None = None

    @property
    def retriable(self) -> bool:
        """A transient failure (``transient`` set: out of memory) may pass when the batch runs again."""
        return self.transient is not None


#: Failures of ONNX Runtime that may pass when the batch runs again: (reason, lower-case substrings of the message).
#: Out of memory: the CUDA provider's "CUDA failure 2: out of memory" / cudaErrorMemoryAllocation, cuDNN's and
#: cuBLAS's ALLOC_FAILED, the BFC arena's "Failed to allocate memory" / "Available memory of ... is smaller than
#: requested bytes", and the CPU allocator's bad_alloc. Anything else (a shape the model refuses, a NaN check, a
#: kernel that is not implemented) fails the same way every time and is never retried.
TRANSIENT_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "out_of_memory",
        (
            "out of memory",
            "failed to allocate",
            "alloc_failed",
            "is smaller than requested bytes",
            "bad_alloc",
            "cudaerrormemoryallocation",
        ),
    ),
)


def transient_reason(exc: BaseException) -> str | None:
    """Why ``exc`` (an ONNX Runtime failure) may pass on a retry (:data:`TRANSIENT_PATTERNS`), or None."""
    if isinstance(exc, MemoryError):
        return "out_of_memory"
    text = str(exc).lower()
    for reason, patterns in TRANSIENT_PATTERNS:
        if any(p in text for p in patterns):
            return reason
    return None


class NotSentError(KafkaError):  # type: ignore[misc]
    """A write that was not attempted because an earlier one of the same round failed; it is simply retried."""


#: Producer errors that mean "this record is too large": retrying the same bytes can never succeed.
TOO_LARGE: tuple[type[BaseException], ...] = (MessageSizeTooLargeError, RecordTooLargeError)
#: Errors after which the idempotent producer's sequence state is broken: only a new producer can write again.
#: A batch the broker refused as too large leaves it so too.
BROKEN_PRODUCER: tuple[type[BaseException], ...] = (
    OutOfOrderSequenceNumber,
    UnknownProducerId,
    InvalidProducerEpoch,
    *TOO_LARGE,
)
