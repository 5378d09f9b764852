"""Running a model over a comparison set, and what a validation record says about it.

The model runs in the consumer's own runner (:class:`consumer.model.runner.OnnxRunner`, opened as the consumer opens
it: :class:`consumer.model.session.SessionOptions`), on the set's micro-batches (:func:`producer_tools.modelset.
batches`), so a record's figures are those of the code that serves. Timings use ``time.perf_counter`` (injectable),
one ``runner.run`` per sample, after one untimed pass over the set.
"""

from __future__ import annotations

import datetime as dt
import platform
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from consumer.errors import ModelError
from consumer.inference import CPU_BATCH_TOKENS
from consumer.model.record import RECORD_FORMAT, file_sha256
from consumer.model.runner import OnnxRunner, describe
from consumer.model.sequence import CPU_BUCKETS, length_buckets
from consumer.model.session import SessionOptions, import_onnxruntime
from producer_tools.modelset import ComparisonSet, Padding, batches

#: Percentiles of every input's values written into a record.
PERCENTILES = (1, 5, 50, 95, 99)
#: Batch sizes timed by default, rows (cut to the set's rows).
DEFAULT_BATCH_SIZES = (1, 8, 32, 64)


def open_runner(path: Path, provider: str = "cpu") -> OnnxRunner:
    """The model opened as the consumer opens it (``execution_provider`` ``provider``), probed.

    Raises:
        consumer.errors.ModelError: it cannot be served.
    """
    options = SessionOptions(execution_provider=provider)  # type: ignore[arg-type]
    return OnnxRunner.load(path, options)


@dataclass
class SetOutputs:
    """A model's outputs over a set at one batch size.

    Attributes:
        batches: per batch, output name -> array (``[rows, ...]`` for batched outputs).
        members: per batch, the set's record indices in it.
    """

    batches: list[dict[str, np.ndarray]]
    members: list[list[int]]
    record_rows: list[int] = field(default_factory=list)

    def joined(self, name: str) -> np.ndarray | None:
        """Output ``name`` over the whole set ``[rows, ...]``, rows in set order (a sequence model's batches group
        records by length bucket); None where batches differ in trailing shape.

        ``record_rows`` (rows of each set record) places each batch's rows; empty: the batches are taken to be in
        set order already."""
        parts = [b[name] for b in self.batches if name in b]
        if not parts or len({p.shape[1:] for p in parts}) != 1 or any(p.ndim == 0 for p in parts):
            return None
        joined = np.concatenate(parts)
        if not self.record_rows or len(parts) != len(self.members):
            return joined
        starts = np.concatenate([[0], np.cumsum(self.record_rows)])
        order = np.concatenate(
            [np.arange(starts[i], starts[i + 1]) for idx in self.members for i in idx] or [np.zeros(0, np.int64)]
        )
        if order.size != joined.shape[0]:
            return joined
        out = np.empty_like(joined)
        out[order] = joined
        return out


def padding_of(runner: OnnxRunner) -> Padding | None:
    """How the consumer batches a sequence model's records on CPU (length buckets :data:`consumer.model.sequence.
    CPU_BUCKETS`, at most :data:`consumer.inference.CPU_BATCH_TOKENS` padded tokens a batch, padded to the longest),
    which the set's batches copy (:func:`producer_tools.modelset.batches`); None for other models, and for a
    sequence model that padding would change (``padding_safe`` False: the consumer batches it by exact length, and
    so does the set).
    """
    spec = runner.signature.sequence
    if spec is None or not spec.padding_safe:
        return None
    return Padding(spec.pad_values, length_buckets(spec.max_length, CPU_BUCKETS), CPU_BATCH_TOKENS)


def run_set(
    runner: OnnxRunner, comparison: ComparisonSet, batch_size: int, padding: Padding | Literal["own"] | None = "own"
) -> SetOutputs:
    """Every batch of the set through ``runner``; whole outputs (no batch axis) are left out.

    Args:
        padding: how a sequence model's records are batched (:func:`producer_tools.modelset.batches`); ``"own"``:
            the runner's own (:func:`padding_of`). The gate gives both models the serving model's, so they run the
            same batches.

    Raises:
        consumer.errors.InferenceError: a batch failed.
    """
    whole = runner.signature.whole_outputs
    out, members = [], []
    pads = padding_of(runner) if padding == "own" else padding
    for feeds, idx in batches(comparison, batch_size, pads):
        rows = sum(comparison.records[i].rows for i in idx)
        result = runner.run(feeds, rows)
        out.append({n: np.asarray(a) for n, a in result.items() if n not in whole})
        members.append(idx)
    return SetOutputs(out, members, [r.rows for r in comparison.records])


def predictions(
    outputs: SetOutputs, label_output: str | None = None, skip: Collection[str] = ()
) -> tuple[str, np.ndarray] | None:
    """(output name, int64 ``[rows]``) of the model's top-1 class: ``label_output`` if given; else an integer
    output of shape ``[rows]`` (a classifier's label); else argmax over axis 1 of the first float ``[rows, classes]``
    output not in ``skip`` (the embedding outputs: a vector is not class scores); None when the model has neither
    (a regressor, an embedding)."""
    names = [n for n in outputs.batches[0] if n not in skip] if outputs.batches else []
    if label_output is not None:
        names = [label_output]
    for name in names:
        arr = outputs.joined(name)
        if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":
            return name, arr.astype(np.int64)
    for name in names:
        arr = outputs.joined(name)
        if arr is not None and arr.ndim == 2 and arr.dtype.kind == "f" and arr.shape[1] > 1:
            return name, np.argmax(arr, axis=1).astype(np.int64)
    return None


def accuracy(
    outputs: SetOutputs, comparison: ComparisonSet, label_output: str | None = None, skip: Collection[str] = ()
) -> dict[str, Any]:
    """Top-1 accuracy against the set's labels (rows of labelled records only); {} without labels or classes
    (``skip``: as :func:`predictions`)."""
    found = predictions(outputs, label_output, skip)
    labels = comparison.labels()
    known = labels >= 0
    if found is None or not known.any():
        return {}
    name, predicted = found
    return {
        "output": name,
        "labelled_rows": int(known.sum()),
        "top1": round(float(np.mean(predicted[known] == labels[known])), 6),
    }


def timings(
    runner: OnnxRunner,
    comparison: ComparisonSet,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    *,
    min_runs: int = 20,
    max_seconds: float = 3.0,
    clock: Callable[[], float] = time.perf_counter,
    padding: Padding | Literal["own"] | None = "own",
) -> list[dict[str, Any]]:
    """Latency and throughput per batch size: one untimed pass over the set's batches, then passes until
    ``min_runs`` runs are timed (at least one whole pass, at most ``max_seconds`` after that).

    Returns:
        per batch size: ``{"batch_size", "runs", "rows", "p50_ms", "p99_ms", "rows_per_s"}`` (rows_per_s: rows
        over the summed run times, so the loop's own cost is not in it); ``padding`` as :func:`run_set`'s.
    """
    rows_total = comparison.rows
    rows_of = [r.rows for r in comparison.records]
    pads = padding_of(runner) if padding == "own" else padding
    out = []
    for size in sorted({min(b, rows_total) for b in batch_sizes}):
        plan = [(feeds, sum(rows_of[i] for i in idx)) for feeds, idx in batches(comparison, size, pads)]
        for feeds, rows in plan:  # warm-up: arenas and kernels sized for these shapes
            runner.run(feeds, rows)
        samples: list[float] = []
        rows_done = 0
        began = clock()
        while len(samples) < min_runs or rows_done < rows_total:
            for feeds, rows in plan:
                t0 = clock()
                runner.run(feeds, rows)
                samples.append(clock() - t0)
                rows_done += rows
            if clock() - began > max_seconds and rows_done >= rows_total:
                break
        ms = np.asarray(samples) * 1000.0
        out.append(
            {
                "batch_size": size,
                "runs": len(samples),
                "rows": rows_done,
                "p50_ms": round(float(np.percentile(ms, 50)), 4),
                "p99_ms": round(float(np.percentile(ms, 99)), 4),
                "rows_per_s": round(rows_done / max(float(np.sum(samples)), 1e-12), 1),
            }
        )
    return out


def input_summary(runner: OnnxRunner, comparison: ComparisonSet) -> dict[str, Any]:
    """Per input: datatype, the observed range (min, max), percentiles, mean; sequence lengths (axis 1 of a
    sequence model's token inputs, tokens); image sizes (the spatial axes of an image model's input, pixels)."""
    sig = runner.signature
    out: dict[str, Any] = {}
    for spec in sig.inputs:
        arrays = [r.inputs[spec.name] for r in comparison.records if spec.name in r.inputs]
        entry: dict[str, Any] = {"datatype": spec.datatype, "shape": list(spec.shape)}
        if arrays and arrays[0].dtype.kind in "biuf":
            flat = np.concatenate([a.ravel() for a in arrays]).astype(np.float64)
            entry["range"] = {"min": float(flat.min()), "max": float(flat.max())}
            entry["percentiles"] = {
                f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(flat, PERCENTILES), strict=True)
            }
            entry["mean"] = float(flat.mean())
            entry["std"] = float(flat.std())
        if sig.sequence is not None and spec.name in sig.sequence.inputs and arrays:
            lengths = np.asarray([a.shape[1] for a in arrays])
            entry["sequence_length"] = _spread(lengths)
        if sig.image is not None and spec.name == sig.image.input and arrays:
            entry["image_size"] = sorted({"x".join(str(d) for d in a.shape[1:]) for a in arrays})
        out[spec.name] = entry
    return out


def output_summary(outputs: SetOutputs) -> dict[str, Any]:
    """Per output: dtype and shape; floats: min, max, mean, std; integers: the counts of its 20 commonest values."""
    out: dict[str, Any] = {}
    for name in outputs.batches[0] if outputs.batches else {}:
        arr = outputs.joined(name)
        if arr is None:
            out[name] = {"shapes": sorted({str(list(b[name].shape)) for b in outputs.batches})}
            continue
        entry: dict[str, Any] = {"dtype": str(arr.dtype), "shape": ["rows", *arr.shape[1:]]}
        if arr.dtype.kind == "f":
            entry.update(min=float(arr.min()), max=float(arr.max()), mean=float(arr.mean()), std=float(arr.std()))
        elif arr.dtype.kind in "iub":
            values, counts = np.unique(arr, return_counts=True)
            top = np.argsort(-counts, kind="stable")[:20]
            entry["counts"] = {str(values[i]): int(counts[i]) for i in top}
        out[name] = entry
    return out


def graph_info(path: Path) -> dict[str, Any]:
    """IR version, opsets, producer, metadata and the operators (domain/op: count) of an ONNX file.

    Raises:
        ModelError: the ``onnx`` package is not installed (the ``rollout`` extra).
    """
    onnx = import_onnx()

    model = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for node in model.graph.node:
        key = f"{node.domain or 'ai.onnx'}/{node.op_type}"
        ops[key] = ops.get(key, 0) + 1
    return {
        "ir_version": int(model.ir_version),
        "opsets": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "producer": {"name": model.producer_name, "version": model.producer_version},
        "model_version": int(model.model_version),
        "metadata": {p.key: p.value for p in model.metadata_props},
        "operators": dict(sorted(ops.items())),
    }


def import_onnx() -> Any:
    """The ``onnx`` package, imported late (the service's images do not install it).

    Raises:
        ModelError: it is not installed; the message names the extra that brings it.
    """
    try:
        import onnx
    except ImportError:
        raise ModelError("streaminfer-model needs the onnx package: pip install 'streaminfer[rollout]'") from None
    return onnx


def make_record(
    model_path: Path,
    runner: OnnxRunner,
    comparison: ComparisonSet,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    label_output: str | None = None,
    min_runs: int = 20,
    max_seconds: float = 3.0,
) -> dict[str, Any]:
    """The validation record of ``model_path`` over ``comparison`` (format: :mod:`consumer.model.record`)."""
    ort = import_onnxruntime()
    summary = describe(runner)
    outputs = run_set(runner, comparison, max(batch_sizes))
    return {
        "format": RECORD_FORMAT,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "file": model_path.name,
        "sha256": file_sha256(model_path),
        "bytes": model_path.stat().st_size,
        "model": {"name": summary["model_name"], "version": summary["model_version"], **graph_info(model_path)},
        "runtime": {
            "onnxruntime": ort.__version__,
            "provider": runner.provider,
            "providers_available": list(ort.get_available_providers()),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "signature": {"inputs": summary["inputs"], "outputs": summary["outputs"], "batch_axis": summary["batch_axis"]},
        "set": _set_info(comparison),
        "inputs": input_summary(runner, comparison),
        "outputs": output_summary(outputs),
        "accuracy": accuracy(outputs, comparison, label_output),
        "performance": timings(runner, comparison, batch_sizes, min_runs=min_runs, max_seconds=max_seconds),
    }


def _set_info(comparison: ComparisonSet) -> dict[str, Any]:
    info: dict[str, Any] = {
        "records": len(comparison.records),
        "rows": comparison.rows,
        "labelled": sum(r.label is not None for r in comparison.records),
        "source": comparison.header.get("source"),
    }
    if comparison.path is not None:
        info["path"] = str(comparison.path)
        info["sha256"] = file_sha256(comparison.path)
    return info


def _spread(values: np.ndarray) -> Mapping[str, float]:
    return {
        "min": int(values.min()),
        "max": int(values.max()),
        "p50": float(np.percentile(values, 50)),
        "p99": float(np.percentile(values, 99)),
    }
