"""The schema registry: writer schemas by ID, checked against the mapping once, and their result schemas; a registry
that does not answer is waited out, never a reason to dead-letter.

The client is confluent-kafka's ``AsyncSchemaRegistryClient`` (the Confluent-compatible REST API: Confluent Schema
Registry, Apicurio's ``/apis/ccompat/v7``, Karapace, Redpanda), used on the event loop without blocking it; its own
retries are off (``max.retries`` 0) because :class:`Schemas` decides what a failure means:

- **unreachable** (a connection error, a time-out, HTTP 5xx, 408 or 429): the records that need the schema are held
  (their partitions' order and commits as for any record in flight), and the request is tried again after a capped
  exponential backoff, for as long as it takes. One warning when the registry stops answering, one line when it
  answers again; ``streaminfer_schema_registry_reachable`` and ``/readyz`` show it; ``/healthz`` stays alive (a
  restart would not bring the registry back). Schemas already cached keep serving meanwhile.
- **an unknown schema ID** (HTTP 404): asked again ``unknown_schema_retries`` times with backoff (a registry follower
  may not know a new ID for a moment), then its records are dead-lettered ``unknown_schema_id``; the ID is asked
  again after :data:`UNKNOWN_TTL_S`.
- **refused** (401, 403, 409 incompatible, 422 invalid): for a result schema, ``result_schema_refused``.

Result schemas (enriched Avro results) go under the results topic's subject (TopicNameStrategy,
``<results_topic>-value``): looked up, and registered only when absent and ``register_result_schema`` is on (a
dozen replicas starting at once register the same schema and get the same ID).
"""

from __future__ import annotations

import asyncio
import difflib
import itertools
import json
import logging
import operator
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httpx2
from confluent_kafka.schema_registry import RegisteredSchema, Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from consumer import fate
from consumer.config import Settings
from consumer.errors import ConfigError, DeadLetterReason, ModelError, RecordError, ValidationError
from consumer.events import avro
from consumer.events.mapping import InputMapping
from consumer.signature import ModelSignature, TensorSpec
from consumer.timeouts import Backoff

log = logging.getLogger(__name__)

#: An ID the registry did not know is asked for again after this long, s.
UNKNOWN_TTL_S = 60.0
#: What a connection that fails raises (httpx2 is the HTTP client of confluent-kafka's registry client).
_TRANSPORT_ERRORS = (httpx2.TransportError, OSError, TimeoutError)

Idle = Callable[[float], Awaitable[None]]
"""Waits about the given seconds while records are held (a delivery mode keeps the group membership alive in it)."""


class RegistryClient(Protocol):
    """The part of confluent-kafka's ``AsyncSchemaRegistryClient`` used here (its ``AsyncMockSchemaRegistryClient``
    in unit tests)."""

    async def get_schema(self, schema_id: int) -> Schema: ...

    async def lookup_schema(self, subject_name: str, schema: Schema) -> RegisteredSchema: ...

    async def register_schema(self, subject_name: str, schema: Schema) -> int: ...

    async def get_latest_version(self, subject_name: str) -> RegisteredSchema: ...

    async def get_schema_types(self) -> list[str]: ...

    async def aclose(self) -> None: ...


def client_config(settings: Settings) -> dict[str, Any]:
    """The ``AsyncSchemaRegistryClient`` configuration of the settings: the URL, basic auth (the password from
    ``schema_registry_password`` or its file), a TLS CA, a request time-out, no retries of its own.

    Raises:
        OSError: ``schema_registry_password_file`` cannot be read.
    """
    assert settings.schema_registry_url is not None  # enforced by Settings for request_format=avro
    conf: dict[str, Any] = {
        "url": settings.schema_registry_url,
        "timeout": settings.schema_registry_timeout_ms / 1000.0,
        "max.retries": 0,
    }
    if settings.schema_registry_username is not None:
        conf["basic.auth.user.info"] = f"{settings.schema_registry_username}:{registry_password(settings)}"
    if settings.schema_registry_ca_file is not None:
        conf["ssl.ca.location"] = str(settings.schema_registry_ca_file)
    return conf


def registry_password(settings: Settings) -> str | None:
    """The schema registry password (``schema_registry_password`` wins over the file), or None.

    Raises:
        OSError: ``schema_registry_password_file`` cannot be read.
    """
    if settings.schema_registry_password is not None:
        return settings.schema_registry_password.get_secret_value()
    if settings.schema_registry_password_file is not None:
        return settings.schema_registry_password_file.read_text().strip()
    return None


@dataclass
class WriterSchema:
    """What one writer schema ID means for its records.

    Attributes:
        schema_id: the ID.
        parsed: fastavro's parsed schema, logical types raw (:func:`consumer.events.avro.parse`); None if unusable.
        error: the reason every record of this schema is dead-lettered, or None.
        result_id: enriched results: the result schema's ID under the results subject.
    """

    schema_id: int
    parsed: Any
    error: RecordError | None = None
    result_id: int | None = None


class _Unreachable(Exception):
    """The registry did not answer (kept from the caller: it is waited out)."""


class _Unknown(Exception):
    """The registry answered 404."""


class Schemas:
    """Writer schemas by ID and their result schemas, resolved on the event loop before a chunk is decoded.

    Args:
        client: the registry client.
        mapping: the input mapping each writer schema is checked against.
        signature: the model (the result fields' types).
        results_subject: the result schemas' subject (``<results_topic>-value``); None: results are not enriched.
        register: register an absent result schema (else only look it up).
        unknown_retries: times an unknown ID is asked again before its records are dead-lettered.
        backoff: pauses between tries.
        clock: monotonic seconds.
        sleep: ``asyncio.sleep`` or a fake.
        reachable: called with True / False when the registry starts or stops answering (a gauge).
        url: the registry's URL, for log lines.

    Attributes:
        down_since: ``clock()`` when the registry stopped answering; None while it answers.
    """

    def __init__(
        self,
        client: RegistryClient,
        mapping: InputMapping,
        signature: ModelSignature,
        results_subject: str | None,
        *,
        register: bool,
        unknown_retries: int,
        backoff: Backoff,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        reachable: Callable[[bool], None] | None = None,
        url: str = "",
    ) -> None:
        self._client = client
        self._mapping = mapping
        outputs = {o.name: o for o in signature.outputs}
        self._outputs: list[tuple[str, TensorSpec]] = [(name, outputs[output]) for output, name in mapping.outputs]
        self._subject = results_subject
        self._register = register
        self._unknown_retries = unknown_retries
        self._backoff = backoff
        self._clock = clock
        self._sleep = sleep
        self._reachable = reachable or (lambda _ok: None)
        self._url = url
        self._known: dict[int, WriterSchema] = {}
        self._unknown: dict[int, float] = {}  # ID -> clock() after which it is asked again
        self.down_since: float | None = None
        self._reachable(True)

    async def close(self) -> None:
        """Close the client's HTTP connections."""
        await self._client.aclose()

    def get(self, schema_id: int) -> WriterSchema | None:
        """What ``schema_id`` means, once resolved; None for an ID the registry does not know (or not yet asked)."""
        return self._known.get(schema_id)

    async def resolve(self, schema_ids: Iterable[int], idle: Idle | None = None) -> None:
        """Make every ID of ``schema_ids`` known (or known unknown), waiting out an unreachable registry.

        Args:
            idle: waits while records are held for an unreachable registry; default: ``sleep``.
        """
        now = self._clock()
        for schema_id in sorted(set(schema_ids)):
            if schema_id in self._known or self._unknown.get(schema_id, 0.0) > now:
                continue
            await self._resolve(schema_id, idle)

    async def start(self, requests_subject: str, idle: Idle | None = None) -> None:
        """At start-up: the requests subject's latest writer schema must feed the model as mapped (a missing field,
        a type that cannot feed its input, a field named like an output stop start-up rather than dead-letter every
        record), and with enriched results its result schema must be registered (or registrable), so a registry that
        refuses writes stops start-up too. A subject without versions yet is skipped (logged).

        First of all the URL must answer as a Confluent-compatible API (:meth:`check_api`).

        Raises:
            ModelError: the latest writer schema cannot feed the model (its ID and the reason named).
            ConfigError: ``schema_registry_url`` answers but not as the API, or its credentials are refused
                (:meth:`check_api`); the input mapping names a field the latest writer schema lacks
                (``input_mapping``, the field and the schema's fields named); the result schema is missing and
                ``register_result_schema`` is off, or registering it was refused (the subject and the registry's
                answer named).
        """
        await self.check_api(idle)
        latest = await self._call(lambda: self._client.get_latest_version(requests_subject), idle, missing_ok=True)
        if latest is None:
            log.info("subject %s has no schema yet: the result schemas are checked as writer schemas appear",
                     requests_subject)  # fmt: skip
            return
        schema_id = latest.schema_id
        assert schema_id is not None
        await self._resolve(schema_id, idle)
        known = self._known.get(schema_id)
        if known is None or known.error is None:
            return
        if known.error.reason is DeadLetterReason.RESULT_SCHEMA_REFUSED:
            raise ConfigError(f"register_result_schema / schema registry: {known.error}")
        if known.error.reason is DeadLetterReason.MISSING_FIELD:  # the mapping names what the schema lacks
            raise ConfigError(
                f"input_mapping names a field the latest writer schema of {requests_subject} (id {schema_id}) lacks: "
                f"{known.error}; "
                f"{_fields_hint(known.parsed, str(known.error))}fix the mapping's field names (or the producers' "
                "schema): else every record is dead-lettered missing_field"
            )
        raise ModelError(
            f"the latest writer schema of {requests_subject} (id {schema_id}) cannot feed the model as mapped: "
            f"{known.error.reason.value}: {known.error}"
        )

    async def check_api(self, idle: Idle | None = None) -> None:
        """The URL answers as a Confluent-compatible Schema Registry API: ``GET <url>/schemas/types`` (a cheap read
        every such registry serves: Confluent >= 5.5, Apicurio's ccompat, Karapace, Redpanda) is a JSON list naming
        ``AVRO``. A registry that does not answer (connection refused, time-out, 5xx) is waited out as for any
        request, its URL logged once.

        Raises:
            ConfigError: an answer that is not the API (a 404 or other 4xx, a redirect, an HTML page, JSON of another
                shape), or credentials refused (401/403); the message names ``schema_registry_url`` (or the
                credentials' settings) and the likely fix.
        """
        log.info("checking the schema registry at %s (GET /schemas/types)", self._url)
        try:
            answer = await self._call(self._client.get_schema_types, idle)
        except (_Unknown, SchemaRegistryError) as exc:
            status = 404 if isinstance(exc, _Unknown) else exc.http_status_code
            raise ConfigError(_api_problem(self._url, f"HTTP {status}", status)) from None
        except ValueError as exc:  # a 2xx whose body is no JSON: a web page, a proxy's answer
            raise ConfigError(_api_problem(self._url, f"an answer that is not JSON ({_short(exc)})", 200)) from None
        if not isinstance(answer, list) or not all(isinstance(t, str) for t in answer):
            raise ConfigError(_api_problem(self._url, f"JSON that is not a list of schema types ({answer!r:.80})", 200))
        if "AVRO" not in answer:
            raise ConfigError(f"schema_registry_url={self._url}: the registry serves no Avro schemas (types {answer})")

    # ---------------------------------------------------------------------------------------------- internals
    async def _resolve(self, schema_id: int, idle: Idle | None) -> None:
        attempt = 0
        while True:
            try:
                schema = await self._call(lambda: self._client.get_schema(schema_id), idle)
                break
            except _Unknown:
                if fate.bounded(attempt, self._unknown_retries, fate.Action.DEAD_LETTER) is fate.Action.DEAD_LETTER:
                    log.warning("schema ID %d is unknown to the schema registry (asked %d times): its records are "
                                "dead-lettered unknown_schema_id", schema_id, attempt + 1)  # fmt: skip
                    self._unknown[schema_id] = self._clock() + UNKNOWN_TTL_S
                    return
                await self._sleep(self._backoff.delay(attempt))
                attempt += 1
        self._unknown.pop(schema_id, None)
        self._known[schema_id] = await self._compile(schema_id, schema, idle)

    async def _compile(self, schema_id: int, schema: Schema, idle: Idle | None) -> WriterSchema:
        """Parse and check a writer schema; with enriched results, find (or register) its result schema."""
        if (schema.schema_type or "AVRO") != "AVRO":
            return WriterSchema(schema_id, None, _wrong(f"schema {schema_id} is {schema.schema_type}, not AVRO"))
        try:
            declared = json.loads(schema.schema_str or "")
            parsed = avro.parse(declared)
        except Exception as exc:  # noqa: BLE001 (fastavro's parse errors have no common base)
            return WriterSchema(schema_id, None, _wrong(f"schema {schema_id} does not parse: {exc!r:.200}"))
        error = avro.check_writer(declared, self._mapping, [name for name, _ in self._outputs])
        if error is not None or self._subject is None:
            if error is not None:
                log.warning("writer schema %d cannot feed the model: %s: %s", schema_id, error.reason.value, error)
            return WriterSchema(schema_id, parsed, error)
        result = avro.result_schema(declared, self._outputs)
        subject = self._subject
        candidate = Schema(json.dumps(result), "AVRO")
        try:
            found = await self._call(lambda: self._client.lookup_schema(subject, candidate), idle, missing_ok=True)
            if found is not None:
                result_id = found.schema_id
            elif not self._register:
                why = (f"the result schema of writer schema {schema_id} is not under subject {subject} and "
                       "register_result_schema is false: register it ahead")  # fmt: skip
                return WriterSchema(schema_id, parsed, _refused(why))
            else:
                result_id = await self._call(lambda: self._client.register_schema(subject, candidate), idle)
                log.info("registered writer schema %d's result schema under %s: id %s", schema_id, subject, result_id)
        except SchemaRegistryError as exc:
            why = f"the registry refused the result schema of writer schema {schema_id} under {subject}: {exc}"
            return WriterSchema(schema_id, parsed, _refused(why))
        assert result_id is not None
        return WriterSchema(schema_id, parsed, None, result_id)

    async def _call(self, request: Callable[[], Awaitable[Any]], idle: Idle | None, missing_ok: bool = False) -> Any:
        """``request()`` once the registry answers: retried after each connection failure or unavailable status
        (the wait logged once, then its end).

        Returns:
            The answer; None for a 404 when ``missing_ok``.

        Raises:
            _Unknown: a 404 (not ``missing_ok``).
            SchemaRegistryError: another refusal (4xx).
        """
        attempt = 0
        while True:
            try:
                answer = await request()
            except SchemaRegistryError as exc:
                action = fate.of_registry(exc.http_status_code)
                if action is fate.Action.RETRY:  # 404: an unknown ID, asked again by the caller
                    self._answered()
                    if missing_ok:
                        return None
                    raise _Unknown from None
                if action is not fate.Action.WAIT:
                    self._answered()
                    raise
                self._unanswered(exc)
            except _TRANSPORT_ERRORS as exc:
                self._unanswered(exc)
            else:
                self._answered()
                return answer
            delay = self._backoff.delay(attempt)
            attempt += 1
            await (idle(delay) if idle is not None else self._sleep(delay))

    def _unanswered(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = self._clock()
            self._reachable(False)
            log.warning("schema registry %s does not answer (%s); holding the records that need a schema, retrying",
                        self._url, _short(exc))  # fmt: skip

    def _answered(self) -> None:
        if self.down_since is not None:
            log.info("schema registry %s answers again after %.1f s", self._url, self._clock() - self.down_since)
            self.down_since = None
            self._reachable(True)


def _api_problem(url: str, what: str, status: int) -> str:
    """The message of a registry URL that answered ``what`` (HTTP ``status``) to ``GET <url>/schemas/types``."""
    if status in (401, 403):
        return (f"schema_registry_url={url}: the registry refused the credentials ({what}): check "
                "schema_registry_username and schema_registry_password (or schema_registry_password_file)")  # fmt: skip
    base = url.rstrip("/")
    hint = (f"for Apicurio Registry the URL ends in /apis/ccompat/v7 ({base}/apis/ccompat/v7), not in its own API's "
            "path" if "/apis/" in base and not base.endswith("/ccompat/v7")
            else f"for Apicurio Registry add its Confluent-compatible path: {base}/apis/ccompat/v7"
            if "/apis/" not in base else "check the host, port and path")  # fmt: skip
    return (f"schema_registry_url={url} answers, but not as a Confluent-compatible Schema Registry API "
            f"(GET {base}/schemas/types: {what}); {hint} (Confluent Schema Registry, Karapace and Redpanda serve it at "
            "their root, e.g. http://registry:8081)")  # fmt: skip


def _fields_hint(parsed: Any, error: str) -> str:
    """``did you mean 'x'? `` for the field name quoted first in ``error`` against the top-level fields of schema
    ``parsed`` (fastavro's parsed record), with the fields it has; "" when there is nothing to say."""
    fields = [f.get("name") for f in parsed.get("fields", [])] if isinstance(parsed, dict) else []
    fields = [f for f in fields if isinstance(f, str)]
    if not fields:
        return ""
    quoted = error.split("'")
    close = difflib.get_close_matches(quoted[1], fields, n=1) if len(quoted) > 1 else []
    mean = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(fields[:20]) + (", ..." if len(fields) > 20 else "")
    return f"{mean}its fields: {shown}; "


def _wrong(message: str) -> RecordError:
    return ValidationError(DeadLetterReason.WRONG_TYPE, message)


def _refused(message: str) -> RecordError:
    return ValidationError(DeadLetterReason.RESULT_SCHEMA_REFUSED, message)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def value_subject(topic: str) -> str:
    """The subject of ``topic``'s values under TopicNameStrategy: ``<topic>-value``."""
    return f"{topic}-value"


#: A value's magic byte and schema ID.
_HEAD = slice(0, avro.HEADER_BYTES)


def schema_ids(values: Sequence[bytes | None]) -> set[int]:
    """The schema IDs of the values in the registry's wire format."""
    try:  # the common chunk, no tombstone: each value's first 5 bytes once, a chunk's few distinct ones converted
        heads = set(map(operator.getitem, cast("Sequence[bytes]", values), itertools.repeat(_HEAD)))
    except TypeError:  # a None (a tombstone)
        pass
    else:
        return {int.from_bytes(h[1:], "big") for h in heads if len(h) == avro.HEADER_BYTES and h[0] == avro.MAGIC}
    ids = set()
    for value in values:
        if value and len(value) >= avro.HEADER_BYTES and value[0] == avro.MAGIC:
            ids.add(int.from_bytes(value[1 : avro.HEADER_BYTES], "big"))
    return ids
