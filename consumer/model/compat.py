"""Which ONNX graphs streaminfer serves, and how: the rules applied to a model's inputs and outputs when it is loaded.

Served (see docs/models.md, "Bring your own model"):

- **inputs**: tensors of every OIP datatype but BF16 (``tensor(string)`` as BYTES), each with a batch axis: axis 0
  dynamic (a symbolic or unknown dimension), or fixed at the same N on every input (a *static batch*: ONNX Runtime
  then runs N rows at a time, see :attr:`~consumer.signature.ModelSignature.static_batch`);
- **outputs**: tensors of every OIP datatype, BF16 included (ONNX Runtime's Python binding has no numpy type for
  bfloat16, so such a model is run through ``OrtValue`` and its bytes read as ``ml_dtypes.bfloat16``), with or
  without a batch axis; and ZipMap outputs (``seq(map(string|int64, tensor(float)))``, skl2onnx's default for a
  classifier's probabilities) as a dense ``[rows, classes]`` tensor whose class labels the response lists in the
  output's ``parameters.classes``.

Anything else is refused at start-up with a :class:`~consumer.errors.ModelError` that names the input or output and
the converter option or export flag that fixes it (the ``FIX_*`` texts below).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from consumer.errors import ModelError
from consumer.signature import BF16, ORT_TO_NUMPY, TensorSpec

#: How to give a model a dynamic batch axis, per exporter.
FIX_BATCH_AXIS = (
    "export it with a dynamic batch axis: torch.onnx.export(..., dynamic_axes={{{name!r}: {{0: 'batch'}}}}) "
    "(or dynamic_shapes with dynamo=True); skl2onnx/onnxmltools initial_types=[({name!r}, "
    "FloatTensorType([None, n_features]))]; tf2onnx --inputs {name}:0[-1,...] or an input_signature whose first "
    "dimension is None"
)
#: How to feed a model tensors instead of sequences or maps.
FIX_TENSOR_INPUT = (
    "export it with tensor inputs: skl2onnx/onnxmltools initial_types of FloatTensorType/Int64TensorType/"
    "StringTensorType; torch.onnx.export with tensor arguments (no lists or dicts of tensors)"
)
#: How to make a bfloat16 (or other exotic) input a float32 one.
FIX_FLOAT_INPUT = (
    "export it with float32 inputs and cast inside the graph: onnxconverter_common.float16.convert_float_to_float16"
    "(model, keep_io_types=True), or in torch cast the input at the top of forward()"
)
#: How to turn a non-tensor output into a tensor.
FIX_TENSOR_OUTPUT = (
    "make the output a tensor: skl2onnx/onnxmltools options={id(model): {'zipmap': False}} (classifier "
    "probabilities as a [rows, classes] tensor); in torch return a tensor (torch.stack the list) instead of a list "
    "or dict"
)
#: How to make an exotic output type a servable one.
FIX_OUTPUT_TYPE = "add a Cast node to float32 (or int64) at the end of the graph for output {name!r}"
#: Where external-data weights must be.
FIX_EXTERNAL_DATA = (
    "copy the weights file(s) beside the .onnx file (ONNX external data paths are relative to the model's folder; "
    "in Kubernetes mount both into one directory), or save the model with its weights inside: "
    "onnx.save_model(onnx.load(path), path, save_as_external_data=False) (models under 2 GiB)"
)

#: ONNX Runtime's load errors for files converters commonly get wrong: (text in the error, the fix).
LOAD_FIXES: tuple[tuple[str, str], ...] = (
    (
        "unsupported model ir version",
        "save it with an IR version this onnxruntime reads (onnx.helper.make_model(..., "
        "ir_version=10), or convert with an onnx release of the same age), or install a newer onnxruntime",
    ),
    (
        "is under development",
        "export it with a released opset (torch.onnx.export(opset_version=...), skl2onnx "
        "target_opset=..., tf2onnx --opset ...)",
    ),
    ("zipmap", "convert it without ZipMap: skl2onnx/onnxmltools options={id(model): {'zipmap': False}}"),
    (
        "treeensemble",
        "convert the trees with float32 inputs (FloatTensorType, X.astype(numpy.float32)); onnxruntime's "
        "tree ensembles take double inputs only from ai.onnx.ml opset 3 with a matching converter",
    ),
    (
        "failed to construct locale",
        "convert it with a locale the container has: skl2onnx options={id(model): "
        "{'locale': 'C'}} (TfidfVectorizer, CountVectorizer), or install the locale in the image",
    ),
    (
        "is not a registered function/op",
        "the graph uses custom operators (onnxruntime-extensions or your own "
        "library), which streaminfer does not load: export it with standard ONNX operators only",
    ),
)

#: ZipMap's output type: a sequence (one per row) of maps label -> probability.
_ZIPMAP = re.compile(r"seq\(map\((string|int64),tensor\((float|double)\)\)\)")


def load_fix(message: str) -> str | None:
    """The fix for an ONNX Runtime load error (:data:`LOAD_FIXES`), or None when it is not one we know."""
    lowered = message.lower()
    return next((fix for text, fix in LOAD_FIXES if text in lowered), None)


def input_spec(name: str, ort_type: str, shape: Sequence[int | str | None] | None) -> TensorSpec:
    """A graph input as a :class:`TensorSpec` (``NodeArg`` fields: ``tensor(float)``, ``[None, 64]``).

    Raises:
        ModelError: a non-tensor input (sequence, map, optional), a bfloat16 or other input type OIP requests
            cannot carry, or a scalar (rank 0) input, each with the export option that fixes it.
    """
    if not ort_type.startswith("tensor("):
        raise ModelError(f"input {name!r} is {ort_type}: requests carry tensors only; {FIX_TENSOR_INPUT}")
    dtype = ORT_TO_NUMPY.get(ort_type)
    if dtype is None or dtype == BF16:
        raise ModelError(f"input {name!r} is {ort_type}, which OIP requests cannot carry; {FIX_FLOAT_INPUT}")
    dims = _dims(shape)
    if not dims:
        raise ModelError(
            f"input {name!r} is a scalar (rank 0): it has no batch axis; {FIX_BATCH_AXIS.format(name=name)}"
        )
    return TensorSpec(name, dtype, dims)


def is_zipmap(ort_type: str) -> bool:
    """Whether a graph output type is ZipMap's ``seq(map(string|int64, tensor(float|double)))``."""
    return _ZIPMAP.fullmatch(ort_type.replace(" ", "")) is not None


def output_spec(name: str, ort_type: str, shape: Sequence[int | str | None] | None) -> TensorSpec:
    """A graph output as a :class:`TensorSpec`; a ZipMap output as a dense float ``[rows, classes]`` one (its
    labels are known after the first run, :class:`OutputReader`).

    Raises:
        ModelError: a sequence, map or optional output other than ZipMap, or an element type OIP has no datatype
            for (complex, float8, int4), with the fix.
    """
    zipmap = _ZIPMAP.fullmatch(ort_type.replace(" ", ""))
    if zipmap is not None:
        return TensorSpec(name, np.dtype(np.float32 if zipmap.group(2) == "float" else np.float64), (None, None))
    if not ort_type.startswith("tensor("):
        raise ModelError(f"output {name!r} is {ort_type}, which OIP responses cannot carry; {FIX_TENSOR_OUTPUT}")
    dtype = ORT_TO_NUMPY.get(ort_type)
    if dtype is None:
        raise ModelError(
            f"output {name!r} is {ort_type}, which OIP has no datatype for; {FIX_OUTPUT_TYPE.format(name=name)}"
        )
    return TensorSpec(name, dtype, _dims(shape))


def static_batch(inputs: Sequence[TensorSpec]) -> int | None:
    """N when every input's axis 0 is fixed at the same N; None when every input's axis 0 is dynamic.

    Raises:
        ModelError: no inputs, inputs that disagree (one fixed, another dynamic, or fixed at different sizes), or
            axis 0 fixed at 0.
    """
    if not inputs:
        raise ModelError("the model has no inputs: there is nothing for a request to feed")
    firsts = {spec.name: spec.shape[0] for spec in inputs}
    sizes = set(firsts.values())
    if sizes == {None}:
        return None
    if len(sizes) > 1:
        listed = ", ".join(f"{n!r} {'dynamic' if d is None else d}" for n, d in firsts.items())
        name = next(n for n, d in firsts.items() if d is not None)
        raise ModelError(
            f"the inputs disagree on the batch axis (axis 0: {listed}), so rows cannot be batched; "
            + FIX_BATCH_AXIS.format(name=name)
        )
    (size,) = sizes
    if size == 0:
        name = next(iter(firsts))
        raise ModelError(f"input {name!r} has axis 0 fixed at 0 rows; {FIX_BATCH_AXIS.format(name=name)}")
    return size


def blank(spec: TensorSpec, rows: int, length: int = 1) -> np.ndarray:
    """Placeholder rows for warmup, probing and static-batch padding: zeros (``attention_mask``: ones; BYTES:
    empty strings), ``[rows, ...]`` with every dynamic non-batch axis ``length`` long."""
    shape = (rows, *(d if d is not None else length for d in spec.shape[1:]))
    if spec.dtype.kind == "O":
        return np.full(shape, "", dtype=object)
    return np.full(shape, 1 if spec.name == "attention_mask" else 0, dtype=spec.dtype)


class OutputReader:
    """Turns what ``InferenceSession`` returns into numpy arrays, one per output in graph order.

    Plain models (every output a tensor numpy has a type for) take ONNX Runtime's arrays as they are
    (:attr:`plain`). Otherwise: ZipMap outputs (a list, per row, of ``{label: probability}``) become
    ``[rows, classes]`` arrays with the labels fixed by the first run (every later run must list the same labels,
    in the same order); bfloat16 outputs are read from ``OrtValue`` bytes (``run_with_ort_values``).

    Args:
        outputs: the graph's outputs, in graph order.
        zipmaps: the names of its ZipMap outputs (:func:`is_zipmap` of their graph types).

    Attributes:
        labels: ZipMap output name -> its class labels, in column order (known after the first run).

    Raises:
        ModelError: a model with both bfloat16 and ZipMap outputs (``OrtValue`` cannot return the maps).
    """

    def __init__(self, outputs: Sequence[TensorSpec], zipmaps: Collection[str] = ()) -> None:
        self._dtypes = {spec.name: spec.dtype for spec in outputs}
        self._bf16 = any(spec.dtype == BF16 for spec in outputs)
        self.zipmaps = frozenset(zipmaps)
        self.labels: dict[str, tuple[str | int, ...]] = {}
        if self._bf16 and self.zipmaps:
            name = sorted(self.zipmaps)[0]
            raise ModelError(
                f"output {name!r} is a ZipMap and another output is bfloat16: ONNX Runtime's Python binding cannot "
                f"return both; {FIX_TENSOR_OUTPUT}"
            )

    @property
    def plain(self) -> bool:
        """Whether ONNX Runtime's own arrays are the outputs (no ZipMap, no bfloat16)."""
        return not self.zipmaps and not self._bf16

    def run(
        self, session: Any, names: list[str], feeds: Mapping[str, np.ndarray], run_options: Any = None
    ) -> list[np.ndarray]:
        """Run ``session`` on ``feeds`` (with ``onnxruntime.RunOptions`` or None) and return each of ``names`` as
        an array.

        Raises:
            ValueError: a ZipMap run lists other labels than the first run did.
            Exception: whatever ONNX Runtime raises.
        """
        if self._bf16:
            import onnxruntime as ort

            values = session.run_with_ort_values(
                names,
                {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()},
                run_options,
            )
            return [_ort_value_array(value) for value in values]
        raw = session.run(names, dict(feeds), run_options)
        return [
            self._dense(name, value) if name in self.zipmaps else value for name, value in zip(names, raw, strict=True)
        ]

    def _dense(self, name: str, rows: list[dict[Any, float]]) -> np.ndarray:
        """ZipMap's per-row maps -> ``[rows, classes]``, columns in the labels' order."""
        dtype = self._dtypes[name]
        if not rows:
            return np.zeros((0, len(self.labels.get(name, ()))), dtype=dtype)
        labels = tuple(rows[0])
        known = self.labels.setdefault(name, labels)
        if labels != known:
            raise ValueError(
                f"ZipMap output {name!r} lists labels {labels[:5]}..., the first run listed {known[:5]}..."
            )
        return np.array([list(row.values()) for row in rows], dtype=dtype)


def _ort_value_array(value: Any) -> np.ndarray:
    """A CPU ``OrtValue`` as a numpy array; bfloat16 read from its bytes as ``ml_dtypes.bfloat16``."""
    if value.data_type() != "tensor(bfloat16)":
        return np.asarray(value.numpy())
    shape = tuple(value.shape())
    size = int(value.tensor_size_in_bytes())
    if size == 0:
        return np.zeros(shape, dtype=BF16)
    raw = ctypes.string_at(value.data_ptr(), size)  # a copy: the OrtValue's buffer goes with it
    arr: np.ndarray = np.frombuffer(raw, dtype=np.uint16).view(BF16).reshape(shape)
    return arr


def _dims(shape: Sequence[int | str | None] | None) -> tuple[int | None, ...]:
    """NodeArg dims -> ints, symbolic or unknown ones None."""
    return tuple(d if isinstance(d, int) and d >= 0 else None for d in (shape or ()))
