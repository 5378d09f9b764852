"""The client side of the record contract: encode requests, decode responses (used by producer_tools and tests)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from consumer.oip.encode import tensor_entry
from consumer.oip.wire import le_bytes
from consumer.signature import OIP_TO_NUMPY

RequestInputs = Mapping[str, "np.ndarray | list[str] | list[bytes]"]


def encode_request(request_id: str | None, inputs: RequestInputs, outputs: Sequence[str] | None = None) -> bytes:
    """Serialise an OIP inference request as JSON.

    Args:
        request_id: the ``id`` field, or None to leave it out.
        inputs: input name -> array ``[rows, ...]`` of an OIP-mappable numeric dtype, a list of ``str`` for a
            text (BYTES) input of shape ``[rows]``, or a list of ``bytes`` (encoded images,
            :mod:`consumer.model.vision`) for a BYTES input of shape ``[rows]``, base64 in JSON.
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
        if isinstance(arr, list):  # text, or encoded images
            raw = [t if isinstance(t, bytes) else t.encode() for t in arr]
            entry: dict[str, Any] = {"name": name, "shape": [len(raw)], "datatype": "BYTES"}
            if binary:
                blob = b"".join(len(r).to_bytes(4, "little") + r for r in raw)
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = [base64.b64encode(t).decode() if isinstance(t, bytes) else t for t in arr]
            tensors.append(entry)
            continue
        tensors.append(tensor_entry(name, arr, binary))
        if binary:
            blobs.append(le_bytes(arr))
    body: dict[str, Any] = {"inputs": tensors}
    if request_id is not None:
        body["id"] = request_id
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    if binary_output:
        body["parameters"] = {"binary_data_output": True}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), blobs


def decode_response(value: bytes, json_length: int | None = None) -> dict[str, Any]:
    """Parse an OIP response into ``{"id", "model_name", "model_version", "outputs": {name: ndarray},
    "output_parameters": {name: the output's parameters, e.g. a ZipMap output's "classes"}}``.

    Args:
        value: the result record's value.
        json_length: the ``inference-header-content-length`` header of a binary response, else None.

    Raises:
        orjson.JSONDecodeError, KeyError, ValueError: the value is not an OIP response.
    """
    head = value if json_length is None else value[:json_length]
    body = orjson.loads(head)
    arrays: dict[str, np.ndarray] = {}
    parameters: dict[str, dict[str, Any]] = {}
    pos = json_length or 0
    for o in body["outputs"]:
        dtype = OIP_TO_NUMPY[o["datatype"]]
        parameters[o["name"]] = {k: v for k, v in (o.get("parameters") or {}).items() if k != "binary_data_size"}
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None and dtype.kind == "O":  # BYTES: each element a 4-byte little-endian length, then bytes
            arrays[o["name"]] = np.array(_elements(value[pos : pos + size]), dtype=object).reshape(o["shape"])
            pos += size
        elif size is not None:
            flat = np.frombuffer(value[pos : pos + size], dtype=dtype.newbyteorder("<"))
            arrays[o["name"]] = flat.astype(dtype).reshape(o["shape"])
            pos += size
        else:
            arrays[o["name"]] = np.asarray(o["data"], dtype=dtype).reshape(o["shape"])
    return {**body, "outputs": arrays, "output_parameters": parameters}


def _elements(raw: bytes) -> list[str]:
    """Binary BYTES elements as text (UTF-8, undecodable bytes escaped)."""
    out = []
    pos = 0
    while pos < len(raw):
        n = int.from_bytes(raw[pos : pos + 4], "little")
        out.append(raw[pos + 4 : pos + 4 + n].decode("utf-8", "backslashreplace"))
        pos += 4 + n
    return out
