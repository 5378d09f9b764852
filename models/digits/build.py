"""Build the digits classifier served by the demo and the integration tests.

Trains a multinomial logistic regression on scikit-learn's bundled digits set (1797 8x8 grey-level images,
pixel values 0..16; UCI "Optical Recognition of Handwritten Digits", shipped inside scikit-learn, so nothing is
downloaded), holds out a stratified 20 % split with a fixed seed and exports ONNX with a dynamic batch axis:

- input  ``input``          float32 ``[batch, 64]`` (the 8x8 image flattened row-major, values 0..16)
- output ``label``          int64   ``[batch]``
- output ``probabilities``  float32 ``[batch, 10]`` (a plain tensor: ZipMap is disabled)

Outputs, all in ``--out`` (default ``models/digits/artifacts/``, ignored by git):

- ``digits.onnx``    the model (producer_name/version and doc_string set; ``model_version`` metadata = 1)
- ``heldout.npz``    ``x`` float32 ``[n, 64]`` and ``y`` int64 ``[n]``: the held-out split for the demo
- ``requests.jsonl`` one OIP JSON request per held-out row (``id`` ``heldout-<i>``, input ``input`` FP32 ``[1, 64]``),
  its true class in ``parameters.label`` (the consumer ignores it): the comparison set of the model's validation
  record (``make model``: ``streaminfer-model set --jsonl ... --label-field parameters.label``)
- ``metrics.json``   ``{"heldout_accuracy": ..., "heldout_rows": ..., "train_rows": ...}``

Deterministic: the same package versions give byte-identical files. Runs in a few seconds.
Usage: ``python models/digits/build.py [--out DIR] [--seed 0] [--c 1.0] [--model-version 1] [--shuffle-labels]``
(``--c`` and ``--model-version``: a retrained candidate, e.g. ``--c 0.5 --model-version 2``, the one
docs/rollout.md gates, shadows and rolls out.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

DEFAULT_OUT = Path(__file__).resolve().parent / "artifacts"
INPUT_NAME = "input"
N_FEATURES = 64  # 8x8 pixels


def build(
    out: Path,
    seed: int = 0,
    heldout_fraction: float = 0.2,
    shuffle_labels: bool = False,
    c: float = 1.0,
    model_version: int = 1,
) -> dict[str, float | int]:
    """Train, export and write the artifacts; returns the metrics written to ``metrics.json``.

    ``c`` is the logistic regression's inverse regularisation strength (scikit-learn's ``C``, default 1.0);
    ``model_version`` goes into the file's ``model_version`` field and metadata (what every answer carries).

    ``shuffle_labels`` trains on the training labels permuted (seeded): a deliberately broken model of the same
    interface, the candidate the gate's test must fail (``streaminfer-model gate``).
    """
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=heldout_fraction, random_state=seed, stratify=y)
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=seed))
    if shuffle_labels:
        y_train = np.random.default_rng(seed).permutation(y_train)
    clf.fit(x_train, y_train)
    accuracy = float(clf.score(x_test, y_test))

    onx = to_onnx(
        clf,
        initial_types=[(INPUT_NAME, FloatTensorType([None, N_FEATURES]))],
        options={id(clf.steps[-1][1]): {"zipmap": False}},
        target_opset=17,
        final_types=None,
    )
    # skl2onnx names outputs output_label / output_probability; rename them to the documented contract.
    renames = {"output_label": "label", "output_probability": "probabilities"}
    for node in onx.graph.node:
        node.output[:] = [renames.get(name, name) for name in node.output]
    for output in onx.graph.output:
        output.name = renames.get(output.name, output.name)
    onx.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    for output in onx.graph.output:
        output.type.tensor_type.shape.dim[0].dim_param = "batch"
    # skl2onnx lists the default domain twice (one entry per converter that asked for it); ONNX Runtime's quantiser
    # then refuses the file ("Failed to find proper ai.onnx domain"). One entry per domain, the highest version.
    opsets: dict[str, int] = {}
    for entry in onx.opset_import:
        opsets[entry.domain] = max(opsets.get(entry.domain, 0), entry.version)
    del onx.opset_import[:]
    onx.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items())
    onx.producer_name = "streaminfer-models-digits"
    onx.model_version = model_version
    onx.doc_string = "Logistic regression on scikit-learn digits (8x8, 0..16), input [batch,64] float32."
    onnx.helper.set_model_props(onx, {"model_version": str(model_version), "model_name": "digits"})
    onnx.checker.check_model(onx)

    out.mkdir(parents=True, exist_ok=True)
    (out / "digits.onnx").write_bytes(onx.SerializeToString())
    np.savez(out / "heldout.npz", x=x_test, y=y_test)
    with (out / "requests.jsonl").open("w") as fh:
        for i, (row, label) in enumerate(zip(x_test, y_test, strict=True)):
            request = {
                "id": f"heldout-{i}",
                "inputs": [{"name": INPUT_NAME, "shape": [1, N_FEATURES], "datatype": "FP32", "data": row.tolist()}],
                "parameters": {"label": int(label)},
            }
            fh.write(json.dumps(request) + "\n")
    metrics: dict[str, float | int] = {
        "heldout_accuracy": round(accuracy, 6),
        "heldout_rows": len(y_test),
        "train_rows": len(y_train),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="split and solver seed")
    parser.add_argument("--c", type=float, default=1.0, help="inverse regularisation strength (scikit-learn's C)")
    parser.add_argument("--model-version", type=int, default=1, help="the model_version the answers carry")
    parser.add_argument(
        "--shuffle-labels", action="store_true", help="train on permuted labels: a broken model, for the gate's test"
    )
    args = parser.parse_args()
    metrics = build(
        args.out, seed=args.seed, shuffle_labels=args.shuffle_labels, c=args.c, model_version=args.model_version
    )
    print(f"digits: wrote {args.out / 'digits.onnx'} heldout_accuracy={metrics['heldout_accuracy']}")


if __name__ == "__main__":
    main()
