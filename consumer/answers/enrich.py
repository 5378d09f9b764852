"""Enriched results: the request's event plus the model's outputs as fields, JSON in -> JSON out, Avro in -> Avro out.

A micro-batch is encoded at once (:meth:`EnrichedAnswers.encode`): each output is turned into per-row values once per
batch, then each event gets them under its result field names (``outputs`` of the input mapping; by default the
output names) after its own fields, in order.

- **JSON**: the event object with the output fields appended, by ``orjson`` (float32 outputs written with their
  shortest float32 text: ``0.9``, not ``0.8999999761581421``: :func:`_json_rows`); a row of one value is a number, a
  row of several an array.
- **Avro**: the datum with the output fields appended, encoded with the result schema of its writer schema
  (:func:`consumer.events.avro.result_schema`) and framed with that schema's ID, so a registry-aware reader (e.g.
  Confluent's ``AvroDeserializer``) reads it.

The result's key and headers are the request's (:class:`consumer.answers.records.AnswerRecords`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import orjson

from consumer.errors import DeadLetterReason, InferenceError, RecordError
from consumer.events import avro
from consumer.events.mapping import InputMapping
from consumer.events.registry import Schemas
from consumer.signature import ModelSignature
from consumer.work import Work

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


class EnrichedAnswers:
    """Encodes a micro-batch's enriched results.

    A result is spliced, not re-encoded: an Avro record's binary encoding is its fields' encodings one after another,
    and the result schema is the writer schema with the output fields appended, so the result is the request's datum
    bytes followed by the output fields' encoding (framed with the result schema's ID); a JSON result is the request's
    object bytes with the output members appended before its closing brace. The event's own bytes (number formats
    included) reach the result untouched, and only the outputs are encoded.

    Args:
        signature: the model (output shapes: a row of one value is a scalar field).
        mapping: output -> result field names.
        result_format: ``json`` or ``avro`` (the request format).
        schemas: avro: the writer schemas and their result schemas' IDs.
    """

    def __init__(
        self,
        signature: ModelSignature,
        mapping: InputMapping,
        result_format: Literal["json", "avro"],
        schemas: Schemas | None = None,
    ) -> None:
        if result_format == "avro" and schemas is None:
            raise ValueError("avro results need the schema registry's schemas")
        outputs = {o.name: o for o in signature.outputs}
        self._fields = [(output, name, outputs[output]) for output, name in mapping.outputs]
        self._format = result_format
        self._schemas = schemas
        #: Avro: the output fields alone, as the result schema appends them (their encoding follows the datum's).
        self._appended = avro.parse(
            {"type": "record", "name": "Outputs", "fields": avro.output_fields([(n, s) for _, n, s in self._fields])}
        )

    def encode(self, works: Sequence[Work], outputs: dict[str, np.ndarray]) -> list[bytes | RecordError]:
        """One result per work item (each holds one row), or the error that dead-letters it (an output its result
        schema cannot carry: ``inference_error``)."""
        rows = len(works)
        if self._format == "avro":
            tails = [avro.tail_values(spec, outputs[output], rows) for output, _, spec in self._fields]
            if all(t is not None for t in tails):
                return self._avro_spliced(works, tails)  # type: ignore[arg-type]
        if self._format == "json":
            columns = [(name, _json_rows(spec.batched, outputs[output], rows)) for output, name, spec in self._fields]
            members = _json_members(columns, rows)
            if members is not None:
                return [_spliced_members(w.request.event.raw, m) for w, m in zip(works, members, strict=True)]  # type: ignore[union-attr]
        else:
            columns = [(name, avro.row_values(spec, outputs[output], rows)) for output, name, spec in self._fields]
        results: list[bytes | RecordError] = []
        append = results.append
        for k, work in enumerate(works):
            assert work.request is not None
            event = work.request.event
            assert event is not None
            row = {name: values[k] for name, values in columns}
            if self._format == "json":
                append(_spliced(event.raw, orjson.dumps(row)))
                continue
            try:
                append(
                    avro.frame(self._result_id(event.schema_id), bytes(event.raw) + avro.encode(self._appended, row))
                )
            except (ValueError, TypeError) as exc:
                why = f"the result does not fit its schema: {exc!r:.200}"
                append(InferenceError(DeadLetterReason.INFERENCE_ERROR, why))
        return results

    def _avro_spliced(self, works: Sequence[Work], tails: list[list[bytes]]) -> list[bytes | RecordError]:
        """Avro results whose output fields were encoded for the batch at once (:func:`consumer.events.avro.
        tail_values`): frame, datum and each field's bytes joined once per result."""
        frames: dict[int | None, bytes] = {}
        results: list[bytes | RecordError] = []
        append = results.append
        join = b"".join
        for work, *pieces in zip(works, *tails, strict=True):
            assert work.request is not None
            event = work.request.event
            assert event is not None
            head = frames.get(event.schema_id)
            if head is None:
                head = frames[event.schema_id] = avro.frame(self._result_id(event.schema_id), b"")
            append(join((head, event.raw, *pieces)))
        return results

    def _result_id(self, schema_id: int | None) -> int:
        """The result schema's ID of writer schema ``schema_id`` (resolved when the request was decoded)."""
        assert self._schemas is not None
        assert schema_id is not None
        known = self._schemas.get(schema_id)
        assert known is not None
        assert known.result_id is not None
        return known.result_id


def _spliced(event: bytes | memoryview, members: bytes) -> bytes:
    """A JSON object's bytes with ``members`` (an object, ``{...}``) appended inside its closing brace."""
    return _spliced_members(event, members[1:])


def _spliced_members(event: bytes | memoryview, members: bytes) -> bytes:
    """:func:`_spliced` of members already joined (``"a":1,"b":[2,3]}``: no opening brace)."""
    end = bytes(event[-2:])
    if end[1:] == b"}" and end[:1] not in _AFTER_NOTHING:  # compact and not empty: as orjson writes one
        return b"".join((memoryview(event)[:-1], b",", members))
    head = bytes(event).rstrip()
    assert head.endswith(b"}")  # the decoder parsed it as an object
    body = head[:-1].rstrip()
    return body + members if body.endswith(b"{") else body + b"," + members


#: What may precede an object's closing brace when no member does: whitespace, or its opening brace.
_AFTER_NOTHING = frozenset((b" ", b"\t", b"\r", b"\n", b"{", b""))


def _json_members(columns: list[tuple[str, list[Any]]], rows: int) -> list[bytes] | None:
    """Each row's output members as ``orjson.dumps`` of its row object writes them, less the opening brace
    (``"label":1,"probabilities":[0.1,0.9]}``), from one ``orjson.dumps`` per output for the whole batch, split at
    its commas (a number's text holds none). None when an output's values are not all numbers (ints, floats,
    booleans, None) or flat lists of them: the caller then writes each row's object."""
    texts = []
    for name, values in columns:
        key = orjson.dumps(name) + b":"
        if not values:
            return []
        first = values[0]
        if type(first) is list:
            if not all(type(v) is list for v in values) or not _numbers(itertools.chain.from_iterable(values)):
                return None
            inner = orjson.dumps(values)[2:-2].split(b"],[")
            texts.append([key + b"[" + t + b"]" for t in inner])
        else:
            if not _numbers(values):
                return None
            texts.append([key + t for t in orjson.dumps(values)[1:-1].split(b",")])
    if not texts:  # no output in the result
        return [b"}"] * rows
    join = b",".join
    return [join(parts) + b"}" for parts in zip(*texts, strict=True)]


def _numbers(values: Any) -> bool:
    """Whether every value is a JSON number, boolean or null (their text holds no comma nor bracket)."""
    return set(map(type, values)) <= _SCALARS


#: The Python types of JSON numbers, booleans and null.
_SCALARS = frozenset({int, float, bool, type(None)})


def _json_rows(batched: bool, arr: np.ndarray, rows: int) -> list[Any]:
    """Per-row values of an output for JSON, as Python values: float32 (and float16) ones are written by ``orjson``
    for the whole batch at once and read back, so each becomes the Python float of its shortest float32 text
    (``0.9``, not ``0.8999999761581421``); everything else through ``tolist``."""
    if not batched:
        return [_python(arr.reshape(1))[0] if arr.size == 1 else _python(arr)] * rows
    per_row = arr.reshape(rows, -1)
    return _python(per_row[:, 0] if per_row.shape[1] == 1 else arr)  # type: ignore[no-any-return]


def _python(arr: np.ndarray) -> Any:
    """``arr`` as Python values (:func:`_json_rows`)."""
    if arr.dtype.kind == "f" and arr.dtype.itemsize < 8:
        return orjson.loads(orjson.dumps(np.ascontiguousarray(arr, dtype=np.float32), option=_NUMPY))
    return arr.tolist()


def check_enriched(signature: ModelSignature, name: str, arr: np.ndarray) -> None:
    """Write one output of a 1-row run into an enriched result, JSON and Avro: the model probe's check
    (:data:`consumer.model.probe.OutputEncoder`) that every result can carry it.

    Raises:
        TypeError, ValueError: JSON or its Avro type cannot carry it.
    """
    spec = signature.output(name)
    if spec is None:
        raise ValueError(f"the model has no output {name!r}")
    rows = arr.shape[0] if spec.batched and arr.ndim else 1
    orjson.dumps({name: _json_rows(spec.batched, arr, rows)[0]})
    schema = avro.parse({"type": "record", "name": "Check", "fields": [{"name": "v", "type": avro.output_type(spec)}]})
    avro.encode(schema, {"v": avro.row_values(spec, arr, rows)[0]})
