"""Building an ONNX Runtime session: execution providers (CUDA when a GPU is present, TensorRT, CPU), session
options, a float16 copy for the GPU, and the model's signature read from the graph and its metadata.

What runs the session is :class:`consumer.model.runner.OnnxRunner`; this module only opens it.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from consumer.errors import ModelError
from consumer.model.compat import FIX_EXTERNAL_DATA, input_spec, is_zipmap, load_fix, output_spec, static_batch
from consumer.model.sequence import GPU_BUCKETS, detect, input_ranges
from consumer.model.vision import preprocessing
from consumer.signature import ModelSignature

if TYPE_CHECKING:
    from consumer.config import Settings

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

#: The distributions that install the ``onnxruntime`` package (they overwrite each other's files).
RUNTIME_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")
#: What to install when no ONNX Runtime is: pyproject.toml's extras (docs/containers.md, "Which ONNX Runtime").
RUNTIME_EXTRAS = (
    "install exactly one of pip install 'streaminfer[cpu]' (ONNX Runtime's CPU build), 'streaminfer[gpu]' (its GPU "
    "build, with CUDA 13 and cuDNN 9 on the system) or 'streaminfer[cuda]' (the GPU build with CUDA and cuDNN from "
    "PyPI); the images have one"
)


def installed_runtimes() -> list[str]:
    """The distributions of :data:`RUNTIME_DISTRIBUTIONS` installed (with their versions, ``name==version``)."""
    found = []
    for name in RUNTIME_DISTRIBUTIONS:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def import_onnxruntime() -> ModuleType:
    """The ``onnxruntime`` module, imported late (it is heavy, and unit tests with fakes never need it). Two builds
    installed together are logged as a warning: they share one package folder, the last one installed wins.

    Raises:
        ModelError: no ONNX Runtime is installed (``pip install streaminfer`` alone has none); the message names the
            extras that bring one.
    """
    try:
        import onnxruntime as module
    except ImportError as exc:
        raise ModelError(f"ONNX Runtime is not installed ({exc}): {RUNTIME_EXTRAS}") from exc
    both = installed_runtimes()
    if len(both) > 1:
        log.warning(
            "%s are all installed: they write the same onnxruntime package, so the one installed last overwrote the "
            "others (uninstall them all, then install one extra: cpu, gpu or cuda)",
            " and ".join(both),
        )
    onnxruntime: ModuleType = module
    return onnxruntime


#: settings name -> onnxruntime.GraphOptimizationLevel (a function of the module: onnxruntime is imported late).
OPTIMIZATION_LEVELS: dict[str, Callable[[Any], Any]] = {
    "disable": lambda ort: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": lambda ort: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": lambda ort: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": lambda ort: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class OpenSession:
    """An ONNX Runtime session and what was read from it.

    Attributes:
        session: the ``onnxruntime.InferenceSession``.
        signature: the model's inputs and outputs (every output taken as batched until the runner probes it).
        zipmaps: names of the outputs that are skl2onnx ZipMaps (sequences of maps, read by the runner's reader).
        provider: the execution provider actually active.
        device_id: the CUDA device index when ``provider`` is CUDA or TensorRT; 0 otherwise.
    """

    session: Any
    signature: ModelSignature
    zipmaps: set[str]
    provider: str
    device_id: int


@dataclass(frozen=True)
class SessionOptions:
    """How to open the model: the execution provider and ONNX Runtime's session options.

    Attributes:
        execution_provider: ``auto`` (CUDA where onnxruntime offers it and a GPU is visible, else CPU), ``cuda`` or
            ``cpu``.
        require_gpu: fail unless CUDA (or TensorRT) is active.
        intra_op_threads: ONNX Runtime's intra-op threads (0: its default).
        inter_op_threads: ONNX Runtime's inter-op threads (0: its default).
        intra_op_spinning: let ONNX Runtime's threads spin-wait for work after a run (its own default) instead of
            sleeping.
        graph_optimization_level: ``disable``, ``basic``, ``extended`` or ``all``.
        tensorrt: put the TensorRT provider before CUDA, with an engine cache in ``trt_engine_cache_dir`` and
            explicit profile shapes from 1 row x 1 token to ``max_batch_size`` rows x the longest sequence.
        trt_engine_cache_dir: TensorRT's engine cache (default ``.cache/trt``).
        fp16: GPU only: serve a float16 copy of the graph (ONNX Runtime's converter, float32 inputs and outputs
            kept); with TensorRT, its FP16 mode instead.
        max_batch_size: the largest batch in rows, for TensorRT's profile shapes.
        model_name: overrides the metadata's ``model_name`` (default: the file's stem).
        model_version: overrides the metadata's ``model_version`` (default ``1``).
        image_preprocessing: image models: the preprocessing declaration (JSON, :mod:`consumer.model.vision`),
            overriding the model metadata's.
    """

    execution_provider: Literal["auto", "cuda", "cpu"] = "auto"
    require_gpu: bool = False
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    intra_op_spinning: bool = False
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    tensorrt: bool = False
    trt_engine_cache_dir: Path | None = None
    fp16: bool = False
    max_batch_size: int = 64
    model_name: str | None = None
    model_version: str | None = None
    image_preprocessing: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> SessionOptions:
        """The options of the service's settings (the settings of the same names)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


def open_session(path: Path, options: SessionOptions = SessionOptions()) -> OpenSession:
    """Create the session and read the signature (sequence layout, value ranges, image preprocessing) from the graph.

    ``auto`` asks for CUDA when the installed onnxruntime offers it and a GPU is visible, and falls back to
    CPU; ONNX Runtime drops a provider it cannot initialise without raising (it logs a warning and runs on
    CPU), so the active provider is read back from the session and logged.

    Raises:
        ModelError: the file cannot be loaded (external-data weights missing beside it included), an input or
            output cannot be served (:mod:`consumer.model.compat`: the message names it and the export option that
            fixes it), the metadata is malformed, or ``require_gpu`` / ``execution_provider=cuda`` / ``tensorrt`` /
            ``fp16`` is set and CUDA (or TensorRT) is not active.
        ConfigError: ``image_preprocessing`` does not fit the model (:func:`consumer.model.vision.preprocessing`).
    """
    ort = import_onnxruntime()
    o = options
    available = ort.get_available_providers()
    gpu_wanted = o.execution_provider == "cuda" or o.require_gpu or o.tensorrt or o.fp16
    if o.execution_provider == "cpu":
        names = [CPU]
    elif gpu_wanted:
        if CUDA not in available:
            raise ModelError(f"a GPU was asked for: this onnxruntime offers only {available}")
        names = [CUDA, CPU]
    else:  # auto: CUDA only where a GPU is really present, so CPU machines start without CUDA load errors
        names = [CUDA, CPU] if CUDA in available and gpu_count() > 0 else [CPU]
    ort_options = ort.SessionOptions()
    ort_options.intra_op_num_threads = o.intra_op_threads
    ort_options.inter_op_num_threads = o.inter_op_threads
    ort_options.graph_optimization_level = OPTIMIZATION_LEVELS[o.graph_optimization_level](ort)
    spin = "1" if o.intra_op_spinning else "0"
    ort_options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    ort_options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    providers: list[Any] = list(names)
    model: str | bytes = str(path)
    if o.tensorrt:
        if TENSORRT not in available:
            raise ModelError(f"tensorrt=true: this onnxruntime offers only {available}")
        planned, _ = _signature(
            _open(ort, model, ort.SessionOptions(), [CPU]), path, o.model_name, o.model_version, o.image_preprocessing
        )
        providers.insert(0, (TENSORRT, _trt_options(planned, o.max_batch_size, o.trt_engine_cache_dir, o.fp16)))
    elif o.fp16 and names[0] == CUDA:
        model = _float16(path)
    session = _open(ort, model, ort_options, providers)
    active = session.get_providers()[0]
    log.info("execution providers: asked %s, active %s", [p if isinstance(p, str) else p[0] for p in providers], active)
    if gpu_wanted and active not in (CUDA, TENSORRT):
        raise ModelError(f"a GPU execution provider was requested but ONNX Runtime is running on {active}")
    if o.tensorrt and active != TENSORRT:
        raise ModelError(f"tensorrt=true but ONNX Runtime is running on {active}")
    signature, zipmaps = _signature(session, path, o.model_name, o.model_version, o.image_preprocessing)
    device_id = int(session.get_provider_options().get(active, {}).get("device_id", 0))
    log.info("model %s v%s loaded on %s", signature.name, signature.version, active)
    return OpenSession(session, signature, zipmaps, active, device_id)


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
