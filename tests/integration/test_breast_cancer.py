"""The tabular example of issue 26 (models/breast_cancer/build.py): both ONNX exports answer as scikit-learn does on
the held-out rows, the model takes one ``[batch, 1]`` input per event field of the same name, and events.jsonl holds
one event per held-out row, valid against the committed events.avsc, whose expectations are the model's answers to
the event's own values. No broker: a model test, kept out of tests/unit because it runs ONNX Runtime."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from fastavro import parse_schema
from fastavro.validation import validate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "models" / "breast_cancer" / "build.py"
#: Float32 trees against scikit-learn's float64 sums: probabilities agree to this (absolute).
TOLERANCE = 1e-5


def build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("breast_cancer_build", BUILD)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def events(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def test_both_exports_predict_what_scikit_learn_predicts_on_the_held_out_rows(breast_cancer_model: Path) -> None:
    build = build_module()
    x_train, x_test, y_train, y_test, _, rows_test = build.split(seed=0)
    heldout = np.load(breast_cancer_model / "heldout.npz")
    np.testing.assert_array_equal(heldout["rows"], rows_test)  # the same split as the artifacts
    pipe = build.train(x_train, y_train, seed=0)  # deterministic: the classifier the build exported
    names = build.feature_names()
    label, proba = session(breast_cancer_model / "breast_cancer.onnx").run(
        ["label", "probabilities"], {name: x_test[:, i : i + 1].astype(np.float32) for i, name in enumerate(names)}
    )
    np.testing.assert_array_equal(label, pipe.predict(x_test))
    np.testing.assert_allclose(proba, pipe.predict_proba(x_test), rtol=0, atol=TOLERANCE)
    label_v, proba_v = session(breast_cancer_model / "breast_cancer_features.onnx").run(
        ["label", "probabilities"], {"features": x_test.astype(np.float32)}
    )
    np.testing.assert_array_equal(label_v, label)
    np.testing.assert_allclose(proba_v, proba, rtol=0, atol=TOLERANCE)
    metrics = json.loads((breast_cancer_model / "metrics.json").read_text())
    assert metrics["heldout_accuracy"] == pytest.approx(float(np.mean(label == y_test)), abs=1e-6)
    assert metrics["heldout_accuracy"] > 0.9  # a real classifier, not a constant one (0.63 says "benign" always)


def test_every_model_input_is_a_float_column_named_after_an_event_field(breast_cancer_model: Path) -> None:
    inputs = session(breast_cancer_model / "breast_cancer.onnx").get_inputs()
    fields = json.loads((breast_cancer_model / "features.json").read_text())
    assert [i.name for i in inputs] == fields["fields"]
    assert len(inputs) == 30
    assert {(i.type, tuple(i.shape)) for i in inputs} == {("tensor(float)", ("batch", 1))}
    outputs = {
        o.name: (o.type, tuple(o.shape)) for o in session(breast_cancer_model / "breast_cancer.onnx").get_outputs()
    }
    assert outputs == {"label": ("tensor(int64)", ("batch",)), "probabilities": ("tensor(float)", ("batch", 2))}
    (vector,) = session(breast_cancer_model / "breast_cancer_features.onnx").get_inputs()
    assert (vector.name, vector.type, tuple(vector.shape)) == ("features", "tensor(float)", ("batch", 30))
    first = events(breast_cancer_model)[0]
    assert all(isinstance(first[i.name], float) for i in inputs)
    assert {"patient_id", "clinic", "recorded_at"} <= set(first)  # fields the model does not use


def test_the_events_are_valid_avro_and_carry_the_models_answers(breast_cancer_model: Path) -> None:
    schema = parse_schema(json.loads((ROOT / "models" / "breast_cancer" / "events.avsc").read_text()))
    rows = events(breast_cancer_model)
    heldout = np.load(breast_cancer_model / "heldout.npz")
    assert len(rows) == len(heldout["y"])
    assert len({e["patient_id"] for e in rows}) == len(rows)
    inputs = [i.name for i in session(breast_cancer_model / "breast_cancer.onnx").get_inputs()]
    feeds = {name: np.array([[e[name]] for e in rows], dtype=np.float32) for name in inputs}
    label, proba = session(breast_cancer_model / "breast_cancer.onnx").run(["label", "probabilities"], feeds)
    for i, body in enumerate(rows):
        expected = {k: body.pop(k) for k in ("true_label", "expected_label", "expected_probability")}
        assert validate(body, schema, raise_errors=True)
        assert expected["true_label"] == int(heldout["y"][i])  # the truth, not the model's answer
        assert expected["expected_label"] == int(label[i])
        assert expected["expected_probability"] == pytest.approx(float(proba[i, 1]), abs=1e-7)
        assert body["recorded_at"].startswith("2026-")
