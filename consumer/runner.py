"""ONNX Runtime: load the model, choose the execution provider, warm up, run micro-batches, split results.

:meth:`OnnxRunner.run` blocks (``InferenceSession.run`` releases the GIL) and is meant for a dedicated worker
thread, never the event loop. Results are split back per request by rows only after every output's first
dimension is checked against the batch's rows (pattern after MLServer ``batching/requests.py`` and ray
``batching.py`` ``_validate_results``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from consumer.errors import DeadLetterReason, InferenceError, ModelError
from consumer.schema import ModelSignature, TensorSpec

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


class SessionLike(Protocol):
    """The part of ``onnxruntime.InferenceSession`` the runner uses (a fake in unit tests)."""

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]: ...


class OnnxRunner:
    """Runs micro-batches through one ONNX Runtime session.

    Args:
        session: an ``onnxruntime.InferenceSession`` (or a fake with the same ``run``).
        signature: the model's inputs and outputs; axis 0 of every input and output is the batch axis.
        provider: the execution provider actually active (``CUDAExecutionProvider``, ``CPUExecutionProvider``).
        device_id: the CUDA device index when ``provider`` is CUDA.
    """

    def __init__(
        self, session: SessionLike, signature: ModelSignature, provider: str = CPU, device_id: int = 0
    ) -> None:
        self.session = session
        self.signature = signature
        self.provider = provider
        self.device_id = device_id
        self._output_names = list(signature.output_names)

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        execution_provider: Literal["auto", "cuda", "cpu"] = "auto",
        require_gpu: bool = False,
        intra_op_threads: int = 0,
        model_name: str | None = None,
        model_version: str | None = None,
    ) -> OnnxRunner:
        """Create the session and read the signature from the graph.

        ``auto`` asks for CUDA when the installed onnxruntime offers it and falls back to CPU; ONNX Runtime drops
        a provider it cannot initialise without raising, so the active provider is read back from the session.

        Raises:
            ModelError: the file cannot be loaded, an input or output is not a tensor, an input's axis 0 is not
                dynamic,
                or ``require_gpu`` / ``execution_provider=cuda`` is set and CUDA is not active.
        """
        import onnxruntime as ort  # heavy import, kept off unit tests that use fakes

        available = ort.get_available_providers()
        if execution_provider == "cpu":
            providers = [CPU]
        elif execution_provider == "cuda" or require_gpu:
            if CUDA not in available:
                raise ModelError(f"execution_provider=cuda: this onnxruntime offers only {available}")
            providers = [CUDA, CPU]
        else:  # auto: CUDA only where a GPU is really present, so CPU machines start without CUDA load errors
            providers = [CUDA, CPU] if CUDA in available and gpu_count() > 0 else [CPU]
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:
            raise ModelError(f"cannot load model {str(path)!r}: {exc}") from exc
        active = session.get_providers()[0]
        if (execution_provider == "cuda" or require_gpu) and active != CUDA:
            raise ModelError(f"CUDA execution provider requested but ONNX Runtime is running on {active}")
        meta = session.get_modelmeta()
        custom = meta.custom_metadata_map
        try:
            inputs = tuple(TensorSpec.from_ort(i.name, i.type, i.shape) for i in session.get_inputs())
            outputs = tuple(TensorSpec.from_ort(o.name, o.type, o.shape) for o in session.get_outputs())
        except KeyError as exc:
            raise ModelError(f"model {str(path)!r} has a non-tensor input or output: {exc}") from None
        for spec in inputs:  # outputs are checked on every run: first dimension == the batch's rows
            if not spec.shape or spec.shape[0] is not None:
                raise ModelError(f"input {spec.name!r} has no dynamic batch axis (shape {spec.shape})")
        signature = ModelSignature(
            name=model_name or custom.get("model_name") or path.stem,
            version=model_version or custom.get("model_version") or "1",
            inputs=inputs,
            outputs=outputs,
        )
        device_id = int(session.get_provider_options().get(active, {}).get("device_id", 0))
        log.info("model %s v%s loaded on %s", signature.name, signature.version, active)
        return cls(session, signature, active, device_id)

    def run(self, feeds: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Run one batch. Blocking; call from the inference thread.

        Args:
            feeds: input name -> array ``[rows, ...]`` of the model's dtype.
            rows: the batch's total rows (axis 0 of every feed).

        Returns:
            output name -> array ``[rows, ...]``.

        Raises:
            InferenceError: ONNX Runtime raised, or an output's first dimension is not ``rows``.
        """
        try:
            values = self.session.run(self._output_names, dict(feeds))
        except Exception as exc:
            raise InferenceError(
                DeadLetterReason.INFERENCE_ERROR, f"ONNX Runtime failed: {type(exc).__name__}: {exc}"
            ) from exc
        out = dict(zip(self._output_names, values, strict=True))
        for name, arr in out.items():
            if arr.ndim == 0 or arr.shape[0] != rows:
                raise InferenceError(
                    DeadLetterReason.INFERENCE_ERROR,
                    f"output {name!r} has shape {list(arr.shape)}, expected first dimension {rows}",
                )
        return out

    def warmup(self, batch_sizes: Sequence[int], runs: int) -> list[int]:
        """Run zeros ``runs`` times at each batch size (rows) so kernels and arenas are ready before serving.

        Dynamic non-batch axes are warmed at length 1. A model that fails at a size above 1 is still served
        (failing batches are bisected down to single records), with a warning.

        Returns:
            The batch sizes at which the model failed.

        Raises:
            InferenceError: the model fails on zeros at batch 1, so it cannot serve at all.
        """
        failing: list[int] = []
        for rows in batch_sizes:
            feeds = {
                s.name: np.zeros((rows, *(d if d is not None else 1 for d in s.shape[1:])), dtype=s.dtype)
                for s in self.signature.inputs
            }
            try:
                for _ in range(runs):
                    self.run(feeds, rows)
            except InferenceError as exc:
                if rows == 1:
                    raise
                failing.append(rows)
                log.warning(
                    "model fails at batch %d (%s); failing batches will be bisected, consider a smaller max_batch_size",
                    rows,
                    exc,
                )
        return failing


def gpu_count() -> int:
    """NVIDIA GPUs visible through NVML (nvidia-ml-py); 0 without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 (NVMLError, ImportError: no driver, no library)
        return 0


def assemble(requests: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
    """Stack requests' inputs along axis 0. All requests must share non-batch shapes (the batcher's key).

    Returns:
        (feeds, rows): input name -> ``[sum of rows, ...]`` array, and the total rows.
    """
    names = list(requests[0])
    if len(requests) == 1:
        feeds = dict(requests[0])
    else:
        feeds = {name: np.concatenate([r[name] for r in requests], axis=0) for name in names}
    return feeds, int(feeds[names[0]].shape[0])


def split(outputs: Mapping[str, np.ndarray], row_counts: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut batch outputs back into per-request outputs by rows, in order.

    Raises:
        ValueError: an output's first dimension is not ``sum(row_counts)``.
    """
    total = sum(row_counts)
    for name, arr in outputs.items():
        if arr.shape[0] != total:
            raise ValueError(f"output {name!r} has {arr.shape[0]} rows, batch has {total}")
    parts: list[dict[str, np.ndarray]] = []
    start = 0
    for n in row_counts:
        parts.append({name: arr[start : start + n] for name, arr in outputs.items()})
        start += n
    return parts


def non_finite_outputs(outputs: Mapping[str, np.ndarray]) -> list[str]:
    """Names of float outputs holding NaN or Inf (JSON cannot carry them)."""
    return [n for n, a in outputs.items() if a.dtype.kind == "f" and not bool(np.isfinite(a).all())]


def describe(runner: OnnxRunner) -> dict[str, Any]:
    """A loggable summary of the model and provider."""
    sig = runner.signature
    return {
        "model_name": sig.name,
        "model_version": sig.version,
        "provider": runner.provider,
        "inputs": {s.name: [s.datatype, list(s.shape)] for s in sig.inputs},
        "outputs": {s.name: [s.datatype, list(s.shape)] for s in sig.outputs},
    }
