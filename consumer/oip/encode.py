"""Model outputs -> OIP inference response values: one record (:func:`encode_response`) or a micro-batch
(:class:`BatchEncoder`).

Response value (JSON, OIP "inference response")::

    {"id": "abc", "model_name": "digits", "model_version": "1",
     "outputs": [{"name": "label", "shape": [2], "datatype": "INT64", "data": [7, 3]}, ...]}

``data`` is flat row-major, as the OIP specifies. Numbers are written by orjson's numpy serialiser (float32 in its
shortest round-trip form; BF16 as the float32 of the same value, which is exact), so a batch-encoded response is
byte-for-byte the one :func:`encode_response` writes. BYTES (``tensor(string)``) data are JSON strings. An output
without a batch axis (``TensorSpec.batched`` false) is carried whole, with its own shape, in every response. A
ZipMap output (a dense ``[rows, classes]`` FP32 tensor) lists its class labels in its ``parameters``::

    {"name": "output_probability", "shape": [1, 3], "datatype": "FP32",
     "parameters": {"classes": ["setosa", "versicolor", "virginica"]}, "data": [0.98, 0.02, 0.0]}
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson

from consumer.oip.wire import le_bytes
from consumer.signature import BF16, NUMPY_TO_OIP, ModelSignature, TensorSpec

Outputs = Sequence[tuple[str, np.ndarray]]

#: A byte orjson would not write as itself in a JSON string (control characters, ``"``, ``\\``) or that is not ASCII:
#: correlation IDs free of them are spliced into responses as they are (:meth:`BatchEncoder.encode_ids`).
_NOT_VERBATIM = re.compile(rb"[^\x20\x21\x23-\x5b\x5d-\x7f]")


def json_data(arr: np.ndarray) -> Any:
    """What orjson writes as an output's JSON ``data``: the array itself (numeric), BF16 as float32 (exact), BYTES
    as a list of str. Shape kept; callers flatten."""
    if arr.dtype.kind == "O":
        return arr.tolist()
    if arr.dtype == BF16:
        return arr.astype(np.float32)
    return arr


def tensor_entry(name: str, arr: np.ndarray, binary: bool, spec: TensorSpec | None = None) -> dict[str, Any]:
    """One OIP tensor object: name, shape, datatype, ``parameters`` and flat ``data`` (or ``binary_data_size``, bytes).

    Args:
        spec: the output's spec: its ZipMap class labels go to ``parameters.classes``.

    Raises:
        KeyError: the array's dtype has no OIP datatype.
    """
    entry: dict[str, Any] = {"name": name, "shape": list(arr.shape), "datatype": NUMPY_TO_OIP[arr.dtype]}
    parameters: dict[str, Any] = {"classes": list(spec.labels)} if spec is not None and spec.labels else {}
    if binary:
        size = len(le_bytes(arr)) if arr.dtype.kind == "O" else arr.nbytes  # BYTES: length-prefixed elements
        entry["parameters"] = {**parameters, "binary_data_size": size}
    else:
        if parameters:
            entry["parameters"] = parameters
        entry["data"] = json_data(np.ascontiguousarray(arr).reshape(-1))
    return entry


def encode_response(response_id: str, signature: ModelSignature, outputs: Outputs) -> bytes:
    """Serialise one OIP inference response as JSON.

    Args:
        response_id: the response ``id`` (the correlation ID as text).
        signature: supplies ``model_name`` and ``model_version``.
        outputs: (name, array) pairs for this record only, each array ``[rows, ...]`` (an output without a batch
            axis: its whole array).

    Returns:
        UTF-8 JSON bytes; ``data`` is flat row-major as the OIP specifies.

    Raises:
        KeyError: an output's dtype has no OIP datatype.
        TypeError: orjson cannot serialise an output (orjson.JSONEncodeError).
    """
    return _response(response_id, signature, outputs, binary=False)


def encode_response_binary(response_id: str, signature: ModelSignature, outputs: Outputs) -> tuple[bytes, int]:
    """Serialise one OIP inference response in the binary data extension.

    Returns:
        (value, json_length): the JSON part (outputs carry ``parameters.binary_data_size``, no ``data``) followed
        by each output's little-endian row-major bytes; and the JSON part's length in bytes (the value of the
        result's ``inference-header-content-length`` header).

    Raises:
        KeyError: an output's dtype has no OIP datatype.
    """
    head = _response(response_id, signature, outputs, binary=True)
    return head + b"".join(le_bytes(arr) for _, arr in outputs), len(head)


def _response(response_id: str, signature: ModelSignature, outputs: Outputs, *, binary: bool) -> bytes:
    body = {
        "id": response_id,
        "model_name": signature.name,
        "model_version": signature.version,
        "outputs": [tensor_entry(name, arr, binary, signature.output(name)) for name, arr in outputs],
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


#: Response layouts kept per encoder (one per output shape; sequence models' per-token outputs have one per padded
#: length): past it, the cache starts again.
MAX_LAYOUTS = 256


class _Layout(NamedTuple):
    """The fixed parts of the responses to one set of outputs (names, dtypes, shapes but the batch axis).

    Attributes:
        statics: per output, (before the rows count, before the data), or the whole entry of an output without a
            batch axis.
        widths: per batched output, its values per row.
        templates: rows of a request -> its response template (:meth:`BatchEncoder._template`).
    """

    statics: list[tuple[bytes, bytes] | bytes]
    widths: list[int]
    templates: dict[int, bytes]


class BatchEncoder:
    """JSON responses of every request of a micro-batch, from the batch's outputs, with one serialiser call per
    output instead of one per record.

    Each batched output ``[total rows, ...]`` is serialised once as ``[total rows, row size]`` (BYTES: row by
    row, since a string may hold any text); the text of each row is cut out of that and spliced, with the
    request's own shape, into a response template made once per model. An output without a batch axis is
    serialised once and spliced whole into every response.

    Args:
        signature: supplies ``model_name``, ``model_version`` and each output's spec.
    """

    def __init__(self, signature: ModelSignature) -> None:
        self._signature = signature
        self._head = (
            b',"model_name":'
            + orjson.dumps(signature.name)
            + b',"model_version":'
            + orjson.dumps(signature.version)
            + b',"outputs":['
        )
        self._layouts: dict[tuple[Any, ...], _Layout] = {}

    def encode_ids(self, correlation_ids: Sequence[bytes], rows: Sequence[int], outputs: Outputs) -> list[bytes]:
        """:meth:`encode` with each response's ``id`` the request's correlation ID as text (its bytes as UTF-8,
        others as backslash escapes): IDs of plain ASCII text (the common case) are spliced as they are, without a
        ``str`` and a serialiser call per request.

        Raises:
            KeyError, TypeError: as :meth:`encode`.
        """
        if _NOT_VERBATIM.search(b"".join(correlation_ids)) is None:
            return self._encode(correlation_ids, rows, outputs, quoted=True)
        ids = [orjson.dumps(c.decode("utf-8", "backslashreplace")) for c in correlation_ids]
        return self._encode(ids, rows, outputs, quoted=False)

    def encode(self, ids: Sequence[str], rows: Sequence[int], outputs: Outputs) -> list[bytes]:
        """The response of each request, in order.

        Args:
            ids: each request's response ``id``.
            rows: each request's rows, in batch order (they sum to the batched outputs' first dimension).
            outputs: (name, array ``[sum(rows), ...]``, or the whole array of an output without a batch axis) in
                response order.

        Returns:
            Per request, the bytes :func:`encode_response` gives for its rows of ``outputs``.

        Raises:
            KeyError: an output's dtype has no OIP datatype.
            TypeError: orjson cannot serialise an output (orjson.JSONEncodeError).
        """
        return self._encode([orjson.dumps(i) for i in ids], rows, outputs, quoted=False)

    def _encode(self, ids: Sequence[bytes], rows: Sequence[int], outputs: Outputs, *, quoted: bool) -> list[bytes]:
        """:meth:`encode` of ``ids`` already JSON strings (``quoted`` False) or text that is its own JSON string
        content (``quoted`` True: the template holds the quotes)."""
        total = sum(rows)
        key = (quoted, *((name, arr.dtype, arr.shape[1:]) for name, arr in outputs))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layout(outputs)
            if not any(isinstance(static, bytes) for static in layout.statics):  # a whole output's data is in it
                if len(self._layouts) >= MAX_LAYOUTS:
                    self._layouts.clear()
                self._layouts[key] = layout
        statics, templates = layout.statics, layout.templates
        texts: list[list[bytes] | None] = []  # per batched output: each row's data text (None: rows are empty)
        batched = (arr for (_, arr), static in zip(outputs, statics, strict=True) if isinstance(static, tuple))
        for arr, width in zip(batched, layout.widths, strict=True):
            texts.append(_row_texts(arr, total, width) if width else None)
        if total == len(rows):  # one row per request (the common case): whole columns at once
            template = templates.get(1) or templates.setdefault(1, self._template(1, statics, quoted))
            columns = [t if t is not None else [b""] * total for t in texts]
            if len(columns) == 1:
                return [template % pair for pair in zip(ids, columns[0], strict=True)]
            if len(columns) == 2:
                return [template % triple for triple in zip(ids, columns[0], columns[1], strict=True)]
            rows_data = zip(*columns, strict=True) if columns else itertools.repeat(())
            return [template % (i, *data) for i, data in zip(ids, rows_data, strict=False)]
        responses = []
        start = 0
        for response_id, n in zip(ids, rows, strict=True):
            cached = templates.get(n)
            template = cached if cached is not None else templates.setdefault(n, self._template(n, statics, quoted))
            data = tuple(b"" if t is None else t[start] if n == 1 else b",".join(t[start : start + n]) for t in texts)
            responses.append(template % (response_id, *data))
            start += n
        return responses

    def _layout(self, outputs: Outputs) -> _Layout:
        """The fixed parts of the responses to a batch of ``outputs`` (see :class:`_Layout`).

        Raises:
            KeyError: an output's dtype has no OIP datatype.
            TypeError: orjson cannot serialise an output without a batch axis.
        """
        statics: list[tuple[bytes, bytes] | bytes] = []
        widths: list[int] = []
        for index, (name, arr) in enumerate(outputs):
            spec = self._signature.output(name)
            comma = b"," if index else b""
            if spec is not None and not spec.batched:
                statics.append(
                    comma + orjson.dumps(tensor_entry(name, arr, False, spec), option=orjson.OPT_SERIALIZE_NUMPY)
                )
                continue
            datatype = NUMPY_TO_OIP[arr.dtype]
            dims = b"".join(b"," + str(d).encode() for d in arr.shape[1:])
            prefix = comma + b'{"name":' + orjson.dumps(name) + b',"shape":['
            parameters = (
                b',"parameters":' + orjson.dumps({"classes": list(spec.labels)})
                if spec is not None and spec.labels
                else b""
            )
            statics.append((prefix, dims + b'],"datatype":"' + datatype.encode() + b'"' + parameters + b',"data":['))
            widths.append(int(np.prod(arr.shape[1:], dtype=np.int64)))
        return _Layout(statics, widths, {})

    def _template(self, rows: int, statics: list[tuple[bytes, bytes] | bytes], quoted: bool = False) -> bytes:
        """The response of a request of ``rows`` rows with ``%b`` for its id (a JSON string, or its content when
        ``quoted``) and each batched output's data."""
        count = str(rows).encode()
        parts = [b'{"id":"%b"' if quoted else b'{"id":%b', self._head.replace(b"%", b"%%")]
        for static in statics:
            if isinstance(static, bytes):  # an output without a batch axis, whole
                parts.append(static.replace(b"%", b"%%"))
                continue
            prefix, before_data = static
            parts += (prefix.replace(b"%", b"%%"), count, before_data.replace(b"%", b"%%"), b"%b]}")
        parts.append(b"]}")
        return b"".join(parts)


def _row_texts(arr: np.ndarray, total: int, width: int) -> list[bytes]:
    """The JSON text of each row's flat data (no brackets), for ``arr`` ``[total, ...]`` of ``width`` values a row."""
    flat = json_data(np.ascontiguousarray(arr).reshape(total, width))
    if arr.dtype.kind == "O":  # strings may hold "],[": serialise each row on its own
        return [orjson.dumps(row)[1:-1] for row in flat]
    if width == 1:  # one number a row (a label): the flat array, cut at its commas (numbers hold none)
        return orjson.dumps(flat.reshape(total), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    return orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2].split(b"],[")


def check_output(signature: ModelSignature, name: str, arr: np.ndarray) -> None:
    """Encode one output of a 1-row run as an OIP response, JSON and binary: the model probe's check
    (:data:`consumer.model.probe.OutputEncoder`) that every answer can carry it.

    Raises:
        KeyError: its dtype has no OIP datatype.
        TypeError, ValueError: its elements cannot be serialised.
    """
    encode_response("probe", signature, [(name, arr)])
    encode_response_binary("probe", signature, [(name, arr)])
