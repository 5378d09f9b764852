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
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from consumer.oip.wire import le_bytes
from consumer.signature import BF16, NUMPY_TO_OIP, ModelSignature, TensorSpec

Outputs = Sequence[tuple[str, np.ndarray]]


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
        total = sum(rows)
        statics: list[tuple[bytes, bytes] | bytes] = []  # per output: (before the rows count, before the data)
        texts: list[list[bytes] | None] = []  # per batched output: each row's data text (None: rows are empty)
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
            width = int(np.prod(arr.shape[1:], dtype=np.int64))
            texts.append(_row_texts(arr, total, width) if width else None)
        if total == len(rows):  # one row per request (the common case): whole columns at once
            template = self._template(1, statics)
            columns = [t if t is not None else [b""] * total for t in texts]
            rows_data = zip(*columns, strict=True) if columns else itertools.repeat(())
            return [template % (orjson.dumps(i), *data) for i, data in zip(ids, rows_data, strict=False)]
        templates: dict[int, bytes] = {}
        responses = []
        start = 0
        for response_id, n in zip(ids, rows, strict=True):
            cached = templates.get(n)
            template = cached if cached is not None else templates.setdefault(n, self._template(n, statics))
            data = tuple(b"" if t is None else t[start] if n == 1 else b",".join(t[start : start + n]) for t in texts)
            responses.append(template % (orjson.dumps(response_id), *data))
            start += n
        return responses

    def _template(self, rows: int, statics: list[tuple[bytes, bytes] | bytes]) -> bytes:
        """The response of a request of ``rows`` rows with ``%b`` for its id and each batched output's data."""
        count = str(rows).encode()
        parts = [b'{"id":%b', self._head.replace(b"%", b"%%")]
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
