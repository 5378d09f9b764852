"""A catalogue of poison records for the digits model (input ``input`` FP32 ``[batch, 64]``), each with the
dead-letter reason the consumer must give it. Used by ``make demo``, the integration tests and
``streaminfer-produce --poison``.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from consumer.errors import DeadLetterReason as R


@dataclass(frozen=True, slots=True)
class Poison:
    """One bad record.

    Attributes:
        kind: a short name of what is wrong.
        reason: the dead-letter reason the consumer must report.
        value: the record value (None is a tombstone).
    """

    kind: str
    reason: R
    value: bytes | None


def _req(inputs: object, **extra: object) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


def _inp(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
    base.update(overrides)
    return base


def catalogue() -> list[Poison]:
    """Every poison kind, at least one per documented reason that a request can trigger."""
    return [
        Poison("garbage_bytes", R.INVALID_JSON, b"{not json"),
        Poison("empty_value", R.INVALID_JSON, b""),
        Poison("null_value_tombstone", R.INVALID_JSON, None),  # sent with a key; see also test_sink
        Poison("non_utf8", R.INVALID_JSON, b"\xff\xfe\x00\x01"),
        Poison(
            "nan_token", R.INVALID_JSON, b'{"inputs":[{"name":"input","shape":[1,1],"datatype":"FP32","data":[NaN]}]}'
        ),
        Poison("json_array", R.NOT_AN_OBJECT, b"[1, 2, 3]"),
        Poison("inputs_not_list", R.INVALID_REQUEST, _req("input")),
        Poison(
            "input_without_data", R.INVALID_REQUEST, _req([{"name": "input", "shape": [1, 64], "datatype": "FP32"}])
        ),
        Poison("id_not_string", R.INVALID_REQUEST, _req([_inp()], id=42)),
        Poison("no_inputs", R.MISSING_INPUT, _req([])),
        Poison("unknown_input", R.UNKNOWN_INPUT, _req([_inp(name="pixels")])),
        Poison("unknown_output", R.UNKNOWN_OUTPUT, _req([_inp()], outputs=[{"name": "logits"}])),
        Poison("bytes_datatype", R.DATATYPE_MISMATCH, _req([_inp(datatype="BYTES")])),
        Poison("unknown_datatype", R.DATATYPE_MISMATCH, _req([_inp(datatype="FLOAT")])),
        Poison("string_data", R.DATATYPE_MISMATCH, _req([_inp(data=["a"] * 64)])),
        Poison("float_beyond_fp32", R.OUT_OF_RANGE, _req([_inp(data=[1e39] + [0.0] * 63)])),
        Poison("int_overflow_int32", R.OUT_OF_RANGE, _req([_inp(datatype="INT32", data=[2**40] + [0] * 63)])),
        Poison("wrong_width", R.SHAPE_MISMATCH, _req([_inp(shape=[1, 63], data=[0.0] * 63)])),
        Poison("wrong_rank", R.SHAPE_MISMATCH, _req([_inp(shape=[64])])),
        Poison("count_mismatch", R.SHAPE_MISMATCH, _req([_inp(data=[0.0] * 60)])),
        Poison("zero_rows", R.SHAPE_MISMATCH, _req([_inp(shape=[0, 64], data=[])])),
        Poison("ragged_rows", R.RAGGED, _req([_inp(shape=[2, 64], data=[[0.0] * 64, [0.0] * 63])])),
        Poison("null_in_data", R.NULL_VALUE, _req([_inp(data=[None] + [0.0] * 63)])),
        Poison("too_many_rows", R.TOO_LARGE, _req([_inp(shape=[100_000, 64], data=[])])),
    ]
