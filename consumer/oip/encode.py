"""Model outputs -> OIP inference response values: one record (:func:`encode_response`) or a micro-batch
(:class:`BatchEncoder`).

Response value (JSON, OIP "inference response")::

    {"id": "abc", "model_name": "digits", "model_version": "1",
     "outputs": [{"name": "label", "shape": [2], "datatype": "INT64", "data": [7, 3]}, ...]}

``data`` is flat row-major, as the OIP specifies. Numbers are written by orjson's numpy serialiser (float32 in its
shortest round-trip form), so a batch-encoded response is byte-for-byte the one :func:`encode_response` writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from consumer.oip.wire import le_bytes
from consumer.schema import NUMPY_TO_OIP, ModelSignature

Outputs = Sequence[tuple[str, np.ndarray]]


def tensor_entry(name: str, arr: np.ndarray, binary: bool) -> dict[str, Any]:
    """One OIP tensor object: name, shape, datatype and flat ``data`` (or ``binary_data_size``, bytes).

    Raises:
        KeyError: the array's dtype has no OIP datatype.
    """
    entry: dict[str, Any] = {"name": name, "shape": list(arr.shape), "datatype": NUMPY_TO_OIP[arr.dtype]}
    if binary:
        entry["parameters"] = {"binary_data_size": arr.nbytes}
    else:
        entry["data"] = np.ascontiguousarray(arr).reshape(-1)
    return entry


def encode_response(response_id: str, signature: ModelSignature, outputs: Outputs) -> bytes:
    """Serialise one OIP inference response as JSON.

    Args:
        response_id: the response ``id`` (the correlation ID as text).
        signature: supplies ``model_name`` and ``model_version``.
        outputs: (name, array) pairs for this record only, each array ``[rows, ...]``, numeric.

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
        "outputs": [tensor_entry(name, arr, binary) for name, arr in outputs],
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


class BatchEncoder:
    """JSON responses of every request of a micro-batch, from the batch's outputs, with one serialiser call per
    output instead of one per record.

    Each output ``[total rows, ...]`` is serialised once as ``[total rows, row size]``; the text of each row is cut
    out of that and spliced, with the request's own shape, into a response template made once per model.

    Args:
        signature: supplies ``model_name`` and ``model_version``.
    """

    def __init__(self, signature: ModelSignature) -> None:
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
            rows: each request's rows, in batch order (they sum to the outputs' first dimension).
            outputs: (name, array ``[sum(rows), ...]``) in response order.

        Returns:
            Per request, the bytes :func:`encode_response` gives for its rows of ``outputs``.

        Raises:
            KeyError: an output's dtype has no OIP datatype.
            TypeError: orjson cannot serialise an output (orjson.JSONEncodeError).
        """
        total = sum(rows)
        statics: list[tuple[bytes, bytes]] = []  # per output: (text before the rows count, text before the data)
        texts: list[list[bytes] | None] = []  # per output: the text of each row's numbers (None: rows are empty)
        for index, (name, arr) in enumerate(outputs):
            datatype = NUMPY_TO_OIP[arr.dtype]
            dims = b"".join(b"," + str(d).encode() for d in arr.shape[1:])
            prefix = (b"," if index else b"") + b'{"name":' + orjson.dumps(name) + b',"shape":['
            statics.append((prefix, dims + b'],"datatype":"' + datatype.encode() + b'","data":['))
            width = int(np.prod(arr.shape[1:], dtype=np.int64))
            flat = (
                orjson.dumps(np.ascontiguousarray(arr).reshape(total, width), option=orjson.OPT_SERIALIZE_NUMPY)
                if width
                else b""
            )
            texts.append(flat[2:-2].split(b"],[") if width else None)
        if total == len(rows):  # one row per request (the common case): whole columns at once
            template = self._template(1, statics)
            columns = [t if t is not None else [b""] * total for t in texts]
            rows_data = zip(*columns, strict=True)
            return [template % (orjson.dumps(i), *data) for i, data in zip(ids, rows_data, strict=True)]
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

    def _template(self, rows: int, statics: list[tuple[bytes, bytes]]) -> bytes:
        """The response of a request of ``rows`` rows with ``%b`` for its id and each output's data."""
        count = str(rows).encode()
        parts = [b'{"id":%b', self._head.replace(b"%", b"%%")]
        for prefix, before_data in statics:
            parts += (prefix.replace(b"%", b"%%"), count, before_data.replace(b"%", b"%%"), b"%b]}")
        parts.append(b"]}")
        return b"".join(parts)
