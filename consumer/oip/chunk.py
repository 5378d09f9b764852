"""A fetched chunk of request values -> validated requests, with the same outcome, record for record, as
:func:`consumer.oip.decode.decode_one`, at a fraction of its cost per record.

Each record's headers are read once (:func:`consumer.oip.forms.classify`: JSON, binary extension or protobuf) and
the record is dispatched on its form: a JSON or binary record may join a stack (below); a protobuf record, an empty
or oversized value, a record whose header is malformed, and any record the fast path cannot take is decoded on its
own (:func:`consumer.oip.decode.decode_form`) with the form already known.

Every plain JSON request (no binary data extension) is parsed with ``orjson``; records that declare the same
``(datatype, shape)`` for every input form a *stack*, whose inputs are each parsed into one numpy array
``[records x rows, ...]`` and checked with one set of reductions (range, exactness, the model's value ranges). A
stack that fails any check is tried again in parts (its records that may hold a string or null apart, then halves,
:func:`_settle`) down to a few records, which are decoded record by record, naming the culprit with the same reason
and message; so is every record that is not plain. A one-input model's records are parsed in
:func:`decode_chunk`'s loop itself (this runs once per record).

Binary-extension requests of a one-input model that are well formed (the length header, one input object with
``binary_data_size`` equal to the bytes after the JSON part) and declare the same ``(datatype, shape)`` form a stack
too: their bytes are joined into one little-endian array and checked at once.

Numbers: numpy picks a stack's dtype as it does for one record (a float stack is not parsed straight into float64,
which would turn a numeric string such as ``"1"`` into its number, where the record on its own is
datatype_mismatch; a string, or a JSON null, fails the stack), unless the chunk's bytes prove its data holds numbers
only (no null; no quote bytes beyond its requests' known strings): a float input is then read straight into
float64 (:func:`_decode_stack`); a float stack holding a value beyond 2**53 (integers are not exact there) is
decoded record by record; integers keep numpy's own integer choice.
``true``/``false`` would become 1/0 next to numbers, so a record whose bytes may hold one is decoded on its own
(one scan of the whole chunk says whether any may).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
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
#: A record that parsed as a well-formed plain JSON request, its values not yet checked: (its stack's key, request
#: id, requested outputs, binary_data_output, each model input's ``data`` in input order).
_Parsed = tuple[_StackKey, str | None, tuple[str, ...] | None, bool, list[list[Any]]]

#: The byte of a JSON string's delimiters.
_QUOTE = ord('"')
#: The bytes of ``null``.
_N, _U, _L = b"nul"

#: A failed stack larger than this is split in two and each half tried as a stack again (a smaller one is decoded
#: record by record): one bad record among many costs a few more stacks, not every neighbour's own decode.
SPLIT_ABOVE = 16


class _Stack:
    """The well-formed plain JSON records of a chunk that declare the same inputs, their values not yet checked.

    Attributes:
        key: each model input's (datatype, shape), in input order.
        indices: each record's index in the chunk.
        ids: each record's request id (or None).
        columns: per model input (in input order), each record's ``data`` as parsed.
        extras: a record's position in the stack -> (requested outputs, binary_data_output), for the records that
            ask for either (most ask for neither).
        quotes: each record's quote bytes if its only strings are its request's known ones (keys, id, name,
            datatype; two bytes each); -1 where they are not known.
        numbers: every record's data is known to hold only numbers and lists (:func:`_decode_stack`).
    """

    __slots__ = ("columns", "extras", "ids", "indices", "key", "numbers", "quotes")

    def __init__(self, key: _StackKey, inputs: int) -> None:
        self.key = key
        self.indices: list[int] = []
        self.ids: list[str | None] = []
        self.columns: list[list[Any]] = [[] for _ in range(inputs)]
        self.extras: dict[int, tuple[tuple[str, ...] | None, bool]] = {}
        self.quotes: list[int] = []
        self.numbers = False

    def add(
        self, index: int, request_id: str | None, outputs: tuple[str, ...] | None, binary_output: bool, data: list[Any]
    ) -> None:
        """Add one record (``data``: each model input's ``data``, in input order)."""
        if outputs is not None or binary_output:
            self.extras[len(self.indices)] = (outputs, binary_output)
        self.indices.append(index)
        self.ids.append(request_id)
        self.quotes.append(-1)
        for column, values in zip(self.columns, data, strict=True):
            column.append(values)

    def part(self, positions: Sequence[int], numbers: bool) -> _Stack:
        """The stack of the records at ``positions`` (in order), ``numbers`` as given."""
        sub = _Stack(self.key, 0)
        sub.indices = [self.indices[p] for p in positions]
        sub.ids = [self.ids[p] for p in positions]
        sub.quotes = [self.quotes[p] for p in positions]
        sub.columns = [[c[p] for p in positions] for c in self.columns]
        sub.extras = {k: self.extras[p] for k, p in enumerate(positions) if p in self.extras}
        sub.numbers = numbers
        return sub

    def halves(self) -> tuple[_Stack, _Stack]:
        """The stack's first and second half (records in order)."""
        n = len(self.indices)
        return self.part(range(n // 2), self.numbers), self.part(range(n // 2, n), self.numbers)

    def split_numbers(self, seen_quotes: np.ndarray, seen_nulls: np.ndarray) -> list[_Stack]:
        """The stack's records whose data holds only numbers and lists (their quote bytes, ``seen_quotes`` by chunk
        index, those of their known strings; no null, ``seen_nulls``; no boolean, as every stacked record) as one
        stack marked ``numbers``, the others as another: one stack where either is empty."""
        clean = (seen_quotes[self.indices] == np.array(self.quotes)) & (seen_nulls[self.indices] == 0)
        if clean.all() or not clean.any():
            return [self]
        return [self.part(np.flatnonzero(clean).tolist(), True), self.part(np.flatnonzero(~clean).tolist(), False)]


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
    joined = b"\0".join([v or b"" for v in values]) + b"\0"  # each value and its separator (_numbers_of)
    # "null" and "false" hold an l, "true" an r; the request's own keys hold neither: most chunks skip the word
    # searches (one memchr each)
    has_l = b"l" in joined
    may_null = has_l and b"null" in joined
    scan = (b"r" in joined and b"true" in joined) or (has_l and b"false" in joined)
    # While every record is a plain one-input request: the quote bytes its known strings (keys, id, name, datatype)
    # hold, two each; every other string, or a \" within one, adds more (_decode_stack's float path)
    quotes = 0
    simple = not may_null  # a record holding false is not stacked (scan)
    stacks: dict[_StackKey, _Stack] = {}
    binaries: dict[_StackKey, list[_Binary]] = {}
    max_bytes = limits.max_record_bytes
    specs = signature.inputs
    one_input = specs[0].name if len(specs) == 1 else None
    loads = orjson.loads
    last: _Stack | None = None  # the stack the previous record joined, and its datatype and shape as parsed
    last_datatype: str | None = None
    last_shape: list[int] | None = None
    for i, value in enumerate(values):
        form = forms[i]
        if not value or len(value) > max_bytes:
            pass
        elif form is JSON_FORM:
            if scan and (b"true" in value or b"false" in value):
                pass
            elif one_input is not None:
                # _parse_plain's checks for a one-input model, inlined (this runs once per record of a chunk): the
                # same records are taken. The request is a JSON object with exactly one input object (str name the
                # model's, list shape of ints >= 0, str datatype, list data, no parameters).
                try:
                    body = loads(value)
                    (item,) = body["inputs"]  # a list of one input (a one-key object, a one-character string: below)
                    name, shape, datatype, data = item["name"], item["shape"], item["datatype"], item["data"]
                except (ValueError, KeyError, TypeError, IndexError):  # orjson.JSONDecodeError is a ValueError
                    pass
                else:
                    # body and item are objects here, so inputs was a list (a string, or an object's key, indexed by a
                    # string raised); a name equal to the model's is a string
                    if (
                        name == one_input
                        and type(data) is list
                        and type(shape) is list
                        and type(datatype) is str
                        and "parameters" not in item
                    ):
                        for d in shape:
                            if type(d) is not int or d < 0:
                                break
                        else:
                            keys = len(body)
                            request_id = body.get("id")
                            if keys == 1 or (keys == 2 and type(request_id) is str):  # inputs and a string id only
                                outputs, binary_output = None, False
                                known = 2 * (keys + len(item)) + (6 if keys == 2 else 4)
                                quotes += known
                            else:
                                known = -1
                                simple = False
                                fields = _request_fields(body, signature)
                                if fields is None:
                                    out[i] = decode_form(value, form, signature, limits)
                                    continue
                                request_id, outputs, binary_output = fields
                            if shape != last_shape or datatype != last_datatype or last is None:
                                declared: _StackKey = ((datatype, tuple(shape)),)
                                last = stacks.get(declared)
                                if last is None:
                                    last = stacks[declared] = _Stack(declared, 1)
                                last_datatype, last_shape = datatype, shape
                            if outputs is not None or binary_output:
                                last.extras[len(last.indices)] = (outputs, binary_output)
                            last.indices.append(i)
                            last.ids.append(request_id)
                            last.quotes.append(known)
                            last.columns[0].append(data)
                            continue
            else:
                simple = False
                parsed = _parse_plain(value, signature)
                if parsed is not None:
                    key, request_id, outputs, binary_output, data = parsed
                    stack = stacks.get(key)
                    if stack is None:
                        stack = stacks[key] = _Stack(key, len(specs))
                    stack.add(i, request_id, outputs, binary_output, data)
                    continue
        elif type(form) is RecordForm and form.json_length is not None:
            simple = False
            binary = _parse_binary(i, value, form.json_length, signature)
            if binary is not None:
                binaries.setdefault(binary[0], []).append(binary[1])
                continue
        if value:
            simple = False
        out[i] = decode_form(value, form, signature, limits)
    # numbers only: no string but the simple records' known ones, no null, no boolean (scanned for above); the
    # whole chunk at once while every record is simple, else record by record
    buf = np.frombuffer(joined, np.uint8)
    numbers = simple and bool(stacks) and int(np.count_nonzero(buf == _QUOTE)) == quotes
    seen: list[tuple[np.ndarray, np.ndarray]] = []  # each record's quote bytes and nulls, once a stack failed
    for stack in stacks.values():
        stack.numbers = numbers
        _settle(stack, values, forms, signature, limits, out, None if numbers else (buf, seen))
    for key, members in binaries.items():
        requests = _decode_binary_stack(key, members, signature, limits)
        if requests is None:  # a stack that failed a check: each of its records on its own
            for m in members:
                i = m[0]
                out[i] = decode_form(values[i], forms[i], signature, limits)
        else:
            for m, request in zip(members, requests, strict=True):
                out[m[0]] = request
    return out  # type: ignore[return-value]  # every slot is filled above


def _counts_of(buf: np.ndarray, values: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """Each record's quote bytes and ``null`` words (``int [records]`` each), from ``buf``: every value followed by
    one separator byte (a zero byte)."""
    ends = np.cumsum(np.fromiter((len(v) + 1 if v else 1 for v in values), np.intp, len(values)))
    starts = np.concatenate(([0], ends[:-1]))
    null = np.zeros(len(buf), dtype=bool)  # where a null starts (a word never spans a separator)
    null[:-3] = (buf[:-3] == _N) & (buf[1:-2] == _U) & (buf[2:-1] == _L) & (buf[3:] == _L)
    return np.add.reduceat(buf == _QUOTE, starts, dtype=np.intp), np.add.reduceat(null, starts, dtype=np.intp)


def _settle(
    stack: _Stack,
    values: Sequence[bytes | None],
    forms: Sequence[RecordForm | RecordError],
    signature: ModelSignature,
    limits: Limits,
    out: list[DecodedRequest | RecordError | None],
    split: tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]] | None = None,
) -> None:
    """Fill ``out`` for a stack's records: one block when it passes every check; else each half as a stack again
    (while larger than :data:`SPLIT_ABOVE`), the rest record by record (which names the culprit).

    Args:
        split: a stack not known to hold numbers only: the chunk's bytes as :func:`_counts_of` takes them, and
            where its counts are kept once made. Its records that may hold a string or null (their quote bytes or nulls
            say) are checked first as a stack of their own: when they pass, the whole stack is decoded as one;
            else (numpy would have turned every number of the whole stack into a string or object first) the
            others are decoded as a stack of numbers only, they record by record or in halves.
    """
    if split is not None and not stack.numbers:
        buf, seen = split
        if not seen:
            seen.append(_counts_of(buf, values))
        parts = stack.split_numbers(*seen[0])
        if len(parts) == 2:
            clean, unclean = parts
            held = _decode_stack(unclean, signature, limits)
            if held is not None:
                requests = _decode_stack(stack, signature, limits)
                if requests is not None:
                    _fill(out, stack, requests)
                    return
                _fill(out, unclean, held)
            _settle(clean, values, forms, signature, limits, out)
            if held is None:
                _settle_failed(unclean, values, forms, signature, limits, out)
            return
    requests = _decode_stack(stack, signature, limits, stack.numbers)
    if requests is not None:
        _fill(out, stack, requests)
    else:
        _settle_failed(stack, values, forms, signature, limits, out)


def _settle_failed(
    stack: _Stack,
    values: Sequence[bytes | None],
    forms: Sequence[RecordForm | RecordError],
    signature: ModelSignature,
    limits: Limits,
    out: list[DecodedRequest | RecordError | None],
) -> None:
    """:func:`_settle` of a stack that failed a check: each half as a stack again (while larger than
    :data:`SPLIT_ABOVE`), else record by record."""
    if len(stack.indices) > SPLIT_ABOVE:
        for half in stack.halves():
            _settle(half, values, forms, signature, limits, out)
    else:
        for i in stack.indices:
            out[i] = decode_form(values[i], forms[i], signature, limits)


def _fill(out: list[DecodedRequest | RecordError | None], stack: _Stack, requests: list[DecodedRequest]) -> None:
    """Each of the stack's requests into its record's slot."""
    for i, request in zip(stack.indices, requests, strict=True):
        out[i] = request


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


def _parse_plain(value: bytes, signature: ModelSignature) -> _Parsed | None:
    """Parse ``value`` if it is a plain JSON request whose fields are all well formed and name exactly the model's
    inputs; None when anything is off (the record is then decoded on its own, which names the problem).
    :func:`decode_chunk` inlines the same checks for a one-input model."""
    specs = signature.inputs
    envelope = _envelope(value, signature)
    if envelope is None:
        return None
    raw_inputs, request_id, outputs, binary_output = envelope
    if len(specs) == 1:  # one input, no name lookups
        item = raw_inputs[0]
        declared = _declared(item)
        if declared is None or item["name"] != specs[0].name:
            return None
        return (declared,), request_id, outputs, binary_output, [item["data"]]
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
    return tuple(key), request_id, outputs, binary_output, data


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
    stack: _Stack, signature: ModelSignature, limits: Limits, numbers: bool = False
) -> list[DecodedRequest] | None:
    """Parse and check a stack's inputs as one array each; None when any check fails (decode record by record).

    Args:
        numbers: the stack's data is known to hold only numbers and lists (no string, null or boolean): a float
            input of a float model whose records' data are flat lists of ``prod(shape)`` elements is then read
            straight into float64, the dtype numpy's own pick gives any such stack holding a float (one of integers
            only, int64 there, casts to the same values below :data:`EXACT_IN_FLOAT64`; above, it is decoded record
            by record either way). Else numpy picks the dtype."""
    n = len(stack.indices)
    block: dict[str, np.ndarray] = {}
    rows: int | None = None
    for spec, (datatype, shape), column in zip(signature.inputs, stack.key, stack.columns, strict=True):
        try:
            declared = check_declaration(spec, datatype, shape, limits.max_record_rows)
        except ValidationError:
            return None
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            return None
        count = math.prod(shape)
        arr = None
        if numbers and declared.kind == "f" and spec.dtype.kind == "f" and set(map(len, column)) == {count}:
            try:  # a nested list or an empty object among the numbers raises: numpy's pick below then
                arr = np.fromiter(chain.from_iterable(column), np.float64, n * count).reshape(n, count)
            except (ValueError, TypeError, OverflowError):
                arr = None
        if arr is None:
            try:  # numpy picks the dtype, as for one record (float64 straight would turn a numeric string into one)
                arr = np.array(column)
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
    ids = stack.ids
    requests = [DecodedRequest(r, None, rows, None, 0, False, block, k * rows, shape_key) for k, r in enumerate(ids)]
    for k, (outputs, binary_output) in stack.extras.items():  # the few records that ask for outputs or binary ones
        requests[k] = DecodedRequest(ids[k], None, rows, outputs, 0, binary_output, block, k * rows, shape_key)
    return requests


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
