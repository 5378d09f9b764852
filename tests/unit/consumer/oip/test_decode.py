from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from consumer.answers.headers import correlation_id
from consumer.errors import DeadLetterReason as R
from consumer.errors import RecordError
from consumer.oip.client import decode_response, encode_request
from consumer.oip.decode import decode_request
from consumer.oip.encode import encode_response
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Limits
from producer_tools.poison import catalogue

LIMITS = Limits(max_record_bytes=1_000_000, max_record_rows=1024)


def request(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def inp(
    name: str = "input", shape: list[int] | None = None, datatype: str = "FP32", data: Any = None
) -> dict[str, Any]:
    return {
        "name": name,
        "shape": shape if shape is not None else [1, 64],
        "datatype": datatype,
        "data": data if data is not None else [0.5] * 64,
    }


def reason_of(value: bytes | None, sig: ModelSignature, limits: Limits = LIMITS) -> R:
    with pytest.raises(RecordError) as info:
        decode_request(value, sig, limits)
    return info.value.reason


@pytest.fixture
def two_input_signature() -> ModelSignature:
    return ModelSignature(
        name="two",
        version="3",
        inputs=(
            TensorSpec("ids", np.dtype(np.int32), (None, None)),
            TensorSpec("mask", np.dtype(np.int64), (None, None)),
        ),
        outputs=(TensorSpec("y", np.dtype(np.float32), (None,)),),
    )


@pytest.mark.parametrize("poison", catalogue(), ids=lambda p: p.kind)
def test_every_poison_kind_gets_its_reason(poison: Any, digits_signature: ModelSignature) -> None:
    assert reason_of(poison.value, digits_signature) == poison.reason


def test_catalogue_covers_every_request_reason() -> None:
    produced_by_model = {R.INFERENCE_ERROR, R.NON_FINITE_OUTPUT, R.RESULT_TOO_LARGE, R.UNDECODABLE_RECORD}
    image_models_only = {R.INVALID_IMAGE}  # tests/unit/test_vision.py gives every image reason its bad record
    # tests/unit/consumer/events/test_decode.py gives every event reason its bad record
    events_only = {
        R.MISSING_FIELD,
        R.WRONG_TYPE,
        R.UNKNOWN_CATEGORY,
        R.FIELD_CLASH,
        R.NOT_IN_WIRE_FORMAT,
        R.UNKNOWN_SCHEMA_ID,
        R.INVALID_AVRO,
        R.RESULT_SCHEMA_REFUSED,
    }
    assert {p.reason for p in catalogue()} == set(R) - produced_by_model - image_models_only - events_only


def test_value_over_byte_limit_is_too_large(digits_signature: ModelSignature) -> None:
    value = request(inp())
    assert reason_of(value, digits_signature, Limits(max_record_bytes=len(value) - 1)) == R.TOO_LARGE


def test_duplicate_input_name_is_invalid_request(digits_signature: ModelSignature) -> None:
    assert reason_of(request(inp(), inp()), digits_signature) == R.INVALID_REQUEST


def test_outputs_must_be_named_objects(digits_signature: ModelSignature) -> None:
    assert reason_of(request(inp(), outputs=["label"]), digits_signature) == R.INVALID_REQUEST


def test_fraction_for_integer_datatype(two_input_signature: ModelSignature) -> None:
    value = request(inp("ids", [1, 2], "INT32", [1.5, 2]), inp("mask", [1, 2], "INT64", [1, 1]))
    assert reason_of(value, two_input_signature) == R.DATATYPE_MISMATCH


def test_float_declared_for_integer_model_is_mismatch(two_input_signature: ModelSignature) -> None:
    value = request(inp("ids", [1, 2], "FP32", [1, 2]), inp("mask", [1, 2], "INT64", [1, 1]))
    assert reason_of(value, two_input_signature) == R.DATATYPE_MISMATCH


def test_booleans_for_float_input_are_mismatch(digits_signature: ModelSignature) -> None:
    assert reason_of(request(inp(data=[True] * 64)), digits_signature) == R.DATATYPE_MISMATCH


def test_int64_to_int32_in_range_is_cast(two_input_signature: ModelSignature) -> None:
    value = request(inp("ids", [1, 2], "INT64", [7, -3]), inp("mask", [1, 2], "INT64", [1, 0]))
    req = decode_request(value, two_input_signature, LIMITS)
    assert req.inputs["ids"].dtype == np.int32
    assert req.inputs["ids"].tolist() == [[7, -3]]


def test_int64_to_int32_overflow_is_out_of_range(two_input_signature: ModelSignature) -> None:
    value = request(inp("ids", [1, 2], "INT64", [2**31, 0]), inp("mask", [1, 2], "INT64", [1, 0]))
    assert reason_of(value, two_input_signature) == R.OUT_OF_RANGE


def test_integer_beyond_64_bits_is_out_of_range(two_input_signature: ModelSignature) -> None:
    value = b'{"inputs":[{"name":"ids","shape":[1,1],"datatype":"INT64","data":[36893488147419103232]},' + (
        b'{"name":"mask","shape":[1,1],"datatype":"INT64","data":[1]}]}'
    )
    assert reason_of(value, two_input_signature) in {R.OUT_OF_RANGE}


def test_integers_to_float32_must_be_exact(digits_signature: ModelSignature) -> None:
    ok = decode_request(request(inp(datatype="INT64", data=[2**24] + [0] * 63)), digits_signature, LIMITS)
    assert ok.inputs["input"][0, 0] == 2**24
    assert reason_of(request(inp(datatype="INT64", data=[2**24 + 1] + [0] * 63)), digits_signature) == R.OUT_OF_RANGE


def test_fp64_in_range_is_cast_to_fp32(digits_signature: ModelSignature) -> None:
    req = decode_request(request(inp(datatype="FP64")), digits_signature, LIMITS)
    assert req.inputs["input"].dtype == np.float32


def test_value_must_fit_declared_datatype(digits_signature: ModelSignature) -> None:
    assert reason_of(request(inp(datatype="INT8", data=[300] + [0] * 63)), digits_signature) == R.OUT_OF_RANGE


def test_rows_must_agree_across_inputs(two_input_signature: ModelSignature) -> None:
    value = request(inp("ids", [2, 1], "INT32", [1, 2]), inp("mask", [1, 2], "INT64", [1, 1]))
    assert reason_of(value, two_input_signature) == R.SHAPE_MISMATCH


def test_nested_shape_must_match_declared(digits_signature: ModelSignature) -> None:
    value = request(inp(shape=[2, 64], data=[[0.0] * 32] * 4))
    assert reason_of(value, digits_signature) == R.SHAPE_MISMATCH


@pytest.mark.parametrize("nested", [False, True])
def test_flat_and_nested_data_decode_alike(nested: bool, digits_signature: ModelSignature) -> None:
    rows = np.arange(128, dtype=np.float32).reshape(2, 64)
    data = rows.tolist() if nested else rows.reshape(-1).tolist()
    req = decode_request(request(inp(shape=[2, 64], data=data), id="x"), digits_signature, LIMITS)
    assert req.rows == 2
    assert req.id == "x"
    np.testing.assert_array_equal(req.inputs["input"], rows)
    assert req.shape_key == (("input", (64,)),)


def test_request_round_trip(digits_signature: ModelSignature) -> None:
    x = np.random.default_rng(0).random((3, 64), dtype=np.float32)
    req: DecodedRequest = decode_request(
        encode_request("rt", {"input": x}, outputs=["label"]), digits_signature, LIMITS
    )
    np.testing.assert_array_equal(req.inputs["input"], x)
    assert req.outputs == ("label",)


def test_response_round_trip(digits_signature: ModelSignature) -> None:
    label = np.array([3, 9], dtype=np.int64)
    probs = np.random.default_rng(1).random((2, 10), dtype=np.float32)
    body = decode_response(encode_response("cid-1", digits_signature, [("label", label), ("probabilities", probs)]))
    assert body["id"] == "cid-1"
    assert (body["model_name"], body["model_version"]) == ("digits", "1")
    np.testing.assert_array_equal(body["outputs"]["label"], label)
    np.testing.assert_array_equal(body["outputs"]["probabilities"], probs)
    assert body["outputs"]["probabilities"].dtype == np.float32


def test_response_is_oip_json(digits_signature: ModelSignature) -> None:
    raw = orjson.loads(encode_response("c", digits_signature, [("label", np.array([4], dtype=np.int64))]))
    assert raw["outputs"] == [{"name": "label", "shape": [1], "datatype": "INT64", "data": [4]}]


def test_correlation_id_precedence() -> None:
    headers = [("other", b"x"), ("correlation_id", b"\xffhdr"), ("correlation_id", b"second")]
    assert correlation_id(headers, "req", b"key", ("t", 0, 1)) == b"\xffhdr"  # byte-for-byte, first wins
    assert correlation_id([], "req", b"key", ("t", 0, 1)) == b"req"
    assert correlation_id([], None, b"key", ("t", 0, 1)) == b"key"
    assert correlation_id([], None, None, ("t", 0, 1)) == b"t:0:1"


@pytest.mark.parametrize("data", [[True] + [0.5] * 63, [[0.5] * 63 + [False]]])
def test_booleans_mixed_with_numbers_are_mismatch(data: list[Any], digits_signature: ModelSignature) -> None:
    shape = [1, 64]
    assert reason_of(request(inp(shape=shape, data=data)), digits_signature) == R.DATATYPE_MISMATCH


def test_true_inside_an_id_does_not_reject_numbers(digits_signature: ModelSignature) -> None:
    req = decode_request(request(inp(), id="true-false"), digits_signature, LIMITS)
    assert req.id == "true-false"


def test_data_nested_beyond_numpy_rank_is_shape_mismatch(digits_signature: ModelSignature) -> None:
    deep: Any = [0.0]
    for _ in range(70):
        deep = [deep]
    assert reason_of(request(inp(data=deep)), digits_signature) == R.SHAPE_MISMATCH


@pytest.mark.parametrize("outputs", [[], [{"name": "label"}, {"name": "label"}]])
def test_empty_or_repeated_outputs_are_invalid(outputs: list[Any], digits_signature: ModelSignature) -> None:
    assert reason_of(request(inp(), outputs=outputs), digits_signature) == R.INVALID_REQUEST


def test_unknown_names_list_what_the_model_has(digits_signature: ModelSignature) -> None:
    with pytest.raises(RecordError, match=r"model has no input 'X'; its inputs: \['input'\]"):
        decode_request(request(inp(name="X")), digits_signature, LIMITS)
    outputs = {"outputs": [{"name": "score"}]}
    with pytest.raises(RecordError, match=r"no output 'score'; its outputs: \['label', 'probabilities'\]"):
        decode_request(request(inp(), **outputs), digits_signature, LIMITS)
