"""A request record's form, read once from its headers, then dispatched on: JSON, the binary data extension or
protobuf.

- **protobuf**: header ``seldon-infer-type: proto/InferModelRequest`` or ``content-type: application/x-protobuf``
  (names in any case; :mod:`consumer.oip.proto`): the value is a ``ModelInferRequest``. Either header wins over a
  binary-extension header.
- **binary**: header ``inference-header-content-length: N`` (decimal, :mod:`consumer.oip.wire`; the first one
  counts): the first N bytes of the value are the JSON request, the rest raw tensor data.
- **JSON**: neither: the value is the JSON request.

:func:`classify` scans a record's headers once; the decoders (:func:`consumer.oip.decode.decode_form`,
:func:`consumer.oip.chunk.decode_chunk`) take its answer instead of asking the headers again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from consumer.errors import DeadLetterReason, DecodeError
from consumer.oip.proto import CONTENT_TYPE_HEADER, PROTO_REQUEST, PROTOBUF, SELDON_TYPE_HEADER
from consumer.oip.wire import BINARY_HEADER, Headers


class Form(enum.Enum):
    """How a request record's value is laid out."""

    JSON = "json"
    BINARY = "binary"
    PROTOBUF = "protobuf"


@dataclass(frozen=True, slots=True)
class RecordForm:
    """A record's form and, for the binary data extension, its JSON part's length.

    Attributes:
        form: JSON, binary or protobuf.
        json_length: binary: the JSON part's length, bytes (header ``inference-header-content-length``); None
            otherwise.
    """

    form: Form
    json_length: int | None = None


#: The form of a record with neither header (the common case: one shared object).
JSON_FORM = RecordForm(Form.JSON)
#: The form of a protobuf ``ModelInferRequest``.
PROTOBUF_FORM = RecordForm(Form.PROTOBUF)

_BINARY_LENGTH = len(BINARY_HEADER)
_SELDON_LENGTH = len(SELDON_TYPE_HEADER)
_CONTENT_TYPE_LENGTH = len(CONTENT_TYPE_HEADER)
#: Longest accepted binary-extension length header, digits.
MAX_LENGTH_DIGITS = 12


def classify(headers: Headers) -> RecordForm | DecodeError:
    """The record's form, from one pass over its headers (names compared by length first: most records carry only a
    correlation ID).

    Returns:
        The form; or, for a record that is not protobuf and whose first ``inference-header-content-length`` is not a
        non-negative decimal integer (ASCII digits only: no sign, space or ``_``; at most 12), the dead-letter
        error (invalid_request) it gets.
    """
    length: bytes | None = None
    seen_length = False
    for name, value in headers:
        size = len(name)
        if size == _BINARY_LENGTH:
            if not seen_length and name.lower() == BINARY_HEADER:
                seen_length = True
                length = value
        elif size == _SELDON_LENGTH:
            if value == PROTO_REQUEST and name.lower() == SELDON_TYPE_HEADER:
                return PROTOBUF_FORM
        elif (
            size == _CONTENT_TYPE_LENGTH
            and value is not None
            and name.lower() == CONTENT_TYPE_HEADER
            and value.split(b";")[0].strip() == PROTOBUF
        ):
            return PROTOBUF_FORM
    if not seen_length:
        return JSON_FORM
    if not length or not length.isdigit() or len(length) > MAX_LENGTH_DIGITS:
        return DecodeError(
            DeadLetterReason.INVALID_REQUEST, f"header {BINARY_HEADER} is not a decimal length: {length!r:.40}"
        )
    return RecordForm(Form.BINARY, int(length))
