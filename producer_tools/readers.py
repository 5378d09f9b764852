"""How ``streaminfer-results`` reads a result's value into an :class:`Answer`: an Open Inference Protocol response
(``--format oip``), or an enriched event (``--format json|avro``: the request's event plus the model's outputs as
fields) as a JSON object or as registry-framed Avro read with confluent-kafka's own ``AsyncAvroDeserializer``; and
where an enriched result keeps its label and score (:class:`EventFields`)."""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx2  # the HTTP client of confluent-kafka's registry client
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AsyncAvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from consumer.json_object import json_object
from consumer.oip.client import decode_response
from consumer.oip.proto import PROTO_RESPONSE, SELDON_TYPE_HEADER, parse_response
from consumer.oip.wire import BINARY_HEADER
from producer_tools.cli import BadArgument
from producer_tools.events import RegistryUnavailable, field_at, registry_config

#: ``--score-tolerance``'s default, absolute: the float32 sums of a tree ensemble may differ in their last bits with
#: the batch they ran in.
DEFAULT_SCORE_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class EventFields:
    """Where an enriched result keeps the model's answer (dotted paths into the event).

    Attributes:
        label: the predicted class (an integer), compared with the manifest's ``label``.
        score: the score compared with the manifest's ``expected_probability``: a number, or an array whose
            ``score_index`` element is taken.
        score_index: the element of an array ``score`` field (the example's ``probabilities``: 1, class 1).
        score_tolerance: the largest absolute difference that counts as equal (both sides read as float32).
    """

    label: str = "label"
    score: str = "probabilities"
    score_index: int = 1
    score_tolerance: float = DEFAULT_SCORE_TOLERANCE


@dataclass(slots=True)
class Answer:
    """One result or dead letter read back.

    Attributes:
        body: an OIP result's parsed response (``--format oip``).
        event: an enriched result's event (``--format json|avro``).
        score: an enriched result's score (:class:`EventFields`), None when it has none.
        tombstone: a tombstone result (a null or empty value): never read.
        error: why a result could not be read (not JSON, not in the registry's wire format, an unknown schema...).
    """

    correlation_id: str
    kind: str  # "result" | "dead_letter"
    latency_ms: float | None
    timestamp_ms: int
    request_timestamp_ms: int | None
    reason: str | None = None
    label: int | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    event: dict[str, Any] | None = None
    score: float | None = None
    tombstone: bool = False
    error: str | None = None


class ResultReader(Protocol):
    """Reads a result's value into its :class:`Answer` (body or event, label, score, or the error)."""

    async def read(self, answer: Answer, value: bytes, topic: str) -> None: ...

    async def close(self) -> None: ...


class OipResults:
    """``--format oip``: an OIP response (JSON, binary data extension or protobuf); the label is the ``label``
    output of a one-row answer (digits: the class index)."""

    async def read(self, answer: Answer, value: bytes, topic: str) -> None:
        headers = answer.headers
        length = headers.get(BINARY_HEADER)
        if headers.get(SELDON_TYPE_HEADER) == PROTO_RESPONSE:
            body = parse_response(value)
        else:
            body = decode_response(value, int(length) if length is not None else None)
        answer.body = body
        label = body["outputs"].get("label")
        if label is not None and label.size == 1 and label.dtype.kind in "iu":  # digits: the class index
            answer.label = int(label.reshape(-1)[0])

    async def close(self) -> None:
        return None


#: Turns an enriched result's value (and its topic) into the event; raises ValueError for one it cannot read.
EventDecode = Callable[[bytes, str], Awaitable[dict[str, Any]]]


class EventResults:
    """``--format json|avro``: an enriched event; its label and score at :class:`EventFields`' paths.

    Args:
        decode: value -> event (:func:`json_event`, :func:`avro_events`).
        fields: where the label and the score are.
        close: releases what ``decode`` holds (the registry client's connections).
    """

    def __init__(
        self,
        decode: EventDecode,
        fields: EventFields | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._decode = decode
        self.fields = fields or EventFields()
        self._close = close

    async def read(self, answer: Answer, value: bytes, topic: str) -> None:
        try:
            event = await self._decode(value, topic)
        except ValueError as exc:
            answer.error = str(exc) or type(exc).__name__
            return
        answer.event = event
        answer.label = event_label(event, self.fields.label)
        answer.score = event_score(event, self.fields.score, self.fields.score_index)

    async def close(self) -> None:
        if self._close is not None:
            await self._close()


def field_hints(events: Sequence[Mapping[str, Any]], fields: EventFields) -> list[str]:
    """One line per field of ``fields`` (label, score) that none of the enriched result ``events`` has: a mapping
    that renamed the model's outputs puts them elsewhere, and accuracy and scores would read 0 without a word.
    Each line names the flag that says where it is, and the closest top-level field of the results."""
    if not events:
        return []
    names = sorted({str(name) for event in events for name in event})
    lines = []
    for what, path, flag in (("label", fields.label, "--label-field"), ("score", fields.score, "--score-field")):
        if any(_has(event, path) for event in events):
            continue
        close = difflib.get_close_matches(path.split(".")[0], names, n=1, cutoff=0.5)
        guess = f" (perhaps {flag} {close[0]})" if close else ""
        shown = ", ".join(names[:15]) + (", ..." if len(names) > 15 else "")
        lines.append(f"hint: no result has the {what} field {path!r}: name the field of your input_mapping's outputs "
                     f"with {flag} PATH{guess}; the results' fields: {shown}")  # fmt: skip
    return lines


def _has(event: Mapping[str, Any], path: str) -> bool:
    try:
        field_at(dict(event), path)
    except KeyError:
        return False
    return True


def event_label(event: Mapping[str, Any], path: str) -> int | None:
    """The integer at ``path`` of ``event`` (a boolean or a one-element array of one too), else None."""
    try:
        value = field_at(dict(event), path)
    except KeyError:
        return None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def event_score(event: Mapping[str, Any], path: str, index: int) -> float | None:
    """The number at ``path`` of ``event`` (an array: its element ``index``), else None."""
    try:
        value = field_at(dict(event), path)
    except KeyError:
        return None
    if isinstance(value, list):
        if not -len(value) <= index < len(value):
            return None
        value = value[index]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


async def json_event(value: bytes, topic: str) -> dict[str, Any]:
    """A JSON result's event (a registry's JSON Schema framing, magic byte 0 and the schema ID, skipped).

    Raises:
        ValueError: not JSON, or not an object.
    """
    if value[:1] == b"\x00" and len(value) > 5:
        value = value[5:]
    return json_object(
        value, lambda text: ValueError(f"not JSON ({text})"), lambda kind: ValueError(f"a JSON {kind}, not an object")
    )


def avro_events(client: Any) -> EventDecode:
    """Registry-framed Avro results read by confluent-kafka's ``AsyncAvroDeserializer`` (the writer schema fetched
    by its ID from ``client``, an ``AsyncSchemaRegistryClient``, and cached; TopicNameStrategy).

    The decoder raises ValueError for a value it cannot read (not in the wire format, a schema ID the registry does
    not know, a datum that does not decode) and :class:`~producer_tools.events.RegistryUnavailable` when the
    registry does not answer (a connection error, a time-out, HTTP 5xx).
    """
    made: list[Any] = []  # the deserializer: its constructor is a coroutine (made on first use)

    async def decode(value: bytes, topic: str) -> dict[str, Any]:
        if not made:
            # TopicNameStrategy, as the consumer's result schemas (no association lookups of the newest clients)
            made.append(
                await AsyncAvroDeserializer(client, conf={"subject.name.strategy": topic_subject_name_strategy})
            )
        try:
            event = await made[0](value, SerializationContext(topic, MessageField.VALUE))
        except SchemaRegistryError as exc:
            if 400 <= exc.http_status_code < 500 and exc.http_status_code not in (408, 429):  # e.g. 404: unknown ID
                raise ValueError(f"schema registry: {exc}") from None
            raise RegistryUnavailable(f"schema registry: {exc}") from exc
        except (httpx2.TransportError, OSError, TimeoutError) as exc:
            raise RegistryUnavailable(f"schema registry: {type(exc).__name__}: {exc}") from exc
        except (SerializationError, ValueError, EOFError, IndexError) as exc:  # framing, or fastavro on a bad datum
            raise ValueError(str(exc) or type(exc).__name__) from None
        if not isinstance(event, dict):
            raise ValueError(f"an Avro {type(event).__name__}, not a record")
        return event

    return decode


def result_reader(
    result_format: str, fields: EventFields | None = None, registry_url: str | None = None
) -> ResultReader:
    """The reader of ``--format``: OIP responses, JSON events, or Avro events through the registry at
    ``registry_url`` (``mock://...``: confluent-kafka's in-process mock)."""
    if result_format == "oip":
        return OipResults()
    if result_format == "json":
        return EventResults(json_event, fields)
    if registry_url is None:
        raise BadArgument("--schema-registry-url: --format avro needs a schema registry (or set SCHEMA_REGISTRY_URL)")
    client = AsyncSchemaRegistryClient.new_client(registry_config(registry_url))

    async def close() -> None:
        closing = getattr(client, "aclose", None)
        if closing is not None:
            await closing()

    return EventResults(avro_events(client), fields, close)
