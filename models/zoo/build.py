"""Build the model-compatibility suite: ONNX files shaped the way people export them, from the real converters.

Every model is trained here on a dataset bundled with scikit-learn (iris, digits, breast cancer, diabetes: nothing
is downloaded) and converted with skl2onnx or onnxmltools (LightGBM, XGBoost) at the converter's defaults unless
the entry says otherwise; the graphs that no converter makes on purpose (every output kind ONNX Runtime returns,
an NCHW image input, the refused shapes) are written with ``onnx.helper``.

Served (``zoo.json`` ``served``):

==================  =================================================================================================
logreg_strings      LogisticRegression on iris with string class names, ``zipmap=False``: label ``tensor(string)``
logreg_zipmap       the same at skl2onnx's defaults: ZipMap probabilities ``seq(map(string, tensor(float)))``
random_forest       RandomForestClassifier (integer classes, ZipMap ``seq(map(int64, tensor(float)))``)
scaler_svc          Pipeline(StandardScaler, SVC(probability=True)) on breast cancer, ``zipmap=False``
gbr                 GradientBoostingRegressor on diabetes: ``[N, 1]`` float
onehot_strings      Pipeline(OneHotEncoder, LogisticRegression) on a string feature: a ``tensor(string)`` input
onehot_strict       the same with ``handle_unknown='error'``: zeros fail it, served with a ``warmup_request``
lightgbm            LGBMClassifier through onnxmltools (if lightgbm and onnxmltools are installed)
xgboost             XGBClassifier through onnxmltools (if xgboost and onnxmltools are installed)
external_data       the ``image`` graph saved with its weights in a separate file (ONNX external data)
static_1            LogisticRegression exported with ``initial_types [1, 4]``: no dynamic batch axis
static_4            the same at ``[4, 4]``
kinds               float16, bfloat16, bool, int8, uint16, int32 outputs, a scalar and a table without batch axis
batch_statistics    ``x - mean(x over the batch)``: rows change each other, every request runs alone
outlier_indices     ``NonZero(x > 6)``: an input-dependent output without a batch axis, every request runs alone
unmasked_pooling    a sequence model without ``attention_mask``: padding would change it, batched by exact length
image               NCHW ``[N, 1, 8, 8]`` digits images: Flatten, the digits LogisticRegression's weights; a class table
==================  =================================================================================================

Refused at start-up (``zoo.json`` ``refused``; each with the text its message must hold): external data whose
weights file is missing, a sequence input, a bfloat16 input, a scalar input, inputs that disagree on the batch
axis, a sequence output.

``zoo.json`` lists, per served model, its file and a few requests (each ``{input: {"datatype", "shape",
"data"}}``, 1 and 3 rows); ``skipped`` names a converter that is not installed. Usage:
``python models/zoo/build.py --out DIR``. Runs in well under a minute.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType, StringTensorType
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_iris
from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.svm import SVC

#: The opset and IR version of the helper-made graphs (ONNX Runtime 1.23 and later read them).
OPSET = 17
IR_VERSION = 9
SEED = 0

Request = dict[str, dict[str, Any]]


def _tensor(arr: np.ndarray) -> dict[str, Any]:
    datatype = {"float32": "FP32", "int64": "INT64", "object": "BYTES"}[arr.dtype.name]
    return {"datatype": datatype, "shape": list(arr.shape), "data": arr.reshape(-1).tolist()}


def _requests(name: str, x: np.ndarray, sizes: tuple[int, ...] = (1, 3, 1, 1, 3, 1)) -> list[Request]:
    """Requests of ``sizes`` rows each, consecutive rows of ``x``."""
    out, start = [], 0
    for n in sizes:
        out.append({name: _tensor(x[start : start + n])})
        start += n
    return out


def _save(model: onnx.ModelProto, path: Path) -> str:
    onnx.save_model(model, str(path))
    return path.name


def _iris() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    return x.astype(np.float32), y, names


def _float_input(columns: int, rows: int | None = None) -> list[tuple[str, FloatTensorType]]:
    return [("input", FloatTensorType([rows, columns]))]


def logreg_strings(out: Path) -> dict[str, Any]:
    x, _, names = _iris()
    model = LogisticRegression(max_iter=1000).fit(x, names)
    onx = convert_sklearn(model, initial_types=_float_input(4), options={id(model): {"zipmap": False}})
    return {"model": _save(onx, out / "logreg_strings.onnx"), "requests": _requests("input", x[::7])}


def logreg_zipmap(out: Path) -> dict[str, Any]:
    x, _, names = _iris()
    model = LogisticRegression(max_iter=1000).fit(x, names)
    onx = convert_sklearn(model, initial_types=_float_input(4))
    return {"model": _save(onx, out / "logreg_zipmap.onnx"), "requests": _requests("input", x[::7])}


def random_forest(out: Path) -> dict[str, Any]:
    x, y, _ = _iris()
    model = RandomForestClassifier(n_estimators=20, max_depth=4, random_state=SEED).fit(x, y)
    onx = convert_sklearn(model, initial_types=_float_input(4))
    return {"model": _save(onx, out / "random_forest.onnx"), "requests": _requests("input", x[::5])}


def scaler_svc(out: Path) -> dict[str, Any]:
    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    model = make_pipeline(StandardScaler(), SVC(probability=True, random_state=SEED)).fit(x, y)
    onx = convert_sklearn(model, initial_types=_float_input(30), options={"zipmap": False})
    return {"model": _save(onx, out / "scaler_svc.onnx"), "requests": _requests("input", x[::41])}


def gbr(out: Path) -> dict[str, Any]:
    x, y = load_diabetes(return_X_y=True)
    x = x.astype(np.float32)
    model = GradientBoostingRegressor(n_estimators=30, random_state=SEED).fit(x, y)
    onx = convert_sklearn(model, initial_types=_float_input(10))
    return {"model": _save(onx, out / "gbr.onnx"), "requests": _requests("input", x[::31])}


def _onehot(handle_unknown: str) -> tuple[onnx.ModelProto, np.ndarray]:
    """Pipeline(OneHotEncoder(handle_unknown), LogisticRegression) on iris' petal length as a string category
    (short / medium / long), converted with ``zipmap=False``; and its string rows ``[150, 1]``."""
    x, _, names = _iris()
    petal = np.array(["short", "medium", "long"], dtype=object)[np.digitize(x[:, 2], [2.5, 5.0])].reshape(-1, 1)
    encoder = OneHotEncoder(handle_unknown=handle_unknown)
    model = make_pipeline(encoder, LogisticRegression(max_iter=1000)).fit(petal, names)
    onx = convert_sklearn(
        model,
        initial_types=[("petal", StringTensorType([None, 1]))],
        options={id(model.steps[-1][1]): {"zipmap": False}},
    )
    return onx, petal


def onehot_strings(out: Path) -> dict[str, Any]:
    onx, petal = _onehot("ignore")
    return {"model": _save(onx, out / "onehot_strings.onnx"), "requests": _requests("petal", petal[::9])}


def onehot_strict(out: Path) -> dict[str, Any]:
    """Pipeline(OneHotEncoder(handle_unknown='error'), LogisticRegression): the empty strings of the probe are an
    unknown category it fails on, so it is served with a ``warmup_request`` (the entry's ``warmup_request``)."""
    onx, petal = _onehot("error")
    warmup = out / "onehot_strict.warmup.json"
    warmup.write_text(json.dumps({"inputs": [{"name": "petal", **_tensor(petal[:2])}]}))
    return {
        "model": _save(onx, out / "onehot_strict.onnx"),
        "requests": _requests("petal", petal[::9]),
        "warmup_request": warmup.name,
    }


def lightgbm(out: Path) -> dict[str, Any]:
    import onnxmltools
    from lightgbm import LGBMClassifier
    from onnxmltools.convert.common.data_types import FloatTensorType as MLFloatTensorType

    x, y, _ = _iris()
    model = LGBMClassifier(n_estimators=20, num_leaves=8, random_state=SEED, verbose=-1).fit(x, y)
    onx = onnxmltools.convert_lightgbm(model, initial_types=[("input", MLFloatTensorType([None, 4]))], zipmap=False)
    return {"model": _save(onx, out / "lightgbm.onnx"), "requests": _requests("input", x[::7])}


def xgboost(out: Path) -> dict[str, Any]:
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType as MLFloatTensorType
    from xgboost import XGBClassifier

    x, y, _ = _iris()
    model = XGBClassifier(n_estimators=20, max_depth=3, random_state=SEED).fit(x, y)
    onx = onnxmltools.convert_xgboost(model, initial_types=[("input", MLFloatTensorType([None, 4]))])
    return {"model": _save(onx, out / "xgboost.onnx"), "requests": _requests("input", x[::7])}


def _digits_logreg() -> tuple[LogisticRegression, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32)
    return LogisticRegression(max_iter=2000).fit(x, y), x


def _save_external(model: onnx.ModelProto, folder: Path) -> str:
    """Save ``model`` as ``folder/model.onnx`` with every initializer in ``folder/model.weights``."""
    folder.mkdir(exist_ok=True)
    onnx.save_model(
        model,
        str(folder / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.weights",
        size_threshold=0,
    )
    assert (folder / "model.weights").stat().st_size > 0
    return f"{folder.name}/model.onnx"


def external_data(out: Path) -> dict[str, Any]:
    """The ``image`` graph with its weights in ``model.weights`` beside ``model.onnx`` (skl2onnx's linear models
    keep their coefficients in node attributes, which external data does not cover)."""
    model, images = _image_graph()
    return {"model": _save_external(model, out / "external_data"), "requests": _requests("image", images)}


def _static(out: Path, rows: int) -> dict[str, Any]:
    x, _, names = _iris()
    model = LogisticRegression(max_iter=1000).fit(x, names)
    onx = convert_sklearn(model, initial_types=_float_input(4, rows), options={id(model): {"zipmap": False}})
    return {"model": _save(onx, out / f"static_{rows}.onnx"), "requests": _requests("input", x[::7], (1, 3, 1, 5, 1))}


def static_1(out: Path) -> dict[str, Any]:
    return _static(out, 1)


def static_4(out: Path) -> dict[str, Any]:
    return _static(out, 4)


def _graph_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "zoo", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def kinds(out: Path) -> dict[str, Any]:
    """Every kind of output: casts of ``x`` to float16, bfloat16, int8, uint16, int32 and bool (``x > 0``), the sum
    of the whole batch (a scalar: no batch axis) and a constant table ``[3]`` (no batch axis)."""
    T = TensorProto
    casts = [("half", T.FLOAT16), ("brain", T.BFLOAT16), ("small", T.INT8), ("medium", T.INT32)]
    nodes = [helper.make_node("Cast", ["x"], [name], to=to) for name, to in casts]
    nodes += [
        helper.make_node("Abs", ["x"], ["magnitude"]),
        helper.make_node("Cast", ["magnitude"], ["unsigned"], to=T.UINT16),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Constant", [], ["table"], value=numpy_helper.from_array(np.array([2, 3, 5], np.int64))),
    ]
    outputs = [helper.make_tensor_value_info(name, to, ["batch", 3]) for name, to in casts]
    outputs += [
        helper.make_tensor_value_info("unsigned", T.UINT16, ["batch", 3]),
        helper.make_tensor_value_info("positive", T.BOOL, ["batch", 3]),
        helper.make_tensor_value_info("total", T.FLOAT, []),
        helper.make_tensor_value_info("table", T.INT64, [3]),
    ]
    zero = numpy_helper.from_array(np.zeros(1, np.float32), "zero")
    model = _graph_model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3])], outputs, [zero])
    x = (np.arange(30, dtype=np.float32).reshape(10, 3) - 12.0) * 1.25
    return {"model": _save(model, out / "kinds.onnx"), "requests": _requests("x", x, (1, 3, 1, 1, 3, 1))}


def batch_statistics(out: Path) -> dict[str, Any]:
    """``y = x - mean(x over the batch)``: rows change each other's answers, so every request runs alone."""
    T = TensorProto
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["y"]),
    ]
    model = _graph_model(
        nodes,
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 4])],
    )
    x, _, _ = _iris()
    return {"model": _save(model, out / "batch_statistics.onnx"), "requests": _requests("x", x[::11])}


def outlier_indices(out: Path) -> dict[str, Any]:
    """Per-row scores and ``NonZero(x > 6)``: an index list without a batch axis that depends on the inputs (served
    per request, so no answer lists another request's outliers)."""
    T = TensorProto
    nodes = [
        helper.make_node("Greater", ["x", "threshold"], ["big"]),
        helper.make_node("NonZero", ["big"], ["outliers"]),
        helper.make_node("ReduceSum", ["x", "last"], ["score"], keepdims=0),
    ]
    model = _graph_model(
        nodes,
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("score", T.FLOAT, ["batch"]),
            helper.make_tensor_value_info("outliers", T.INT64, [2, "n"]),
        ],
        [
            numpy_helper.from_array(np.array([6.0], np.float32), "threshold"),
            numpy_helper.from_array(np.array([1], np.int64), "last"),
        ],
    )
    x, _, _ = _iris()
    return {"model": _save(model, out / "outlier_indices.onnx"), "requests": _requests("x", x[60::6])}


def unmasked_pooling(out: Path) -> dict[str, Any]:
    """A sequence model without ``attention_mask``: ``input_ids [batch, sequence]`` -> embedding mean over every
    position, so padding would change the answer; batched by exact length instead. The embedding table is the
    digits LogisticRegression's coefficients (64 token ids, 10 dimensions)."""
    model, _ = _digits_logreg()
    T = TensorProto
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["vectors"]),
        helper.make_node("ReduceMean", ["vectors"], ["embedding"], axes=[1], keepdims=0),
    ]
    graph = _graph_model(
        nodes,
        [helper.make_tensor_value_info("input_ids", T.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedding", T.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(model.coef_.T.astype(np.float32).copy(), "table")],
    )
    rng = np.random.default_rng(SEED)
    requests = [
        {"input_ids": _tensor(rng.integers(1, 64, size=(rows, length)).astype(np.int64))}
        for rows, length in ((1, 3), (3, 5), (1, 7), (1, 3), (3, 9), (1, 5))
    ]
    return {"model": _save(graph, out / "unmasked_pooling.onnx"), "requests": requests}


def image(out: Path) -> dict[str, Any]:
    """NCHW digits images ``[N, 1, 8, 8]`` -> Flatten -> the digits LogisticRegression's weights (Gemm) ->
    Softmax probabilities and ArgMax label; and the class table ``[10]``, a constant without a batch axis."""
    model, images = _image_graph()
    return {"model": _save(model, out / "image.onnx"), "requests": _requests("image", images)}


def _image_graph() -> tuple[onnx.ModelProto, np.ndarray]:
    """The image graph and some of its inputs ``[N, 1, 8, 8]``."""
    model, x = _digits_logreg()
    T = TensorProto
    weights = numpy_helper.from_array(model.coef_.T.astype(np.float32), "weights")
    bias = numpy_helper.from_array(model.intercept_.astype(np.float32), "bias")
    nodes = [
        helper.make_node("Flatten", ["image"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "weights", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
        helper.make_node("Constant", [], ["classes"], value=numpy_helper.from_array(np.arange(10, dtype=np.int64))),
    ]
    graph = _graph_model(
        nodes,
        [helper.make_tensor_value_info("image", T.FLOAT, ["batch", 1, 8, 8])],
        [
            helper.make_tensor_value_info("probabilities", T.FLOAT, ["batch", 10]),
            helper.make_tensor_value_info("label", T.INT64, ["batch"]),
            helper.make_tensor_value_info("classes", T.INT64, [10]),
        ],
        [weights, bias],
    )
    return graph, x.reshape(-1, 1, 8, 8)[::17]


SERVED: dict[str, Callable[[Path], dict[str, Any]]] = {
    f.__name__: f
    for f in (
        logreg_strings,
        logreg_zipmap,
        random_forest,
        scaler_svc,
        gbr,
        onehot_strings,
        onehot_strict,
        lightgbm,
        xgboost,
        external_data,
        static_1,
        static_4,
        kinds,
        batch_statistics,
        outlier_indices,
        unmasked_pooling,
        image,
    )
}


def refused(out: Path) -> dict[str, dict[str, str]]:
    """Models streaminfer must refuse at start-up, each with the text of the fix its message must name."""
    T = TensorProto
    row = helper.make_tensor_value_info
    cases: dict[str, tuple[onnx.ModelProto, str]] = {
        "sequence_input": (
            _graph_model(
                [helper.make_node("SequenceAt", ["items", "first"], ["y"])],
                [helper.make_tensor_sequence_value_info("items", T.FLOAT, ["batch", 4])],
                [row("y", T.FLOAT, ["batch", 4])],
                [numpy_helper.from_array(np.array(0, np.int64), "first")],
            ),
            "export it with tensor inputs",
        ),
        "bfloat16_input": (
            _graph_model(
                [helper.make_node("Cast", ["x"], ["y"], to=T.FLOAT)],
                [row("x", T.BFLOAT16, ["batch", 4])],
                [row("y", T.FLOAT, ["batch", 4])],
            ),
            "float32 inputs",
        ),
        "scalar_input": (
            _graph_model([helper.make_node("Neg", ["x"], ["y"])], [row("x", T.FLOAT, [])], [row("y", T.FLOAT, [])]),
            "dynamic_axes",
        ),
        "mixed_batch_axes": (
            _graph_model(
                [helper.make_node("Add", ["a", "b"], ["y"])],
                [row("a", T.FLOAT, [1, 4]), row("b", T.FLOAT, ["batch", 4])],
                [row("y", T.FLOAT, ["batch", 4])],
            ),
            "disagree on the batch axis",
        ),
        "sequence_output": (
            _graph_model(
                [helper.make_node("SequenceConstruct", ["x"], ["items"])],
                [row("x", T.FLOAT, ["batch", 4])],
                [helper.make_tensor_sequence_value_info("items", T.FLOAT, None)],
            ),
            "'zipmap': False",
        ),
    }
    found = {name: {"model": _save(model, out / f"{name}.onnx"), "fix": fix} for name, (model, fix) in cases.items()}
    missing = out / "missing_weights"
    found["missing_weights"] = {"model": _save_external(_image_graph()[0], missing), "fix": "beside the .onnx file"}
    (missing / "model.weights").unlink()
    return found


def build(out: Path) -> dict[str, Any]:
    """Write every model and ``zoo.json`` into ``out``; returns what ``zoo.json`` holds."""
    out.mkdir(parents=True, exist_ok=True)
    served: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name, make in SERVED.items():
        try:
            served[name] = make(out)
        except ImportError as exc:  # lightgbm, xgboost, onnxmltools are optional
            skipped[name] = f"not installed: {exc.name}"
    manifest = {"served": served, "refused": refused(out), "skipped": skipped}
    (out / "zoo.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the models and zoo.json")
    manifest = build(parser.parse_args().out)
    print(f"zoo: served={len(manifest['served'])} refused={len(manifest['refused'])} skipped={manifest['skipped']}")


if __name__ == "__main__":
    main()
