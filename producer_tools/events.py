"""Domain events for ``streaminfer-produce --format json|avro``: read from a JSONL file, one JSON object a line, and
encoded as a plain JSON object or as Confluent-framed Avro.

Avro is written by confluent-kafka's own ``AvroSerializer`` against a schema registry (TopicNameStrategy: subject
``<topic>-value``; the schema registered if absent), so each value is what any Confluent producer writes: magic byte
0, the 4-byte big-endian schema ID, the Avro binary body. Every event is checked against the schema (fastavro) before
the registry is asked anything, so a bad event is named by its line and nothing is registered or sent.

Fields an events file carries for checking, not for the topic (:data:`EXPECTATION_FIELDS`): ``true_label`` (the
held-out truth), ``expected_label`` and ``expected_probability`` (what a direct ONNX Runtime run of the model gave;
models/breast_cancer/build.py writes all three) go to the manifest (as ``label``, ``expected_label`` and
``expected_probability``) and are taken off the event before it is encoded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema
from fastavro.schema import SchemaParseException
from fastavro.validation import ValidationError, validate

from consumer.json_object import json_object
from producer_tools.cli import BadArgument, ClusterFault

#: Fields of an event that are expectations for checking: the manifest takes them, the record does not carry them.
EXPECTATION_FIELDS = ("true_label", "expected_label", "expected_probability")
#: One event: a JSON object.
Event = dict[str, Any]
#: Turns an event into a record value.
Encoder = Callable[[Event], bytes]


class RegistryUnavailable(ClusterFault, RuntimeError):
    """The schema registry could not be reached or refused a request; the message names the URL and the error."""


def read_events(path: Path, limit: int | None = None) -> list[Event]:
    """The events of a JSONL file (at most ``limit``), in file order; blank lines are skipped.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not a JSON object (its line number named).
    """
    events: list[Event] = []
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if limit is not None and len(events) >= limit:
                break
            if not line.strip():
                continue
            events.append(_line_event(line, number))
    return events


def _line_event(line: bytes, number: int) -> Event:
    """Line ``number`` (1-based) of an events file, an event.

    Raises:
        ValueError: the line is not JSON, or not an object.
    """
    return json_object(
        line,
        lambda text: ValueError(f"line {number}: not JSON ({text})"),
        lambda _kind: ValueError(f"line {number}: not a JSON object"),
    )


def field_at(event: Event, path: str) -> Any:
    """The value at a dotted ``path`` (``clinic.region``) of ``event``.

    Raises:
        KeyError: a step of the path is missing or not an object.
    """
    value: Any = event
    for step in path.split("."):
        if not isinstance(value, dict) or step not in value:
            raise KeyError(path)
        value = value[step]
    return value


def key_of(event: Event, key_field: str, number: int) -> bytes:
    """The record key: the UTF-8 text of the scalar at ``key_field`` (a string as it is, a number or a boolean as
    JSON writes it).

    Raises:
        BadArgument: the field is missing, null, an object or an array (event ``number`` named).
    """
    try:
        value = field_at(event, key_field)
    except KeyError:
        raise BadArgument(f"--key-field {key_field}: event {number} has no such field") from None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool | int | float):
        return orjson.dumps(value)
    raise BadArgument(f"--key-field {key_field}: event {number} holds {type(value).__name__}, not a string or number")


class Expectations(NamedTuple):
    """What an event's answer is checked against (each None when the events file does not say).

    Attributes:
        label: the held-out truth (``true_label``): accuracy.
        expected_label: the label a direct ONNX Runtime run gave (``expected_label``): agreement.
        expected_probability: the probability of class 1 that run gave (``expected_probability``).
    """

    label: int | None
    expected_label: int | None
    expected_probability: float | None


def take_expectations(event: Event, number: int) -> Expectations:
    """Remove :data:`EXPECTATION_FIELDS` from ``event`` and return them.

    Raises:
        BadArgument: ``true_label`` or ``expected_label`` is not an integer, or ``expected_probability`` not a number.
    """
    truth, label = event.pop("true_label", None), event.pop("expected_label", None)
    probability = event.pop("expected_probability", None)
    for name, value in (("true_label", truth), ("expected_label", label)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise BadArgument(f"--source: event {number}: {name} must be an integer, got {value!r}")
    if probability is not None and (isinstance(probability, bool) or not isinstance(probability, int | float)):
        raise BadArgument(f"--source: event {number}: expected_probability must be a number, got {probability!r}")
    return Expectations(truth, label, None if probability is None else float(probability))


def json_encoder() -> Encoder:
    """Events as plain JSON objects (compact)."""
    return orjson.dumps


def load_schema(path: Path) -> tuple[str, Any]:
    """(the schema's text, fastavro's parsed schema) of an Avro schema file (``.avsc``).

    Raises:
        BadArgument: the file cannot be read, is not JSON or is not an Avro schema (named as --schema).
    """
    try:
        text = path.read_text()
        return text, parse_schema(json.loads(text))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, SchemaParseException) as exc:
        raise BadArgument(f"--schema {path}: not a readable Avro schema ({type(exc).__name__}: {exc})") from None


def check_avro(events: Sequence[Event], parsed: Any, path: Path) -> None:
    """Every event matches the schema (extra fields are allowed: Avro leaves them out).

    Raises:
        BadArgument: an event does not (its number and the fields named).
    """
    for number, event in enumerate(events, start=1):
        try:
            validate(event, parsed, raise_errors=True)
        except ValidationError as exc:
            problems = "; ".join(str(e) for e in exc.errors) or str(exc)
            raise BadArgument(f"--source: event {number} does not match --schema {path}: {problems}") from None


#: Seconds a schema registry request may go unanswered before it is abandoned and sent again: confluent-kafka's
#: client retries a transport error (a time-out included) ``max.retries`` times, 3 by default, but without a
#: ``timeout`` it waits on one unanswered request for ever.
REGISTRY_TIMEOUT_S = 10.0


def registry_config(url: str) -> dict[str, Any]:
    """The configuration of a confluent-kafka registry client for ``url`` (sync or async): the URL and a request
    time-out of :data:`REGISTRY_TIMEOUT_S` seconds, so that an unanswered request is retried, never waited on."""
    return {"url": url, "timeout": REGISTRY_TIMEOUT_S}


def avro_encoder(url: str, schema_text: str, topic: str) -> Encoder:
    """Events as Confluent-framed Avro: confluent-kafka's ``AvroSerializer`` (TopicNameStrategy, the schema
    registered under ``<topic>-value`` when absent) with a registry client for ``url`` (``mock://...``:
    confluent-kafka's in-process mock registry).

    The encoder raises :class:`RegistryUnavailable` when the registry cannot be reached or refuses; events must be
    checked first (:func:`check_avro`).
    """
    serializer = AvroSerializer(SchemaRegistryClient.new_client(registry_config(url)), schema_text)
    context = SerializationContext(topic, MessageField.VALUE)

    def encode(event: Event) -> bytes:
        try:
            value = serializer(event, context)
        except Exception as exc:  # the client raises httpx's, its own and Kafka's error classes
            raise RegistryUnavailable(f"schema registry at {url}: {type(exc).__name__}: {exc}") from exc
        if value is None:  # only for a None event, which a JSONL line cannot be
            raise RegistryUnavailable(f"schema registry at {url}: the serializer returned nothing")
        return bytes(value)

    return encode
