"""A fetched chunk of request values -> validated requests, with the same outcome, record for record, as
:func:`consumer.oip.decode.decode_one`, at a fraction of its cost per record.

Each record's headers are read once (:func:`consumer.oip.forms.classify`: JSON, binary extension or protobuf) and
the record is dispatched on its form: a JSON or binary record may join a stack (below); a protobuf record, an empty
or oversized value, a record whose header is malformed, and any record the fast path cannot take is decoded on its
own (:func:`consumer.oip.decode.decode_form`) with the form already known.

Every plain JSON request (no binary data extension) is parsed with ``orjson``; records that declare the same
``(datatype, shape)`` for every input form a *stack*, whose inputs are each parsed into one numpy array
``[records x rows, ...]`` and checked with one set of reductions (range, exactness, the model's value ranges). A
stack that fails any check, and every record that is not plain, is decoded record by record, which names the
culprit with the same reason and message.

Binary-extension requests of a one-input model that are well formed (the length header, one input object with
``binary_data_size`` equal to the bytes after the JSON part) and declare the same ``(datatype, shape)`` form a stack
too: their bytes are joined into one little-endian array and checked at once.

Numbers: numpy picks a stack's dtype as it does for one record (a float stack is not parsed straight into float64,
which would turn a numeric string such as ``"1"`` into its number, where the record on its own is
datatype_mismatch; a string, or a JSON null, fails the stack); a float stack holding a value beyond 2**53 (integers
are not exact there) is decoded record by record; integers keep numpy's own integer choice.
``true``/``false`` would become 1/0 next to numbers, so a record whose bytes may hold one is decoded on its own
(one scan of the whole chunk says whether any may).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from consumer.errors import RecordError, ValidationError
from consumer.oip.decode import decode_form, requested_outputs
from consumer.oip.forms import JSON_FORM, RecordForm, classify
from consumer.oip.validate import check_declaration, check_ranges, check_values
from consumer.oip.wire import Headers
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Limits

if TYPE_CHECKING:
    from consumer.model.sequence import TextEncoder
    from consumer.model.vision import ImageEncoder

#: A well-formed binary-extension record of a one-input model: (index in the chunk, request id, requested
#: outputs, binary_data_output, its tensor's bytes).
_Binary = tuple[int, str | None, tuple[str, ...] | None, bool, memoryview]

#: Integers above this are not exact in float64: a chunk holding them is decoded record by record (a float32
#: input then gets each record's own int64 -> float32 cast, never float64 -> float32).
EXACT_IN_FLOAT64 = 2**53

#: (datatype, shape) of every model input, in the model's input order: the records of one stack share it.
_StackKey = tuple[tuple[str, tuple[int, ...]], ...]
#: A record that parsed as a well-formed plain JSON request, its values not yet checked: (index in the chunk,
#: request id, requested outputs, binary_data_output, each model input's ``data`` in input order).
_Parsed = tuple[int, str | None, tuple[str, ...] | None, bool, list[list[Any]]]


def decode_chunk(
    values: Sequence[bytes | None],
    headers: Sequence[Headers],
    signature: ModelSignature,
    limits: Limits,
    text: TextEncoder | None = None,
    images: ImageEncoder | None = None,
) -> list[DecodedRequest | RecordError]:
    """Decode and validate a fetched chunk of records: the same outcome, record for record, as ``decode_one``.

    Args:
        values: the record values, in fetch order.
        headers: each record's headers.
        signature: the model's inputs and outputs.
        limits: per-record size limits.
        text: tokenizer of a sequence model that serves text (such chunks are decoded record by record).
        images: an image model's encoder: records are checked one by one, then every image of the chunk is
            decoded on its thread pool at once (:meth:`~consumer.model.vision.ImageEncoder.finish`).

    Returns:
        One :class:`~consumer.oip.decode.DecodedRequest` (its ``inputs`` views of its stack's ``block``) or
        :class:`~consumer.errors.RecordError` per record, in order.
    """
    forms = [classify(h) for h in headers]
    if images is not None:
        outcomes = [decode_form(v, f, signature, limits, images=images) for v, f in zip(values, forms, strict=True)]
        images.finish(outcomes)
        return outcomes
    if signature.sequence is not None or text is not None:
        return [decode_form(v, f, signature, limits, text) for v, f in zip(values, forms, strict=True)]
    out: list[DecodedRequest | RecordError | None] = [None] * len(values)
    joined = b"\0".join([v for v in values if v])
    scan = b"true" in joined or b"false" in joined
    stacks: dict[_StackKey, list[_Parsed]] = {}
    binaries: dict[_StackKey, list[_Binary]] = {}
    max_bytes = limits.max_record_bytes
    parse_plain = _parse_plain_one if len(signature.inputs) == 1 else _parse_plain
    for i, (value, form) in enumerate(zip(values, forms, strict=True)):
        found: tuple[_StackKey, Any] | None = None
        if not value or len(value) > max_bytes:
            pass
        elif form is JSON_FORM:
            if not (scan and (b"true" in value or b"false" in value)):
                found = parse_plain(i, value, signature)
                if found is not None:
                    stacks.setdefault(found[0], []).append(found[1])
                    continue
        elif type(form) is RecordForm and form.json_length is not None:
            found = _parse_binary(i, value, form.json_length, signature)
            if found is not None:
                binaries.setdefault(found[0], []).append(found[1])
                continue
        out[i] = decode_form(value, form, signature, limits)
    decoded: list[tuple[Sequence[tuple[int, Any, Any, Any, Any]], list[DecodedRequest] | None]] = [
        (members, _decode_stack(key, members, signature, limits)) for key, members in stacks.items()
    ]
    decoded += [(found, _decode_binary_stack(key, found, signature, limits)) for key, found in binaries.items()]
    for members, requests in decoded:
        if requests is None:  # a stack that failed a check: each of its records on its own
            for m in members:
                i = m[0]
                out[i] = decode_form(values[i], forms[i], signature, limits)
        else:
            for m, request in zip(members, requests, strict=True):
                out[m[0]] = request
    return out  # type: ignore[return-value]  # every slot is filled above


# ------------------------------------------------------------------------------------------------ stacks
def _envelope(
    value: bytes, signature: ModelSignature
) -> tuple[list[Any], str | None, tuple[str, ...] | None, bool] | None:
    """The well-formed request object around the inputs (a JSON object with one input entry per model input, a
    string ``id`` or none, an object ``parameters`` or none, valid ``outputs`` or none): (inputs, request id,
    requested outputs, binary_data_output); None when anything is off."""
    try:
        body = orjson.loads(value)
        raw_inputs = body["inputs"]
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
        return None
    if type(body) is not dict or type(raw_inputs) is not list or len(raw_inputs) != len(signature.inputs):
        return None
    fields = _request_fields(body, signature)
    if fields is None:
        return None
    return raw_inputs, *fields


def _request_fields(
    body: dict[str, Any], signature: ModelSignature
) -> tuple[str | None, tuple[str, ...] | None, bool] | None:
    """The request object's own fields, if well formed (a string ``id`` or none, an object ``parameters`` or none,
    valid ``outputs`` or none): (request id, requested outputs, binary_data_output); None when any is off."""
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
    return request_id, outputs, bool(parameters and parameters.get("binary_data_output") is True)


def _parse_plain_one(index: int, value: bytes, signature: ModelSignature) -> tuple[_StackKey, _Parsed] | None:
    """:func:`_parse_plain` of a one-input model, :func:`_envelope`'s input checks and :func:`_declared` inlined (the
    same checks, so the same records are taken; this runs once per record of a chunk); the request's own fields are
    :func:`_request_fields`, as :func:`_envelope`'s."""
    try:
        body = orjson.loads(value)
        raw_inputs = body["inputs"]
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
        return None
    if type(body) is not dict or type(raw_inputs) is not list or len(raw_inputs) != 1:
        return None
    item = raw_inputs[0]
    if type(item) is not dict or "parameters" in item:
        return None
    try:
        name, shape, datatype, data = item["name"], item["shape"], item["datatype"], item["data"]
    except KeyError:
        return None
    if type(name) is not str or type(shape) is not list or type(datatype) is not str or type(data) is not list:
        return None
    if name != signature.inputs[0].name:
        return None
    for d in shape:
        if type(d) is not int or d < 0:
            return None
    fields = _request_fields(body, signature)
    if fields is None:
        return None
    request_id, outputs, binary_output = fields
    return ((datatype, tuple(shape)),), (index, request_id, outputs, binary_output, [data])


def _parse_plain(index: int, value: bytes, signature: ModelSignature) -> tuple[_StackKey, _Parsed] | None:
    """Parse ``value`` if it is a plain JSON request whose fields are all well formed and name exactly the model's
    inputs; None when anything is off (the record is then decoded on its own, which names the problem)."""
    specs = signature.inputs
    envelope = _envelope(value, signature)
    if envelope is None:
        return None
    raw_inputs, request_id, outputs, binary_output = envelope
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


def _parse_binary(index: int, value: bytes, length: int, signature: ModelSignature) -> tuple[_StackKey, _Binary] | None:
    """Parse a binary-extension record of a one-input model if it is well formed: a JSON part of ``length`` bytes (its
    header's value) with one input object (name, shape, datatype, ``parameters.binary_data_size``, no ``data``) whose
    size is exactly the bytes after the JSON part. None when anything is off (the record is then decoded on its
    own)."""
    if len(signature.inputs) != 1 or length > len(value):
        return None
    envelope = _envelope(value[:length], signature)
    if envelope is None:
        return None
    raw_inputs, request_id, outputs, binary_output = envelope
    item = raw_inputs[0]
    if type(item) is not dict or "data" in item or type(item.get("parameters")) is not dict:
        return None
    size = item["parameters"].get("binary_data_size")
    try:
        name, shape, datatype = item["name"], item["shape"], item["datatype"]
    except KeyError:
        return None
    if type(size) is not int or size != len(value) - length or name != signature.inputs[0].name:
        return None
    if type(shape) is not list or type(datatype) is not str or any(type(d) is not int or d < 0 for d in shape):
        return None
    return ((datatype, tuple(shape)),), (index, request_id, outputs, binary_output, memoryview(value)[length:])


def _decode_binary_stack(
    key: _StackKey, members: list[_Binary], signature: ModelSignature, limits: Limits
) -> list[DecodedRequest] | None:
    """A stack of well-formed binary records with one ``(datatype, shape)``: their bytes as one little-endian
    array ``[records x rows, ...]``, checked at once; None when any check fails (decode record by record)."""
    (spec,) = signature.inputs
    ((datatype, shape),) = key
    try:
        declared = check_declaration(spec, datatype, shape, limits.max_record_rows)
    except ValidationError:
        return None
    nbytes = math.prod(shape) * declared.itemsize
    if declared.kind not in "biuf" or not shape or any(len(m[4]) != nbytes for m in members):
        return None
    rows = shape[0]
    raw = np.frombuffer(b"".join(m[4] for m in members), dtype=declared.newbyteorder("<"))
    arr = raw.reshape(len(members) * rows, *shape[1:])
    try:
        check_values(spec.name, arr, declared, spec.dtype)
        block = {spec.name: np.ascontiguousarray(arr, dtype=spec.dtype)}
        check_ranges(block, signature)
    except ValidationError:
        return None
    shape_key = ((spec.name, arr.shape[1:]),)
    return [DecodedRequest(m[1], None, rows, m[2], 0, m[3], block, k * rows, shape_key) for k, m in enumerate(members)]


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


def _decode_stack(
    key: _StackKey, members: list[_Parsed], signature: ModelSignature, limits: Limits
) -> list[DecodedRequest] | None:
    """Parse and check a stack's inputs as one array each; None when any check fails (decode record by record)."""
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
        count = math.prod(shape)
        try:  # numpy picks the dtype, as for one record (float64 straight would turn a numeric string into a number)
            arr = np.array([m[4][j] for m in members])
        except (ValueError, TypeError, OverflowError):
            return None
        if arr.shape != (n, count) and arr.shape != (n, *shape):
            return None
        checked = _checked_block(spec, arr, declared, shape, n)
        if checked is None:
            return None
        block[spec.name] = checked
    try:
        check_ranges(block, signature)
    except ValidationError:
        return None
    assert rows is not None
    shape_key = tuple((name, arr.shape[1:]) for name, arr in sorted(block.items()))
    return [DecodedRequest(m[1], None, rows, m[2], 0, m[3], block, k * rows, shape_key) for k, m in enumerate(members)]


def _checked_block(
    spec: TensorSpec, arr: np.ndarray, declared: np.dtype[Any], shape: tuple[int, ...], n: int
) -> np.ndarray | None:
    """``arr`` (``[n, ...]`` as parsed) checked like one record's data and cast to the model's dtype, rows one
    after another (``[n x rows, ...]``); None when a check fails."""
    kind = arr.dtype.kind
    if kind not in "iuf" or (kind == "f" and declared.kind in "iu"):
        return None
    try:
        check_values(spec.name, arr, declared, spec.dtype)
    except ValidationError:
        return None
    if kind == "f" and arr.size and max(-float(arr.min()), float(arr.max())) > EXACT_IN_FLOAT64:
        return None
    return np.ascontiguousarray(arr.reshape(n * shape[0], *shape[1:]), dtype=spec.dtype)
