"""The model-compatibility suite: models as skl2onnx, onnxmltools and onnx.helper export them (models/zoo/build.py),
each served end to end through the broker and answered with what a direct ``InferenceSession.run`` gives for the
same inputs; the models that cannot be served are refused at start-up (exit 3) with the fix in the message."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER
from consumer.signature import BF16, OIP_TO_NUMPY
from harness.process import consumer_argv
from producer_tools.produce import Outgoing, send_all
from tests.integration.conftest import AppFactory, answers

ROOT = Path(__file__).resolve().parents[2]
#: Every served model of models/zoo/build.py (a model added there and not here fails test_the_suite_is_complete).
SERVED = (
    "logreg_strings",
    "logreg_zipmap",
    "random_forest",
    "scaler_svc",
    "gbr",
    "onehot_strings",
    "onehot_strict",
    "lightgbm",
    "xgboost",
    "external_data",
    "static_1",
    "static_4",
    "kinds",
    "batch_statistics",
    "outlier_indices",
    "unmasked_pooling",
    "image",
)
REFUSED = ("sequence_input", "bfloat16_input", "scalar_input", "mixed_batch_axes", "sequence_output", "missing_weights")
#: Batched and solo runs of the same rows may sum in another order: float outputs agree to this (relative).
TOLERANCE = 1e-5
#: How often the zoo's requests are sent per model: enough records for several micro-batches.
REPEATS = 4


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """(folder, zoo.json) built for this session by models/zoo/build.py."""
    out = tmp_path_factory.mktemp("zoo")
    subprocess.run(
        [sys.executable, str(ROOT / "models" / "zoo" / "build.py"), "--out", str(out)], check=True, timeout=300
    )
    return out, json.loads((out / "zoo.json").read_text())


def test_the_suite_is_complete(zoo: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = zoo
    assert sorted(manifest["served"]) + sorted(manifest["skipped"]) == sorted(SERVED)
    assert sorted(manifest["refused"]) == sorted(REFUSED)


def _arrays(request: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    """A zoo request's inputs as numpy arrays of their declared datatype."""
    return {
        name: np.array(t["data"], dtype=OIP_TO_NUMPY[t["datatype"]]).reshape(t["shape"]) for name, t in request.items()
    }


def _direct(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """What ONNX Runtime itself gives for ``inputs``. Its Python binding returns no bfloat16 arrays, so a bfloat16
    output is taken as the Cast it is in the zoo (float32 -> bfloat16, round to nearest even, as ml_dtypes does).
    A static-batch model (axis 0 fixed at N) takes N rows a run: the rows go N at a time, the last run filled up
    with zero rows, and the outputs of the real rows are joined."""
    names = [o.name for o in session.get_outputs() if o.type != "tensor(bfloat16)"]
    size = session.get_inputs()[0].shape[0]
    rows = len(next(iter(inputs.values())))
    if isinstance(size, int) and size != rows:
        runs = []
        for start in range(0, rows, size):
            part = {k: v[start : start + size] for k, v in inputs.items()}
            part = {k: np.concatenate([v, np.zeros((size - len(v), *v.shape[1:]), v.dtype)]) for k, v in part.items()}
            runs.append(session.run(names, part))
        joined = [np.concatenate([r[i] for r in runs])[:rows] for i in range(len(names))]
        return dict(zip(names, joined, strict=True))
    out: dict[str, Any] = dict(zip(names, session.run(names, inputs), strict=True))
    for o in session.get_outputs():
        if o.type == "tensor(bfloat16)":
            out[o.name] = next(iter(inputs.values())).astype(BF16)
    return out


def _assert_same(name: str, got: np.ndarray, want: Any, classes: list[Any] | None) -> None:
    if isinstance(want, list):  # ZipMap: one {label: probability} per row -> the dense columns, in `classes` order
        assert classes is not None, f"{name}: a ZipMap output must list its classes"
        assert [sorted(row) for row in want] == [sorted(classes)] * len(want)
        want = np.array([[row[c] for c in classes] for row in want], dtype=np.float32)
    want = np.asarray(want)
    assert got.shape == want.shape, name
    if want.dtype.kind == "f" or want.dtype == BF16:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=TOLERANCE, atol=1e-6)
    else:
        assert got.tolist() == want.tolist(), name


@pytest.mark.parametrize("name", SERVED)
async def test_each_model_is_served_as_a_direct_run_answers(
    name: str,
    zoo: tuple[Path, dict[str, Any]],
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
) -> None:
    folder, manifest = zoo
    if name in manifest["skipped"]:
        pytest.skip(f"{name}: {manifest['skipped'][name]}")
    entry = manifest["served"][name]
    path = folder / entry["model"]
    warmup = entry.get("warmup_request")
    app = await start_app(
        model_path=path, max_batch_size=8, max_batch_delay_ms=20, warmup_request=folder / warmup if warmup else None
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    run = uuid.uuid4().hex[:6]
    records: list[Outgoing] = []
    expected: dict[str, dict[str, Any]] = {}
    for repeat in range(REPEATS):
        for k, request in enumerate(entry["requests"]):
            cid = f"{run}-{repeat}-{k}"
            inputs = _arrays(request)
            expected[cid] = _direct(session, inputs)
            if k % 2:  # the binary data extension, both ways
                value, length = encode_request_binary(cid, inputs)
                records.append(Outgoing(cid, value, headers=((BINARY_HEADER, str(length).encode()),)))
            else:
                records.append(Outgoing(cid, encode_request(cid, inputs)))
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.dead_letters == 0
    assert report.results == len(records)
    for cid, want in expected.items():
        answer = report.answers[cid]
        assert answer.body is not None
        assert sorted(answer.body["outputs"]) == sorted(want)
        for output, got in answer.body["outputs"].items():
            classes = answer.body["output_parameters"][output].get("classes")
            _assert_same(output, got, want[output], classes)
    rows = app.metrics.registry.get_sample_value("streaminfer_batch_rows_count")
    assert rows is not None
    assert rows > 0
    signature = app.runner.signature
    if signature.solo or signature.static_batch == 1:  # batching off: every request is a micro-batch of its own
        assert rows == len(records)
    elif signature.static_batch is not None:  # micro-batches of at most N rows, but a request is never split
        at_most_n = app.metrics.registry.get_sample_value("streaminfer_batch_rows_bucket", {"le": "4.0"})
        assert at_most_n is not None
        assert at_most_n >= rows - REPEATS


async def test_a_sequence_model_is_served_as_a_direct_run_answers(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, text_model: tuple[Path, Path]
) -> None:
    model, _ = text_model
    await start_app(model_path=model, max_batch_size=8, max_batch_delay_ms=20)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    run = uuid.uuid4().hex[:6]
    records, expected = [], {}
    for k in range(24):
        ids = rng.integers(5, 30, size=(1 + k % 3, 2 + k % 7), dtype=np.int64)
        cid = f"{run}-{k}"
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        expected[cid] = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
        records.append(Outgoing(cid, encode_request(cid, {"input_ids": ids})))
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.dead_letters == 0
    for cid, want in expected.items():
        body = report.answers[cid].body
        assert body is not None
        for output, got in body["outputs"].items():
            _assert_same(output, got, want[output], None)


@pytest.mark.parametrize("name", REFUSED)
def test_a_model_that_cannot_be_served_is_refused_with_the_fix(name: str, zoo: tuple[Path, dict[str, Any]]) -> None:
    folder, manifest = zoo
    entry = manifest["refused"][name]
    done = subprocess.run(
        consumer_argv({"model_path": folder / entry["model"], "http_port": 0}),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "model cannot be served" in done.stderr
    assert entry["fix"] in done.stderr, done.stderr[-2000:]
