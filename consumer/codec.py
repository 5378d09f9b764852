"""Bytes <-> tensors: decode and validate Open Inference Protocol requests, encode responses.

Request value (JSON, KServe V2 / Open Inference Protocol "inference request")::

    {"id": "abc",                                   # optional string
     "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32",
                 "data": [...128 numbers, flat row-major, or nested [[...64], [...64]]]}],
     "outputs": [{"name": "probabilities"}],        # optional: only these outputs are returned
     "parameters": {...}}                           # optional, ignored

Every input's ``shape[0]`` is its number of rows (>= 1) and must agree across inputs; batching counts rows.

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
from typing import Any

import numpy as np
import orjson

from consumer.errors import DeadLetterReason, DecodeError, ValidationError
from consumer.schema import NUMPY_TO_OIP, OIP_TO_NUMPY, ModelSignature, TensorSpec

R = DeadLetterReason

#: Header carrying the correlation ID on requests (optional) and on every result and dead letter.
CORRELATION_HEADER = "correlation_id"


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-record size limits, checked before parsing (bytes) and before allocating tensors (rows).

    Attributes:
        max_record_bytes: largest accepted record value, bytes.
        max_record_rows: largest accepted ``shape[0]``, rows.
    """

    max_record_bytes: int = 1_048_576
    max_record_rows: int = 1024


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    """A validated request, ready to batch.

    Attributes:
        id: the request's ``id`` or None.
        inputs: model input name -> array already cast to the model's dtype, shape ``[rows, ...]``.
        rows: ``shape[0]`` shared by all inputs.
        outputs: requested output names, or None for all outputs.
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    rows: int
    outputs: tuple[str, ...] | None

    @property
    def shape_key(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Non-batch shape of every input: requests are only stacked with requests of the same key."""
        return tuple((name, arr.shape[1:]) for name, arr in sorted(self.inputs.items()))


def decode_request(value: bytes | None, signature: ModelSignature, limits: Limits) -> DecodedRequest:
    """Parse and validate one record value against the model's inputs.

    Args:
        value: the Kafka record value (UTF-8 JSON), possibly None for a tombstone.
        signature: the model's inputs and outputs.
        limits: size limits.

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
    outputs = _requested_outputs(body.get("outputs"), signature)

    raw_inputs = body.get("inputs")
    if not isinstance(raw_inputs, list):
        raise DecodeError(R.INVALID_REQUEST, "'inputs' must be a list")
    by_name: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(raw_inputs):
        _check_input_fields(i, item)
        if item["name"] in by_name:
            raise DecodeError(R.INVALID_REQUEST, f"input {item['name']!r} appears twice")
        by_name[item["name"]] = item

    unknown = sorted(set(by_name) - {s.name for s in signature.inputs})
    if unknown:
        raise ValidationError(R.UNKNOWN_INPUT, f"model has no input {unknown[0]!r}")
    missing = [s.name for s in signature.inputs if s.name not in by_name]
    if missing:
        raise ValidationError(R.MISSING_INPUT, f"model input {missing[0]!r} is missing")

    # numpy turns JSON true/false into 1/0 next to numbers; look for them only when the bytes could hold one.
    may_hold_booleans = b"true" in value or b"false" in value
    arrays: dict[str, np.ndarray] = {}
    rows: int | None = None
    for spec in signature.inputs:
        arr = _to_array(spec, by_name[spec.name], limits, may_hold_booleans)
        if rows is None:
            rows = arr.shape[0]
        elif arr.shape[0] != rows:
            raise ValidationError(
                R.SHAPE_MISMATCH, f"input {spec.name!r} has {arr.shape[0]} rows, other inputs have {rows}"
            )
        arrays[spec.name] = arr
    assert rows is not None  # signature.inputs is never empty
    return DecodedRequest(id=request_id, inputs=arrays, rows=rows, outputs=outputs)


def _check_input_fields(index: int, item: object) -> None:
    if not isinstance(item, dict):
        raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}] is not an object")
    for field, kind in (("name", str), ("shape", list), ("datatype", str), ("data", list)):
        if field not in item:
            raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}] has no {field!r}")
        if not isinstance(item[field], kind):
            raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}].{field} must be a {kind.__name__}")
    shape = item["shape"]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}].shape must be non-negative integers")


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


def _to_array(spec: TensorSpec, item: Mapping[str, Any], limits: Limits, may_hold_booleans: bool) -> np.ndarray:
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
    if shape[0] < 1:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: shape[0] (rows) must be >= 1")
    if shape[0] > limits.max_record_rows:
        raise ValidationError(
            R.TOO_LARGE, f"input {name!r}: {shape[0]} rows; max_record_rows is {limits.max_record_rows}"
        )

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


def encode_response(response_id: str, signature: ModelSignature, outputs: Sequence[tuple[str, np.ndarray]]) -> bytes:
    """Serialise one OIP inference response.

    Args:
        response_id: the response ``id`` (the correlation ID as text).
        signature: supplies ``model_name`` and ``model_version``.
        outputs: (name, array) pairs for this record only, each array ``[rows, ...]``.

    Returns:
        UTF-8 JSON bytes; ``data`` is flat row-major as the OIP specifies.
    """
    body = {
        "id": response_id,
        "model_name": signature.name,
        "model_version": signature.version,
        "outputs": [
            {
                "name": name,
                "shape": list(arr.shape),
                "datatype": NUMPY_TO_OIP[arr.dtype],
                "data": np.ascontiguousarray(arr).reshape(-1),
            }
            for name, arr in outputs
        ],
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_request(
    request_id: str | None, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
) -> bytes:
    """Serialise an OIP inference request (used by producer_tools and tests).

    Args:
        request_id: the ``id`` field, or None to leave it out.
        inputs: input name -> array ``[rows, ...]`` of an OIP-mappable dtype.
        outputs: output names to request, or None for all.
    """
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": name,
                "shape": list(arr.shape),
                "datatype": NUMPY_TO_OIP[arr.dtype],
                "data": np.ascontiguousarray(arr).reshape(-1),
            }
            for name, arr in inputs.items()
        ]
    }
    if request_id is not None:
        body["id"] = request_id
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_response(value: bytes) -> dict[str, Any]:
    """Parse an OIP response into ``{"id", "model_name", "model_version", "outputs": {name: ndarray}}``.

    Raises:
        orjson.JSONDecodeError, KeyError: the value is not an OIP response.
    """
    body = orjson.loads(value)
    arrays = {
        o["name"]: np.asarray(o["data"], dtype=OIP_TO_NUMPY[o["datatype"]]).reshape(o["shape"]) for o in body["outputs"]
    }
    return {**body, "outputs": arrays}
