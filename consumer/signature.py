"""The model's signature (its inputs' and outputs' tensor specs) and the Open Inference Protocol (KServe V2) datatype
table.

OIP datatypes are the strings of the KServe V2 "Tensor Data Types" table
(https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/), plus ``BF16`` as Triton names it.
ONNX Runtime reports a tensor's type as ``tensor(<onnx type>)``; the table below maps both to numpy dtypes
(bfloat16 is ``ml_dtypes.bfloat16``, numpy has none). Dimensions that ONNX declares with a symbolic name
(``"batch"``) or leave unknown are *dynamic* and stored as ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import ml_dtypes
import numpy as np

#: bfloat16 (8 exponent bits, 7 mantissa bits): numpy has no such type; ml_dtypes (JAX's) gives it one.
BF16: np.dtype[np.generic] = np.dtype(ml_dtypes.bfloat16)

#: OIP datatype -> numpy dtype (BYTES is variable-length and carried as Python objects).
OIP_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "BF16": BF16,
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
NUMPY_TO_OIP: dict[np.dtype[np.generic], str] = {v: k for k, v in OIP_TO_NUMPY.items()}

#: ONNX Runtime's ``NodeArg.type`` strings -> numpy dtype.
ORT_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(bfloat16)": BF16,
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(string)": np.dtype(np.object_),
}


def floating(dtype: np.dtype[np.generic]) -> bool:
    """Whether a dtype holds floating-point values (NaN and Inf possible): numpy's float kinds and bfloat16."""
    return dtype.kind == "f" or dtype == BF16


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output.

    Attributes:
        name: the ONNX graph name.
        dtype: numpy dtype of the tensor.
        shape: one entry per axis; ``None`` for a dynamic axis. Axis 0 is the batch axis (rows) where ``batched``.
        batched: outputs: axis 0 follows the batch's rows, so each response gets its own rows; False for an output
            without a batch axis (a scalar, a fixed table), which every response carries whole. Found by running
            the model at 1 and 2 rows when it is loaded (:func:`consumer.model.compat.probe`).
        labels: a ZipMap output (``seq(map(string|int64, tensor(float)))``, skl2onnx's default for classifier
            probabilities), served as a dense ``[rows, classes]`` tensor: the class labels of its columns, in
            order; the response lists them in the output's ``parameters.classes``. () for other outputs.
    """

    name: str
    dtype: np.dtype[np.generic]
    shape: tuple[int | None, ...]
    batched: bool = True
    labels: tuple[str | int, ...] = ()

    @property
    def datatype(self) -> str:
        """The OIP datatype string (``FP32``, ``INT64`` ...)."""
        return NUMPY_TO_OIP[self.dtype]


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """How a sequence model's ``[batch, sequence]`` token inputs are padded and validated (see
    :mod:`consumer.model.sequence`, which detects it from the graph and metadata).

    Attributes:
        inputs: the ``[batch, sequence]`` inputs, graph order; all padded to one length per batch.
        pad_values: input name -> padding value (``input_ids``: the pad token id; others 0).
        max_length: longest accepted sequence, tokens.
        optional: inputs a request may leave out, with their fill value (``attention_mask`` 1, ``token_type_ids``
            0), so a request of bare ``input_ids`` is enough.
        padding_safe: padding a row to its batch's longest leaves its answer as it is (checked when the model is
            loaded, :mod:`consumer.model.probe`); False (no ``attention_mask``, last-token pooling): a request is
            batched only with requests of its own length.
    """

    inputs: tuple[str, ...]
    pad_values: Mapping[str, int]
    max_length: int
    optional: Mapping[str, int]
    padding_safe: bool = True


#: An image input's layout (:class:`Preprocessing`).
Layout = Literal["NCHW", "NHWC"]


@dataclass(frozen=True, slots=True)
class Preprocessing:
    """How one image becomes one row of the model's image input (:mod:`consumer.model.vision` reads the declaration and
    does it).

    Attributes:
        input: the model input fed, shape ``[rows, 3, H, W]`` (NCHW) or ``[rows, H, W, 3]`` (NHWC).
        layout: NCHW or NHWC.
        height: model input height, px.
        width: model input width, px.
        resize: shorter side the image is scaled to before the centre crop to ``height`` x ``width``, px; 0:
            scaled straight to ``height`` x ``width`` (aspect not kept).
        mean: per channel (R, G, B), subtracted from 0-255 pixel values; float inputs only.
        std: per channel, divides after the mean; float inputs only.
        interpolation: Pillow's resampling filter name (bilinear, bicubic, nearest).
        dtype: the model input's dtype: float32/float16/float64 (normalised) or uint8 (raw pixels).
    """

    input: str
    layout: Layout
    height: int
    width: int
    resize: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str
    dtype: np.dtype[Any]

    @property
    def row_shape(self) -> tuple[int, int, int]:
        """One image's shape in the model input: (3, H, W) or (H, W, 3)."""
        if self.layout == "NCHW":
            return (3, self.height, self.width)
        return (self.height, self.width, 3)

    @property
    def row_bytes(self) -> int:
        """One preprocessed image's size, bytes."""
        return math.prod(self.row_shape) * self.dtype.itemsize

    def source_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The box of a ``width`` x ``height`` image (px) that ends up in the model input: the centre crop of the
        image scaled so its shorter side is ``resize``, in source pixels; the whole image when ``resize`` is 0."""
        if not self.resize:
            return (0.0, 0.0, float(width), float(height))
        scale = self.resize / min(width, height)
        box_w, box_h = min(width, self.width / scale), min(height, self.height / scale)
        left, top = (width - box_w) / 2, (height - box_h) / 2
        return (left, top, left + box_w, top + box_h)


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """The served model's identity and tensors, as the codec validates against and the runner feeds.

    Attributes:
        name: model name echoed in every response's ``model_name``.
        version: model version echoed in ``model_version``.
        inputs: the graph inputs, in graph order.
        outputs: the graph outputs, in graph order.
        sequence: the padding layout when the inputs are variable-length token sequences, else None.
        ranges: input name -> inclusive (low, high) value range checked on every request (e.g. token ids below
            the vocabulary size), from the model's ``input_ranges`` metadata.
        static_batch: N when every input's axis 0 is fixed at N in the graph (an export without a dynamic batch
            axis): ONNX Runtime then runs exactly N rows at a time, a batch is cut into runs of N rows and the
            last padded (zeros), the padding cut off the outputs. None: axis 0 is dynamic.
    """

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sequence: SequenceSpec | None = None
    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    static_batch: int | None = None
    solo: bool = False
    image: Preprocessing | None = None

    def input(self, name: str) -> TensorSpec | None:
        """The input called ``name``, or None."""
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    def output(self, name: str) -> TensorSpec | None:
        """The output called ``name``, or None."""
        for spec in self.outputs:
            if spec.name == name:
                return spec
        return None

    @property
    def output_names(self) -> tuple[str, ...]:
        """Output names in graph order."""
        return tuple(o.name for o in self.outputs)

    @property
    def whole_outputs(self) -> frozenset[str]:
        """Names of the outputs without a batch axis (every response carries them whole)."""
        return frozenset(o.name for o in self.outputs if not o.batched)
