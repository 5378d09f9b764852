"""Sequence models without ONNX Runtime: detection, buckets, padding buffers, token/text/binary requests."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from consumer.batcher import MicroBatcher
from consumer.errors import DeadLetterReason, RecordError
from consumer.inference import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, BatchRunner
from consumer.model.buffers import BatchBuffers
from consumer.model.runner import OnnxRunner
from consumer.model.sequence import (
    CPU_BUCKETS,
    TextEncoder,
    bucket,
    detect,
    input_ranges,
    length_buckets,
)
from consumer.model.session import CPU, CUDA
from consumer.oip.client import decode_response, encode_request, encode_request_binary
from consumer.oip.decode import decode_request
from consumer.oip.encode import encode_response, encode_response_binary
from consumer.oip.forms import Form, RecordForm, classify
from consumer.oip.wire import BINARY_HEADER
from consumer.ops.metrics import Metrics
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import Limits
from tests.unit.fakes import FakeSession

LIMITS = Limits()
I64 = np.dtype(np.int64)


def text_signature(max_length: int = 32) -> ModelSignature:
    inputs = tuple(TensorSpec(n, I64, (None, None)) for n in ("input_ids", "attention_mask", "token_type_ids"))
    plain = ModelSignature(
        "text", "1", inputs, (TensorSpec("embedding", np.dtype(np.float32), (None, 8)),), sequence=None
    )
    meta = {"max_sequence_length": str(max_length), "pad_token_id": "0", "input_ranges": '{"input_ids": [0, 29]}'}
    return ModelSignature(
        plain.name, plain.version, plain.inputs, plain.outputs, detect(plain, meta), input_ranges(meta)
    )


def reason_of(value: bytes, signature: ModelSignature, **kwargs: object) -> str:
    with pytest.raises(RecordError) as info:
        decode_request(value, signature, LIMITS, **kwargs)  # type: ignore[arg-type]
    return info.value.reason.value


def test_detect_sequence_model_and_not_digits(digits_signature: ModelSignature) -> None:
    sig = text_signature()
    assert sig.sequence is not None
    assert sig.sequence.inputs == ("input_ids", "attention_mask", "token_type_ids")
    assert sig.sequence.max_length == 32
    assert dict(sig.sequence.optional) == {"attention_mask": 1, "token_type_ids": 0}
    assert detect(digits_signature, {}) is None


def test_buckets() -> None:
    assert length_buckets(32) == (8, 12, 16, 24, 32)
    assert length_buckets(100) == (8, 12, 16, 24, 32, 48, 64, 96, 100)
    bounds = length_buckets(512)
    assert all(b / a <= 1.5 for a, b in itertools.pairwise(bounds))  # padding waste below a third
    assert [bucket(n, (8, 16, 32)) for n in (1, 8, 9, 16, 17, 32, 40)] == [8, 8, 16, 16, 32, 32, 32]


def test_cpu_buckets_are_fine() -> None:
    bounds = length_buckets(512, CPU_BUCKETS)
    assert (bounds[0], bounds[-1]) == (8, 512)
    assert all(a < b <= a * 1.125 + 0.5 for a, b in itertools.pairwise(bounds))  # x 1.125, rounded
    assert length_buckets(20, CPU_BUCKETS) == (8, 9, 10, 11, 12, 14, 16, 18, 20)


@pytest.mark.parametrize(
    ("provider", "configured", "tokens", "bounds"),
    [
        (CPU, None, CPU_BATCH_TOKENS, (8, 9, 10, 11, 12, 14, 16, 18, 20, 22, 25, 28, 32)),
        (CUDA, None, GPU_BATCH_TOKENS, (8, 12, 16, 24, 32)),
        (CPU, 4096, 4096, (8, 9, 10, 11, 12, 14, 16, 18, 20, 22, 25, 28, 32)),
        (CUDA, 100, 100, (8, 12, 16, 24, 32)),
    ],
)
def test_token_budget_and_buckets_follow_the_provider(
    provider: str, configured: int | None, tokens: int, bounds: tuple[int, ...]
) -> None:
    runner = OnnxRunner(FakeSession(), text_signature(), provider=provider)
    inference = BatchRunner(runner, Metrics(CollectorRegistry()), lambda: 0.0, configured)
    assert inference.batch_tokens == tokens
    assert inference.buckets == bounds


def test_no_token_budget_for_other_models(digits_signature: ModelSignature) -> None:
    runner = OnnxRunner(FakeSession(), digits_signature, provider=CPU)
    assert BatchRunner(runner, Metrics(CollectorRegistry()), lambda: 0.0, 4096).batch_tokens is None


def test_pad_into_reused_buffers() -> None:
    buffers = BatchBuffers({"input_ids": I64, "attention_mask": I64}, {"input_ids": 9, "attention_mask": 0})
    a = {"input_ids": np.array([[1, 2, 3]]), "attention_mask": np.ones((1, 3), np.int64)}
    b = {"input_ids": np.array([[4], [5]]), "attention_mask": np.ones((2, 1), np.int64)}
    feeds, rows, length = buffers.pad([a, b])
    assert (rows, length) == (3, 3)
    assert feeds["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9], [5, 9, 9]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert feeds["input_ids"].flags.c_contiguous
    first = feeds["input_ids"]
    again, _, _ = buffers.pad([b])
    assert np.shares_memory(first, again["input_ids"])  # no new allocation for a smaller batch
    assert again["input_ids"].tolist() == [[4], [5]]


def test_token_request_fills_optional_inputs() -> None:
    value = encode_request("t", {"input_ids": np.array([[2, 5, 3]], np.int64)})
    request = decode_request(value, text_signature(), LIMITS)
    assert request.length == 3
    assert list(request.inputs) == ["input_ids", "attention_mask", "token_type_ids"]
    assert request.inputs["attention_mask"].tolist() == [[1, 1, 1]]
    assert request.inputs["token_type_ids"].tolist() == [[0, 0, 0]]


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        ({"input_ids": np.array([[2, 30]], np.int64)}, "out_of_range"),  # beyond the vocabulary
        ({"input_ids": np.zeros((1, 33), np.int64)}, "too_large"),  # longer than max_sequence_length
        ({"input_ids": np.zeros((1, 3), np.int64), "attention_mask": np.ones((1, 2), np.int64)}, "shape_mismatch"),
        ({"attention_mask": np.ones((1, 2), np.int64)}, "missing_input"),
        ({"input_ids": np.zeros((1, 0), np.int64)}, "shape_mismatch"),
        ({"input_ids": np.array([[2, 5, 3]]), "attention_mask": np.zeros((1, 3), np.int64)}, "out_of_range"),
    ],
)
def test_token_request_errors(inputs: dict[str, np.ndarray], reason: str) -> None:
    assert reason_of(encode_request(None, inputs), text_signature()) == reason


def test_record_above_the_token_budget_is_too_large() -> None:
    ids = np.full((300, 30), 5, np.int64)  # 9000 tokens > 8192: it would be run alone at any size
    assert reason_of(encode_request(None, {"input_ids": ids}), text_signature()) == "too_large"
    assert decode_request(encode_request(None, {"input_ids": ids[:200]}), text_signature(), LIMITS).rows == 200


@pytest.fixture
def encoder(tmp_path: Path) -> TextEncoder:
    from tests.text_model import build

    _, tokenizer = build(tmp_path)
    spec = text_signature().sequence
    assert spec is not None
    return TextEncoder(tokenizer, spec)


def test_text_request_is_tokenized(encoder: TextEncoder) -> None:
    value = encode_request("t", {"text": ["the quick fox", "kafka"]})
    request = decode_request(value, text_signature(), LIMITS, text=encoder)
    assert request.rows == 2
    assert request.length == 5  # [CLS] the quick fox [SEP]
    ids = request.inputs["input_ids"]
    assert ids[0, 0] == 2
    assert ids[0, 4] == 3
    assert request.inputs["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_text_truncated_to_max_length(encoder: TextEncoder) -> None:
    value = encode_request(None, {"text": [" ".join(["fox"] * 100)]})
    assert decode_request(value, text_signature(), LIMITS, text=encoder).length == 32


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}, "datatype_mismatch"),
        ({"name": "text", "shape": [1], "datatype": "BYTES", "data": [5]}, "datatype_mismatch"),
        ({"name": "text", "shape": [1], "datatype": "BYTES", "data": [None]}, "null_value"),
        ({"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a"]}, "shape_mismatch"),
        ({"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}, "shape_mismatch"),
        ({"name": "text", "shape": [0], "datatype": "BYTES", "data": []}, "shape_mismatch"),
    ],
)
def test_text_request_errors(encoder: TextEncoder, item: dict[str, object], reason: str) -> None:
    value = orjson.dumps({"inputs": [item]})
    assert reason_of(value, text_signature(), text=encoder) == reason


def test_text_without_tokenizer_is_unknown_input() -> None:
    assert reason_of(encode_request(None, {"text": ["a"]}), text_signature()) == "unknown_input"


def test_binary_request_round_trip(digits_signature: ModelSignature) -> None:
    x = np.arange(128, dtype=np.float32).reshape(2, 64) / 7
    value, json_length = encode_request_binary("b", {"input": x}, binary_output=True)
    headers = [(BINARY_HEADER.upper(), str(json_length).encode())]
    form = classify(headers)
    assert isinstance(form, RecordForm)
    assert form.form is Form.BINARY
    request = decode_request(value, digits_signature, LIMITS, json_length=form.json_length)
    assert np.array_equal(request.inputs["input"], x)
    assert request.binary_output
    assert request.rows == 2


def test_binary_text_request(encoder: TextEncoder) -> None:
    value, json_length = encode_request_binary(None, {"text": ["the dog", "kafka stream batch"]})
    request = decode_request(value, text_signature(), LIMITS, json_length=json_length, text=encoder)
    assert request.rows == 2
    assert request.length == 5


def test_binary_request_errors(digits_signature: ModelSignature) -> None:
    x = np.ones((1, 64), np.float32)
    value, n = encode_request_binary(None, {"input": x})
    assert reason_of(value[:-4], digits_signature, json_length=n) == "invalid_request"  # data cut short
    assert reason_of(value + b"\0\0\0\0", digits_signature, json_length=n) == "invalid_request"  # trailing bytes
    assert reason_of(value, digits_signature) == "invalid_json"  # binary without the header
    assert reason_of(value, digits_signature, json_length=len(value) + 1) == "invalid_request"
    nan = x.copy()
    nan[0, 3] = np.nan
    value, n = encode_request_binary(None, {"input": nan})
    assert reason_of(value, digits_signature, json_length=n) == "out_of_range"
    body = orjson.loads(value[:n])
    body["inputs"][0]["parameters"]["binary_data_size"] = 255
    head = orjson.dumps(body)
    assert reason_of(head + value[n:][:255], digits_signature, json_length=len(head)) == "shape_mismatch"
    for bad in (b"12x", b"+104", b" 104 ", b"10_4", b"-1", b"", None, b"1" * 13):
        error = classify([("Inference-Header-Content-Length", bad)])
        assert isinstance(error, RecordError)
        assert error.reason is DeadLetterReason.INVALID_REQUEST
    assert classify([("Inference-Header-Content-Length", b"1" * 12)]) == RecordForm(Form.BINARY, int(b"1" * 12))
    # the first length header counts; a protobuf header wins over a malformed length
    assert classify([(BINARY_HEADER, b"7"), (BINARY_HEADER, b"x")]) == RecordForm(Form.BINARY, 7)
    assert classify([(BINARY_HEADER, b"x"), ("Seldon-Infer-Type", b"proto/InferModelRequest")]).form is Form.PROTOBUF


def test_binary_data_size_needs_the_header(digits_signature: ModelSignature) -> None:
    body = {
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": 256}}]
    }
    assert reason_of(orjson.dumps(body), digits_signature) == "invalid_request"


def test_binary_response_round_trip(digits_signature: ModelSignature) -> None:
    outputs = [("label", np.array([3, 4], np.int64)), ("probabilities", np.full((2, 10), 0.1, np.float32))]
    value, n = encode_response_binary("r", digits_signature, outputs)
    body = decode_response(value, n)
    assert body["id"] == "r"
    assert body["outputs"]["label"].tolist() == [3, 4]
    assert np.array_equal(body["outputs"]["probabilities"], outputs[1][1])
    plain = decode_response(encode_response("r", digits_signature, outputs))
    assert plain["outputs"]["label"].tolist() == [3, 4]


def test_batcher_flushes_at_token_budget(clock: object) -> None:
    batcher: MicroBatcher[str] = MicroBatcher(64, 5, clock, max_batch_tokens=100)  # type: ignore[arg-type]
    batcher.put("a", rows=1, key=32, tokens=32)
    batcher.put("b", rows=1, key=32, tokens=32)
    assert batcher.pop_ready(clock()) is None  # type: ignore[operator]
    batcher.put("c", rows=2, key=32, tokens=64)  # 128 tokens pending >= 100
    assert batcher.pop_ready(clock()) == ["a", "b"]  # type: ignore[operator]  # c would pass the budget
    batcher.close()
    assert batcher.pop_ready(clock()) == ["c"]  # type: ignore[operator]
