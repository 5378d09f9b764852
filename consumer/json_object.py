"""JSON that must be an object: parsed and checked once, for the record decoders (OIP requests, JSON events), the
model's ``image_preprocessing`` metadata and the user tools' files.

Each caller names the errors it raises, so its messages (and a record's dead-letter reason) stay its own;
:func:`record_json` is the records' pair (``invalid_json``, ``not_an_object``), the same for both protocols.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from consumer.errors import DeadLetterReason, DecodeError

#: What :func:`json_object` accepts: orjson's inputs.
Text = bytes | bytearray | memoryview | str


def json_object(
    value: Text, not_json: Callable[[str], Exception], not_object: Callable[[str], Exception]
) -> dict[str, Any]:
    """``value`` parsed as a JSON object.

    Raises:
        Exception: ``not_json(orjson's message)`` when ``value`` is not JSON; ``not_object(type name)`` when it is
            JSON but not an object (the parsed value's Python type: ``list``, ``str``, ``int``, ``float``, ``bool``,
            ``NoneType``).
    """
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise not_json(str(exc)) from None
    if not isinstance(parsed, dict):
        raise not_object(type(parsed).__name__)
    return parsed


def record_json(value: Text) -> dict[str, Any]:
    """A record's value (an OIP request's JSON part, a JSON event) parsed as a JSON object.

    Raises:
        DecodeError: ``invalid_json`` (not JSON), ``not_an_object`` (JSON, but not an object).
    """
    return json_object(
        value,
        lambda text: DecodeError(DeadLetterReason.INVALID_JSON, f"value is not valid JSON: {text}"),
        lambda kind: DecodeError(DeadLetterReason.NOT_AN_OBJECT, f"value is a JSON {kind}, not an object"),
    )
