"""Avro through a schema registry: the wire format, writer schemas checked against the input mapping, result schemas.

**Wire format** (Confluent's, which Apicurio's compatible API and every registry-aware serializer write): byte 0 is
the magic byte ``0``, bytes 1-4 the schema ID (big-endian), the rest the Avro binary encoding of one datum of that
schema (:func:`split_frame`).

**Logical types are read raw** (:func:`raw`): a ``timestamp-millis`` is its ``long`` (ms since the epoch),
``timestamp-micros`` its ``long`` (us), ``date`` its ``int`` (days since the epoch), ``time-millis`` /
``time-micros`` their ``int`` / ``long`` since midnight, ``uuid`` its ``string``. So they feed numeric (or string)
inputs as those numbers, never guessed at, and an enriched result writes them back byte for byte. A ``decimal``
(``bytes`` or ``fixed``) feeds no input: a field of that type is ``wrong_type`` for every record of its schema.

**Writer schemas are checked once** per schema ID (:func:`check_writer`), when it is first seen: a field the mapping
needs that the schema lacks (without a default in the mapping) is ``missing_field``, a type that cannot feed its
input ``wrong_type``, an output field the schema already has ``field_clash``; every record of that schema then gets
that reason. A field added upstream changes nothing.

**The result schema** (:func:`result_schema`) is the writer schema plus one field per output, ``["null", T]`` with
default null (so it stays compatible with the writer's evolution): ``T`` is ``float`` for FP32/FP16/BF16,
``double`` for FP64, ``int`` for INT8-32 and UINT8-16, ``long`` for INT64 and UINT32-64, ``boolean``, ``string`` for
BYTES; an output of more than one value per row is an ``array`` of them (nested for each further axis).
"""

from __future__ import annotations

import copy
import io
from collections.abc import Sequence
from typing import Any

import fastavro
import numpy as np

from consumer.errors import DeadLetterReason, RecordError, ValidationError
from consumer.events.mapping import REQUIRED, InputMapping
from consumer.signature import TensorSpec

#: The registry wire format's first byte.
MAGIC = 0
#: Magic byte and schema ID, bytes.
HEADER_BYTES = 5

_NUMERIC = {"int", "long", "float", "double"}
_INTEGRAL = {"int", "long"}


def split_frame(value: bytes) -> tuple[int, memoryview] | None:
    """(schema ID, payload) of a value in the registry's wire format; None when it is not (too short, or another
    first byte)."""
    if len(value) < HEADER_BYTES or value[0] != MAGIC:
        return None
    return int.from_bytes(value[1:HEADER_BYTES], "big"), memoryview(value)[HEADER_BYTES:]


def frame(schema_id: int, payload: bytes) -> bytes:
    """``payload`` in the registry's wire format for ``schema_id``."""
    return bytes((MAGIC,)) + schema_id.to_bytes(4, "big") + payload


def raw(schema: Any) -> Any:
    """``schema`` (parsed JSON) without its ``logicalType`` annotations: values read and written as their
    underlying type (module docstring)."""
    if isinstance(schema, dict):
        return {k: raw(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [raw(s) for s in schema]
    return schema


def parse(schema: Any) -> Any:
    """fastavro's parsed form of ``schema`` (JSON) with logical types left raw, its named types in a namespace of
    their own (two writer schemas may reuse a name).

    Raises:
        fastavro.schema.SchemaParseException, ValueError: not a valid Avro schema.
    """
    return fastavro.parse_schema(raw(schema), named_schemas={})


def decode(parsed: Any, payload: memoryview) -> Any:
    """One datum of ``payload``, every byte of it.

    Raises:
        ValidationError: invalid_avro: it does not decode with the schema, or bytes are left over.
    """
    stream = io.BytesIO(payload)
    try:
        datum = fastavro.schemaless_reader(stream, parsed, None)
    except Exception as exc:  # noqa: BLE001 (fastavro raises EOFError, ValueError, UnicodeDecodeError, IndexError...)
        raise ValidationError(DeadLetterReason.INVALID_AVRO, f"does not decode with its schema: {exc!r:.200}") from None
    if stream.tell() != len(payload):
        raise ValidationError(
            DeadLetterReason.INVALID_AVRO, f"{len(payload) - stream.tell()} bytes left over after the datum"
        )
    return datum


#: Avro's fixed-width number types and their little-endian numpy dtypes (as fastavro reads them: a Python float).
_FIXED = {"double": "<f8", "float": "<f4"}
#: A record's shape: each field's name and, for a nested record, its own shape (None for a leaf).
_Shape = list[tuple[str, "_Shape | None"]]


class FixedTail:
    """A record schema whose leaves are ``string``, ``double`` or ``float`` fields (nested records of them too), read
    for a chunk of data at once: each datum's strings one by one (a zigzag varint length, then strict UTF-8), every
    run of numbers as one numpy array over the chunk. The same data :func:`decode` gives: fastavro reads a double or
    a float as the float of its 8 or 4 little-endian bytes, a string as its strict UTF-8 decoding, a nested record
    inline, fields in schema order.

    Args:
        steps: the leaves in encoding order, consecutive numbers merged: ``None`` for a string, else the numbers'
            structured dtype.
        shape: the fields' names and nesting, to build each datum.
    """

    def __init__(self, steps: list[np.dtype[Any] | None], shape: _Shape) -> None:
        self.steps = steps
        self.build = _builder(shape)

    @classmethod
    def of(cls, parsed: Any) -> FixedTail | None:
        """The layout of fastavro's parsed record schema ``parsed``; None when it is not of that shape."""
        leaves: list[str] = []
        shape = _shape(parsed, leaves)
        if shape is None:
            return None
        steps: list[np.dtype[Any] | None] = []
        run: list[str] = []
        for leaf in [*leaves, "string"]:  # (a closing string flushes the last run; it is not a step)
            if leaf == "string":
                if run:
                    steps.append(np.dtype([(f"f{i}", _FIXED[t]) for i, t in enumerate(run)]))
                    run = []
                steps.append(None)
            else:
                run.append(leaf)
        return cls(steps[:-1], shape)

    def read(self, payloads: Sequence[bytes | memoryview]) -> list[dict[str, Any]] | None:
        """Each payload's datum; None when one is not exactly such a datum (a bad length, bytes short or left over,
        a string that is not UTF-8): :func:`decode` then names its error."""
        steps = self.steps
        texts: list[list[str]] = []
        runs: list[list[bytes]] = [[] for _ in steps]
        try:
            for payload in payloads:
                raw = bytes(payload)
                pos = 0
                row = []
                for k, step in enumerate(steps):
                    if step is None:
                        b = raw[pos]
                        if b < 0x80:  # a length below 64: one byte
                            length, pos = (b >> 1) ^ -(b & 1), pos + 1
                        else:
                            length, pos = _varint(raw, pos)
                        if length < 0 or pos + length > len(raw):
                            return None
                        row.append(raw[pos : pos + length].decode("utf-8"))
                        pos += length
                    else:
                        end = pos + step.itemsize
                        if end > len(raw):
                            return None
                        runs[k].append(raw[pos:end])
                        pos = end
                if pos != len(raw):
                    return None
                texts.append(row)
        except (IndexError, UnicodeDecodeError):
            return None
        numbers = [
            np.frombuffer(b"".join(runs[k]), dtype=step).tolist() if step is not None else None
            for k, step in enumerate(steps)
        ]
        out = []
        build = self.build
        for i, row in enumerate(texts):
            strings = iter(row)
            flat: list[Any] = []
            for k, step in enumerate(steps):
                if step is None:
                    flat.append(next(strings))
                else:
                    flat.extend(numbers[k][i])  # type: ignore[index]  # a run's numbers: not None
            out.append(build(flat, 0)[0])
        return out


def _shape(schema: Any, leaves: list[str]) -> _Shape | None:
    """A record schema's shape, its leaves' types appended to ``leaves`` in encoding order; None when a field is
    anything but a string, a double, a float or such a record."""
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        return None
    shape: _Shape = []
    for field in schema["fields"]:
        if not isinstance(field, dict) or not isinstance(field.get("name"), str):
            return None
        kind = field.get("type")
        if kind == "string" or (isinstance(kind, str) and kind in _FIXED):
            leaves.append(kind)
            shape.append((field["name"], None))
        else:
            sub = _shape(kind, leaves)
            if sub is None:
                return None
            shape.append((field["name"], sub))
    if not shape or len({name for name, _ in shape}) != len(shape):
        return None
    return shape


def _builder(shape: _Shape) -> Any:
    """A function ``(leaves, start) -> (datum, end)`` over a datum's leaves in order (a list) to the datum (dicts
    in schema order): consecutive leaf fields taken as one slice, a nested record by its own builder."""
    parts: list[tuple[tuple[str, ...], Any]] = []
    for name, sub in shape:
        if sub is not None:
            parts.append(((name,), _builder(sub)))
        elif parts and parts[-1][1] is None:
            parts[-1] = ((*parts[-1][0], name), None)
        else:
            parts.append(((name,), None))
    if len(parts) == 1 and parts[0][1] is None:
        names, count = parts[0][0], len(parts[0][0])
        return lambda leaves, start: (dict(zip(names, leaves[start : start + count], strict=True)), start + count)

    def build(leaves: list[Any], start: int) -> tuple[dict[str, Any], int]:
        datum: dict[str, Any] = {}
        for names, sub in parts:
            if sub is None:
                datum.update(zip(names, leaves[start : start + len(names)], strict=True))
                start += len(names)
            else:
                datum[names[0]], start = sub(leaves, start)
        return datum, start

    return build


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint (an Avro ``long``) at ``pos``: (its value, the position after it).

    Raises:
        IndexError: the bytes end inside it.
    """
    b = raw[pos]
    pos += 1
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        b = raw[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
    return (n >> 1) ^ -(n & 1), pos


def encode(parsed: Any, datum: dict[str, Any]) -> bytes:
    """The Avro binary encoding of ``datum`` (schemaless: no frame).

    Raises:
        ValueError, TypeError: the datum does not fit the schema.
    """
    stream = io.BytesIO()
    fastavro.schemaless_writer(stream, parsed, datum)
    return stream.getvalue()


# ------------------------------------------------------------------------------------------------ writer schemas
def check_writer(schema: Any, mapping: InputMapping, output_fields: Sequence[str]) -> RecordError | None:
    """Whether every record of writer schema ``schema`` (JSON) can feed the model as mapped: the reason its records
    get when not (module docstring), else None.

    Args:
        output_fields: the result fields an enriched result adds (``field_clash`` when the schema has one).
    """
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return ValidationError(DeadLetterReason.WRONG_TYPE, "the writer schema is not a record: events are records")
    fields = {f["name"] for f in schema.get("fields", [])}
    for name in output_fields:
        if name in fields:
            return ValidationError(
                DeadLetterReason.FIELD_CLASH, f"the writer schema has a field {name!r}, which the result writes"
            )
    for plan in mapping.inputs:
        for spec_field in plan.fields:
            found = _field_type(schema, spec_field.path)
            if found is None:
                if spec_field.default is REQUIRED:
                    return ValidationError(
                        DeadLetterReason.MISSING_FIELD,
                        f"the writer schema has no field {spec_field.name!r} (input {plan.spec.name!r} needs it)",
                    )
                continue
            problem = _type_problem(found, plan.spec, plan.array, spec_field.lookup is not None)
            if problem is not None:
                return ValidationError(
                    DeadLetterReason.WRONG_TYPE, f"field {spec_field.name!r} is {problem} (input {plan.spec.name!r})"
                )
    return None


def _field_type(schema: Any, path: tuple[str, ...]) -> Any:
    """The Avro type at ``path`` in record ``schema`` (nulls of a union dropped); None when a part is absent."""
    current: Any = schema
    for part in path:
        current = _non_null(current)
        if not isinstance(current, dict) or current.get("type") != "record":
            return None
        match = next((f for f in current.get("fields", []) if f.get("name") == part), None)
        if match is None:
            return None
        current = match["type"]
    return current


def _non_null(t: Any) -> Any:
    """A union's branches without ``null`` (one branch: itself)."""
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        return branches[0] if len(branches) == 1 else branches
    return t


def _type_problem(t: Any, spec: TensorSpec, array: bool, lookup: bool) -> str | None:
    """Why a field of Avro type ``t`` cannot feed ``spec`` (an element, or with ``array`` the whole row), or None."""
    t = _non_null(t)
    if isinstance(t, list):  # a union of several types: each branch must do
        for branch in t:
            problem = _type_problem(branch, spec, array, lookup)
            if problem is not None:
                return problem
        return None
    if array:
        if not (isinstance(t, dict) and t.get("type") == "array"):
            return f"{_name(t)}, not an array"
        return _type_problem(t["items"], spec, False, lookup)
    name = _name(t)
    if isinstance(t, dict) and t.get("logicalType") == "decimal":
        return "a decimal, which no input takes (cast it upstream)"
    if lookup:
        return None if name in ("string", "enum", "int", "long", "boolean") else f"{name}, not a category"
    kind = spec.dtype.kind
    if kind == "f":
        return None if name in _NUMERIC else f"{name}, not a number"
    if kind in "iu":
        return None if name in _INTEGRAL else f"{name}, not an int or long"
    if kind == "b":
        return None if name == "boolean" else f"{name}, not a boolean"
    return None if name in ("string", "enum") else f"{name}, not a string"


def _name(t: Any) -> str:
    """The type name of an Avro type: ``long``, ``record``, ``enum``... (a named reference: its name)."""
    if isinstance(t, dict):
        return str(t.get("type"))
    return str(t)


# ------------------------------------------------------------------------------------------------ result schemas
def result_schema(writer: dict[str, Any], outputs: Sequence[tuple[str, TensorSpec]]) -> dict[str, Any]:
    """The writer schema plus one ``["null", T]`` field with default null per (result field, output), appended."""
    result = copy.deepcopy(writer)
    result["fields"] = [*result["fields"], *output_fields(outputs)]
    return result


def output_fields(outputs: Sequence[tuple[str, TensorSpec]]) -> list[dict[str, Any]]:
    """The result schema's fields of (result field, output) pairs: ``["null", T]``, default null."""
    return [{"name": name, "type": ["null", output_type(spec)], "default": None} for name, spec in outputs]


def output_type(spec: TensorSpec) -> Any:
    """The Avro type of one row of output ``spec`` (module docstring)."""
    kind, size = spec.dtype.kind, spec.dtype.itemsize
    element: str
    if kind == "f":
        element = "double" if size == 8 else "float"
    elif kind in "iu":
        element = "int" if (kind == "i" and size <= 4) or (kind == "u" and size <= 2) else "long"
    elif kind == "b":
        element = "boolean"
    else:
        element = "string"
    dims = spec.shape[1:] if spec.batched else spec.shape
    t: Any = element
    if any(d != 1 for d in dims):
        for _ in dims:
            t = {"type": "array", "items": t}
    return t


def row_values(spec: TensorSpec, arr: np.ndarray, rows: int) -> list[Any]:
    """Each row's value of a batched output ``arr`` ``[rows, ...]`` (an output without a batch axis: the whole
    array for every row), as Python values of :func:`output_type`'s shape."""
    dims = spec.shape[1:] if spec.batched else spec.shape
    scalar = not any(d != 1 for d in dims)
    if not spec.batched:
        whole = arr.reshape(-1)[0].item() if scalar else arr.tolist()
        return [whole] * rows
    if scalar:
        return arr.reshape(rows, -1)[:, 0].tolist()  # type: ignore[no-any-return]
    return arr.tolist()  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------ result tails
#: The ``["null", T]`` union's branch index of ``T`` (1), as Avro writes a union: the zigzag varint of the index.
_SECOND_BRANCH = b"\x02"


def zigzag(n: int) -> bytes:
    """The Avro binary encoding of ``int`` or ``long`` ``n`` (a signed 64-bit value): its zigzag varint, as
    fastavro's ``write_long`` writes it."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def tail_values(spec: TensorSpec, arr: np.ndarray, rows: int) -> list[bytes] | None:
    """Each row's encoding of the result field ``["null", T]`` of batched output ``arr`` ``[rows, ...]``, computed
    for the whole batch at once: the same bytes fastavro's ``schemaless_writer`` writes for :func:`row_values`'
    values (a test holds them equal). None where this fast path does not apply (an output without a batch axis, more
    than one axis per row, a type other than FP32/FP64, INT8-64 and UINT8-32, a non-finite float); the caller then
    encodes with fastavro.

    - a scalar FP32 / FP64 row: the branch byte and the 4 / 8 little-endian bytes of the value (``float`` /
      ``double``); an INT / UINT row: the branch byte and its zigzag varint (``int`` / ``long``);
    - a row of N floats (``array``): the branch byte, N as a varint, the N values, and the array's end (a 0 block).
    """
    dims = spec.shape[1:] if spec.batched else spec.shape
    kind, size = arr.dtype.kind, arr.dtype.itemsize
    if not spec.batched or arr.ndim < 1 or arr.shape[0] != rows:
        return None
    scalar = not any(d != 1 for d in dims)
    if kind in "iu" and scalar and not (kind == "u" and size > 4):
        codes: dict[int, bytes] = {}
        out = []
        for v in arr.reshape(rows, -1)[:, 0].tolist():
            code = codes.get(v)
            if code is None:
                code = codes[v] = _SECOND_BRANCH + zigzag(v)
            out.append(code)
        return out
    if kind != "f" or size not in (4, 8) or not np.isfinite(arr).all():
        return None
    per_row = arr.reshape(rows, -1)
    if scalar:
        values = per_row[:, :1]
        head = _SECOND_BRANCH
        foot = b""
    elif len(dims) == 1 and arr.ndim == 2 and per_row.shape[1] > 0:
        values = per_row
        head = _SECOND_BRANCH + zigzag(per_row.shape[1])
        foot = b"\x00"
    else:
        return None
    body = np.ascontiguousarray(values, dtype=f"<f{size}").view(np.uint8).reshape(rows, -1)
    width = len(head) + body.shape[1] + len(foot)
    buf = np.empty((rows, width), dtype=np.uint8)
    buf[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    buf[:, len(head) : len(head) + body.shape[1]] = body
    if foot:
        buf[:, -1] = 0
    flat = buf.tobytes()
    return [flat[k : k + width] for k in range(0, rows * width, width)]
