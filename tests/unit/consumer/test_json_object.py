"""consumer/json_object.py: JSON that must be an object, parsed and checked once; each caller names its errors."""

from __future__ import annotations

import pytest

from consumer.errors import DeadLetterReason, DecodeError
from consumer.json_object import json_object, record_json


def test_an_object_is_returned_as_parsed() -> None:
    assert json_object(b'{"a": [1, 2]}', ValueError, TypeError) == {"a": [1, 2]}


@pytest.mark.parametrize(("value", "kind"), [(b"[1]", "list"), (b'"x"', "str"), (b"3", "int"), (b"null", "NoneType")])
def test_json_that_is_not_an_object_raises_the_callers_error_naming_its_type(value: bytes, kind: str) -> None:
    with pytest.raises(TypeError, match=f"^{kind}$"):
        json_object(value, ValueError, TypeError)


def test_text_that_is_not_json_raises_the_callers_error_with_orjsons_message() -> None:
    with pytest.raises(ValueError, match="unexpected character"):
        json_object(b"{oops", ValueError, TypeError)


@pytest.mark.parametrize(
    ("value", "reason", "message"),
    [
        (b"{oops", DeadLetterReason.INVALID_JSON, "value is not valid JSON: "),
        (b"[1, 2]", DeadLetterReason.NOT_AN_OBJECT, "value is a JSON list, not an object"),
    ],
)
def test_a_records_value_is_dead_lettered_with_its_reason(value: bytes, reason: DeadLetterReason, message: str) -> None:
    with pytest.raises(DecodeError) as caught:
        record_json(value)
    assert caught.value.reason is reason
    assert message in str(caught.value)
