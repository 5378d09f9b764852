"""Images in: encoded JPEG/PNG bytes or decoded uint8 pixels -> the model's image tensor, off the event loop.

A request of an image model carries one input (``image`` by default, setting ``image_input_name``), one image per
row, in one of three forms:

- ``BYTES`` ``[rows]``, binary data extension: each element an encoded image (JPEG, PNG, WebP, GIF, BMP, TIFF:
  what Pillow reads), 4-byte little-endian length first, as for any BYTES tensor;
- ``BYTES`` ``[rows]`` in JSON: each element the image's bytes in base64 (RFC 4648, standard alphabet);
- ``UINT8`` ``[rows, H, W, 3]``: pixels already decoded, RGB, row-major (JSON ``data`` or binary).

How an image becomes the model's input is declared once, as JSON, in the model's ONNX metadata under
:data:`METADATA_KEY` (``models/efficientnet_lite0/build.py`` writes it) or in the ``image_preprocessing`` setting,
which wins (:func:`preprocessing`)::

    {"input": "pixels",            # the model input fed (default: the model's only input)
     "layout": "NCHW",             # or "NHWC" (default: NCHW when axis 1 is 3, NHWC when the last axis is 3)
     "size": [224, 224],           # height, width of the model input, px (default: the input's static dims)
     "resize": 256,                # shorter side before the centre crop to size, px (default: no crop, a stretch)
     "mean": [127, 127, 127],      # per channel R, G, B, subtracted from 0-255 pixels (default 0)
     "std": [128, 128, 128],       # per channel, divides after the mean (default 1)
     "interpolation": "bilinear"}  # or "bicubic", "nearest"

Per image: Pillow reads the header first (an image of more than ``image_max_pixels`` pixels is refused as
``too_large`` before its pixels are decoded: decompression bombs); a JPEG is decoded at a reduced scale where the
codec can (libjpeg's DCT scaling, ``Image.draft``: at least the size the resize needs); EXIF orientation is
applied; greyscale, palette, CMYK and 16-bit images are converted to RGB; alpha is composited onto white; then
one resize of the crop's source box to ``size`` (:meth:`PIL.Image.Image.resize` with ``box``: resize and centre
crop in one pass). A float model input gets ``(pixel - mean) / std`` as float32 in its layout; a ``uint8`` input
(a model with the normalisation folded into its graph, run on the GPU: only uint8 pixels cross PCIe) gets the
pixels as they are. Bytes that are no image, a format Pillow cannot read, a truncated or empty file are
``invalid_image``.

The decoding runs on :class:`ImageEncoder`'s own bounded thread pool (``image_threads``, default the CPUs given to
the process); Pillow's decoders and resampling release the GIL, so images of a chunk decode in parallel, and the
intake's decode thread waits on them, never the event loop. The images a consumer holds are bounded by
``max_in_flight_images`` (every image is one row).
"""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from consumer.errors import ConfigError, ModelError, RecordError, ValidationError
from consumer.errors import DeadLetterReason as R
from consumer.json_object import json_object
from consumer.signature import Layout, Preprocessing

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from consumer.signature import ModelSignature

#: ONNX metadata key holding the preprocessing declaration (JSON).
METADATA_KEY = "streaminfer.image"
#: Default pixel budget per image (``image_max_pixels``): 40 megapixels, a 7,300 x 5,500 photograph; Pillow's own
#: decompression-bomb warning starts at 89 M.
DEFAULT_MAX_PIXELS = 40_000_000
#: Where a container's CPU quota is read (cgroup v2 ``cpu.max``: "quota period" in microseconds, or "max").
CGROUP_CPU_FILE = "/sys/fs/cgroup/cpu.max"
#: The colour alpha is composited onto: white, what a viewer shows behind a transparent PNG.
BACKGROUND = (255, 255, 255)

_KEYS = frozenset({"input", "layout", "size", "resize", "mean", "std", "interpolation"})


def preprocessing(
    signature: ModelSignature, metadata: Mapping[str, str], override: str | None = None
) -> Preprocessing | None:
    """The model's image preprocessing: ``override`` (the ``image_preprocessing`` setting, JSON), else its
    metadata's :data:`METADATA_KEY`, else None (not an image model).

    Raises:
        ConfigError: ``override`` (a setting: start-up exit 2) is not a JSON object of the documented keys, names
            an input the model does not have, or does not fit that input's shape or dtype.
        ModelError: the same of the model's own metadata (exit 3).
    """
    raw = override if override is not None else metadata.get(METADATA_KEY)
    if raw is None:
        return None
    where = "image_preprocessing" if override is not None else f"model metadata {METADATA_KEY!r}"
    error = ConfigError if override is not None else ModelError
    declared = json_object(
        raw, lambda text: error(f"{where} is not JSON: {text}"), lambda _kind: error(f"{where} must be a JSON object")
    )
    unknown = sorted(set(declared) - _KEYS)
    if unknown:
        raise error(f"{where}: unknown key {unknown[0]!r}; known: {sorted(_KEYS)}")
    try:
        return _build(signature, declared)
    except (TypeError, ValueError) as exc:
        raise error(f"{where}: {exc}") from None


def _build(signature: ModelSignature, declared: dict[str, Any]) -> Preprocessing:
    name = declared.get("input")
    if name is None:
        if len(signature.inputs) != 1:
            raise ValueError(f"the model has {len(signature.inputs)} inputs; say which one takes images ('input')")
        name = signature.inputs[0].name
    spec = signature.input(name)
    if spec is None:
        raise ValueError(f"the model has no input {name!r}")
    if len(spec.shape) != 4:
        raise ValueError(f"input {name!r} has rank {len(spec.shape)}; images are [rows, 3, H, W] or [rows, H, W, 3]")
    found = declared.get("layout") or ("NCHW" if spec.shape[1] == 3 else "NHWC" if spec.shape[3] == 3 else None)
    if found not in ("NCHW", "NHWC"):
        raise ValueError(f"input {name!r} {list(spec.shape)}: say its layout ('layout': 'NCHW' or 'NHWC')")
    layout: Layout = "NCHW" if found == "NCHW" else "NHWC"
    channels, dims = (spec.shape[1], spec.shape[2:4]) if layout == "NCHW" else (spec.shape[3], spec.shape[1:3])
    if channels not in (3, None):
        raise ValueError(f"input {name!r} has {channels} channels in layout {layout}; RGB needs 3")
    size = declared.get("size", list(dims))
    if not (isinstance(size, list) and len(size) == 2 and all(_count(d) and d > 0 for d in size)):
        raise ValueError(f"'size' must be [height, width] in pixels (> 0); input {name!r} is {list(spec.shape)}")
    for declared_dim, graph_dim in zip(size, dims, strict=True):
        if graph_dim is not None and graph_dim != declared_dim:
            raise ValueError(f"'size' {size} disagrees with input {name!r} {list(spec.shape)}")
    resize = declared.get("resize", 0)
    if not _count(resize) or resize < 0:
        raise ValueError("'resize' must be an integer >= 0 (pixels; 0: no centre crop)")
    if resize and resize < min(size):
        raise ValueError(f"'resize' {resize} is smaller than the crop {size}")
    mean, std = _triple(declared, "mean", 0.0), _triple(declared, "std", 1.0)
    if min(std) <= 0:
        raise ValueError("'std' values must be > 0")
    interpolation = declared.get("interpolation", "bilinear")
    if interpolation not in _FILTERS:
        raise ValueError(f"'interpolation' must be one of {sorted(_FILTERS)}")
    if spec.dtype.kind != "f" and spec.dtype != np.dtype(np.uint8):
        raise ValueError(f"input {name!r} is {spec.dtype}; an image input is float or uint8")
    return Preprocessing(name, layout, size[0], size[1], resize, mean, std, interpolation, spec.dtype)


def _count(value: object) -> bool:
    """An integer that is not a bool (JSON ``true`` is not 1 pixel)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _triple(declared: Mapping[str, Any], key: str, default: float) -> tuple[float, float, float]:
    value = declared.get(key, [default] * 3)
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = [value] * 3
    numbers = isinstance(value, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not (numbers and len(value) == 3):
        raise ValueError(f"{key!r} must be a number or three numbers (R, G, B)")
    return (float(value[0]), float(value[1]), float(value[2]))


_FILTERS = {"nearest": 0, "bilinear": 2, "bicubic": 3}  # PIL.Image.Resampling values


def cpus_given(cpu_file: str = CGROUP_CPU_FILE) -> int:
    """CPUs this process may use, >= 1: its CPU affinity, lowered to a container's cgroup v2 quota (rounded up)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path(cpu_file).read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


class Pending(Protocol):
    """A request whose images wait for :meth:`ImageEncoder.finish` (``consumer.oip.decode.DecodedRequest``)."""

    pending: list[Any] | None

    def complete(self, inputs: dict[str, np.ndarray]) -> None:
        """Take the preprocessed inputs ``[rows, ...]``."""


class ImageEncoder:
    """Request images -> the model's image input, decoded and preprocessed on a bounded thread pool.

    Args:
        prep: the model's preprocessing.
        input_name: the request input that carries images.
        max_pixels: largest accepted image, width x height pixels (above: ``too_large``), checked from the header
            before decoding.
        threads: decode threads; 0: :func:`cpus_given`.
        max_images: largest accepted number of images in one record (``max_in_flight_images``: a record must fit).
        observe: called from the decode thread with each image's preprocessing time, seconds (a metric).
    """

    def __init__(
        self,
        prep: Preprocessing,
        input_name: str = "image",
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        threads: int = 0,
        max_images: int = 256,
        observe: Callable[[Sequence[float]], None] | None = None,
    ) -> None:
        from PIL import Image  # imported only when images are served

        self.prep = prep
        self.input_name = input_name
        self.max_pixels = max_pixels
        self.max_images = max_images
        self.threads = threads or cpus_given()
        self._observe = observe
        self._image = Image
        Image.init()  # Pillow's format plugins, registered once here rather than by the first decodes racing
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="streaminfer-image")
        self._mean = np.array(prep.mean, dtype=np.float32)
        self._scale = np.array([1.0 / s for s in prep.std], dtype=np.float32)

    def close(self) -> None:
        """Stop the decode threads."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def finish(self, outcomes: MutableSequence[Any]) -> None:
        """Decode and preprocess the images of every pending request of a chunk, on the pool, in place: a request
        (a :class:`Pending`: its ``pending`` images not None) gets its input ``[rows, *row_shape]``, or is replaced
        by the error of its first bad image; the other outcomes are left as they are."""
        jobs: list[tuple[int, Any]] = []
        for i, outcome in enumerate(outcomes):
            images = getattr(outcome, "pending", None)
            if images is not None:
                jobs += [(i, element) for element in images]
        if not jobs:
            return
        done = list(self._pool.map(self._one, [element for _, element in jobs]))
        if self._observe is not None:
            self._observe([seconds for _, seconds in done])
        by_request: dict[int, list[np.ndarray | RecordError]] = {}
        for (i, _), (result, _) in zip(jobs, done, strict=True):
            by_request.setdefault(i, []).append(result)
        for i, results in by_request.items():
            error = next((r for r in results if isinstance(r, RecordError)), None)
            if error is not None:
                outcomes[i] = error
                continue
            request: Pending = outcomes[i]
            request.complete({self.prep.input: np.stack([r for r in results if isinstance(r, np.ndarray)])})

    def _one(self, element: Any) -> tuple[np.ndarray | RecordError, float]:
        """One image -> (its preprocessed row, or the error), seconds spent; runs on the pool."""
        started = time.perf_counter()
        try:
            result: np.ndarray | RecordError = self.preprocess(element)
        except RecordError as err:
            result = err
        return result, time.perf_counter() - started

    def preprocess(self, element: bytes | np.ndarray) -> np.ndarray:
        """One image (encoded bytes, or ``[H, W, 3]`` uint8 RGB) -> its row of the model input.

        Returns:
            ``row_shape`` of the model input's dtype: float ``(pixel - mean) / std`` or uint8 pixels.

        Raises:
            ValidationError: invalid_image (not an image Pillow can read, truncated, empty), too_large (more than
                ``max_pixels`` pixels).
        """
        image = self._open(element) if isinstance(element, bytes) else self._image.fromarray(element, "RGB")
        prep = self.prep
        resized = image.resize(
            (prep.width, prep.height), _FILTERS[prep.interpolation], box=prep.source_box(*image.size)
        )
        pixels = np.asarray(resized, dtype=np.uint8)
        raw = prep.dtype == np.dtype(np.uint8)
        out = pixels if raw else (pixels.astype(np.float32) - self._mean) * self._scale
        if prep.layout == "NCHW":
            out = out.transpose(2, 0, 1)
        return np.ascontiguousarray(out, dtype=prep.dtype)

    def _open(self, data: bytes) -> PILImage.Image:
        """Encoded bytes -> an RGB Pillow image, decoded at the smallest scale the resize allows."""
        Image = self._image
        if not data:
            raise ValidationError(R.INVALID_IMAGE, "an image of 0 bytes")
        try:
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > self.max_pixels:
                raise ValidationError(
                    R.TOO_LARGE, f"image of {width} x {height} pixels; image_max_pixels is {self.max_pixels}"
                )
            if width < 1 or height < 1:
                raise ValidationError(R.INVALID_IMAGE, f"an image of {width} x {height} pixels")
            if image.format == "JPEG" and image.mode in ("RGB", "L", "YCbCr", "CMYK"):
                left, top, right, bottom = self.prep.source_box(width, height)
                need = max(self.prep.width / (right - left), self.prep.height / (bottom - top))
                image.draft("RGB", (math.ceil(width * need), math.ceil(height * need)))
            image.load()
            return _rgb(image)
        except RecordError:
            raise
        except Image.DecompressionBombError as exc:
            raise ValidationError(R.TOO_LARGE, f"image refused by Pillow's decompression-bomb check: {exc}") from None
        except Image.UnidentifiedImageError:
            raise ValidationError(R.INVALID_IMAGE, "cannot decode the image: not a format Pillow reads") from None
        except (OSError, ValueError, SyntaxError, EOFError, TypeError, IndexError, KeyError, MemoryError) as exc:
            # Pillow raises UnidentifiedImageError (OSError) for unknown bytes, OSError for truncated data, and
            # various others from its format plugins on hostile files.
            raise ValidationError(R.INVALID_IMAGE, f"cannot decode the image: {type(exc).__name__}: {exc}") from None


def _rgb(image: PILImage.Image) -> PILImage.Image:
    """Any mode -> RGB: EXIF orientation applied, alpha composited onto :data:`BACKGROUND`, 16-bit scaled."""
    from PIL import Image, ImageOps

    image = ImageOps.exif_transpose(image) or image
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16"):  # 16-bit greyscale: the high byte (no float copy of a large image)
        image = Image.fromarray((np.asarray(image, dtype=np.uint16) >> 8).astype(np.uint8), "L")
    elif image.mode in ("I", "F"):  # 32-bit integer or float greyscale: scaled by its own maximum
        values = np.asarray(image, dtype=np.float32)
        values *= 255.0 / max(float(values.max()), 1.0)
        image = Image.fromarray(np.clip(values, 0, 255, out=values).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
