"""Request value -> validated tensors, one record (:func:`decode_request`) or a fetched chunk (:func:`decode_chunk`).

Request value (JSON, KServe V2 / Open Inference Protocol "inference request")::

    {"id": "abc",                                   # optional string
     "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32",
                 "data": [...128 numbers, flat row-major, or nested [[...64], [...64]]]}],
     "outputs": [{"name": "probabilities"}],        # optional: only these outputs are returned
     "parameters": {...}}                           # optional, ignored but for binary_data_output

Every input's ``shape[0]`` is its number of rows (>= 1) and must agree across inputs; batching counts rows.

Binary tensor data (:mod:`consumer.oip.wire`): an input with ``"parameters": {"binary_data_size": K}`` and no
``data`` takes the next K bytes after the JSON part: ``prod(shape) * itemsize`` bytes, little-endian, row-major
(BYTES elements each a 4-byte little-endian length then the bytes). A request with ``"parameters":
{"binary_data_output": true}`` gets its response in the same form.

Sequence models (:mod:`consumer.sequence`) take ``[rows, length]`` token ids, ``attention_mask`` and
``token_type_ids`` optional; with a tokenizer configured they also take text: one BYTES input (``text`` by
default) of shape ``[rows]``, one UTF-8 string per row.

Validation is strict and happens before anything reaches ONNX Runtime; every failure is a
:class:`~consumer.errors.RecordError` whose reason is one of :class:`~consumer.errors.DeadLetterReason`.
:func:`decode_chunk` gives exactly what :func:`decode_request` gives record by record, faster: records that declare
the same inputs are parsed into one array and checked together, and only a group that fails is decoded again
record by record, to name the culprit with the same reason and message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from consumer.errors import DeadLetterReason as R
from consumer.errors import DecodeError, RecordError, ValidationError
from consumer.oip.validate import (
    check_declaration,
    check_ranges,
    check_rows,
    check_values,
    holds_boolean,
    oip_name,
)
from consumer.oip.wire import BINARY_HEADER, Headers, binary_header_length
from consumer.schema import ModelSignature, TensorSpec

if TYPE_CHECKING:
    from consumer.sequence import TextEncoder

#: The attention mask input of a sequence model (Hugging Face name).
MASK = "attention_mask"
#: Integers above this are not exact in float64: a chunk holding them is decoded record by record (a float32
#: input then gets each record's own int64 -> float32 cast, never float64 -> float32).
_EXACT_IN_FLOAT64 = 2**53


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-record size limits, checked before parsing (bytes) and before allocating tensors (rows).

    Attributes:
        max_record_bytes: largest accepted record value, bytes.
        max_record_rows: largest accepted ``shape[0]``, rows.
        max_record_tokens: sequence models: largest accepted rows x length, tokens (the consumer passes
            ``max_batch_tokens``: a record is never split, so one above the batch budget would be run alone at any
            size, and attention memory grows with rows x length^2).
    """

    max_record_bytes: int = 1_048_576
    max_record_rows: int = 1024
    max_record_tokens: int = 8192


ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]


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
    """

    __slots__ = ("_inputs", "_shape_key", "binary_output", "block", "id", "length", "outputs", "rows", "start")

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


def decode_request(
    value: bytes | None,
    signature: ModelSignature,
    limits: Limits,
    *,
    json_length: int | None = None,
    text: TextEncoder | None = None,
) -> DecodedRequest:
    """Parse and validate one record value against the model's inputs.

    Args:
        value: the Kafka record value (UTF-8 JSON), possibly None for a tombstone.
        signature: the model's inputs and outputs.
        limits: size limits.
        json_length: binary data extension: the JSON part's length in bytes (from
            :func:`~consumer.oip.wire.binary_header_length`); None for a plain JSON value.
        text: tokenizer for text requests of a sequence model, or None when text is not served.

    Returns:
        The request with each input as a numpy array of the model's dtype and shape ``[rows, ...]``.

    Raises:
        DecodeError: reasons invalid_json, not_an_object, invalid_request, too_large.
        ValidationError: reasons missing_input, unknown_input, unknown_output, datatype_mismatch,
            out_of_range, shape_mismatch, ragged, null_value, too_large.
    """
    if not value:
        raise DecodeError(R.INVALID_JSON, "record value is empty or null")
    if len(value) > limits.max_record_bytes:
        raise DecodeError(
            R.TOO_LARGE, f"record value is {len(value)} bytes; max_record_bytes is {limits.max_record_bytes}"
        )
    binary: memoryview | None = None
    if json_length is not None:
        if json_length > len(value):
            raise DecodeError(R.INVALID_REQUEST, f"{BINARY_HEADER} {json_length} exceeds the value ({len(value)} B)")
        binary = memoryview(value)[json_length:]
        value = value[:json_length]
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(R.INVALID_JSON, f"value is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise DecodeError(R.NOT_AN_OBJECT, f"value is a JSON {type(body).__name__}, not an object")

    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise DecodeError(R.INVALID_REQUEST, "'id' must be a string")
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise DecodeError(R.INVALID_REQUEST, "'parameters' must be an object")
    binary_output = bool(parameters and parameters.get("binary_data_output") is True)
    outputs = requested_outputs(body.get("outputs"), signature)

    raw_inputs = body.get("inputs")
    if not isinstance(raw_inputs, list):
        raise DecodeError(R.INVALID_REQUEST, "'inputs' must be a list")
    by_name: dict[str, dict[str, Any]] = {}
    chunks: dict[str, memoryview] = {}
    taken = 0
    for i, item in enumerate(raw_inputs):
        size = _check_input_fields(i, item, binary is not None)
        if item["name"] in by_name:
            raise DecodeError(R.INVALID_REQUEST, f"input {item['name']!r} appears twice")
        by_name[item["name"]] = item
        if size is not None:
            assert binary is not None
            if taken + size > len(binary):
                raise DecodeError(R.INVALID_REQUEST, f"inputs[{i}].binary_data_size runs past the value's end")
            chunks[item["name"]] = binary[taken : taken + size]
            taken += size
    if binary is not None and taken != len(binary):
        raise DecodeError(R.INVALID_REQUEST, f"{len(binary) - taken} bytes of binary data belong to no input")

    if text is not None and set(by_name) == {text.input_name}:
        arrays = _tokenize(by_name[text.input_name], chunks.get(text.input_name), text, limits)
        return _sequence_request(request_id, arrays, outputs, signature, binary_output, limits)

    sequence = signature.sequence
    names = {s.name for s in signature.inputs}
    unknown = sorted(set(by_name) - names)
    if unknown:
        raise ValidationError(R.UNKNOWN_INPUT, f"model has no input {unknown[0]!r}")
    optional = sequence.optional if sequence is not None else {}
    missing = [s.name for s in signature.inputs if s.name not in by_name and s.name not in optional]
    if missing:
        raise ValidationError(R.MISSING_INPUT, f"model input {missing[0]!r} is missing")

    # numpy turns JSON true/false into 1/0 next to numbers; look for them only when the bytes could hold one.
    may_hold_booleans = b"true" in value or b"false" in value
    arrays = {}
    rows: int | None = None
    for spec in signature.inputs:
        if spec.name not in by_name:
            continue
        arr = _to_array(spec, by_name[spec.name], chunks.get(spec.name), limits, may_hold_booleans)
        if rows is None:
            rows = arr.shape[0]
        elif arr.shape[0] != rows:
            raise ValidationError(
                R.SHAPE_MISMATCH, f"input {spec.name!r} has {arr.shape[0]} rows, other inputs have {rows}"
            )
        arrays[spec.name] = arr
    if rows is None:  # only optional inputs were given
        raise ValidationError(R.MISSING_INPUT, f"model input {signature.inputs[0].name!r} is missing")
    if sequence is not None:
        return _sequence_request(request_id, arrays, outputs, signature, binary_output, limits)
    check_ranges(arrays, signature)
    return DecodedRequest(id=request_id, inputs=arrays, rows=rows, outputs=outputs, binary_output=binary_output)


def decode_one(
    value: bytes | None,
    headers: Headers,
    signature: ModelSignature,
    limits: Limits,
    text: TextEncoder | None = None,
) -> DecodedRequest | RecordError:
    """:func:`decode_request` of one record with its headers (binary extension length); the error is returned,
    not raised."""
    try:
        return decode_request(value, signature, limits, json_length=binary_header_length(headers), text=text)
    except RecordError as err:
        return err


#: (datatype, shape) of every model input, in the model's input order: the records of one group stack.
_GroupKey = tuple[tuple[str, tuple[int, ...]], ...]


#: A record that parsed as a well-formed plain JSON request, its values not yet checked: (index in the chunk,
#: request id, requested outputs, binary_data_output, each model input's ``data`` in input order).
_Parsed = tuple[int, str | None, tuple[str, ...] | None, bool, list[list[Any]]]


def decode_chunk(
    values: Sequence[bytes | None],
    headers: Sequence[Headers],
    signature: ModelSignature,
    limits: Limits,
    text: TextEncoder | None = None,
) -> list[DecodedRequest | RecordError]:
    """Decode and validate a fetched chunk of records: the same outcome, record for record, as :func:`decode_one`.

    Plain JSON requests of a fixed-shape model that declare the same ``(datatype, shape)`` for every input form a
    group; each input of a group is parsed into one array ``[records x rows, ...]`` and checked with one set of
    reductions. A group whose array or checks fail, a binary-extension record, a record that may hold booleans,
    sequence models and text are decoded record by record.

    Args:
        values: the record values, in fetch order.
        headers: each record's headers.

    Returns:
        One :class:`DecodedRequest` (its ``inputs`` views of the group's ``block``) or
        :class:`~consumer.errors.RecordError` per record, in order.
    """
    out: list[DecodedRequest | RecordError | None] = [None] * len(values)
    if signature.sequence is not None or text is not None:
        return [decode_one(v, h, signature, limits, text) for v, h in zip(values, headers, strict=True)]
    groups: dict[_GroupKey, list[_Parsed]] = {}
    for i, (value, hdrs) in enumerate(zip(values, headers, strict=True)):
        parsed = _parse_plain(i, value, hdrs, signature, limits)
        if parsed is None:
            out[i] = decode_one(value, hdrs, signature, limits)
        else:
            groups.setdefault(parsed[0], []).append(parsed[1])
    for key, members in groups.items():
        decoded = _decode_group(key, members, signature, limits)
        if decoded is None:
            for member in members:
                i = member[0]
                out[i] = decode_one(values[i], headers[i], signature, limits)
        else:
            for member, request in zip(members, decoded, strict=True):
                out[member[0]] = request
    return out  # type: ignore[return-value]  # every slot is filled above


def _parse_plain(
    index: int, value: bytes | None, headers: Headers, signature: ModelSignature, limits: Limits
) -> tuple[_GroupKey, _Parsed] | None:
    """Parse ``value`` if it is a plain JSON request whose fields are all well formed and name exactly the model's
    inputs; None when anything is off (the record is then decoded on its own, which names the problem)."""
    if not value or len(value) > limits.max_record_bytes or b"true" in value or b"false" in value:
        return None
    for header, _ in headers:
        if header.lower() == BINARY_HEADER:
            return None
    try:
        body = orjson.loads(value)
        raw_inputs = body["inputs"]
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
        return None
    specs = signature.inputs
    if type(body) is not dict or type(raw_inputs) is not list or len(raw_inputs) != len(specs):
        return None
    request_id = body.get("id")
    parameters = body.get("parameters")
    if (request_id is not None and type(request_id) is not str) or (
        parameters is not None and type(parameters) is not dict
    ):
        return None
    outputs = None
    if "outputs" in body:
        try:
            outputs = requested_outputs(body["outputs"], signature)
        except RecordError:
            return None
    binary_output = bool(parameters and parameters.get("binary_data_output") is True)
    if len(specs) == 1:  # the common case: one input, no name lookups
        item = raw_inputs[0]
        declared = _declared(item)
        if declared is None or item["name"] != specs[0].name:
            return None
        return (declared,), (index, request_id, outputs, binary_output, [item["data"]])
    by_name: dict[str, dict[str, Any]] = {}
    for item in raw_inputs:
        if _declared(item) is None or item["name"] in by_name:
            return None
        by_name[item["name"]] = item
    key = []
    data = []
    for spec in specs:
        item = by_name.get(spec.name)
        if item is None:
            return None
        key.append((item["datatype"], tuple(item["shape"])))
        data.append(item["data"])
    return tuple(key), (index, request_id, outputs, binary_output, data)


def _declared(item: object) -> tuple[str, tuple[int, ...]] | None:
    """(datatype, shape) of a well-formed plain input object (str name, int shape >= 0, str datatype, list data,
    no parameters); None otherwise."""
    if type(item) is not dict or "parameters" in item:
        return None
    try:
        name, shape, datatype, data = item["name"], item["shape"], item["datatype"], item["data"]
    except KeyError:
        return None
    if type(name) is not str or type(shape) is not list or type(datatype) is not str or type(data) is not list:
        return None
    for d in shape:
        if type(d) is not int or d < 0:
            return None
    return datatype, tuple(shape)


def _decode_group(
    key: _GroupKey, members: list[_Parsed], signature: ModelSignature, limits: Limits
) -> list[DecodedRequest] | None:
    """Parse and check a group's inputs as one array each; None when any check fails (decode record by record)."""
    n = len(members)
    block: dict[str, np.ndarray] = {}
    rows: int | None = None
    for j, spec in enumerate(signature.inputs):
        datatype, shape = key[j]
        try:
            declared = check_declaration(spec, datatype, shape, limits.max_record_rows)
        except ValidationError:
            return None
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            return None
        try:
            # Floats: parsed straight into float64 (a null becomes NaN, which the range check refuses; integers
            # are exact below 2**53, checked below). Integers: numpy's own choice, so they stay exact.
            arr = np.array([m[4][j] for m in members], dtype=np.float64 if declared.kind == "f" else None)
        except (ValueError, TypeError, OverflowError):
            return None
        if arr.shape != (n, math.prod(shape)) and arr.shape != (n, *shape):
            return None
        kind = arr.dtype.kind
        if kind not in "iuf" or (kind == "f" and declared.kind in "iu"):
            return None
        try:
            check_values(spec.name, arr, declared, spec.dtype)
        except ValidationError:
            return None
        if kind == "f" and arr.size and max(-float(arr.min()), float(arr.max())) > _EXACT_IN_FLOAT64:
            return None
        block[spec.name] = np.ascontiguousarray(arr.reshape(n * shape[0], *shape[1:]), dtype=spec.dtype)
    try:
        check_ranges(block, signature)
    except ValidationError:
        return None
    assert rows is not None
    shape_key = tuple((name, arr.shape[1:]) for name, arr in sorted(block.items()))
    return [
        DecodedRequest(
            m[1],
            None,
            rows,
            m[2],
            binary_output=m[3],
            block=block,
            start=k * rows,
            shape_key=shape_key,
        )
        for k, m in enumerate(members)
    ]


def _sequence_request(
    request_id: str | None,
    arrays: dict[str, np.ndarray],
    outputs: tuple[str, ...] | None,
    signature: ModelSignature,
    binary_output: bool,
    limits: Limits,
) -> DecodedRequest:
    """Check a sequence model's token inputs agree on ``[rows, length]``, fill the optional ones, check ranges."""
    sequence = signature.sequence
    assert sequence is not None
    first = next(iter(arrays.values()))
    rows, length = int(first.shape[0]), int(first.shape[1])
    for name, arr in arrays.items():
        if arr.shape != first.shape:
            raise ValidationError(
                R.SHAPE_MISMATCH, f"input {name!r} has shape {list(arr.shape)}, other inputs {list(first.shape)}"
            )
    if length < 1:
        raise ValidationError(R.SHAPE_MISMATCH, "sequence length (axis 1) must be >= 1")
    if length > sequence.max_length:
        raise ValidationError(
            R.TOO_LARGE, f"sequence of {length} tokens; the model takes at most {sequence.max_length}"
        )
    if rows * length > limits.max_record_tokens:
        raise ValidationError(
            R.TOO_LARGE,
            f"{rows} rows x {length} tokens = {rows * length} tokens; max_batch_tokens is {limits.max_record_tokens}",
        )
    dtypes = {s.name: s.dtype for s in signature.inputs}
    for name, fill in sequence.optional.items():
        if name not in arrays:
            arrays[name] = np.full((rows, length), fill, dtype=dtypes[name])
    mask = arrays.get(MASK)
    if mask is not None and not bool(mask.any(axis=1).all()):
        raise ValidationError(R.OUT_OF_RANGE, f"input {MASK!r}: a row attends to no token (all 0)")
    check_ranges(arrays, signature)
    ordered = {name: arrays[name] for name in sequence.inputs}
    return DecodedRequest(request_id, ordered, rows, outputs, length=length, binary_output=binary_output)


def _tokenize(
    item: Mapping[str, Any], chunk: memoryview | None, text: TextEncoder, limits: Limits
) -> dict[str, np.ndarray]:
    """A text input (BYTES ``[rows]`` or ``[rows, 1]``, one UTF-8 string per row) -> token id inputs."""
    name = item["name"]
    shape: list[int] = item["shape"]
    if item["datatype"] != "BYTES":
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: text must be BYTES, got {item['datatype']!r}")
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: text shape must be [rows] or [rows, 1], got {shape}")
    rows = check_rows(name, shape[0], limits.max_record_rows)
    if chunk is not None:
        texts = _bytes_elements(name, chunk)
    else:
        data = item["data"]
        if len(shape) == 2 and all(isinstance(v, list) and len(v) == 1 for v in data):
            data = [v[0] for v in data]
        if any(v is None for v in data):
            raise ValidationError(R.NULL_VALUE, f"input {name!r}: data contains null")
        if not all(isinstance(v, str) for v in data):
            raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: BYTES data must be strings")
        texts = data
    if len(texts) != rows:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: {len(texts)} strings, shape {shape} needs {rows}")
    return text.encode(texts)


def _bytes_elements(name: str, chunk: memoryview) -> list[str]:
    """Binary BYTES elements: each a 4-byte little-endian length, then that many UTF-8 bytes."""
    texts: list[str] = []
    pos = 0
    raw = chunk.tobytes()
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: binary BYTES element length is cut off")
        n = int.from_bytes(raw[pos : pos + 4], "little")
        pos += 4
        if pos + n > len(raw):
            raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: binary BYTES element runs past its data")
        try:
            texts.append(raw[pos : pos + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: a BYTES element is not UTF-8") from None
        pos += n
    return texts


def _check_input_fields(index: int, item: object, binary: bool) -> int | None:
    """Check one input object's fields; return its ``binary_data_size`` (bytes) when its data is binary."""
    if not isinstance(item, dict):
        raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}] is not an object")
    params = item.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}].parameters must be an object")
    size = params.get("binary_data_size") if params else None
    if size is not None:
        if not binary:
            raise DecodeError(
                R.INVALID_REQUEST, f"inputs[{index}] has binary_data_size but the record has no {BINARY_HEADER} header"
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}].parameters.binary_data_size must be an integer >= 0")
        if "data" in item:
            raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}] has both data and binary_data_size")
    fields: tuple[tuple[str, type], ...] = (("name", str), ("shape", list), ("datatype", str))
    if size is None:
        fields += (("data", list),)
    for field, kind in fields:
        if field not in item:
            raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}] has no {field!r}")
        if not isinstance(item[field], kind):
            raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}].{field} must be a {kind.__name__}")
    shape = item["shape"]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}].shape must be non-negative integers")
    return size


def requested_outputs(raw: object, signature: ModelSignature) -> tuple[str, ...] | None:
    """A request's ``outputs``: the names asked for, or None for every output.

    Raises:
        DecodeError: invalid_request: not a list of ``{"name": str}`` objects, empty, or a name twice.
        ValidationError: unknown_output.
    """
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in raw):
        raise DecodeError(R.INVALID_REQUEST, "'outputs' must be a list of objects with a string 'name'")
    names = tuple(o["name"] for o in raw)
    if not names:
        raise DecodeError(R.INVALID_REQUEST, "'outputs' is empty; leave it out to get every output")
    if len(set(names)) != len(names):
        raise DecodeError(R.INVALID_REQUEST, "'outputs' names an output twice")
    known = set(signature.output_names)
    for name in names:
        if name not in known:
            raise ValidationError(R.UNKNOWN_OUTPUT, f"model has no output {name!r}")
    return names


def _to_array(
    spec: TensorSpec, item: Mapping[str, Any], chunk: memoryview | None, limits: Limits, may_hold_booleans: bool
) -> np.ndarray:
    name: str = item["name"]
    shape: list[int] = item["shape"]
    datatype: str = item["datatype"]
    declared = check_declaration(spec, datatype, shape, limits.max_record_rows)

    if chunk is not None:
        count = math.prod(shape)
        if len(chunk) != count * declared.itemsize:
            raise ValidationError(
                R.SHAPE_MISMATCH,
                f"input {name!r}: {len(chunk)} bytes of binary data, shape {shape} of {datatype} needs "
                f"{count * declared.itemsize}",
            )
        arr = np.frombuffer(chunk, dtype=declared.newbyteorder("<")).reshape(shape)
        check_values(name, arr, declared, spec.dtype)
        return np.ascontiguousarray(arr, dtype=spec.dtype)
    if may_hold_booleans and declared.kind != "b" and holds_boolean(item["data"]):
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: data holds booleans, declared {oip_name(declared)}"
        )
    try:
        arr = np.array(item["data"])
    except (ValueError, TypeError) as exc:
        if "maximum number of dimension" in str(exc):
            raise ValidationError(
                R.SHAPE_MISMATCH, f"input {name!r}: data is nested deeper than rank {len(shape)}"
            ) from None
        raise ValidationError(R.RAGGED, f"input {name!r}: nested data is ragged") from None
    except OverflowError:
        raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: an integer exceeds 64 bits") from None
    check_values(name, arr, declared, spec.dtype)

    count = math.prod(shape)
    if arr.size != count:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: {arr.size} elements, shape {shape} needs {count}")
    if arr.ndim == 1:
        arr = arr.reshape(shape)
    elif list(arr.shape) != shape:
        raise ValidationError(
            R.SHAPE_MISMATCH, f"input {name!r}: nested data has shape {list(arr.shape)}, declared {shape}"
        )
    return np.ascontiguousarray(arr, dtype=spec.dtype)
