"""A tiny colour classifier for tests, built with onnx.helper (no torch): the interface of models/efficientnet_lite0.

Graph::

    pixels          FP32   [batch, 3, 16, 16]   (NCHW, (pixel - 127) / 128, as EfficientNet-Lite's preprocessing)
    means = ReduceMean(pixels, axes=[2, 3])                       FP32 [batch, 3]
    probabilities = Softmax(means @ W + b)                        FP32 [batch, 4]   classes: red, green, blue, grey
    top_k_indices, top_k_labels = TopK(probabilities, 2)          INT64 / STRING [batch, 2]

so a mostly red image's top-1 label is ``red``, a mid-grey one's ``grey``. Its metadata declares the preprocessing
(:mod:`consumer.model.vision`): ``size`` 16 x 16, ``resize`` 18 (shorter side, then a centre crop), mean 127, std 128.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

CLASSES = ("red", "green", "blue", "grey")
SIZE = 16
RESIZE = 18
DECLARED = {"size": [SIZE, SIZE], "resize": RESIZE, "mean": [127, 127, 127], "std": [128, 128, 128]}
#: Columns: red, green, blue, grey; rows: the R, G, B channel means in [-1, 1].
WEIGHTS = np.array([[4, -4, -4, 0], [-4, 4, -4, 0], [-4, -4, 4, 0]], dtype=np.float32)
BIAS = np.array([0, 0, 0, 1], dtype=np.float32)


def build(path: Path) -> Path:
    """Write the model to ``path``; returns it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("ReduceMean", ["pixels", "axes"], ["means"], keepdims=0),
        helper.make_node("MatMul", ["means", "weights"], ["logits_raw"]),
        helper.make_node("Add", ["logits_raw", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("TopK", ["probabilities", "k"], ["top_k_scores", "top_k_indices"], axis=1),
        helper.make_node("Gather", ["labels", "top_k_indices"], ["top_k_labels"], axis=0),
    ]
    labels = helper.make_tensor("labels", TensorProto.STRING, [len(CLASSES)], [c.encode() for c in CLASSES])
    graph = helper.make_graph(
        nodes,
        "tiny_colours",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
        [
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", len(CLASSES)]),
            helper.make_tensor_value_info("top_k_indices", TensorProto.INT64, ["batch", 2]),
            helper.make_tensor_value_info("top_k_labels", TensorProto.STRING, ["batch", 2]),
        ],
        initializer=[
            numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes"),
            numpy_helper.from_array(WEIGHTS, "weights"),
            numpy_helper.from_array(BIAS, "bias"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "k"),
            labels,
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    for key, value in {
        "model_name": "colours",
        "model_version": "1",
        "streaminfer.image": json.dumps(DECLARED),
    }.items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def png(rgb: tuple[int, int, int], size: tuple[int, int] = (40, 30), mode: str = "RGB") -> bytes:
    """A ``size`` (width, height) image of one colour, PNG-encoded in Pillow mode ``mode`` (converted from RGB)."""
    return encoded(rgb, size, "PNG", mode)


def jpeg(rgb: tuple[int, int, int], size: tuple[int, int] = (40, 30), mode: str = "RGB") -> bytes:
    """As :func:`png`, JPEG-encoded (quality 95)."""
    return encoded(rgb, size, "JPEG", mode)


def encoded(rgb: tuple[int, int, int], size: tuple[int, int], fmt: str, mode: str = "RGB") -> bytes:
    """A one-colour image in format ``fmt`` (Pillow's name) and mode ``mode``."""
    import io

    from PIL import Image

    image = Image.new("RGB", size, rgb)
    if mode != "RGB":
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


def corruptions(seed: int, n: int) -> list[bytes]:
    """``n`` damaged images: bit flips, cut files, spliced headers and random bytes, from JPEG, PNG, GIF, WebP."""
    rng = random.Random(seed)
    sources = [encoded((rng.randrange(256), 40, 200), (48, 32), fmt) for fmt in ("JPEG", "PNG", "GIF", "WEBP", "BMP")]
    out = []
    for i in range(n):
        data = bytearray(rng.choice(sources))
        kind = i % 4
        if kind == 0:
            for _ in range(rng.randint(1, 20)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data = data[: rng.randrange(1, len(data))]
        elif kind == 2:
            data = data[:16] + bytearray(rng.randbytes(rng.randint(0, 400)))
        else:
            data = bytearray(rng.randbytes(rng.randint(0, 600)))
        out.append(bytes(data))
    return out
