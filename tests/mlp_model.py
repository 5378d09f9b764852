"""A digits classifier of standard ONNX operators (MatMul, Add, Relu, Softmax: a small MLP, exported by skl2onnx),
the model the FP16 and INT8 converters apply to; digits' own export (Scaler, LinearClassifier, Normalizer of
ai.onnx.ml) they do not. Same interface as digits.onnx: input ``input`` float32 ``[batch, 64]`` (pixels 0..16),
outputs ``label`` int64 ``[batch]`` and ``probabilities`` float32 ``[batch, 10]``. Deterministic, about a second."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np


def build(out: Path, heldout: Path) -> Path:
    """Train on scikit-learn's digits minus the rows of ``heldout`` (digits' ``heldout.npz``), write ``out``."""
    import onnx
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    digits = load_digits()
    held = np.load(heldout)["x"]
    x, y = digits.data.astype(np.float32), digits.target.astype(np.int64)
    keep = ~(x[:, None, :] == held[None, :, :]).all(axis=2).any(axis=1)
    mlp = MLPClassifier(hidden_layer_sizes=(64,), max_iter=200, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(x[keep], y[keep])  # raw pixels 0..16: weights of a range int8 keeps
    onx = to_onnx(
        mlp,
        initial_types=[("input", FloatTensorType([None, 64]))],
        options={id(mlp): {"zipmap": False}},
        target_opset=17,
    )
    renames = {"output_label": "label", "output_probability": "probabilities"}
    for node in onx.graph.node:
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in [*onx.graph.input, *onx.graph.output]:
        value.name = renames.get(value.name, value.name)
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.helper.set_model_props(onx, {"model_version": "1", "model_name": "digits_mlp"})
    out.write_bytes(onx.SerializeToString())
    return out
