"""The Open Inference Protocol in protobuf against an independent implementation: Triton's compiled ``inference``
messages (``tritonclient.grpc.service_pb2``). Same fields on the wire, requests decoded as their JSON twins are,
the same dead-letter reasons, responses those messages parse with the JSON path's outputs."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as triton

from consumer.answers.records import AnswerRecords
from consumer.errors import RecordError
from consumer.oip import proto
from consumer.oip.chunk import decode_chunk
from consumer.oip.client import decode_response
from consumer.oip.decode import decode_one
from consumer.oip.encode import encode_response, encode_response_binary
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Limits

LIMITS = Limits()
SELDON = [("seldon-infer-type", b"proto/InferModelRequest")]


def fields(descriptor: Any) -> dict[str, tuple[Any, ...]]:
    return {
        f.name: (
            f.number,
            f.type,
            f.is_repeated,
            f.message_type.full_name if f.message_type else None,
            f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in descriptor.fields
    }


def same_messages(ours: Any, theirs: Any) -> list[str]:
    """Names of the messages (nested ones and field types included) whose fields differ."""
    differ = [] if fields(ours) == fields(theirs) else [ours.full_name]
    for nested in ours.nested_types:
        differ += same_messages(nested, theirs.nested_types_by_name[nested.name])
    for field in ours.fields:
        if field.message_type is not None and field.message_type.containing_type is None:
            differ += same_messages(field.message_type, theirs.fields_by_name[field.name].message_type)
    return differ


def test_every_field_has_the_published_number_and_type() -> None:
    assert same_messages(proto.ModelInferRequest.DESCRIPTOR, triton.ModelInferRequest.DESCRIPTOR) == []
    assert same_messages(proto.ModelInferResponse.DESCRIPTOR, triton.ModelInferResponse.DESCRIPTOR) == []


def digits_rows(n: int) -> np.ndarray:
    return np.arange(n * 64, dtype=np.float32).reshape(n, 64) / 7


def json_twin(x: np.ndarray, request_id: str = "r1") -> bytes:
    return orjson.dumps(
        {
            "id": request_id,
            "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        }
    )


def typed_request(x: np.ndarray, **extra: Any) -> bytes:
    request = triton.ModelInferRequest(model_name="digits", id="r1", **extra)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request.SerializeToString()


def decoded(
    value: bytes, signature: ModelSignature, headers: list[tuple[str, bytes | None]] = SELDON
) -> DecodedRequest:
    out = decode_one(value, headers, signature, LIMITS)
    assert isinstance(out, DecodedRequest), out
    return out


def test_typed_and_raw_contents_decode_as_their_json_twin(digits_signature: ModelSignature) -> None:
    x = digits_rows(3)
    twin = decoded(json_twin(x), digits_signature, [])
    typed = decoded(typed_request(x), digits_signature)
    raw = triton.ModelInferRequest(id="r1", raw_input_contents=[x.astype("<f4").tobytes()])
    raw.inputs.add(name="input", datatype="FP32", shape=[3, 64])
    by_content_type = decoded(raw.SerializeToString(), digits_signature, [("Content-Type", b"application/x-protobuf")])
    for request in (typed, by_content_type):
        assert request.protobuf
        assert request.id == twin.id == "r1"
        assert request.rows == 3
        np.testing.assert_array_equal(request.inputs["input"], twin.inputs["input"])
    assert not twin.protobuf


def test_requested_outputs_are_kept(digits_signature: ModelSignature) -> None:
    request = triton.ModelInferRequest()
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend([0.0] * 64)
    request.outputs.add(name="label")
    assert decoded(request.SerializeToString(), digits_signature).outputs == ("label",)


def reason(value: bytes, signature: ModelSignature) -> str:
    out = decode_one(value, SELDON, signature, LIMITS)
    assert isinstance(out, RecordError), out
    return out.reason.value


def test_bad_requests_get_the_json_paths_reasons(digits_signature: ModelSignature) -> None:
    x = digits_rows(1)
    assert reason(b"\xff\xff\xff", digits_signature) == "invalid_request"  # not a ModelInferRequest
    short = triton.ModelInferRequest()
    short.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend([0.0] * 63)
    assert reason(short.SerializeToString(), digits_signature) == "shape_mismatch"
    wrong_field = triton.ModelInferRequest()
    wrong_field.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.int64_contents.extend([0] * 64)
    assert reason(wrong_field.SerializeToString(), digits_signature) == "datatype_mismatch"
    half = triton.ModelInferRequest()
    half.inputs.add(name="input", datatype="FP16", shape=[1, 64]).contents.fp32_contents.extend([0.0] * 64)
    assert reason(half.SerializeToString(), digits_signature) == "datatype_mismatch"  # FP16 travels raw only
    unknown = triton.ModelInferRequest()
    unknown.inputs.add(name="pixels", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend([0.0] * 64)
    assert reason(unknown.SerializeToString(), digits_signature) == "unknown_input"
    missing_raw = triton.ModelInferRequest(raw_input_contents=[b"\0" * 256, b"\0"])
    missing_raw.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    assert reason(missing_raw.SerializeToString(), digits_signature) == "invalid_request"
    nan = triton.ModelInferRequest()
    nan.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend([float("nan")] * 64)
    assert reason(nan.SerializeToString(), digits_signature) == "out_of_range"
    big = typed_request(x)
    assert decode_one(big, SELDON, digits_signature, Limits(max_record_bytes=len(big) - 1)).reason.value == "too_large"  # type: ignore[union-attr]
    assert reason(typed_request(digits_rows(2000)), digits_signature) == "too_large"  # max_record_rows


def test_integer_and_bytes_contents_are_range_checked_and_length_prefixed() -> None:
    signature = ModelSignature(
        name="m",
        version="1",
        inputs=(TensorSpec("small", np.dtype(np.int8), (None, 2)), TensorSpec("text", np.dtype(object), (None,))),
        outputs=(TensorSpec("y", np.dtype(np.float32), (None,)),),
    )
    request = triton.ModelInferRequest()
    request.inputs.add(name="small", datatype="INT8", shape=[1, 2]).contents.int_contents.extend([-128, 127])
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append("héllo".encode())
    ok = decoded(request.SerializeToString(), signature)
    assert ok.inputs["small"].tolist() == [[-128, 127]]
    assert ok.inputs["text"].tolist() == ["héllo"]
    binary, json_length = proto.to_binary(request.SerializeToString())
    assert binary[json_length:] == b"\x80\x7f" + struct.pack("<I", 6) + "héllo".encode()  # the extension's layout
    request.inputs[0].contents.int_contents[1] = 128
    assert reason(request.SerializeToString(), signature) == "out_of_range"


def test_a_chunk_decodes_protobuf_and_json_records_side_by_side(digits_signature: ModelSignature) -> None:
    x = digits_rows(2)
    values = [json_twin(x[:1], "a"), typed_request(x), json_twin(x[1:], "b")]
    headers: list[list[tuple[str, bytes | None]]] = [[], SELDON, []]
    out = decode_chunk(values, headers, digits_signature, LIMITS)
    assert [getattr(r, "protobuf", None) for r in out] == [False, True, False]
    assert isinstance(out[1], DecodedRequest)
    np.testing.assert_array_equal(out[1].inputs["input"], x)


def test_the_response_parses_with_triton_messages_to_the_json_paths_outputs(digits_signature: ModelSignature) -> None:
    outputs = [("label", np.array([3, 7], dtype=np.int64)), ("probabilities", np.full((2, 10), 0.1, np.float32))]
    as_json = decode_response(encode_response("r1", digits_signature, outputs))
    parsed = triton.ModelInferResponse.FromString(
        proto.response(*encode_response_binary("r1", digits_signature, outputs))
    )
    assert (parsed.model_name, parsed.model_version, parsed.id) == ("digits", "1", "r1")
    assert [o.name for o in parsed.outputs] == ["label", "probabilities"]
    for tensor, raw in zip(parsed.outputs, parsed.raw_output_contents, strict=True):
        expected = as_json["outputs"][tensor.name]
        assert list(tensor.shape) == list(expected.shape)
        dtype = {"INT64": "<i8", "FP32": "<f4"}[tensor.datatype]
        np.testing.assert_array_equal(np.frombuffer(raw, dtype=dtype).reshape(tensor.shape), expected)
    ours = proto.parse_response(parsed.SerializeToString())  # the reader's side (streaminfer-results)
    assert ours["id"] == "r1"
    for name, arr in as_json["outputs"].items():
        np.testing.assert_array_equal(ours["outputs"][name], arr)
    typed = triton.ModelInferResponse(id="t")  # another server's typed answer reads the same
    typed.outputs.add(name="label", datatype="INT64", shape=[2]).contents.int64_contents.extend([3, 7])
    assert proto.parse_response(typed.SerializeToString())["outputs"]["label"].tolist() == [3, 7]


def test_a_protobuf_result_says_so_in_its_headers() -> None:
    class Rec:
        topic, partition, offset, timestamp, key, value = "requests", 0, 1, 5, None, b""
        headers = (("traceparent", b"00-a-b-01"),)

    sink = AnswerRecords(results_topic="results", dead_letter_topic="dlq", group_id="g")
    _, _, _, headers = sink.result(Rec(), b"cid", b"\x0a\x00", protobuf=True)
    assert headers == [
        ("correlation_id", b"cid"),
        ("content-type", b"application/x-protobuf"),
        ("seldon-infer-type", b"proto/InferModelResponse"),
        ("streaminfer.request.timestamp_ms", b"5"),
        ("traceparent", b"00-a-b-01"),
    ]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("seldon-infer-type", b"proto/InferModelRequest")], True),
        ([("Content-Type", b"application/x-protobuf; charset=binary")], True),
        ([("seldon-infer-type", b"json/inferModelRequest")], False),
        ([("content-type", b"application/json")], False),
        ([("content-type", None)], False),
        ([], False),
    ],
)
def test_which_records_are_protobuf(headers: list[tuple[str, bytes | None]], expected: bool) -> None:
    assert proto.is_protobuf(headers) is expected
