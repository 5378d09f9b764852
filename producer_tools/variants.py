"""Candidate variants of a model made with the ONNX toolchain's own converters (never our own graph rewriting):

- ``fp16``: ONNX Runtime's ``convert_float_to_float16`` (``onnxruntime.transformers.float16``, the converter the
  consumer's ``fp16`` setting runs, so a gated FP16 copy is the one ``fp16=true`` serves) with ``keep_io_types=True``:
  inputs and outputs stay float32, the operators of its default block list stay float32 behind Casts.
  (onnxconverter-common's copy of that converter was tried first: it leaves a ``Cast(to=float)`` in front of a
  float16 ``MatMul``, which ONNX Runtime refuses to load, on skl2onnx's MLP export; ORT's own handles it);
- ``int8-dynamic``: ONNX Runtime's ``quantize_dynamic`` (int8 weights, one scale per weight tensor, activations
  quantised at run time);
- ``int8-dynamic-per-channel``: the same with ``per_channel=True``: a ``MatMul``'s weight ``[in, out]`` gets one
  scale and zero point per output column (``[out]``), where a per-tensor scale is set by the weight's largest value
  (the toolchain's own option; ``Gather`` tables stay per tensor, ONNX Runtime quantises those per tensor either way).
  On the real MiniLM export it keeps the embeddings (mean cosine 0.993, p1 0.985, docs/rollout.md) where
  ``int8-dynamic`` turns them (0.961, 0.919);
- ``int8-static``: ONNX Runtime's ``quantize_static`` in QDQ format, activations calibrated (MinMax) on the
  comparison set's batches.

A converter that would change nothing is not run: :func:`not_applicable` names the graph's operators instead (digits'
``Scaler``/``LinearClassifier``/``Normalizer`` keep their weights in attributes of ``ai.onnx.ml`` operators; a tree
ensemble likewise), and the gate exits 2 on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from producer_tools.evaluate import import_onnx
from producer_tools.modelset import ComparisonSet, Padding, batches

VARIANTS = ("fp16", "int8-dynamic", "int8-dynamic-per-channel", "int8-static")
#: The variants made by ``quantize_dynamic``.
DYNAMIC = ("int8-dynamic", "int8-dynamic-per-channel")
#: Rows per calibration batch of ``int8-static``.
CALIBRATION_BATCH_ROWS = 16


class NotApplicable(ValueError):
    """The converter does not apply to this graph (the operators named)."""


def _default_domain(domain: str) -> bool:
    return domain in ("", "ai.onnx")


def _float_initializers(model: Any) -> set[str]:
    onnx = import_onnx()
    return {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}


def not_applicable(model: Any, variant: str) -> str | None:
    """Why ``variant`` cannot convert ``model`` (an ``onnx.ModelProto``), naming its operators; None if it can.

    The rule: the converter must act on at least one node of the default ONNX domain that takes a float32 weight
    (an initializer): FP16 on a node outside the float16 converter's block list, INT8 on an operator of ONNX
    Runtime's quantisation registry (dynamic: ``IntegerOpsRegistry``; static: ``QLinearOpsRegistry``).
    """
    weights = _float_initializers(model)
    if variant == "fp16":
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

        acted = {
            n.op_type
            for n in model.graph.node
            if _default_domain(n.domain) and n.op_type not in DEFAULT_OP_BLOCK_LIST and set(n.input) & weights
        }
        tool = "ONNX Runtime's float16 converter (float32 weights of standard operators)"
    else:
        from onnxruntime.quantization.registry import IntegerOpsRegistry, QLinearOpsRegistry

        registry = IntegerOpsRegistry if variant in DYNAMIC else QLinearOpsRegistry
        acted = {
            n.op_type
            for n in model.graph.node
            if _default_domain(n.domain) and n.op_type in registry and set(n.input) & weights
        }
        kind = "dynamic" if variant in DYNAMIC else "static"
        tool = f"ONNX Runtime's {kind} quantiser ({', '.join(sorted(registry))})"
    if acted:
        return None
    ops = sorted({f"{n.op_type} ({n.domain or 'ai.onnx'})" for n in model.graph.node})
    return f"{variant} does not apply to this graph: {tool} converts none of its operators {', '.join(ops)}"


def _set_reader(comparison: ComparisonSet, input_names: set[str], padding: Padding | None = None) -> Any:
    """An ``onnxruntime.quantization.CalibrationDataReader`` over the set's batches (the dtypes the consumer feeds;
    a sequence model's batched and padded as :func:`producer_tools.modelset.batches` does with ``padding``)."""
    from onnxruntime.quantization import CalibrationDataReader

    class SetReader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it: Iterator[dict[str, Any]] = (
                {n: a for n, a in feeds.items() if n in input_names}
                for feeds, _ in batches(comparison, CALIBRATION_BATCH_ROWS, padding)
            )

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

    return SetReader()


def build_variant(
    model_path: Path,
    variant: str,
    out: Path,
    comparison: ComparisonSet | None = None,
    padding: Padding | None = None,
) -> Path:
    """Write ``variant`` of ``model_path`` to ``out`` (``int8-static``: calibrated on ``comparison``'s batches,
    batched with ``padding`` for a sequence model, :func:`producer_tools.evaluate.padding_of`).

    Raises:
        NotApplicable: the converter does not apply (:func:`not_applicable`), or it raised (its message kept).
        ValueError: an unknown variant, or ``int8-static`` without a set to calibrate on.
        consumer.errors.ModelError: the ``onnx`` package is not installed.
    """
    onnx = import_onnx()

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    model = onnx.load(str(model_path))
    why = not_applicable(model, variant)
    if why is not None:
        raise NotApplicable(why)
    try:
        if variant == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            onnx.save(convert_float_to_float16(model, keep_io_types=True), str(out))
        elif variant in DYNAMIC:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            per_channel = variant == "int8-dynamic-per-channel"
            quantize_dynamic(str(model_path), str(out), weight_type=QuantType.QInt8, per_channel=per_channel)
        else:
            if comparison is None:
                raise ValueError("int8-static calibrates on a comparison set: --set is needed")
            from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

            quantize_static(
                str(model_path),
                str(out),
                _set_reader(comparison, {i.name for i in model.graph.input}, padding),
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
            )
    except (NotApplicable, ValueError):
        raise
    except Exception as exc:
        raise NotApplicable(f"{variant}: the converter failed on {model_path}: {exc}") from exc
    return out
