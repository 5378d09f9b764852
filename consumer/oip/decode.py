"""Request value -> validated tensors, one record: :func:`decode_request`, :func:`decode_form` (a record of a known
form) and :func:`decode_one` (a record with its headers). A fetched chunk: :func:`consumer.oip.chunk.decode_chunk`.

Request value (JSON, KServe V2 / Open Inference Protocol "inference request")::

    {"id": "abc",                                   # optional string
     "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32",
                 "data": [...128 numbers, flat row-major, or nested [[...64], [...64]]]}],
     "outputs": [{"name": "probabilities"}],        # optional: only these outputs are returned
     "parameters": {...}}                           # optional, ignored but for binary_data_output

Every input's ``shape[0]`` is its number of rows (>= 1) and must agree across inputs; batching counts rows.

Binary tensor data (:mod:`consumer.oip.wire`): an input with ``"parameters": {"binary_data_size": K}`` and no
``data`` takes the next K bytes after the JSON part (its *span* of the binary data): ``prod(shape) * itemsize``
bytes, little-endian, row-major (BYTES elements each a 4-byte little-endian length then the bytes). A request
with ``"parameters": {"binary_data_output": true}`` gets its response in the same form.

Sequence models (:mod:`consumer.model.sequence`) take ``[rows, length]`` token ids, ``attention_mask`` and
``token_type_ids`` optional; with a tokenizer configured they also take text: one BYTES input (``text`` by
default) of shape ``[rows]``, one UTF-8 string per row.

Validation is strict and happens before anything reaches ONNX Runtime; every failure is a
:class:`~consumer.errors.RecordError` whose reason is one of :class:`~consumer.errors.DeadLetterReason`.
:func:`consumer.oip.chunk.decode_chunk` gives exactly what :func:`decode_request` gives record by record, faster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from consumer.errors import DeadLetterReason as R
from consumer.errors import DecodeError, RecordError, ValidationError
from consumer.json_object import record_json
from consumer.oip.forms import Form, RecordForm, classify
from consumer.oip.images import check_pixels, image_elements
from consumer.oip.proto import to_binary
from consumer.oip.validate import (
    check_declaration,
    check_ranges,
    check_rows,
    check_strings,
    check_values,
    holds_boolean,
    oip_name,
    row_elements,
    split_bytes,
)
from consumer.oip.wire import BINARY_HEADER, Headers
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Limits

if TYPE_CHECKING:
    from consumer.model.sequence import TextEncoder
    from consumer.model.vision import ImageEncoder

#: The attention mask input of a sequence model (Hugging Face name).
MASK = "attention_mask"


def decode_request(
    value: bytes | None,
    signature: ModelSignature,
    limits: Limits,
    *,
    json_length: int | None = None,
    text: TextEncoder | None = None,
    images: ImageEncoder | None = None,
) -> DecodedRequest:
    """Parse and validate one record value against the model's inputs.

    Args:
        value: the Kafka record value (UTF-8 JSON), possibly None for a tombstone.
        signature: the model's inputs and outputs.
        limits: size limits.
        json_length: binary data extension: the JSON part's length in bytes (from
            :func:`consumer.oip.forms.classify`); None for a plain JSON value.
        text: tokenizer for text requests of a sequence model, or None when text is not served.
        images: image models: a request whose one input is the image input (BYTES or UINT8) is returned pending
            (its images checked but not decoded: :meth:`consumer.model.vision.ImageEncoder.finish` does that).

    What every request shares is checked first (:func:`_envelope`), then the request by its kind: a sequence
    model's text (:func:`_text_request`), an image model's images (:func:`_image_request`), or tensors, one per
    model input (:func:`_tensor_request`).

    Returns:
        The request with each input as a numpy array of the model's dtype and shape ``[rows, ...]``.

    Raises:
        DecodeError: reasons invalid_json, not_an_object, invalid_request, too_large.
        ValidationError: reasons missing_input, unknown_input, unknown_output, datatype_mismatch,
            out_of_range, shape_mismatch, ragged, null_value, too_large.
    """
    envelope = _envelope(value, signature, limits, json_length)
    inputs = envelope.inputs
    if text is not None and set(inputs) == {text.input_name}:
        return _text_request(envelope, text, signature, limits)
    if (
        images is not None
        and set(inputs) == {images.input_name}
        and (inputs[images.input_name]["datatype"] in ("BYTES", "UINT8") or signature.input(images.input_name) is None)
    ):  # images, unless the model has an input of that name and the request feeds it a tensor
        return _image_request(envelope, images, limits)
    return _tensor_request(envelope, signature, limits, images)


class _Envelope(NamedTuple):
    """What every request kind shares, checked: the JSON part, ``id``, ``parameters`` and ``outputs``, and the
    input objects (fields checked, names unique) with their spans of the binary data."""

    #: The JSON part of the value (all of it without the binary data extension).
    json: bytes
    request_id: str | None
    outputs: tuple[str, ...] | None
    binary_output: bool
    #: Input objects by name, in request order.
    inputs: dict[str, dict[str, Any]]
    #: Binary data extension: each such input's span of the bytes after the JSON part.
    spans: dict[str, memoryview]

    def may_hold_booleans(self) -> bool:
        """Whether the JSON part could hold a ``true`` or ``false`` (numpy turns them into 1/0 next to numbers)."""
        return b"true" in self.json or b"false" in self.json


def _envelope(value: bytes | None, signature: ModelSignature, limits: Limits, json_length: int | None) -> _Envelope:
    """Parse a request value and check what every kind of request shares (:class:`_Envelope`).

    Raises:
        DecodeError: invalid_json (empty, not JSON), not_an_object, too_large (over ``max_record_bytes``),
            invalid_request (a bad binary header length, ``id``, ``parameters``, ``inputs`` or input object, binary
            data sizes that do not add up).
        ValidationError: unknown_output.
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
    body = record_json(value)

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
    spans: dict[str, memoryview] = {}
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
            spans[item["name"]] = binary[taken : taken + size]
            taken += size
    if binary is not None and taken != len(binary):
        raise DecodeError(R.INVALID_REQUEST, f"{len(binary) - taken} bytes of binary data belong to no input")
    return _Envelope(value, request_id, outputs, binary_output, by_name, spans)


def _text_request(envelope: _Envelope, text: TextEncoder, signature: ModelSignature, limits: Limits) -> DecodedRequest:
    """A sequence model's request whose one input is text: tokenized, then checked as token inputs.

    Raises:
        ValidationError: datatype_mismatch, shape_mismatch, null_value, too_large, out_of_range.
    """
    name = text.input_name
    arrays = _tokenize(envelope.inputs[name], envelope.spans.get(name), text, limits)
    return _sequence_request(envelope.request_id, arrays, envelope.outputs, signature, envelope.binary_output, limits)


def _image_request(envelope: _Envelope, images: ImageEncoder, limits: Limits) -> DecodedRequest:
    """An image model's request whose one input is the image input, returned pending: encoded images (BYTES) or
    decoded pixels (UINT8 ``[rows, H, W, 3]``), checked but not yet preprocessed.

    Raises:
        ValidationError: datatype_mismatch, shape_mismatch, null_value, out_of_range, too_large (more images than
            ``max_record_rows`` or ``max_in_flight_images``, or pixels over the budget).
    """
    limit = min(limits.max_record_rows, images.max_images)
    item = envelope.inputs[images.input_name]
    span = envelope.spans.get(images.input_name)
    if item["datatype"] == "UINT8":  # decoded pixels: checked as any UINT8 tensor, after the pixel budget
        check_pixels(item["name"], item["shape"], limit, images.max_pixels)
        spec = TensorSpec(item["name"], np.dtype(np.uint8), (None, None, None, 3))
        bounded = Limits(limits.max_record_bytes, limit, limits.max_record_tokens)
        pending = list(_to_array(spec, item, span, bounded, envelope.may_hold_booleans()))
    else:
        pending = image_elements(item, span, limit)
    request = DecodedRequest(
        envelope.request_id, None, len(pending), envelope.outputs, binary_output=envelope.binary_output
    )
    request.pending = pending
    return request


def _tensor_request(
    envelope: _Envelope, signature: ModelSignature, limits: Limits, images: ImageEncoder | None
) -> DecodedRequest:
    """A request of tensors, one per model input (a sequence model's token inputs, or any model's).

    Args:
        images: an image model's encoder, for the hint when an input is unknown; None otherwise.

    Raises:
        ValidationError: unknown_input, missing_input, datatype_mismatch, shape_mismatch, ragged, null_value,
            out_of_range, too_large.
    """
    by_name = envelope.inputs
    sequence = signature.sequence
    names = {s.name for s in signature.inputs}
    unknown = sorted(set(by_name) - names)
    if unknown:
        hint = f"; images go alone in input {images.input_name!r} (BYTES or UINT8)" if images is not None else ""
        raise ValidationError(
            R.UNKNOWN_INPUT,
            f"model has no input {unknown[0]!r}; its inputs: {[s.name for s in signature.inputs]}{hint}",
        )
    optional = sequence.optional if sequence is not None else {}
    missing = [s.name for s in signature.inputs if s.name not in by_name and s.name not in optional]
    if missing:
        raise ValidationError(R.MISSING_INPUT, f"model input {missing[0]!r} is missing")

    # look for JSON booleans only when the bytes could hold one
    may_hold_booleans = envelope.may_hold_booleans()
    arrays = {}
    rows: int | None = None
    for spec in signature.inputs:
        if spec.name not in by_name:
            continue
        arr = _to_array(spec, by_name[spec.name], envelope.spans.get(spec.name), limits, may_hold_booleans)
        if rows is None:
            rows = arr.shape[0]
        elif arr.shape[0] != rows:
            raise ValidationError(
                R.SHAPE_MISMATCH, f"input {spec.name!r} has {arr.shape[0]} rows, other inputs have {rows}"
            )
        arrays[spec.name] = arr
    if rows is None:  # only optional inputs were given
        raise ValidationError(R.MISSING_INPUT, f"model input {signature.inputs[0].name!r} is missing")
    outputs, binary_output = envelope.outputs, envelope.binary_output
    if sequence is not None:
        return _sequence_request(envelope.request_id, arrays, outputs, signature, binary_output, limits)
    check_ranges(arrays, signature)
    return DecodedRequest(
        id=envelope.request_id, inputs=arrays, rows=rows, outputs=outputs, binary_output=binary_output
    )


def decode_one(
    value: bytes | None,
    headers: Headers,
    signature: ModelSignature,
    limits: Limits,
    text: TextEncoder | None = None,
    images: ImageEncoder | None = None,
) -> DecodedRequest | RecordError:
    """:func:`decode_form` of one record with its headers (:func:`consumer.oip.forms.classify` reads them)."""
    return decode_form(value, classify(headers), signature, limits, text, images)


def decode_form(
    value: bytes | None,
    form: RecordForm | RecordError,
    signature: ModelSignature,
    limits: Limits,
    text: TextEncoder | None = None,
    images: ImageEncoder | None = None,
) -> DecodedRequest | RecordError:
    """:func:`decode_request` of one record of a known form: JSON, the binary extension (its JSON part's length) or a
    protobuf ``ModelInferRequest`` (transcoded first by :func:`consumer.oip.proto.to_binary`); the error is returned,
    not raised.

    Args:
        form: :func:`consumer.oip.forms.classify`'s answer for the record's headers (an error: returned as it is).
    """
    if not isinstance(form, RecordForm):
        return form
    try:
        if value and form.form is Form.PROTOBUF:
            if len(value) > limits.max_record_bytes:
                raise DecodeError(
                    R.TOO_LARGE, f"record value is {len(value)} bytes; max_record_bytes is {limits.max_record_bytes}"
                )
            binary, json_length = to_binary(value)
            request = decode_request(
                binary, signature, _unbounded(limits), json_length=json_length, text=text, images=images
            )
            request.protobuf = True
            return request
        return decode_request(value, signature, limits, json_length=form.json_length, text=text, images=images)
    except RecordError as err:
        return err


def _unbounded(limits: Limits) -> Limits:
    """``limits`` without the byte limit: a protobuf value was measured before it was transcoded (typed contents
    take more bytes once unpacked, e.g. a varint INT64)."""
    return Limits(2**62, limits.max_record_rows, limits.max_record_tokens)


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
            f"{rows} rows x {length} tokens = {rows * length} tokens; max_record_tokens is {limits.max_record_tokens}",
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
    item: Mapping[str, Any], span: memoryview | None, text: TextEncoder, limits: Limits
) -> dict[str, np.ndarray]:
    """A text input (BYTES ``[rows]`` or ``[rows, 1]``, one UTF-8 string per row) -> token id inputs."""
    name = item["name"]
    shape: list[int] = item["shape"]
    if item["datatype"] != "BYTES":
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: text must be BYTES, got {item['datatype']!r}")
    rows, data = row_elements(item, span, "text", lambda n, r: check_rows(n, r, limits.max_record_rows))
    if span is not None:
        texts = _utf8(name, data)
    else:
        if any(v is None for v in data):
            raise ValidationError(R.NULL_VALUE, f"input {name!r}: data contains null")
        if not all(isinstance(v, str) for v in data):
            raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: BYTES data must be strings")
        texts = data
    if len(texts) != rows:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: {len(texts)} strings, shape {shape} needs {rows}")
    return text.encode(texts)


def _utf8(name: str, elements: list[bytes]) -> list[str]:
    """Binary BYTES elements as UTF-8 strings."""
    try:
        return [raw.decode("utf-8") for raw in elements]
    except UnicodeDecodeError:
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: a BYTES element is not UTF-8") from None


def _strings_array(spec: TensorSpec, item: Mapping[str, Any], span: memoryview | None) -> np.ndarray:
    """A BYTES input of a ``tensor(string)`` model input: JSON strings (flat or nested as the shape), or binary
    elements (each a 4-byte little-endian length, then UTF-8), as an object array of str of the declared shape."""
    name: str = item["name"]
    shape: list[int] = item["shape"]
    count = math.prod(shape)
    if span is not None:
        arr = np.array(_utf8(name, split_bytes(name, span)), dtype=object)
    else:
        arr = np.array(item["data"], dtype=object)
        check_strings(name, arr)
    if arr.size != count:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: {arr.size} elements, shape {shape} needs {count}")
    if arr.ndim == 1:
        return arr.reshape(shape)
    if list(arr.shape) != shape:
        raise ValidationError(
            R.SHAPE_MISMATCH, f"input {name!r}: nested data has shape {list(arr.shape)}, declared {shape}"
        )
    return arr


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
            raise ValidationError(
                R.UNKNOWN_OUTPUT, f"model has no output {name!r}; its outputs: {list(signature.output_names)}"
            )
    return names


def _to_array(
    spec: TensorSpec, item: Mapping[str, Any], span: memoryview | None, limits: Limits, may_hold_booleans: bool
) -> np.ndarray:
    name: str = item["name"]
    shape: list[int] = item["shape"]
    datatype: str = item["datatype"]
    declared = check_declaration(spec, datatype, shape, limits.max_record_rows)
    if declared.kind == "O":  # BYTES into a tensor(string) input
        return _strings_array(spec, item, span)

    if span is not None:
        count = math.prod(shape)
        if len(span) != count * declared.itemsize:
            raise ValidationError(
                R.SHAPE_MISMATCH,
                f"input {name!r}: {len(span)} bytes of binary data, shape {shape} of {datatype} needs "
                f"{count * declared.itemsize}",
            )
        arr = np.frombuffer(span, dtype=declared.newbyteorder("<")).reshape(shape)
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
