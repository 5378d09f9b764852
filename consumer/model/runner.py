"""ONNX Runtime: load the model, choose the execution provider, warm up, run micro-batches, split results.

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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from consumer.errors import DeadLetterReason, InferenceError, ModelError, RecordError, transient_reason
from consumer.model.compat import (
    FIX_EXTERNAL_DATA,
    OutputReader,
    blank,
    input_spec,
    is_zipmap,
    load_fix,
    output_spec,
    static_batch,
)
from consumer.model.probe import graph_constants, probe, rows_from
from consumer.model.sequence import GPU_BUCKETS, detect, input_ranges, length_buckets
from consumer.model.vision import preprocessing
from consumer.oip.decode import decode_request
from consumer.schema import ModelSignature, floating
from consumer.work import Limits

if TYPE_CHECKING:
    from consumer.config import Settings

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

#: settings name -> onnxruntime.GraphOptimizationLevel (a function of the module: onnxruntime is imported late).
OPTIMIZATION_LEVELS: dict[str, Callable[[Any], Any]] = {
    "disable": lambda ort: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": lambda ort: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": lambda ort: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": lambda ort: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


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
        *,
        execution_provider: Literal["auto", "cuda", "cpu"] = "auto",
        require_gpu: bool = False,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all",
        tensorrt: bool = False,
        trt_engine_cache_dir: Path | None = None,
        fp16: bool = False,
        max_batch_size: int = 64,
        model_name: str | None = None,
        model_version: str | None = None,
        warmup_request: bytes | None = None,
        image_preprocessing: str | None = None,
    ) -> OnnxRunner:
        """Create the session and read the signature (sequence layout and value ranges included) from the graph.

        ``auto`` asks for CUDA when the installed onnxruntime offers it and a GPU is visible, and falls back to
        CPU; ONNX Runtime drops a provider it cannot initialise without raising (it logs a warning and runs on
        CPU), so the active provider is read back from the session and logged.

        Args:
            tensorrt: put the TensorRT provider before CUDA, with an engine cache in ``trt_engine_cache_dir`` and
                explicit profile shapes from 1 row x 1 token to ``max_batch_size`` rows x the longest sequence.
            fp16: GPU only: serve a float16 copy of the graph (ONNX Runtime's converter, float32 inputs and
                outputs kept); with TensorRT, its FP16 mode instead.
            max_batch_size: the largest batch in rows, for TensorRT's profile shapes.
            warmup_request: an OIP request (JSON) whose rows probe and warm the model up instead of zeros, for a
                model that zeros are not valid input for.
            image_preprocessing: image models: the preprocessing declaration (JSON, :mod:`consumer.model.vision`),
                overriding the model metadata's.

        The model is then probed (:meth:`probe`): run on zeros to learn which outputs have a batch axis and
        ZipMap's class labels, and every output encoded as an OIP response, so a model that loads can serve.

        Raises:
            ModelError: the file cannot be loaded (external-data weights missing beside it included), an input or
                output cannot be served (:mod:`consumer.model.compat`: the message names it and the export option that
                fixes it), the model fails on zeros at one row, an output cannot be encoded, the metadata is
                malformed, or ``require_gpu`` / ``execution_provider=cuda`` / ``tensorrt`` / ``fp16`` is set and
                CUDA (or TensorRT) is not active.
            ConfigError: ``image_preprocessing`` does not fit the model (:func:`consumer.model.vision.preprocessing`).
        """
        import onnxruntime as ort  # heavy import, kept off unit tests that use fakes

        available = ort.get_available_providers()
        gpu_wanted = execution_provider == "cuda" or require_gpu or tensorrt or fp16
        if execution_provider == "cpu":
            names = [CPU]
        elif gpu_wanted:
            if CUDA not in available:
                raise ModelError(f"a GPU was asked for: this onnxruntime offers only {available}")
            names = [CUDA, CPU]
        else:  # auto: CUDA only where a GPU is really present, so CPU machines start without CUDA load errors
            names = [CUDA, CPU] if CUDA in available and gpu_count() > 0 else [CPU]
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        options.graph_optimization_level = OPTIMIZATION_LEVELS[graph_optimization_level](ort)
        providers: list[Any] = list(names)
        model: str | bytes = str(path)
        if tensorrt:
            if TENSORRT not in available:
                raise ModelError(f"tensorrt=true: this onnxruntime offers only {available}")
            probe, _ = _signature(
                _open(ort, model, ort.SessionOptions(), [CPU]), path, model_name, model_version, image_preprocessing
            )
            providers.insert(0, (TENSORRT, _trt_options(probe, max_batch_size, trt_engine_cache_dir, fp16)))
        elif fp16 and names[0] == CUDA:
            model = _float16(path)
        session = _open(ort, model, options, providers)
        active = session.get_providers()[0]
        log.info(
            "execution providers: asked %s, active %s", [p if isinstance(p, str) else p[0] for p in providers], active
        )
        if gpu_wanted and active not in (CUDA, TENSORRT):
            raise ModelError(f"a GPU execution provider was requested but ONNX Runtime is running on {active}")
        if tensorrt and active != TENSORRT:
            raise ModelError(f"tensorrt=true but ONNX Runtime is running on {active}")
        signature, zipmaps = _signature(session, path, model_name, model_version, image_preprocessing)
        device_id = int(session.get_provider_options().get(active, {}).get("device_id", 0))
        log.info("model %s v%s loaded on %s", signature.name, signature.version, active)
        runner = cls(session, signature, active, device_id, OutputReader(signature.outputs, zipmaps))
        sample = _sample(warmup_request, signature) if warmup_request is not None else None
        runner.probe(sample, path)
        if runner.signature.static_batch is not None:
            log.warning(
                "every input's batch axis is fixed at %d in the graph: ONNX Runtime runs %d row(s) at a time%s; "
                "export the model with a dynamic batch axis to batch",
                runner.signature.static_batch,
                runner.signature.static_batch,
                " (batching is off)" if runner.signature.static_batch == 1 else ", batches padded to that size",
            )
        return runner

    @classmethod
    def from_settings(cls, settings: Settings) -> OnnxRunner:
        """:meth:`load` with the settings' model, provider, session and warmup options (what the service runs).

        Raises:
            ModelError: as :meth:`load`; or ``warmup_request`` cannot be read.
        """
        try:
            warmup = settings.warmup_request.read_bytes() if settings.warmup_request is not None else None
        except OSError as exc:
            raise ModelError(f"warmup_request: {exc}") from None
        return cls.load(
            settings.model_path,
            execution_provider=settings.execution_provider,
            require_gpu=settings.require_gpu,
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
            graph_optimization_level=settings.graph_optimization_level,
            tensorrt=settings.tensorrt,
            trt_engine_cache_dir=settings.trt_engine_cache_dir,
            fp16=settings.fp16,
            max_batch_size=settings.max_batch_size,
            model_name=settings.model_name,
            model_version=settings.model_version,
            warmup_request=warmup,
            image_preprocessing=settings.image_preprocessing,
        )

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

    def probe(self, sample: Mapping[str, np.ndarray] | None = None, path: Path | None = None) -> None:
        """Run the model before serving to learn what its graph does not say (:mod:`consumer.model.probe`: outputs
        without a batch axis, ZipMap labels, whether requests may share a run, whether padding is safe) and check
        every output can be encoded; ``signature`` is updated.

        Args:
            sample: input name -> rows ``[n, ...]`` to probe with (``warmup_request``); None: placeholder rows.
            path: the model file, to find which outputs are graph constants (with the ``onnx`` package).

        Raises:
            ModelError: the model fails on the probe rows at one row, or an output cannot be encoded.
        """
        self.sample = sample
        self.signature = probe(
            self,
            rows_from(sample, self.signature.inputs),
            (lambda: graph_constants(path)) if path is not None else frozenset,
            sampled=sample is not None,
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


def _sample(value: bytes, signature: ModelSignature) -> dict[str, np.ndarray]:
    """The inputs of the ``warmup_request`` JSON, validated like any request.

    Raises:
        ModelError: it is not a valid request for this model (the reason and message named).
    """
    try:
        request = decode_request(value, signature, Limits(max_record_bytes=len(value), max_record_rows=1 << 20))
    except RecordError as err:
        raise ModelError(f"warmup_request is not a valid request for this model: {err.reason}: {err}") from None
    return dict(request.inputs)


def _open(ort: Any, model: str | bytes, options: Any, providers: list[Any]) -> Any:
    try:
        return ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as exc:
        if "external data" in str(exc).lower():
            raise ModelError(
                f"cannot load model: its external-data weights are missing: {exc}; {FIX_EXTERNAL_DATA}"
            ) from exc
        fix = load_fix(str(exc))
        raise ModelError(f"cannot load model: {exc}" + (f"; {fix}" if fix else "")) from exc


def _signature(
    session: Any, path: Path, model_name: str | None, model_version: str | None, image: str | None = None
) -> tuple[ModelSignature, set[str]]:
    """The session's inputs and outputs, with the sequence layout, value ranges and image preprocessing
    (``image`` overriding its metadata's, :func:`consumer.model.vision.preprocessing`) from its metadata, and the
    names of its ZipMap outputs. Outputs are all taken as batched until :meth:`OnnxRunner.probe` runs.

    Raises:
        ModelError: an input or output :mod:`consumer.model.compat` cannot serve, inputs that disagree on the batch
            axis, malformed metadata.
    """
    custom: dict[str, str] = dict(session.get_modelmeta().custom_metadata_map)
    inputs = tuple(input_spec(i.name, i.type, i.shape) for i in session.get_inputs())
    outputs = tuple(output_spec(o.name, o.type, o.shape) for o in session.get_outputs())
    zipmaps = {o.name for o in session.get_outputs() if is_zipmap(o.type)}
    plain = ModelSignature(
        name=model_name or custom.get("model_name") or path.stem,
        version=model_version or custom.get("model_version") or "1",
        inputs=inputs,
        outputs=outputs,
        static_batch=static_batch(inputs),
    )
    return (
        replace(
            plain,
            sequence=detect(plain, custom),
            ranges=input_ranges(custom),
            image=preprocessing(plain, custom, image),
        ),
        zipmaps,
    )


def _trt_options(signature: ModelSignature, max_rows: int, cache_dir: Path | None, fp16: bool) -> dict[str, Any]:
    """TensorRT provider options: engine cache, FP16, and explicit profile shapes per input (min 1 row and
    1 token, opt and max ``max_rows`` rows and the longest sequence) so engines are not rebuilt per new shape."""
    inputs = signature.inputs
    longest = signature.sequence.max_length if signature.sequence is not None else GPU_BUCKETS[-1]

    def shapes(rows: int, tokens: int) -> str:
        return ",".join(
            f"{s.name}:"
            + "x".join(str(d if d is not None else (rows if i == 0 else tokens)) for i, d in enumerate(s.shape))
            for s in inputs
        )

    cache = cache_dir or Path(".cache/trt")
    cache.mkdir(parents=True, exist_ok=True)
    return {
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_fp16_enable": fp16,
        "trt_profile_min_shapes": shapes(1, 1),
        "trt_profile_opt_shapes": shapes(max_rows, min(128, longest)),
        "trt_profile_max_shapes": shapes(max_rows, longest),
    }


def _float16(path: Path) -> bytes:
    """A float16 copy of the model with float32 inputs and outputs (ONNX Runtime's own converter).

    Raises:
        ModelError: the onnx package is missing or the conversion fails.
    """
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise ModelError(f"fp16 needs the onnx package: {exc}") from None
    try:
        converted = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    except Exception as exc:
        raise ModelError(f"fp16 conversion of {str(path)!r} failed: {exc}") from exc
    return bytes(converted.SerializeToString())


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


def non_finite_outputs(outputs: Mapping[str, np.ndarray]) -> list[str]:
    """Names of float outputs (bfloat16 included) holding NaN or Inf (JSON cannot carry them)."""
    return [n for n, a in outputs.items() if floating(a.dtype) and not bool(np.isfinite(a).all())]


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
