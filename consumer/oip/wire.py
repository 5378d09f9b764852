"""What travels beside an OIP record's value: the binary extension's header and byte layout (the correlation ID rule,
shared with events, is :mod:`consumer.answers.headers`).

Binary tensor data (the OIP/KServe V2 binary data extension, as Triton implements it over HTTP): when a record
carries header ``inference-header-content-length: N`` (decimal text, any case), the first N bytes of the value are
the JSON request or response and the rest is raw tensor data, little-endian and row-major, in input (output) order.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Header of a binary-extension record: the JSON part's length, bytes (the HTTP header name of OIP, lower case).
BINARY_HEADER = "inference-header-content-length"

Headers = Iterable[tuple[str, bytes | None]]


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
