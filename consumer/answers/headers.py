"""What both protocols share beside a record's value: the correlation ID's header and rule.

Read at intake for every request (OIP or event) and written on every result and dead letter
(:mod:`consumer.answers.records`).
"""

from __future__ import annotations

from collections.abc import Iterable

#: Header carrying the correlation ID on requests (optional) and on every result and dead letter.
CORRELATION_HEADER = "correlation_id"
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
