"""Model compatibility without a model file: the graph rules (consumer.model.compat), static batches and the output
probe (consumer.model.runner) on fake sessions, BYTES inputs (consumer.oip), and answers with outputs without a batch
axis."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from consumer.errors import DeadLetterReason as R
from consumer.errors import ModelError, RecordError
from consumer.model.compat import OutputReader, input_spec, is_zipmap, output_spec, static_batch
from consumer.model.runner import OnnxRunner, batch_axis, split, warmup_plan
from consumer.oip.chunk import decode_chunk
from consumer.oip.decode import decode_request
from consumer.oip.encode import check_output
from consumer.signature import BF16, ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Limits

LIMITS = Limits()
F32 = np.dtype(np.float32)


# ------------------------------------------------------------------------------------------------ graph rules
@pytest.mark.parametrize(
    ("ort_type", "shape", "fix"),
    [
        ("seq(tensor(float))", [], "export it with tensor inputs"),
        ("map(string,tensor(float))", [], "export it with tensor inputs"),
        ("tensor(bfloat16)", [None, 4], "float32 inputs"),
        ("tensor(complex64)", [None, 4], "float32 inputs"),
        ("tensor(float)", [], "dynamic_axes={'x': {0: 'batch'}}"),
    ],
)
def test_inputs_that_cannot_be_fed_are_refused_with_the_fix(ort_type: str, shape: list[Any], fix: str) -> None:
    with pytest.raises(ModelError, match="input 'x'") as info:
        input_spec("x", ort_type, shape)
    assert fix in str(info.value)


def test_tensor_inputs_of_every_request_type_are_served() -> None:
    assert input_spec("x", "tensor(string)", ["batch", 1]) == TensorSpec("x", np.dtype(object), (None, 1))
    assert input_spec("x", "tensor(float16)", [None, "n", 3]).shape == (None, None, 3)


@pytest.mark.parametrize(
    ("ort_type", "fix"),
    [("seq(tensor(float))", "'zipmap': False"), ("map(int64,tensor(float))", "'zipmap': False"),
     ("tensor(float8e4m3fn)", "add a Cast node")],
)  # fmt: skip
def test_outputs_that_cannot_be_answered_are_refused_with_the_fix(ort_type: str, fix: str) -> None:
    with pytest.raises(ModelError, match="output 'y'") as info:
        output_spec("y", ort_type, [None])
    assert fix in str(info.value)


def test_zipmap_and_bfloat16_outputs_are_served() -> None:
    assert is_zipmap("seq(map(string,tensor(float)))")
    assert is_zipmap("seq(map(int64,tensor(double)))")
    assert not is_zipmap("seq(tensor(float))")
    assert output_spec("p", "seq(map(int64,tensor(float)))", []) == TensorSpec("p", F32, (None, None))
    assert output_spec("b", "tensor(bfloat16)", ["batch", 2]).dtype == BF16


def spec(name: str, first: int | None) -> TensorSpec:
    return TensorSpec(name, F32, (first, 4))


def test_static_batch_is_the_fixed_axis_every_input_shares() -> None:
    assert static_batch([spec("a", None), spec("b", None)]) is None
    assert static_batch([spec("a", 4), spec("b", 4)]) == 4
    with pytest.raises(ModelError, match=r"disagree on the batch axis .*'a' 1, 'b' dynamic"):
        static_batch([spec("a", 1), spec("b", None)])
    with pytest.raises(ModelError, match="disagree"):
        static_batch([spec("a", 1), spec("b", 2)])
    with pytest.raises(ModelError, match="fixed at 0"):
        static_batch([spec("a", 0)])
    with pytest.raises(ModelError, match="no inputs"):
        static_batch([])


def test_zipmap_maps_become_dense_columns_in_label_order() -> None:
    outputs = [TensorSpec("label", np.dtype(object), (None,)), TensorSpec("p", F32, (None, None))]
    reader = OutputReader(outputs, {"p"})
    assert not reader.plain

    class Session:
        def __init__(self, maps: list[dict[str, float]]) -> None:
            self.maps = maps

        def run(self, names: list[str], feeds: dict[str, np.ndarray], options: Any = None) -> list[Any]:
            return [np.array(["b"] * len(self.maps), dtype=object), self.maps]

    _, dense = reader.run(Session([{"b": 0.25, "a": 0.75}, {"b": 1.0, "a": 0.0}]), ["label", "p"], {})
    assert reader.labels == {"p": ("b", "a")}
    assert dense.dtype == F32
    assert dense.tolist() == [[0.25, 0.75], [1.0, 0.0]]
    with pytest.raises(ValueError, match="lists labels"):
        reader.run(Session([{"a": 1.0, "b": 0.0}]), ["label", "p"], {})
    with pytest.raises(ModelError, match="bfloat16"):
        OutputReader([*outputs, TensorSpec("h", BF16, (None,))], {"p"})


# ------------------------------------------------------------------------------------------------ runner
class StaticSession:
    """A graph fixed at ``size`` rows: ``y = 2 x`` per row, plus ``total`` (sum of its run) and ``table``
    (a constant), neither with a batch axis. Records each run's rows."""

    def __init__(self, size: int | None) -> None:
        self.size = size
        self.calls: list[int] = []

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = input_feed["x"]
        if self.size is not None and x.shape[0] != self.size:
            raise RuntimeError(f"INVALID_ARGUMENT: Got {x.shape[0]} Expected {self.size}")
        self.calls.append(x.shape[0])
        return [2 * x, np.array(x.sum(), np.float32), np.array([7, 9], np.int64)]


def static_signature(size: int | None) -> ModelSignature:
    return ModelSignature(
        name="s",
        version="1",
        inputs=(TensorSpec("x", F32, (size, 2)),),
        outputs=(
            TensorSpec("y", F32, (size, 2)),
            TensorSpec("total", F32, ()),
            TensorSpec("table", np.dtype(np.int64), (2,)),
        ),
        static_batch=size,
    )


def probed(size: int | None) -> tuple[OnnxRunner, StaticSession]:
    session = StaticSession(size)
    runner = OnnxRunner(session, static_signature(size))
    runner.probe()
    session.calls.clear()
    return runner, session


def test_probe_finds_outputs_without_a_batch_axis_and_input_dependence() -> None:
    runner, _ = probed(None)
    signature = runner.signature
    assert [o.batched for o in signature.outputs] == [True, False, False]
    assert signature.whole_outputs == {"total", "table"}
    assert signature.solo  # `total` depends on the inputs: a batch of several requests would mix them
    assert batch_axis(signature) == "per-request"


def test_a_static_batch_runs_n_rows_at_a_time_and_cuts_the_padding() -> None:
    runner, session = probed(4)
    assert runner.signature.outputs[0].batched
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    out = runner.run({"x": x}, rows=7)
    assert session.calls == [4, 4]  # 4 rows, then 3 rows and one of padding
    assert out["y"].tolist() == (2 * x).tolist()
    assert out["table"].tolist() == [7, 9]
    assert batch_axis(runner.signature) == "static:4"
    assert warmup_plan(runner, 64) == ([4], [1])


def test_a_static_batch_of_one_row_runs_row_by_row() -> None:
    runner, session = probed(1)
    out = runner.run({"x": np.ones((3, 2), F32)}, rows=3)
    assert session.calls == [1, 1, 1]
    assert out["y"].shape == (3, 2)


def test_a_model_that_fails_on_zeros_cannot_be_served() -> None:
    class Broken:
        def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION")

    with pytest.raises(ModelError, match=r"fails on its probe input at 1 row.*--warmup-request"):
        OnnxRunner(Broken(), static_signature(None)).probe()


def test_an_output_the_encoder_cannot_carry_fails_the_probe() -> None:
    class Objects:
        def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            rows = input_feed["x"].shape[0]
            return [np.array([{1}] * rows, dtype=object)]

    signature = ModelSignature(
        "o", "1", (TensorSpec("x", F32, (None, 2)),), (TensorSpec("y", np.dtype(object), (None,)),)
    )
    OnnxRunner(Objects(), signature).probe()  # no answer encoder given: not checked
    with pytest.raises(ModelError, match=r"output 'y' .* cannot be encoded .*add a Cast node"):
        OnnxRunner(Objects(), signature).probe(encoders=(check_output,))


def test_split_gives_whole_outputs_to_every_request() -> None:
    outputs = {"y": np.arange(6).reshape(3, 2), "table": np.array([7, 9])}
    first, second = split(outputs, [1, 2], whole={"table"})
    assert first["y"].tolist() == [[0, 1]]
    assert second["y"].tolist() == [[2, 3], [4, 5]]
    assert first["table"].tolist() == second["table"].tolist() == [7, 9]


# ------------------------------------------------------------------------------------------------ BYTES inputs
STRINGS = ModelSignature(
    name="strings",
    version="1",
    inputs=(TensorSpec("petal", np.dtype(object), (None, 1)),),
    outputs=(TensorSpec("label", np.dtype(object), (None,)),),
)


def strings_request(data: Any, shape: list[int], datatype: str = "BYTES") -> bytes:
    return orjson.dumps({"inputs": [{"name": "petal", "shape": shape, "datatype": datatype, "data": data}]})


def test_bytes_inputs_decode_as_strings() -> None:
    request = decode_request(strings_request([["short"], ["long"]], [2, 1]), STRINGS, LIMITS)
    arr = request.inputs["petal"]
    assert arr.dtype == np.dtype(object)
    assert arr.tolist() == [["short"], ["long"]]
    flat = decode_request(strings_request(["short", "long"], [2, 1]), STRINGS, LIMITS)
    assert flat.inputs["petal"].tolist() == [["short"], ["long"]]


def test_bytes_inputs_in_the_binary_extension() -> None:
    blob = b"".join(len(t).to_bytes(4, "little") + t for t in (b"short", "\u00e9".encode()))
    head = orjson.dumps(
        {
            "inputs": [
                {"name": "petal", "shape": [2, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
            ]
        }
    )
    request = decode_request(head + blob, STRINGS, LIMITS, json_length=len(head))
    assert request.inputs["petal"].tolist() == [["short"], ["\u00e9"]]


@pytest.mark.parametrize(
    ("data", "shape", "datatype", "reason"),
    [
        ([["a"], [None]], [2, 1], "BYTES", R.NULL_VALUE),
        ([["a"], [1]], [2, 1], "BYTES", R.DATATYPE_MISMATCH),
        ([["a"], ["b", "c"]], [2, 1], "BYTES", R.RAGGED),
        (["a", "b", "c"], [2, 1], "BYTES", R.SHAPE_MISMATCH),
        ([[1.0], [2.0]], [2, 1], "FP32", R.DATATYPE_MISMATCH),
    ],
)
def test_bad_bytes_inputs_get_their_reason(data: Any, shape: list[int], datatype: str, reason: R) -> None:
    with pytest.raises(RecordError) as info:
        decode_request(strings_request(data, shape, datatype), STRINGS, LIMITS)
    assert info.value.reason == reason


def test_a_chunk_of_bytes_requests_decodes_as_record_by_record() -> None:
    values: list[bytes | None] = [
        strings_request([["short"]], [1, 1]),
        strings_request([["a"], [None]], [2, 1]),
        strings_request([["long"], ["medium"]], [2, 1]),
    ]
    got = decode_chunk(values, [[] for _ in values], STRINGS, LIMITS)
    assert isinstance(got[0], DecodedRequest)
    assert got[0].inputs["petal"].tolist() == [["short"]]
    assert isinstance(got[1], RecordError)
    assert got[1].reason == R.NULL_VALUE
    assert isinstance(got[2], DecodedRequest)
    assert got[2].inputs["petal"].tolist() == [["long"], ["medium"]]


def test_a_static_batch_input_takes_any_number_of_rows() -> None:
    signature = ModelSignature("s", "1", (TensorSpec("x", F32, (1, 2)),), (), static_batch=1)
    value = orjson.dumps({"inputs": [{"name": "x", "shape": [3, 2], "datatype": "FP32", "data": [0.0] * 6}]})
    assert decode_request(value, signature, LIMITS).rows == 3
    wrong = orjson.dumps({"inputs": [{"name": "x", "shape": [3, 5], "datatype": "FP32", "data": [0.0] * 15}]})
    with pytest.raises(RecordError, match="dimension 1 is 5, model expects 2"):
        decode_request(wrong, signature, LIMITS)


# ------------------------------------------------------------------------------------------------ probe
class RowwiseSession:
    """``y = f(x)`` of a ``[batch, 2]`` input: per row (``x * 2``), or across rows (``x - x.mean(0)``)."""

    def __init__(self, across_rows: bool) -> None:
        self.across_rows = across_rows
        self.feeds: list[np.ndarray] = []

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = input_feed["x"]
        self.feeds.append(x)
        return [x - x.mean(axis=0) if self.across_rows else x * 2]


def rowwise_signature() -> ModelSignature:
    return ModelSignature("r", "1", (TensorSpec("x", F32, (None, 2)),), (TensorSpec("y", F32, (None, 2)),))


@pytest.mark.parametrize("across_rows", [False, True])
def test_rows_that_change_each_other_make_every_request_run_alone(across_rows: bool) -> None:
    runner = OnnxRunner(RowwiseSession(across_rows), rowwise_signature())
    runner.probe()
    assert runner.signature.solo == across_rows


def test_the_probe_runs_on_the_warmup_request_rows() -> None:
    session = RowwiseSession(False)
    runner = OnnxRunner(session, rowwise_signature())
    sample = {"x": np.array([[3.0, 4.0]], F32)}
    runner.probe(sample)
    assert session.feeds[0].tolist() == [[3.0, 4.0]]
    assert session.feeds[1].tolist() == [[3.0, 4.0], [3.0, 4.0]]  # its rows repeated to 2
    runner.warmup([3], runs=1)
    assert session.feeds[-1].shape == (3, 2)
    assert (session.feeds[-1] == 3.0).any()


class PoolingSession:
    """A sequence model: the mean of its token ids over the positions its mask keeps (``masked``), or over all."""

    def __init__(self, masked: bool) -> None:
        self.masked = masked

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        ids = input_feed["input_ids"].astype(np.float32)
        mask = input_feed["attention_mask"].astype(np.float32) if self.masked else np.ones_like(ids)
        return [(ids * mask).sum(axis=1, keepdims=True) / mask.sum(axis=1, keepdims=True)]


@pytest.mark.parametrize("masked", [True, False])
def test_a_sequence_model_that_padding_changes_is_batched_by_exact_length(masked: bool) -> None:
    from prometheus_client import CollectorRegistry

    from consumer.inference import BatchRunner
    from consumer.model.sequence import detect
    from consumer.ops.metrics import Metrics

    i64 = np.dtype(np.int64)
    plain = ModelSignature(
        "p",
        "1",
        (TensorSpec("input_ids", i64, (None, None)), TensorSpec("attention_mask", i64, (None, None))),
        (TensorSpec("pooled", F32, (None, 1)),),
    )
    signature = ModelSignature(plain.name, plain.version, plain.inputs, plain.outputs, detect(plain, {}))
    runner = OnnxRunner(PoolingSession(masked), signature)
    runner.probe()
    assert runner.signature.sequence is not None
    assert runner.signature.sequence.padding_safe == masked
    batches = BatchRunner(runner, Metrics(CollectorRegistry()), clock=lambda: 0.0)
    request = DecodedRequest(None, {"input_ids": np.ones((1, 5), np.int64)}, rows=1, outputs=None, length=5)
    assert batches.lane(request) == ((8, 8) if masked else (5, 5))  # the 8-token bucket, or its own 5 tokens


def test_only_graph_constants_without_a_batch_axis_keep_batching(tmp_path: Any) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from consumer.model.probe import graph_constants

    table = numpy_helper.from_array(np.array([1, 2], np.int64), "table_value")
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["table_value"], ["table"]),
            helper.make_node("Constant", [], ["answer"], value=numpy_helper.from_array(np.array(42, np.int64))),
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [
            helper.make_tensor_value_info("table", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("answer", TensorProto.INT64, []),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
        [table],
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert graph_constants(path) == {"table", "answer"}


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        ("Unsupported model IR version: 14, max supported IR version: 13", "ir_version=10"),
        ("Opset 28 is under development and support for this is limited", "released opset"),
        ("Type 'tensor(double)' of input parameter (probabilities) of operator (ZipMap)", "'zipmap': False"),
        ("Failed to construct locale with name:en_US.UTF-8", "'locale': 'C'"),
        ("ai.onnx.contrib:StringLower(-1) is not a registered function/op", "custom operators"),
    ],
)
def test_load_errors_converters_cause_get_their_fix(error: str, fix: str) -> None:
    from consumer.model.compat import load_fix

    assert fix in (load_fix(error) or "")
    assert load_fix("something else entirely") is None


def test_a_warmup_request_the_model_fails_on_is_named_as_such() -> None:
    class Broken:
        def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            raise RuntimeError("[ONNXRuntimeError] : 6 : Unknown Category")

    runner = OnnxRunner(Broken(), static_signature(None))
    with pytest.raises(ModelError, match=r"fails on the warmup_request rows at 1 row.*check the request") as info:
        runner.probe(sample={"x": np.ones((1, 2), F32)})
    assert "--warmup-request" not in str(info.value)
