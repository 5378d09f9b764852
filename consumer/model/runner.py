"""Running the model: probe it, warm it up, run micro-batches through ONNX Runtime, split the results.

The session itself is built by :mod:`consumer.model.session` (execution providers, options).

:meth:`OnnxRunner.run` blocks (``InferenceSession.run`` releases the GIL) and is meant for a dedicated worker
thread, never the event loop. Results are split back per request by rows only after every output's first
dimension is checked against the batch's rows (pattern after MLServer ``batching/requests.py`` and ray
``batching.py`` ``_validate_results``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from consumer.errors import DeadLetterReason, InferenceError, transient_reason
from consumer.model.compat import OutputReader, blank
from consumer.model.probe import OutputEncoder, graph_constants, probe, rows_from
from consumer.model.sequence import length_buckets
from consumer.model.session import CPU, SessionOptions, open_session
from consumer.signature import ModelSignature

log = logging.getLogger(__name__)


class SessionLike(Protocol):
    """The part of ``onnxruntime.InferenceSession`` the runner uses (a fake in unit tests)."""

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]: ...


class OnnxRunner:
    """Runs micro-batches through one ONNX Runtime session.

    Args:
        session: an ``onnxruntime.InferenceSession`` (or a fake with the same ``run``).
        signature: the model's inputs and outputs; axis 0 of every input, and of every output whose ``batched``
            is set, is the batch axis.
        provider: the execution provider actually active (``CUDAExecutionProvider``, ``CPUExecutionProvider``).
        device_id: the CUDA device index when ``provider`` is CUDA.
        reader: turns the session's values into arrays (ZipMap, bfloat16); default: ONNX Runtime's arrays as
            they are.
    """

    def __init__(
        self,
        session: SessionLike,
        signature: ModelSignature,
        provider: str = CPU,
        device_id: int = 0,
        reader: OutputReader | None = None,
    ) -> None:
        self.session = session
        self.signature = signature
        self.provider = provider
        self.device_id = device_id
        self.reader = reader or OutputReader(signature.outputs)
        #: The rows probe and warmup run on (``warmup_request``), or None for placeholder rows.
        self.sample: Mapping[str, np.ndarray] | None = None
        self._output_names = list(signature.output_names)
        #: ``onnxruntime.RunOptions`` passed to every run, or None (see :meth:`probe`).
        self._run_options: Any = None
        #: Median compute time of the largest warmup batch (the last batch size, first length), seconds; None
        #: before :meth:`warmup`.
        self.batch_seconds: float | None = None

    @classmethod
    def load(
        cls,
        path: Path,
        options: SessionOptions | None = None,
        *,
        warmup_sample: Callable[[ModelSignature], Mapping[str, np.ndarray]] | None = None,
        answer_encoders: Sequence[OutputEncoder] = (),
    ) -> OnnxRunner:
        """Open the model (:func:`consumer.model.session.open_session` with ``options``), then probe it
        (:meth:`probe`): run it on placeholder rows, or on ``warmup_sample``'s, to learn which outputs have a batch
        axis and ZipMap's class labels, and encode every output with each of ``answer_encoders``, so a model that
        loads can serve.

        Args:
            options: the execution provider and session options (default :class:`SessionOptions`'s defaults).
            warmup_sample: given the model's signature, the rows to probe and warm up with instead of zeros (the
                decoded ``warmup_request``: :func:`consumer.__main__.warmup_sample`), for a model that zeros are
                not valid input for.
            answer_encoders: every output of the probe's 1-row run must pass each (the service's:
                :func:`consumer.oip.encode.check_output`), so a model that loads can be answered.

        Raises:
            ModelError: as :func:`~consumer.model.session.open_session`; the model fails on the probe rows at one
                row, or an output cannot be encoded; ``warmup_sample`` raised it (not a valid request).
            ConfigError: ``image_preprocessing`` does not fit the model.
        """
        opened = open_session(path, options or SessionOptions())
        runner = cls(
            opened.session,
            opened.signature,
            opened.provider,
            opened.device_id,
            OutputReader(opened.signature.outputs, opened.zipmaps),
        )
        sample = warmup_sample(opened.signature) if warmup_sample is not None else None
        runner.probe(sample, path, answer_encoders)
        if runner.signature.static_batch is not None:
            log.warning(
                "every input's batch axis is fixed at %d in the graph: ONNX Runtime runs %d row(s) at a time%s; "
                "export the model with a dynamic batch axis to batch",
                runner.signature.static_batch,
                runner.signature.static_batch,
                " (batching is off)" if runner.signature.static_batch == 1 else ", batches padded to that size",
            )
        return runner

    def run(self, feeds: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Run one batch. Blocking; call from the inference thread.

        Args:
            feeds: input name -> array ``[rows, ...]`` of the model's dtype.
            rows: the batch's total rows (axis 0 of every feed).

        Returns:
            output name -> array: ``[rows, ...]`` for a batched output, the model's own shape for an output without
            a batch axis (``TensorSpec.batched`` false).

        Raises:
            InferenceError: ONNX Runtime raised (``transient`` set when it may pass on a retry: out of memory), or
                a batched output's first dimension is not ``rows``.
        """
        try:
            out = self.execute(feeds, rows)
        except Exception as exc:
            err = InferenceError(DeadLetterReason.INFERENCE_ERROR, f"ONNX Runtime failed: {type(exc).__name__}: {exc}")
            err.transient = transient_reason(exc)
            raise err from exc
        for spec in self.signature.outputs:
            arr = out[spec.name]
            if spec.batched and (arr.ndim == 0 or arr.shape[0] != rows):
                raise InferenceError(
                    DeadLetterReason.INFERENCE_ERROR,
                    f"output {spec.name!r} has shape {list(arr.shape)}, expected first dimension {rows}",
                )
        return out

    def execute(self, feeds: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Output name -> array of one batch, unchecked (:meth:`run` checks); a static-batch model runs it N rows at
        a time, the last run padded with :func:`~consumer.model.compat.blank` rows and the padding cut off the batched
        outputs.

        Raises:
            Exception: whatever ONNX Runtime raises.
        """
        size = self.signature.static_batch
        if size is None or rows == size:
            return dict(zip(self._output_names, self._session_run(feeds), strict=True))
        parts: list[list[np.ndarray]] = []
        for start in range(0, rows, size):
            part = {name: arr[start : start + size] for name, arr in feeds.items()}
            short = size - min(size, rows - start)
            if short:
                specs = {spec.name: spec for spec in self.signature.inputs}
                part = {
                    name: np.concatenate([arr, blank(specs[name], short, arr.shape[1] if arr.ndim > 1 else 1)])
                    for name, arr in part.items()
                }
            parts.append(self._session_run(part))
        out: dict[str, np.ndarray] = {}
        for index, spec in enumerate(self.signature.outputs):
            values = [p[index] for p in parts]
            batched = spec.batched and values[0].ndim > 0 and values[0].shape[0] == size
            out[spec.name] = np.concatenate(values)[:rows] if batched else values[0]
        return out

    def _session_run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if not self.reader.plain:  # ZipMap, bfloat16: host outputs, read by the reader
            return self.reader.run(self.session, self._output_names, feeds, self._run_options)
        if self.provider == CPU:
            if self._run_options is not None:
                return self.session.run(self._output_names, dict(feeds), self._run_options)  # type: ignore[call-arg]
            return self.session.run(self._output_names, dict(feeds))
        return self._run_bound(feeds)  # CUDA / TensorRT: IO binding, one host->device copy per input, outputs once

    def probe(
        self,
        sample: Mapping[str, np.ndarray] | None = None,
        path: Path | None = None,
        encoders: Sequence[OutputEncoder] = (),
    ) -> None:
        """Run the model before serving to learn what its graph does not say (:mod:`consumer.model.probe`: outputs
        without a batch axis, ZipMap labels, whether requests may share a run, whether padding is safe) and check
        every output can be encoded by each of ``encoders``; ``signature`` is updated.

        Args:
            sample: input name -> rows ``[n, ...]`` to probe with (``warmup_request``); None: placeholder rows.
            path: the model file, to find which outputs are graph constants (with the ``onnx`` package).
            encoders: the answer encoders (:data:`consumer.model.probe.OutputEncoder`) every output must pass.

        Raises:
            ModelError: the model fails on the probe rows at one row, or an output cannot be encoded.
        """
        self.sample = sample
        self.signature = probe(
            self,
            rows_from(sample, self.signature.inputs),
            (lambda: graph_constants(path)) if path is not None else frozenset,
            sampled=sample is not None,
            encoders=encoders,
        )

    @contextlib.contextmanager
    def quiet_runs(self) -> Iterator[None]:
        """Runs inside log nothing below fatal (probe runs on rows the model may reject); no-op on a fake session."""
        if not hasattr(self.session, "get_providers"):  # not an onnxruntime.InferenceSession
            yield
            return
        import onnxruntime as ort

        kept = self._run_options
        options = ort.RunOptions()
        options.log_severity_level = 4
        self._run_options = options
        try:
            yield
        finally:
            self._run_options = kept

    def quiet_shape_warnings(self) -> None:
        """Pass ``RunOptions`` with errors-only logging to every run (ONNX Runtime warns on each run whose output
        shape differs from the graph's annotation)."""
        import onnxruntime as ort

        options = ort.RunOptions()
        options.log_severity_level = 3
        self._run_options = options

    def _run_bound(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        binding: Any = self.session.io_binding()  # type: ignore[attr-defined]
        for name, arr in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        for name in self._output_names:
            binding.bind_output(name, "cuda", self.device_id)
        self.session.run_with_iobinding(binding)  # type: ignore[attr-defined]
        return list(binding.copy_outputs_to_cpu())

    def warmup(self, batch_sizes: Sequence[int], runs: int, lengths: Sequence[int] = (1,)) -> list[int]:
        """Run ``runs`` times at each batch size (rows) and sequence length (tokens) so kernels, arenas and (on a
        GPU) algorithm choices are ready before serving.

        Inputs are zeros (token ids: the pad id, attention mask 1; dynamic non-batch axes get each of
        ``lengths``), or the rows of ``sample`` (``warmup_request``) repeated to each batch size.
        The median time of the runs at the last (largest) batch size is kept in ``batch_seconds``.
        A model that fails at a size above 1 is still served (failing batches are bisected down to single
        records), with a warning.

        Returns:
            The batch sizes at which the model failed.

        Raises:
            InferenceError: the model fails on zeros at batch 1, so it cannot serve at all.
        """
        rows_for = rows_from(self.sample, self.signature.inputs)
        failing: list[int] = []
        for rows in batch_sizes:
            for length in lengths:
                feeds = rows_for(rows, length)
                times = []
                try:
                    for _ in range(runs):
                        started = time.perf_counter()
                        self.run(feeds, rows)
                        times.append(time.perf_counter() - started)
                except InferenceError as exc:
                    if rows == 1:
                        raise
                    failing.append(rows)
                    log.warning(
                        "model fails at batch %d (%s); failing batches will be bisected, consider a smaller "
                        "max_batch_size",
                        rows,
                        exc,
                    )
                    break
                if times and length == lengths[0]:
                    self.batch_seconds = float(np.median(times))
        return failing


def split(
    outputs: Mapping[str, np.ndarray], row_counts: Sequence[int], whole: Collection[str] = ()
) -> list[dict[str, np.ndarray]]:
    """Cut batch outputs back into per-request outputs by rows, in order; the outputs named in ``whole`` (no batch
    axis) go to every request as they are.

    Raises:
        ValueError: a batched output's first dimension is not ``sum(row_counts)``.
    """
    total = sum(row_counts)
    for name, arr in outputs.items():
        if name not in whole and arr.shape[0] != total:
            raise ValueError(f"output {name!r} has {arr.shape[0]} rows, batch has {total}")
    parts: list[dict[str, np.ndarray]] = []
    start = 0
    for n in row_counts:
        parts.append({name: arr if name in whole else arr[start : start + n] for name, arr in outputs.items()})
        start += n
    return parts


def warmup_plan(runner: OnnxRunner, max_batch_size: int) -> tuple[list[int], list[int]]:
    """Batch sizes (rows) and sequence lengths (tokens) to warm up at.

    CPU: 1 and ``max_batch_size`` rows at the shortest length bucket (ONNX Runtime's CPU kernels do not depend
    on the shape; the arena grows on first use). GPU (CUDA, TensorRT): every power of two up to
    ``max_batch_size`` and ``max_batch_size`` itself, times every length bucket, so no request pays for an
    algorithm search or an engine build. A static-batch model: its N only.
    """
    spec = runner.signature.sequence
    lengths = list(length_buckets(spec.max_length)) if spec is not None else [1]
    if runner.signature.static_batch is not None:  # every run is N rows: one size covers it
        return [runner.signature.static_batch], lengths[:1] if runner.provider == CPU else lengths
    if runner.provider == CPU:
        return sorted({1, max_batch_size}), lengths[:1]
    sizes = {max_batch_size}
    rows = 1
    while rows < max_batch_size:
        sizes.add(rows)
        rows *= 2
    return sorted(sizes), lengths


def describe(runner: OnnxRunner) -> dict[str, Any]:
    """A loggable summary of the model and provider."""
    sig = runner.signature
    return {
        "model_name": sig.name,
        "model_version": sig.version,
        "provider": runner.provider,
        "inputs": {s.name: [s.datatype, list(s.shape)] for s in sig.inputs},
        "outputs": {s.name: [s.datatype, list(s.shape)] + ([] if s.batched else ["whole"]) for s in sig.outputs},
        "sequence": None
        if sig.sequence is None
        else {"max_length": sig.sequence.max_length, "padding_safe": sig.sequence.padding_safe},
        "batch_axis": batch_axis(sig),
    }


def batch_axis(signature: ModelSignature) -> str:
    """``dynamic``; ``static:N`` for a model whose batch axis is fixed at N rows (``static:1``: batching off);
    ``per-request`` for a model whose requests run alone (``ModelSignature.solo``). The ``batch_axis`` label of
    ``streaminfer_model_info``."""
    if signature.static_batch is not None:
        return f"static:{signature.static_batch}"
    return "per-request" if signature.solo else "dynamic"
