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

**A chunk of a schema of strings, doubles and floats is read at once** (:class:`FixedTail`), a reader of the Avro
specification's binary encoding for those types only (zigzag varint ``long`` lengths, length-prefixed UTF-8 strings,
little-endian IEEE 754 doubles and floats) beside fastavro, which reads everything else, every chunk it cannot read
exactly, and is its oracle in the tests. Measured on the bench's Avro events (in-process, process CPU time, min of
9, the consumer's garbage-collector settings, chunks of 500): ``EventDecoder.decode`` 1.5-1.8 us per event with it
(the tensors from its number columns, the datums built only if looked at), 7.6-7.9 without (fastavro datum by
datum, then the tensors from the datums); the reader alone, datums built, 2.8 us a datum against fastavro's 5.6.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator, Sequence
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
    for a chunk of data at once, column by column: each datum's strings one by one, every run of consecutive numbers
    as one numpy array over the chunk, then the chunk's datums built from the columns.

    **Why it exists** (measured in-process, process CPU time, min of 9, the consumer's garbage-collector settings,
    chunks of 500 of the bench's Avro events: a string, 30 doubles, a nested record of a string, a string): it reads
    a datum in 2.8 us where fastavro's ``schemaless_reader`` takes 5.6, and its number columns feed the tensors
    without the datums, which are built only when looked at (:meth:`read_columns`, :class:`Datums`):
    ``EventDecoder.decode`` takes 1.5-1.8 us per event with it, 7.6-7.9 without (fastavro was the largest per-record
    cost of the Avro path that is not the Kafka client's).

    **Its format** is the Avro specification's binary encoding (https://avro.apache.org/docs/current/specification/,
    "Binary Encoding"): a record is its fields' encodings one after another in schema order, nested records inline; a
    ``string`` is a ``long`` length (zigzag varint: 7 bits a byte, low group first, high bit set on all but the last;
    then ``(n >> 1) ^ -(n & 1)``) followed by that many bytes of UTF-8 (decoded strictly, as fastavro does); a
    ``double`` is 8 bytes, a ``float`` 4, little-endian IEEE 754 (read as the Python float of that value, as fastavro
    does). Nothing else is read here.

    **fastavro stays the reader of record and the oracle**: any other schema has no layout (:meth:`of` is None), and
    any chunk with one datum that does not decode exactly (a bad length, bytes short or left over, a string that is
    not UTF-8) reads as None, so the caller decodes it datum by datum with :func:`decode` (fastavro), which names the
    error; tests/unit/consumer/events/test_fixed_tail.py compares the two on random data of every type read here.

    Args:
        steps: the leaves in encoding order, consecutive numbers merged: ``None`` for a string, else the numbers'
            structured dtype (fields ``f0``, ``f1``... in order).
        shape: the fields' names and nesting, to build each datum.
        paths: each leaf's field path (names from the top record down), in encoding order.
    """

    def __init__(self, steps: list[np.dtype[Any] | None], shape: _Shape, paths: Sequence[tuple[str, ...]] = ()) -> None:
        self.steps = steps
        self.shape = shape
        #: Top-level number fields: name -> (its step, its field in the step's dtype).
        self.numbers: dict[str, tuple[int, str]] = {}
        leaf = 0
        for k, step in enumerate(steps):
            names: tuple[str | None, ...] = (None,) if step is None else step.names or ()
            for name in names:
                if name is not None and leaf < len(paths) and len(paths[leaf]) == 1:
                    self.numbers[paths[leaf][0]] = (k, name)
                leaf += 1

    @classmethod
    def of(cls, parsed: Any) -> FixedTail | None:
        """The layout of fastavro's parsed record schema ``parsed``; None when it is not of that shape."""
        leaves: list[tuple[str, tuple[str, ...]]] = []
        shape = _shape(parsed, leaves, ())
        if shape is None:
            return None
        steps: list[np.dtype[Any] | None] = []
        run: list[str] = []
        for leaf, _ in [*leaves, ("string", ())]:  # (a closing string flushes the last run; it is not a step)
            if leaf == "string":
                if run:
                    steps.append(np.dtype([(f"f{i}", _FIXED[t]) for i, t in enumerate(run)]))
                    run = []
                steps.append(None)
            else:
                run.append(leaf)
        return cls(steps[:-1], shape, [path for _, path in leaves])

    def read(self, payloads: Sequence[bytes | memoryview]) -> list[dict[str, Any]] | None:
        """Each payload's datum; None when one is not exactly such a datum (a bad length, bytes short or left over,
        a string that is not UTF-8): :func:`decode` then names its error."""
        read = self.read_columns(payloads)
        return None if read is None else read[0].all()

    def read_columns(self, payloads: Sequence[bytes | memoryview]) -> tuple[Datums, dict[str, np.ndarray]] | None:
        """(the payloads' datums, built when asked for; each top-level number field -> its values over the chunk:
        ``[len(payloads)]`` little-endian float64 (a ``double``) or float32 (a ``float``) in payload order); None as
        :meth:`read`."""
        steps = self.steps
        columns: list[list[Any]] = [[] for _ in steps]  # a string step's strings; a number run's bytes
        sinks = [
            (column.append, 0 if step is None else step.itemsize) for column, step in zip(columns, steps, strict=True)
        ]
        varint = _varint
        try:
            for payload in payloads:
                raw = bytes(payload)
                size = len(raw)
                pos = 0
                for append, width in sinks:
                    if width:
                        end = pos + width
                        if end > size:
                            return None
                        append(raw[pos:end])
                        pos = end
                        continue
                    b = raw[pos]
                    if b < 0x80:  # a length below 64: one byte
                        length, pos = (b >> 1) ^ -(b & 1), pos + 1
                    else:
                        length, pos = varint(raw, pos)
                    if length < 0 or pos + length > size:
                        return None
                    append(raw[pos : pos + length].decode("utf-8"))
                    pos += length
                if pos != size:
                    return None
        except (IndexError, UnicodeDecodeError):
            return None
        steps_read: list[list[str] | np.ndarray] = [
            column if step is None else np.frombuffer(b"".join(column), dtype=step)
            for column, step in zip(columns, steps, strict=True)
        ]
        numbers = {name: steps_read[k][field] for name, (k, field) in self.numbers.items()}  # type: ignore[call-overload]
        return Datums(self.shape, steps_read, len(payloads)), numbers


class Datums:
    """A chunk's datums as :meth:`FixedTail.read_columns` read them, built when asked for: all at once
    (:meth:`all`, column by column) or one (:meth:`datum`, for an event whose fields are looked at later).

    Args:
        shape: the record's fields' names and nesting.
        steps: per step of the layout, in encoding order: a string step's strings (one per datum), or a number run's
            structured array (one element per datum).
        rows: the datums.
    """

    __slots__ = ("_rows", "_shape", "_steps")

    def __init__(self, shape: _Shape, steps: list[list[str] | np.ndarray], rows: int) -> None:
        self._shape = shape
        self._steps = steps
        self._rows = rows

    def __len__(self) -> int:
        return self._rows

    @property
    def names(self) -> list[str]:
        """The record's top-level field names, in schema order (every datum has exactly these)."""
        return [name for name, _ in self._shape]

    def all(self) -> list[dict[str, Any]]:
        """Every datum (dicts in schema order, numbers as Python floats: as fastavro reads them)."""
        leaves: list[list[Any]] = []
        for step in self._steps:
            if isinstance(step, list):
                leaves.append(step)
            else:
                leaves.extend(step[name].tolist() for name in step.dtype.names or ())
        return _datums(self._shape, iter(leaves))

    def datum(self, i: int) -> dict[str, Any]:
        """Datum ``i`` (as :meth:`all` gives it)."""
        leaves: list[list[Any]] = []
        for step in self._steps:
            if isinstance(step, list):
                leaves.append([step[i]])
            else:
                leaves.extend([v] for v in step[i].tolist())
        return _datums(self._shape, iter(leaves))[0]


def _shape(schema: Any, leaves: list[tuple[str, tuple[str, ...]]], path: tuple[str, ...]) -> _Shape | None:
    """A record schema's shape, its leaves' types and paths appended to ``leaves`` in encoding order; None when a
    field is anything but a string, a double, a float or such a record."""
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        return None
    shape: _Shape = []
    for field in schema["fields"]:
        if not isinstance(field, dict) or not isinstance(field.get("name"), str):
            return None
        kind = field.get("type")
        if kind == "string" or (isinstance(kind, str) and kind in _FIXED):
            leaves.append((kind, (*path, field["name"])))
            shape.append((field["name"], None))
        else:
            sub = _shape(kind, leaves, (*path, field["name"]))
            if sub is None:
                return None
            shape.append((field["name"], sub))
    if not shape or len({name for name, _ in shape}) != len(shape):
        return None
    return shape


def _datums(shape: _Shape, leaves: Iterator[list[Any]]) -> list[dict[str, Any]]:
    """The datums of ``shape`` (dicts in schema order) from its leaves' columns, taken in encoding order (a nested
    record's datums become a column of its parent)."""
    names = [name for name, _ in shape]
    columns = [next(leaves) if sub is None else _datums(sub, leaves) for _, sub in shape]
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


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
