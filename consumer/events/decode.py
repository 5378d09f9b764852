"""A fetched chunk of event values -> one decoded request (or dead-letter error, or tombstone) per record.

- **json**: each value is one JSON object (``orjson``); a value in a registry's wire format (magic byte 0 and a schema
  ID, as a JSON Schema serializer writes) has those 5 bytes skipped. Not JSON: ``invalid_json``; JSON but not an
  object: ``not_an_object``.
- **avro**: each value is in the registry's wire format (else ``not_in_wire_format``); its writer schema, resolved
  beforehand by :meth:`EventDecoder.prepare` (:class:`~consumer.events.registry.Schemas`), decodes it (else
  ``invalid_avro``); an ID the registry does not know is ``unknown_schema_id``; a schema that cannot feed the model
  gives all its records its reason (:func:`consumer.events.avro.check_writer`).
- A null value (a tombstone) is not scored: :data:`TOMBSTONE`, answered with a tombstone of the same key.
- A value above ``max_record_bytes`` is ``too_large``.

Then the whole chunk's events become one tensor per input at once (:meth:`InputMapping.tensors`), and each request's
inputs are rows of those tensors (``DecodedRequest.block``), so a micro-batch of consecutive records is fed as a
slice (no copy). With enriched results an event that already has a field the result writes is ``field_clash``.
An Avro chunk read at once (:class:`~consumer.events.avro.FixedTail`) feeds its tensors from its number columns,
and its events' fields are built only when looked at (nothing on the serving path does: the enriched result is
spliced from the event's bytes).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterator, Sequence
from enum import Enum
from itertools import repeat
from typing import Any, Final, Literal, cast

import numpy as np
import orjson

from consumer.errors import DeadLetterReason, DecodeError, RecordError, ValidationError
from consumer.events import avro
from consumer.events.mapping import InputMapping
from consumer.events.registry import Idle, Schemas, schema_ids
from consumer.json_object import record_json
from consumer.work import DecodedRequest, Event, Limits


class Tombstone(Enum):
    """A tombstone's outcome (one value): not scored, answered with a tombstone."""

    TOMBSTONE = "tombstone"


#: A tombstone's outcome: not scored, answered with a tombstone.
TOMBSTONE: Final = Tombstone.TOMBSTONE

Outcome = DecodedRequest | RecordError | Literal[Tombstone.TOMBSTONE]

#: A value's first byte; the schema ID and the datum of a value in the registry's wire format.
_FIRST = operator.itemgetter(0)
_SCHEMA_ID = slice(1, avro.HEADER_BYTES)
_PAYLOAD = slice(avro.HEADER_BYTES, None)


class EventDecoder:
    """Decodes chunks of event records.

    Args:
        request_format: ``json`` or ``avro``.
        mapping: the input mapping.
        limits: ``max_record_bytes``.
        schemas: avro: the writer schemas (resolved by :meth:`prepare`).
        result_fields: with enriched results, the fields the result adds (an event holding one is ``field_clash``).
    """

    def __init__(
        self,
        request_format: Literal["json", "avro"],
        mapping: InputMapping,
        limits: Limits,
        schemas: Schemas | None = None,
        result_fields: Sequence[str] = (),
    ) -> None:
        if request_format == "avro" and schemas is None:
            raise ValueError("avro events need the schema registry's schemas")
        self._format = request_format
        self._mapping = mapping
        self._limits = limits
        self.schemas = schemas
        self._clash = tuple(result_fields)
        self._shape_key = mapping.shape_key
        self._numeric_ids: dict[int | None, bool] = {}
        self._layouts: dict[int, avro.FixedTail | None] = {}  # per writer schema ID: read a chunk at once, or not

    async def prepare(self, values: Sequence[bytes | None], idle: Idle | None = None) -> None:
        """Avro: resolve the writer schemas of ``values`` (waiting out an unreachable registry); json: nothing."""
        if self.schemas is not None:
            await self.schemas.resolve(schema_ids(values), idle)

    def decode(self, values: Sequence[bytes | None]) -> list[Outcome]:
        """One outcome per value, in order: a :class:`~consumer.work.DecodedRequest` holding its
        :class:`~consumer.work.Event`, a :class:`~consumer.errors.RecordError`, or :data:`TOMBSTONE`."""
        uniform = self._uniform(values)
        if uniform is not None:
            chunk, chunk_raws, chunk_schema, read = uniform
            numbers = chunk_schema is not None and self._numeric(chunk_schema)
            if read is not None:  # Avro read by its layout: the tensors from its number columns, the events lazily
                datums, columns = read
                block = self._mapping.number_columns(columns, len(datums)) if numbers else None
                if block is not None:
                    rows = len(datums)
                    lazy = map(Event, repeat(None), chunk_raws, repeat(chunk_schema), repeat(datums), range(rows))
                    return self._requests(block, rows, lazy)
                chunk = datums.all()
            assert chunk is not None  # (given unless read)
            chunk_block, chunk_errors = self._mapping.tensors(chunk, numbers)
            if not any(chunk_errors):
                return self._requests(chunk_block, len(chunk), map(Event, chunk, chunk_raws, repeat(chunk_schema)))
        out: list[Any] = [None] * len(values)  # every slot is set below
        events: list[dict[str, Any]] = []
        where: list[int] = []
        schema_of: list[int | None] = []
        raws: list[bytes | memoryview] = []
        max_bytes = self._limits.max_record_bytes
        clash = self._clash
        json = self._format == "json"
        loads, invalid = orjson.loads, orjson.JSONDecodeError
        for i, value in enumerate(values):
            if value is None:
                out[i] = TOMBSTONE
                continue
            if len(value) > max_bytes:
                out[i] = DecodeError(
                    DeadLetterReason.TOO_LARGE, f"record value is {len(value)} bytes; max_record_bytes is {max_bytes}"
                )
                continue
            decoded: Any
            if json:
                raw: bytes | memoryview = value[avro.HEADER_BYTES :] if value.startswith(b"\x00") else value
                try:
                    decoded = loads(raw)
                except invalid:
                    decoded = _json(raw)  # the error, worded as every JSON record's
                if type(decoded) is not dict:
                    decoded = _json(raw)
                schema_id = None
            else:
                decoded, schema_id, raw = self._avro(value)
            if isinstance(decoded, RecordError):
                out[i] = decoded
                continue
            if clash and not decoded.keys().isdisjoint(clash):  # a lookup per result field; the culprit named after
                taken = next(name for name in self._clash if name in decoded)
                out[i] = ValidationError(
                    DeadLetterReason.FIELD_CLASH, f"the event has a field {taken!r}, which the result writes"
                )
                continue
            events.append(decoded)
            where.append(i)
            schema_of.append(schema_id)
            raws.append(raw)
        if events:
            numbers = not json and all(map(self._numeric, set(schema_of)))
            block, errors = self._mapping.tensors(events, numbers)
            key = self._shape_key
            row = 0
            for i, event, schema_id, raw, error in zip(where, events, schema_of, raws, errors, strict=True):
                if error is not None:
                    out[i] = error
                    continue
                request = DecodedRequest(None, None, 1, None, block=block, start=row, shape_key=key)
                request.event = Event(event, raw, schema_id)
                out[i] = request
                row += 1
        return out

    def _requests(self, block: dict[str, np.ndarray], rows: int, events: Iterator[Event]) -> list[Outcome]:
        """One request per row of ``block``, in order, each holding its event of ``events``."""
        requests = list(
            map(
                DecodedRequest,
                repeat(None),
                repeat(None),
                repeat(1),
                repeat(None),
                repeat(0),
                repeat(False),
                repeat(block),
                range(rows),
                repeat(self._shape_key),
            )
        )
        deque(map(setattr, requests, repeat("event"), events), maxlen=0)
        return cast("list[Outcome]", requests)

    def _uniform(
        self, values: Sequence[bytes | None]
    ) -> (
        tuple[
            list[dict[str, Any]] | None,
            Sequence[bytes | memoryview],
            int | None,
            tuple[avro.Datums, dict[str, np.ndarray]] | None,
        ]
        | None
    ):
        """The common chunk's events at once: every value bytes within ``max_record_bytes``; json: each an object
        (no registry frame), avro: each of one known usable writer schema, decoded to a record
        (:func:`~consumer.events.avro.decode`); no event holding a field the result writes. (events, their
        raw bytes, the schema ID or None); None when any record is anything else: the chunk is then decoded record
        by record, which names each culprit. Avro read by its layout (:class:`~consumer.events.avro.FixedTail`)
        gives no events but (its datums, built when asked for; its top-level number fields as columns)
        (:meth:`~consumer.events.avro.FixedTail.read_columns`) as a fourth item, else that is None."""
        if not values or set(map(type, values)) != {bytes}:
            return None
        plain = cast("Sequence[bytes]", values)  # all bytes: checked above
        lengths = set(map(len, plain))
        if min(lengths) < avro.HEADER_BYTES or max(lengths) > self._limits.max_record_bytes:
            return None  # (an empty or short value: left to the general path too)
        firsts = set(map(_FIRST, plain))
        events: list[Any] | None
        raws: Sequence[bytes | memoryview]
        schema_id: int | None = None
        if self._format == "json":
            if avro.MAGIC in firsts:
                return None
            try:
                events = list(map(orjson.loads, plain))
            except orjson.JSONDecodeError:
                return None
            raws = plain
        else:
            ids = set(map(operator.getitem, plain, repeat(_SCHEMA_ID)))
            if firsts != {avro.MAGIC} or len(ids) != 1:
                return None
            schema_id = int.from_bytes(ids.pop(), "big")
            assert self.schemas is not None
            known = self.schemas.get(schema_id)
            if known is None or known.error is not None:
                return None
            payloads = [memoryview(v)[_PAYLOAD] for v in plain]
            if schema_id not in self._layouts:
                self._layouts[schema_id] = avro.FixedTail.of(known.parsed)
            layout = self._layouts[schema_id]
            read = layout.read_columns(payloads) if layout is not None else None
            if read is not None:  # records of one schema: dicts of its fields, its names the same for each
                if not self._clash or set(self._clash).isdisjoint(read[0].names):
                    return None, payloads, schema_id, read
                return None
            parsed, decode = known.parsed, avro.decode
            try:
                events = [decode(parsed, payload) for payload in payloads]
            except RecordError:
                return None
            raws = payloads
        if set(map(type, events)) != {dict}:
            return None
        for name in self._clash:
            if any(map(operator.contains, events, repeat(name))):
                return None
        return events, raws, schema_id, None

    def _numeric(self, schema_id: int | None) -> bool:
        """Whether the records of writer schema ``schema_id`` hold every mapped field as a number
        (:meth:`~consumer.events.mapping.InputMapping.numeric`; asked once per schema)."""
        numeric = self._numeric_ids.get(schema_id)
        if numeric is None:
            known = self.schemas.get(schema_id) if self.schemas is not None and schema_id is not None else None
            if known is None:
                return False
            numeric = self._numeric_ids[schema_id] = self._mapping.numeric(known.parsed)
        return numeric

    def _avro(self, value: bytes) -> tuple[dict[str, Any] | RecordError, int | None, memoryview]:
        """(the datum or its error, the schema ID, the datum's bytes)."""
        framed = avro.split_frame(value)
        if framed is None:
            return (
                ValidationError(
                    DeadLetterReason.NOT_IN_WIRE_FORMAT,
                    "the value is not in the schema registry's wire format (magic byte 0, a 4-byte schema ID, a datum)",
                ),
                None,
                memoryview(value),
            )
        schema_id, payload = framed
        assert self.schemas is not None
        known = self.schemas.get(schema_id)
        if known is None:
            return (
                ValidationError(
                    DeadLetterReason.UNKNOWN_SCHEMA_ID, f"schema ID {schema_id} is unknown to the schema registry"
                ),
                schema_id,
                payload,
            )
        if known.error is not None:
            return known.error, schema_id, payload
        try:
            datum = avro.decode(known.parsed, payload)
        except RecordError as err:
            return err, schema_id, payload
        if type(datum) is not dict:
            return ValidationError(DeadLetterReason.WRONG_TYPE, "the datum is not a record"), schema_id, payload
        return datum, schema_id, payload


def _json(value: bytes | memoryview) -> dict[str, Any] | RecordError:
    """The event of a JSON value (a registry's JSON Schema frame already left out)."""
    try:
        return record_json(value)
    except DecodeError as err:
        return err
