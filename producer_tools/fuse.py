"""Fold an image model's normalisation and layout into its ONNX graph: uint8 NHWC pixels in.

``python -m producer_tools.fuse MODEL OUT`` reads the preprocessing declared in MODEL's metadata
(``streaminfer.image``, :mod:`consumer.model.vision`) and writes OUT, the same model behind a small graph::

    pixels  UINT8 [batch, H, W, 3]
      -> Cast(float32) -> Sub(mean) -> Mul(1 / std) -> Transpose(0, 3, 1, 2) (an NCHW model only)
      -> the model's image input

with ``streaminfer.image`` rewritten for it (layout NHWC, no mean and std): streaminfer then hands ONNX Runtime the
resized uint8 pixels, and the float work runs wherever the model runs (the CUDA or TensorRT provider on a GPU), so a
224 x 224 image crosses PCIe as 147 KiB instead of 588 KiB of float32. Resizing stays on the CPU, in the decode
threads: a micro-batch needs one shape, and JPEG's reduced-scale decoding has done most of the down-scaling by then.
On the CPU provider the fused model's outputs equal the plain model's on the same pixels within float32 rounding
(:data:`TOLERANCE`, checked by the tests and by ``models/efficientnet_lite0/build.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from consumer.model.vision import METADATA_KEY
from producer_tools.cli import ToolParser

#: Largest difference between a fused and a plain model's float outputs on the same pixels (probabilities).
TOLERANCE = 1e-5
#: Name of the fused model's uint8 input.
PIXELS = "pixels"


def fuse(model: Any, declared: dict[str, Any]) -> Any:
    """The fused model (``onnx.ModelProto``) of ``model`` and its preprocessing declaration.

    Args:
        model: an image model whose input ``declared["input"]`` (default: its only input) is float
            ``[batch, 3, H, W]`` (NCHW) or ``[batch, H, W, 3]`` (NHWC).
        declared: its ``streaminfer.image`` declaration (JSON object).

    Returns:
        A model with input ``pixels`` uint8 ``[batch, H, W, 3]`` and the same outputs.

    Raises:
        ValueError: the declaration does not fit the model.
    """
    from onnx import TensorProto, compose, helper

    graph = model.graph
    initialised = {init.name for init in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initialised]
    name = declared.get("input") or (inputs[0].name if len(inputs) == 1 else None)
    target = next((i for i in inputs if i.name == name), None)
    if target is None:
        raise ValueError(f"no image input {name!r} in the model")
    if target.type.tensor_type.elem_type == TensorProto.UINT8:
        raise ValueError(f"input {target.name!r} already takes uint8 pixels (a fused model?)")
    dims = [d.dim_value or None for d in target.type.tensor_type.shape.dim]
    if len(dims) != 4:
        raise ValueError(
            f"input {target.name!r} has rank {len(dims)}; an image input is [batch, 3, H, W] or [batch, H, W, 3]"
        )
    layout = declared.get("layout") or ("NCHW" if dims[1] == 3 else "NHWC")
    height, width = declared.get("size") or (dims[2:4] if layout == "NCHW" else dims[1:3])
    mean = np.broadcast_to(np.asarray(declared.get("mean", 0.0), dtype=np.float32), (3,))
    scale = 1.0 / np.broadcast_to(np.asarray(declared.get("std", 1.0), dtype=np.float32), (3,))
    batch = target.type.tensor_type.shape.dim[0].dim_param or "batch"
    nodes = [
        helper.make_node("Cast", [PIXELS], ["fuse_float"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["fuse_float", "fuse_mean"], ["fuse_centred"]),
        helper.make_node("Mul", ["fuse_centred", "fuse_scale"], ["fuse_nhwc" if layout == "NCHW" else "fuse_out"]),
    ]
    if layout == "NCHW":
        nodes.append(helper.make_node("Transpose", ["fuse_nhwc"], ["fuse_out"], perm=[0, 3, 1, 2]))
    out_shape = [batch, 3, height, width] if layout == "NCHW" else [batch, height, width, 3]
    pre = helper.make_graph(
        nodes,
        "streaminfer_preprocessing",
        [helper.make_tensor_value_info(PIXELS, TensorProto.UINT8, [batch, height, width, 3])],
        [helper.make_tensor_value_info("fuse_out", TensorProto.FLOAT, out_shape)],
        initializer=[
            helper.make_tensor("fuse_mean", TensorProto.FLOAT, [3], mean.tolist()),
            helper.make_tensor("fuse_scale", TensorProto.FLOAT, [3], scale.tolist()),
        ],
    )
    opsets = [helper.make_opsetid(o.domain, o.version) for o in model.opset_import]
    pre_model = helper.make_model(pre, opset_imports=opsets, ir_version=model.ir_version)
    fused = compose.merge_models(pre_model, model, io_map=[("fuse_out", target.name)])
    kept = {p.key: p.value for p in model.metadata_props}
    rewritten = {k: v for k, v in declared.items() if k not in ("mean", "std", "layout", "input")}
    kept[METADATA_KEY] = json.dumps({"input": PIXELS, "layout": "NHWC", **rewritten, "size": [height, width]})
    del fused.metadata_props[:]
    for key, value in kept.items():
        fused.metadata_props.add(key=key, value=value)
    return fused


def main(argv: list[str] | None = None) -> int:
    """CLI: fold MODEL's declared preprocessing into OUT. Exit 0 written, 2 no declaration or a bad model."""
    parser = ToolParser(prog="python -m producer_tools.fuse", description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="an image model with streaminfer.image metadata")
    parser.add_argument("out", type=Path, help="where to write the fused model")
    args = parser.parse_args(argv)
    import onnx

    try:
        model = onnx.load(str(args.model))
    except Exception as exc:  # noqa: BLE001 (a missing file, or bytes protobuf cannot parse: DecodeError)
        print(f"fuse: cannot read {args.model} as an ONNX model: {exc}", file=sys.stderr)
        return 2
    raw = {p.key: p.value for p in model.metadata_props}.get(METADATA_KEY)
    if raw is None:
        print(f"fuse: {args.model} has no {METADATA_KEY!r} metadata", file=sys.stderr)
        return 2
    try:
        fused = fuse(model, json.loads(raw))
    except ValueError as exc:  # a declaration that does not fit, or onnx.compose refusing the graphs
        print(f"fuse: {exc}", file=sys.stderr)
        return 2
    try:
        onnx.save(fused, str(args.out))
    except OSError as exc:
        print(f"fuse: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    dims = [d.dim_param or d.dim_value for d in fused.graph.input[0].type.tensor_type.shape.dim]
    print(f"fuse: wrote {args.out} (input {PIXELS} uint8 {dims})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
