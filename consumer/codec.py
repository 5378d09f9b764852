"""Bytes <-> tensors: decode and validate Open Inference Protocol requests, encode responses.

Request value (JSON, KServe V2 / Open Inference Protocol "inference request")::

    {"id": "abc",                                   # optional string
     "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32",
                 "data": [...128 numbers, flat row-major, or nested [[...64], [...64]]]}],
     "outputs": [{"name": "probabilities"}],        # optional: only these outputs are returned
     "parameters": {...}}                           # optional, ignored

Every input's ``shape[0]`` is its number of rows (>= 1) and must agree across inputs; batching counts rows.

Binary tensor data (the OIP/KServe V2 binary data extension, as Triton implements it over HTTP): when the record
carries header ``inference-header-content-length: N`` (decimal text, any case), the first N bytes of the value are
the JSON request and the rest is raw tensor data; an input with ``"parameters": {"binary_data_size": K}`` and no
``data`` takes the next K bytes, in input order: little-endian, row-major, ``prod(shape) * itemsize`` bytes (BYTES
elements each a 4-byte little-endian length then the bytes). A request with ``"parameters":
{"binary_data_output": true}`` gets its response in the same form (header on the result record).

Sequence models (:mod:`consumer.sequence`) take ``[rows, length]`` token ids, ``attention_mask`` and
``token_type_ids`` optional; with a tokenizer configured they also take text: one BYTES input (``text`` by
default) of shape ``[rows]``, one UTF-8 string per row.

Response value (JSON, OIP "inference response")::

    {"id": "abc", "model_name": "digits", "model_version": "1",
     "outputs": [{"name": "label", "shape": [2], "datatype": "INT64", "data": [7, 3]}, ...]}

Validation is strict and happens before anything reaches ONNX Runtime; every failure raises a
:class:`~consumer.errors.RecordError` whose reason is one of :class:`~consumer.errors.DeadLetterReason`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from consumer.errors import DeadLetterReason, DecodeError, ValidationError
from consumer.schema import NUMPY_TO_OIP, OIP_TO_NUMPY, ModelSignature, TensorSpec

if TYPE_CHECKING:
    from consumer.sequence import TextEncoder

#: The attention mask input of a sequence model (Hugging Face name).
MASK = "attention_mask"

R = DeadLetterReason

#: Header carrying the correlation ID on requests (optional) and on every result and dead letter.
CORRELATION_HEADER = "correlation_id"
#: Header of a binary-extension record: the JSON part's length, bytes (the HTTP header name of OIP, lower case).
BINARY_HEADER = "inference-header-content-length"


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


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    """A validated request, ready to batch.

    Attributes:
        id: the request's ``id`` or None.
        inputs: model input name -> array already cast to the model's dtype, shape ``[rows, ...]``.
        rows: ``shape[0]`` shared by all inputs.
        outputs: requested output names, or None for all outputs.
        length: sequence models: the request's token length (axis 1); 0 otherwise.
        binary_output: answer in the binary data extension (``parameters.binary_data_output``).
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    rows: int
    outputs: tuple[str, ...] | None
    length: int = 0
    binary_output: bool = False

    @property
    def shape_key(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Non-batch shape of every input: requests are only stacked with requests of the same key."""
        return tuple((name, arr.shape[1:]) for name, arr in sorted(self.inputs.items()))


def binary_header_length(headers: Iterable[tuple[str, bytes | None]]) -> int | None:
    """The ``inference-header-content-length`` header's value (JSON part of a binary-extension record), or None.

    Raises:
        DecodeError: invalid_request: the header is not a non-negative decimal integer.
    """
    for name, value in headers:
        if name.lower() == BINARY_HEADER:
            if not value or not value.isdigit() or len(value) > 12:  # ASCII digits only: no sign, space or "_"
                raise DecodeError(R.INVALID_REQUEST, f"header {BINARY_HEADER} is not a decimal length: {value!r:.40}")
            return int(value)
    return None


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
            :func:`binary_header_length`); None for a plain JSON value.
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
    outputs = _requested_outputs(body.get("outputs"), signature)

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
    _check_ranges(arrays, signature)
    return DecodedRequest(id=request_id, inputs=arrays, rows=rows, outputs=outputs, binary_output=binary_output)


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
    _check_ranges(arrays, signature)
    ordered = {name: arrays[name] for name in sequence.inputs}
    return DecodedRequest(request_id, ordered, rows, outputs, length=length, binary_output=binary_output)


def _check_ranges(arrays: Mapping[str, np.ndarray], signature: ModelSignature) -> None:
    for name, (low, high) in signature.ranges.items():
        arr = arrays.get(name)
        if arr is None or arr.size == 0:
            continue
        lo, hi = int(arr.min()), int(arr.max())
        if lo < low or hi > high:
            raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: values [{lo}, {hi}] outside [{low}, {high}]")


def _check_rows(name: str, rows: int, limits: Limits) -> int:
    """``shape[0]`` of an input: at least 1 (shape_mismatch) and at most ``max_record_rows`` (too_large)."""
    if rows < 1:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: shape[0] (rows) must be >= 1")
    if rows > limits.max_record_rows:
        raise ValidationError(R.TOO_LARGE, f"input {name!r}: {rows} rows; max_record_rows is {limits.max_record_rows}")
    return rows


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
    rows = _check_rows(name, shape[0], limits)
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


def _requested_outputs(raw: object, signature: ModelSignature) -> tuple[str, ...] | None:
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


def _holds_boolean(data: list[Any]) -> bool:
    stack: list[Any] = [data]
    while stack:
        for v in stack.pop():
            if v is True or v is False:
                return True
            if isinstance(v, list):
                stack.append(v)
    return False


def _castable(declared: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether a declared OIP datatype may be fed to a model input of ``target`` dtype (values checked later)."""
    if declared == target:
        return True
    dk, tk = declared.kind, target.kind
    if dk in "iu" and tk in "iuf":
        return True  # integer -> integer (range checked) or -> float (exactness checked)
    return dk == "f" and tk == "f"  # float width change (range checked)


def _to_array(
    spec: TensorSpec, item: Mapping[str, Any], chunk: memoryview | None, limits: Limits, may_hold_booleans: bool
) -> np.ndarray:
    name: str = item["name"]
    shape: list[int] = item["shape"]
    datatype: str = item["datatype"]
    declared = OIP_TO_NUMPY.get(datatype)
    if declared is None:
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: unknown datatype {datatype!r}")
    if spec.dtype.kind == "O" or declared.kind == "O":
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: BYTES tensors are not supported")
    if not _castable(declared, spec.dtype):
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: {datatype} cannot be cast to the model's {spec.datatype}"
        )
    if len(shape) != len(spec.shape):
        raise ValidationError(
            R.SHAPE_MISMATCH, f"input {name!r}: rank {len(shape)}, model expects rank {len(spec.shape)}"
        )
    for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if want is not None and got != want:
            raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: dimension {axis} is {got}, model expects {want}")
    _check_rows(name, shape[0], limits)

    if chunk is not None:
        count = math.prod(shape)
        if len(chunk) != count * declared.itemsize:
            raise ValidationError(
                R.SHAPE_MISMATCH,
                f"input {name!r}: {len(chunk)} bytes of binary data, shape {shape} of {datatype} needs "
                f"{count * declared.itemsize}",
            )
        arr = np.frombuffer(chunk, dtype=declared.newbyteorder("<")).reshape(shape)
        _check_values(name, arr, declared, spec.dtype)
        return np.ascontiguousarray(arr, dtype=spec.dtype)
    if may_hold_booleans and declared.kind != "b" and _holds_boolean(item["data"]):
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: data holds booleans, declared {_oip(declared)}")
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
    _check_values(name, arr, declared, spec.dtype)

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


def _check_values(name: str, arr: np.ndarray, declared: np.dtype[Any], target: np.dtype[Any]) -> None:
    """Check the parsed values fit the declared datatype and cast losslessly (or in range) to ``target``."""
    kind = arr.dtype.kind
    if kind == "O":
        if any(v is None for v in arr.flat):
            raise ValidationError(R.NULL_VALUE, f"input {name!r}: data contains null")
        if all(isinstance(v, int) for v in arr.flat):  # Python ints beyond uint64
            raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: an integer exceeds 64 bits")
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: data mixes types {datatype_of(arr)}")
    if kind in "USV":
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: data holds strings, declared {_oip(declared)}")
    if (kind == "b") != (declared.kind == "b"):
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: data is {datatype_of(arr)}, declared {_oip(declared)}"
        )
    if arr.size == 0 or kind == "b":
        return
    if kind == "f" and declared.kind in "iu" and not bool(np.all(np.floor(arr) == arr)):
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: fractional values for integer datatype {_oip(declared)}"
        )
    lo, hi = arr.min(), arr.max()
    for dtype in (declared, target):
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            ok = int(lo) >= info.min and int(hi) <= info.max if kind in "iu" else lo >= info.min and hi <= info.max
        else:
            fmax = float(np.finfo(dtype).max)
            ok = -fmax <= float(lo) and float(hi) <= fmax
        if not ok:
            raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: values [{lo}, {hi}] do not fit {_oip(dtype)}")
    if declared.kind in "iu" and target.kind == "f":
        exact = 2 ** (np.finfo(target).nmant + 1)
        if max(abs(int(lo)), abs(int(hi))) > exact:
            raise ValidationError(
                R.OUT_OF_RANGE, f"input {name!r}: integers beyond +-{exact} are not exact in {_oip(target)}"
            )


def _oip(dtype: np.dtype[Any]) -> str:
    return NUMPY_TO_OIP.get(dtype, str(dtype))


def datatype_of(arr: np.ndarray) -> str:
    """Readable datatype of parsed JSON data, for messages (``INT64``, ``FP64``, ``object``)."""
    return NUMPY_TO_OIP.get(arr.dtype, str(arr.dtype))


def correlation_id(
    headers: Iterable[tuple[str, bytes | None]], request_id: str | None, key: bytes | None, fallback: str
) -> bytes:
    """The record's correlation ID: header ``correlation_id`` (first if repeated), else the request ``id``,
    else the record key, else ``fallback`` (``topic:partition:offset``). Echoed byte-for-byte."""
    for name, value in headers:
        if name == CORRELATION_HEADER and value is not None:
            return value
    if request_id is not None:
        return request_id.encode()
    if key is not None:
        return key
    return fallback.encode()


def _le_bytes(arr: np.ndarray) -> bytes:
    """Row-major little-endian bytes of a numeric array (the binary data extension's layout)."""
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _tensor(name: str, arr: np.ndarray, binary: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "shape": list(arr.shape), "datatype": NUMPY_TO_OIP[arr.dtype]}
    if binary:
        entry["parameters"] = {"binary_data_size": arr.nbytes}
    else:
        entry["data"] = np.ascontiguousarray(arr).reshape(-1)
    return entry


def encode_response(response_id: str, signature: ModelSignature, outputs: Sequence[tuple[str, np.ndarray]]) -> bytes:
    """Serialise one OIP inference response as JSON.

    Args:
        response_id: the response ``id`` (the correlation ID as text).
        signature: supplies ``model_name`` and ``model_version``.
        outputs: (name, array) pairs for this record only, each array ``[rows, ...]``, numeric.

    Returns:
        UTF-8 JSON bytes; ``data`` is flat row-major as the OIP specifies.

    Raises:
        KeyError: an output's dtype has no OIP datatype.
    """
    return _response(response_id, signature, outputs, binary=False)


def encode_response_binary(
    response_id: str, signature: ModelSignature, outputs: Sequence[tuple[str, np.ndarray]]
) -> tuple[bytes, int]:
    """Serialise one OIP inference response in the binary data extension.

    Returns:
        (value, json_length): the JSON part (outputs carry ``parameters.binary_data_size``, no ``data``) followed
        by each output's little-endian row-major bytes; and the JSON part's length in bytes (the value of the
        result's ``inference-header-content-length`` header).

    Raises:
        KeyError: an output's dtype has no OIP datatype.
    """
    head = _response(response_id, signature, outputs, binary=True)
    return head + b"".join(_le_bytes(arr) for _, arr in outputs), len(head)


def _response(
    response_id: str, signature: ModelSignature, outputs: Sequence[tuple[str, np.ndarray]], *, binary: bool
) -> bytes:
    body = {
        "id": response_id,
        "model_name": signature.name,
        "model_version": signature.version,
        "outputs": [_tensor(name, arr, binary) for name, arr in outputs],
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


RequestInputs = Mapping[str, "np.ndarray | list[str]"]


def encode_request(request_id: str | None, inputs: RequestInputs, outputs: Sequence[str] | None = None) -> bytes:
    """Serialise an OIP inference request as JSON (used by producer_tools and tests).

    Args:
        request_id: the ``id`` field, or None to leave it out.
        inputs: input name -> array ``[rows, ...]`` of an OIP-mappable numeric dtype, or a list of ``str`` for a
            text (BYTES) input of shape ``[rows]``.
        outputs: output names to request, or None for all.
    """
    head, _ = _request(request_id, inputs, outputs, binary=False, binary_output=False)
    return head


def encode_request_binary(
    request_id: str | None, inputs: RequestInputs, outputs: Sequence[str] | None = None, *, binary_output: bool = True
) -> tuple[bytes, int]:
    """Serialise an OIP inference request in the binary data extension.

    Args:
        binary_output: ask for the response in the binary data extension too.

    Returns:
        (value, json_length): the record value, and the JSON part's length in bytes (send it as header
        ``inference-header-content-length``).
    """
    head, blobs = _request(request_id, inputs, outputs, binary=True, binary_output=binary_output)
    return head + b"".join(blobs), len(head)


def _request(
    request_id: str | None,
    inputs: RequestInputs,
    outputs: Sequence[str] | None,
    *,
    binary: bool,
    binary_output: bool,
) -> tuple[bytes, list[bytes]]:
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, arr in inputs.items():
        if isinstance(arr, list):  # text
            raw = [t.encode() for t in arr]
            entry: dict[str, Any] = {"name": name, "shape": [len(raw)], "datatype": "BYTES"}
            if binary:
                blob = b"".join(len(r).to_bytes(4, "little") + r for r in raw)
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = arr
            tensors.append(entry)
            continue
        tensors.append(_tensor(name, arr, binary))
        if binary:
            blobs.append(_le_bytes(arr))
    body: dict[str, Any] = {"inputs": tensors}
    if request_id is not None:
        body["id"] = request_id
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    if binary_output:
        body["parameters"] = {"binary_data_output": True}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), blobs


def decode_response(value: bytes, json_length: int | None = None) -> dict[str, Any]:
    """Parse an OIP response into ``{"id", "model_name", "model_version", "outputs": {name: ndarray}}``.

    Args:
        value: the result record's value.
        json_length: the ``inference-header-content-length`` header of a binary response, else None.

    Raises:
        orjson.JSONDecodeError, KeyError, ValueError: the value is not an OIP response.
    """
    head = value if json_length is None else value[:json_length]
    body = orjson.loads(head)
    arrays: dict[str, np.ndarray] = {}
    pos = json_length or 0
    for o in body["outputs"]:
        dtype = OIP_TO_NUMPY[o["datatype"]]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            flat = np.frombuffer(value[pos : pos + size], dtype=dtype.newbyteorder("<"))
            arrays[o["name"]] = flat.astype(dtype).reshape(o["shape"])
            pos += size
        else:
            arrays[o["name"]] = np.asarray(o["data"], dtype=dtype).reshape(o["shape"])
    return {**body, "outputs": arrays}
