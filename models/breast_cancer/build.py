"""Build the tabular model and the domain events of the "score an existing topic" example (issue 26).

Trains scikit-learn's gradient-boosted trees (``GradientBoostingClassifier``) on scikit-learn's bundled breast-cancer
set (569 fine-needle aspirates, 30 named numeric features; the Wisconsin Diagnostic Breast Cancer set, shipped inside
scikit-learn, so nothing is downloaded; class 0 malignant, 1 benign), holds out a stratified 20 % split with a fixed
seed, and exports the same fitted classifier twice with skl2onnx (ZipMap off, dynamic batch axis ``batch``):

- ``breast_cancer.onnx``: one input per feature, named after it in snake_case (``mean_radius``, ...,
  ``worst_fractal_dimension``), each float32 ``[batch, 1]``, so that an event's field of the same name feeds it
  (a ``ColumnTransformer`` passthrough in front of the classifier: skl2onnx concatenates the columns in the graph);
- ``breast_cancer_features.onnx``: one input ``features`` float32 ``[batch, 30]``, the features in the order of
  ``features.json``: the model a mapping file (a list of fields per input) is for;

both with outputs ``label`` int64 ``[batch]`` and ``probabilities`` float32 ``[batch, 2]``.

Outputs, all in ``--out`` (default ``models/breast_cancer/artifacts/``, ignored by git):

- ``breast_cancer.onnx``, ``breast_cancer_features.onnx``: the models (``model_version`` metadata = 1)
- ``features.json``: ``{"input": "features", "fields": [the 30 feature names in column order]}``
- ``heldout.npz``: ``x`` float64 ``[n, 30]``, ``y`` int64 ``[n]``, ``rows`` int64 ``[n]`` (row index in the set)
- ``events.jsonl``: one JSON event per held-out row, the fields of ``events.avsc`` (``patient_id``, the 30
  features as numbers, ``clinic`` ``{"region": ...}`` and ``recorded_at``, which the model does not use) plus, for
  checking, ``true_label`` (the held-out truth: 0 malignant, 1 benign), ``expected_label`` (the exported model's
  label) and ``expected_probability`` (its probability of class 1, benign), these two computed with ONNX Runtime on
  ``breast_cancer.onnx`` from the event's own values cast to float32
- ``metrics.json``: ``{"heldout_accuracy": ..., "onnx_heldout_accuracy": ..., "heldout_rows": ..., "train_rows": ...}``

The committed ``events.avsc`` (record ``example.clinic.BreastCancerEvent``) is checked against the data set: it must
name exactly the 30 features, as doubles. Deterministic: the same package versions give byte-identical files. Runs
in a few seconds. Usage: ``python models/breast_cancer/build.py [--out DIR] [--seed 0] [--n-estimators 100]
[--model-version 1]`` (the last two: a retrained candidate, docs/rollout.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.model_selection import train_test_split
from sklearn.pipeline import Pipeline

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "artifacts"
SCHEMA = HERE / "events.avsc"
FEATURES_INPUT = "features"
#: The clinics events come from (``clinic.region``), assigned by row index: a nested field no model input uses.
REGIONS = ("north", "south", "east", "west")
#: ``recorded_at`` of row i: this instant plus i x 17 minutes (UTC).
FIRST_RECORDED = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.UTC)


def feature_names() -> list[str]:
    """The data set's 30 feature names in column order, in snake_case (``mean radius`` -> ``mean_radius``)."""
    return [str(name).replace(" ", "_") for name in load_breast_cancer().feature_names]


def split(seed: int = 0, heldout_fraction: float = 0.2) -> tuple[np.ndarray, ...]:
    """(x_train, x_test, y_train, y_test, rows_train, rows_test): the stratified split, x float64."""
    data = load_breast_cancer()
    x, y = data.data.astype(np.float64), data.target.astype(np.int64)
    rows = np.arange(len(y), dtype=np.int64)
    return tuple(train_test_split(x, y, rows, test_size=heldout_fraction, random_state=seed, stratify=y))


def train(x_train: np.ndarray, y_train: np.ndarray, seed: int = 0, n_estimators: int = 100) -> Pipeline:
    """The fitted pipeline: every column passed through, then the gradient-boosted classifier (``n_estimators``
    boosting stages, scikit-learn's default 100)."""
    pipe = Pipeline(
        [
            ("columns", ColumnTransformer([("all", "passthrough", list(range(x_train.shape[1])))])),
            ("gbc", GradientBoostingClassifier(n_estimators=n_estimators, random_state=seed)),
        ]
    )
    return pipe.fit(x_train, y_train)


def export(model: Any, inputs: list[tuple[str, FloatTensorType]], doc: str, model_version: int = 1) -> onnx.ModelProto:
    """``model`` in ONNX (opset 17): ZipMap off, outputs ``label`` and ``probabilities``, batch axis ``batch``,
    ``model_version`` in the file's field and metadata (what every answer carries)."""
    classifier = model.steps[-1][1] if isinstance(model, Pipeline) else model
    onx = to_onnx(model, initial_types=inputs, options={id(classifier): {"zipmap": False}}, target_opset=17)
    renames = {"output_label": "label", "output_probability": "probabilities"}  # older skl2onnx names
    for node in onx.graph.node:
        node.output[:] = [renames.get(name, name) for name in node.output]
    for value in [*onx.graph.input, *onx.graph.output]:
        value.name = renames.get(value.name, value.name)
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    if sorted(o.name for o in onx.graph.output) != ["label", "probabilities"]:
        raise RuntimeError(f"unexpected outputs {[o.name for o in onx.graph.output]}")
    onx.producer_name = "streaminfer-models-breast-cancer"
    onx.model_version = model_version
    onx.doc_string = doc
    onnx.helper.set_model_props(onx, {"model_version": str(model_version), "model_name": "breast_cancer"})
    onnx.checker.check_model(onx)
    return onx


def check_schema(names: list[str], schema_path: Path = SCHEMA) -> None:
    """``events.avsc`` lists exactly ``names`` as doubles.

    Raises:
        RuntimeError: it does not (the difference named).
    """
    schema = json.loads(schema_path.read_text())
    doubles = [f["name"] for f in schema["fields"] if f["type"] == "double"]
    if doubles != names:
        raise RuntimeError(f"{schema_path}: its double fields {doubles} are not the data set's features {names}")


def run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(label, probabilities) of an exported model."""
    label, proba = session.run(["label", "probabilities"], feeds)
    return np.asarray(label), np.asarray(proba)


def per_feature(x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """The feeds of ``breast_cancer.onnx``: column i as float32 ``[n, 1]`` under feature name i."""
    x32 = x.astype(np.float32)
    return {name: x32[:, i : i + 1] for i, name in enumerate(names)}


def event(row: int, values: np.ndarray, names: list[str]) -> dict[str, Any]:
    """The domain event of data set row ``row`` (no expectations yet)."""
    body: dict[str, Any] = {"patient_id": f"bc-{row:04d}"}
    body.update({name: float(v) for name, v in zip(names, values, strict=True)})
    body["clinic"] = {"region": REGIONS[row % len(REGIONS)]}
    body["recorded_at"] = (FIRST_RECORDED + dt.timedelta(minutes=17 * row)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return body


def build(out: Path, seed: int = 0, n_estimators: int = 100, model_version: int = 1) -> dict[str, float | int]:
    """Train, export, check and write the artifacts; returns the metrics written to ``metrics.json``.
    ``n_estimators`` and ``model_version``: a retrained candidate (docs/rollout.md: 200 stages, version 2).

    Raises:
        RuntimeError: events.avsc does not match the data set, or the two exports disagree.
    """
    names = feature_names()
    check_schema(names)
    x_train, x_test, y_train, y_test, _, rows_test = split(seed)
    pipe = train(x_train, y_train, seed, n_estimators)
    accuracy = float(pipe.score(x_test, y_test))

    by_feature = export(
        pipe,
        [(name, FloatTensorType([None, 1])) for name in names],
        "Gradient-boosted trees on scikit-learn's breast-cancer set; one float32 [batch,1] input per feature.",
        model_version,
    )
    by_vector = export(
        pipe.named_steps["gbc"],
        [(FEATURES_INPUT, FloatTensorType([None, len(names)]))],
        "Gradient-boosted trees on scikit-learn's breast-cancer set; input 'features' float32 [batch,30].",
        model_version,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "breast_cancer.onnx").write_bytes(by_feature.SerializeToString())
    (out / "breast_cancer_features.onnx").write_bytes(by_vector.SerializeToString())

    events = [event(int(row), values, names) for row, values in zip(rows_test, x_test, strict=True)]
    x_events = np.array([[e[name] for name in names] for e in events], dtype=np.float64)  # from the events' values
    providers = ["CPUExecutionProvider"]
    label, proba = run(
        ort.InferenceSession(str(out / "breast_cancer.onnx"), providers=providers), per_feature(x_events, names)
    )
    label_v, proba_v = run(
        ort.InferenceSession(str(out / "breast_cancer_features.onnx"), providers=providers),
        {FEATURES_INPUT: x_events.astype(np.float32)},
    )
    if not (np.array_equal(label, label_v) and np.allclose(proba, proba_v, rtol=0, atol=1e-6)):
        raise RuntimeError("the two exports disagree on the held-out rows")
    with (out / "events.jsonl").open("w") as fh:
        for body, truth, lab, p in zip(events, y_test, label, proba, strict=True):
            body["true_label"] = int(truth)
            body["expected_label"] = int(lab)
            body["expected_probability"] = float(p[1])
            fh.write(json.dumps(body) + "\n")

    (out / "features.json").write_text(json.dumps({"input": FEATURES_INPUT, "fields": names}, indent=2) + "\n")
    np.savez(out / "heldout.npz", x=x_test, y=y_test, rows=rows_test)
    metrics: dict[str, float | int] = {
        "heldout_accuracy": round(accuracy, 6),
        "onnx_heldout_accuracy": round(float(np.mean(label == y_test)), 6),
        "heldout_rows": len(y_test),
        "train_rows": len(y_train),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="split and training seed")
    parser.add_argument("--n-estimators", type=int, default=100, help="boosting stages (scikit-learn's default)")
    parser.add_argument("--model-version", type=int, default=1, help="the model_version the answers carry")
    args = parser.parse_args()
    metrics = build(args.out, seed=args.seed, n_estimators=args.n_estimators, model_version=args.model_version)
    print(
        f"breast_cancer: wrote {args.out / 'breast_cancer.onnx'} heldout_accuracy={metrics['heldout_accuracy']} "
        f"onnx_heldout_accuracy={metrics['onnx_heldout_accuracy']} events={metrics['heldout_rows']}"
    )


if __name__ == "__main__":
    main()
