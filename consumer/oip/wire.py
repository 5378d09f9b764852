"""What travels beside a record's value: header names, the correlation ID rule, the binary extension's layout.

Binary tensor data (the OIP/KServe V2 binary data extension, as Triton implements it over HTTP): when a record
carries header ``inference-header-content-length: N`` (decimal text, any case), the first N bytes of the value are
the JSON request or response and the rest is raw tensor data, little-endian and row-major, in input (output) order.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Header carrying the correlation ID on requests (optional) and on every result and dead letter.
CORRELATION_HEADER = "correlation_id"
#: Header of a binary-extension record: the JSON part's length, bytes (the HTTP header name of OIP, lower case).
BINARY_HEADER = "inference-header-content-length"

Headers = Iterable[tuple[str, bytes | None]]


def correlation_id(
    headers: Headers, request_id: str | None, key: bytes | None, fallback: tuple[str, int, int]
) -> bytes:
    """The record's correlation ID: header ``correlation_id`` (first if repeated), else the request ``id``,
    else the record key, else ``topic:partition:offset`` of the record (``fallback``, formatted only when
    needed). Echoed byte-for-byte."""
    for name, value in headers:
        if name == CORRELATION_HEADER and value is not None:
            return value
    if request_id is not None:
        return request_id.encode()
    if key is not None:
        return key
    return "{}:{}:{}".format(*fallback).encode()


def le_bytes(arr: np.ndarray) -> bytes:
    """Row-major little-endian bytes of an array (the binary data extension's layout): numbers as they are
    (BF16: 2 bytes each), BYTES (str or bytes elements) each as a 4-byte little-endian length then its UTF-8
    bytes, as Triton writes them.

    Raises:
        TypeError: a BYTES element is neither str nor bytes.
    """
    if arr.dtype.kind == "O":
        parts: list[bytes] = []
        for element in arr.reshape(-1).tolist():
            raw = element.encode() if isinstance(element, str) else element
            if not isinstance(raw, bytes):
                raise TypeError(f"a BYTES element is {type(element).__name__}, not str or bytes")
            parts += (len(raw).to_bytes(4, "little"), raw)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
