"""Batch failure isolation against a real broker: a failing batch is bisected, only culprits are dead-lettered."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from consumer.oip.client import encode_request
from producer_tools.produce import Outgoing, digits_requests, send_all
from tests.integration.conftest import AppFactory, answers

pytestmark = pytest.mark.integration


def batch_one_model(path: Path) -> Path:
    """Declares input [batch, 64] with a dynamic batch axis, but reshapes to [1, 64]: only batch 1 runs."""
    w = numpy_helper.from_array(np.random.default_rng(0).random((64, 10), dtype=np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 64], dtype=np.int64), "one_row")
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["input", "one_row"], ["row"]),
            helper.make_node("MatMul", ["row", "w"], ["probabilities"]),
            helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
        ],
        "batch_one",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10]),
        ],
        [w, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def nan_on_marker_model(path: Path) -> Path:
    """probabilities = sqrt(input[:, :10]): NaN exactly where a row has a negative value there (pixels are >= 0)."""
    starts = numpy_helper.from_array(np.array([0], dtype=np.int64), "starts")
    ends = numpy_helper.from_array(np.array([10], dtype=np.int64), "ends")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["input", "starts", "ends", "axes"], ["head"]),
            helper.make_node("Sqrt", ["head"], ["probabilities"]),
            helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
        ],
        "nan_marker",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10]),
        ],
        [starts, ends, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


async def test_model_that_only_runs_at_batch_one_is_rescued(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path, tmp_path: Path
) -> None:
    model = batch_one_model(tmp_path / "batch_one.onnx")
    app = await start_app(model_path=model, max_batch_size=8, max_batch_delay_ms=50)
    records = list(digits_requests(uuid.uuid4().hex[:6], digits_model / "heldout.npz", limit=40))
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.results == 40  # every record answered, none dead-lettered
    assert app.metrics.registry.get_sample_value("streaminfer_batch_failures_total") > 0  # batches did fail


async def test_non_finite_output_dead_letters_only_that_record(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path, tmp_path: Path
) -> None:
    model = nan_on_marker_model(tmp_path / "nan.onnx")
    await start_app(model_path=model, max_batch_size=16, max_batch_delay_ms=50)
    run = uuid.uuid4().hex[:6]
    good = list(digits_requests(run, digits_model / "heldout.npz", limit=30))
    row = np.ones((1, 64), np.float32)
    row[0, :10] = -1.0  # sqrt(-1) -> NaN
    bad = Outgoing(f"{run}-nan", encode_request(None, {"input": row}), expected_reason="non_finite_output")
    records = [*good[:15], bad, *good[15:]]
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.dead_letters == 1
    assert report.answers[bad.correlation_id].reason == "non_finite_output"
    assert report.results == 30
