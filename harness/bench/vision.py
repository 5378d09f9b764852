"""The vision part of the benchmark: EfficientNet-Lite0 on JPEG photographs, against its two ceilings.

The ceiling is the slower of the two parts streaminfer is made of here, each alone on this machine:

- **decode-alone**: :class:`consumer.model.vision.ImageEncoder` (Pillow, reduced-scale JPEG decoding, one resize, the
  normalisation) on its thread pool of ``cpus_given()`` threads, over the same images, no Kafka, no model;
- **bare-ort**: ONNX Runtime's ``session.run`` at the consumer's batch size (64) on already preprocessed tensors.

``vision_vs_ceiling`` is streaminfer's closed-loop images/s over min(decode-alone, bare-ort), the median over the
rounds (each round measures all three back to back). Where ONNX Runtime runs on the same CPU cores as the decoding
(no GPU), the two cannot both run at their solo speed: the vision line also prints ``shared_cpu_bound``,
1 / (1 / decode-alone + 1 / bare-ort), what the cores allow when every image costs both.

Beside it: **naive-vision** (PIL, one image at a time; the worker in :mod:`harness.bench.workers`),
streaminfer on the fused uint8 model, and the decoder candidates (Pillow with and without reduced-scale decoding,
simplejpeg and OpenCV where installed) on 1 thread and on the pool, so the choice of library is a measurement.
"""

from __future__ import annotations

import argparse
import io
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from consumer.model.vision import ImageEncoder, cpus_given
from harness.bench.measure import Run, new_topics
from producer_tools.images import sample_images
from producer_tools.produce import image_requests, send_all


class BenchLike(Protocol):
    """What the vision runs use of :class:`harness.bench.plan.Bench`."""

    args: argparse.Namespace
    bootstrap: str
    tag: str
    runs: list[Run]

    def step(self, what: str) -> None:
        """Advance the progress bar."""

    def bare_ort(self, model_name: str, model: Path, batches: Sequence[dict[str, np.ndarray]], setting: str) -> Run:
        """Bare ONNX Runtime over ``batches``."""

    async def closed_streaminfer(
        self, model_name: str, model: Path, topics_backlog: str, n: int, setting: str, **settings: Any
    ) -> Run:
        """streaminfer over a backlog."""

    async def closed_worker(
        self, mode: str, model: Path, backlog: str, n: int, seconds: float, model_name: str = "digits"
    ) -> Run:
        """A baseline worker over a backlog."""


#: The consumer's default max_batch_size: bare ORT runs batches of this many images.
BATCH = 64
#: Each decoder measurement runs for at least this long, s.
DECODE_MIN_S = 1.5
MODEL, FUSED = "efficientnet_lite0.onnx", "efficientnet_lite0_uint8.onnx"


def model_paths(folder: Path) -> tuple[Path, Path]:
    """The plain and fused models in ``folder`` (models/efficientnet_lite0/build.py's output).

    Raises:
        SystemExit: they are not there.
    """
    plain, fused = folder / MODEL, folder / FUSED
    if not plain.is_file() or not fused.is_file():
        raise SystemExit(
            f"streaminfer-bench: no EfficientNet-Lite0 in {folder}; run models/efficientnet_lite0/build.py"
        )
    return plain, fused


async def backlog(bench: BenchLike) -> str:
    """A topic holding ``--images`` records of one JPEG each (the sample photographs, cycled; binary data
    extension), written early so it has settled before it is read."""
    topics = await new_topics(bench.bootstrap, f"{bench.tag}-vision")
    records = list(image_requests("v", sample_images(), "image", 1, bench.args.images))
    await send_all(bench.bootstrap, topics["requests"], records, progress=False)
    return topics["requests"]


def rate(step: Callable[[], int], min_s: float = DECODE_MIN_S) -> tuple[float, int]:
    """(items/s, items) of ``step`` (which returns the items it did) repeated for at least ``min_s`` after one warm
    call."""
    step()
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < min_s:
        done += step()
    return done / (time.perf_counter() - started), done


def decode_alone(encoder: ImageEncoder, images: list[bytes], setting: str, min_s: float = DECODE_MIN_S) -> Run:
    """The consumer's own preprocessing over ``images`` on its pool: the decode ceiling."""
    from consumer.work import DecodedRequest

    def step() -> int:
        pending = []
        for blob in images:
            request = DecodedRequest(None, None, 1, None)
            request.pending = [blob]
            pending.append(request)
        encoder.finish(pending)
        return len(images)

    ips, done = rate(step, min_s)
    return Run("vision", "decode-alone", setting, done, ips, extra={"threads": encoder.threads})


def candidates(images: list[bytes], threads: int, min_s: float = DECODE_MIN_S) -> list[Run]:
    """Decode + resize + centre crop (256 -> 224) per library, on 1 thread and on ``threads``: images/s."""
    from PIL import Image

    def finish(image: Image.Image) -> np.ndarray:
        scale = 256 / min(image.size)
        w, h = image.width * scale, image.height * scale
        box = ((w - 224) / 2 / scale, (h - 224) / 2 / scale, (w + 224) / 2 / scale, (h + 224) / 2 / scale)
        return np.asarray(image.resize((224, 224), Image.Resampling.BILINEAR, box=box))

    def pillow_draft(blob: bytes) -> np.ndarray:
        image = Image.open(io.BytesIO(blob))
        scale = 256 / min(image.size)
        image.draft("RGB", (math.ceil(image.width * scale), math.ceil(image.height * scale)))
        return finish(image.convert("RGB"))

    def pillow_full(blob: bytes) -> np.ndarray:
        return finish(Image.open(io.BytesIO(blob)).convert("RGB"))

    libraries: dict[str, Callable[[bytes], np.ndarray]] = {
        "pillow (reduced-scale JPEG)": pillow_draft,
        "pillow (full decode)": pillow_full,
    }
    try:
        import simplejpeg

        def simple(blob: bytes) -> np.ndarray:
            return finish(
                Image.fromarray(simplejpeg.decode_jpeg(blob, colorspace="RGB", min_height=256, min_width=256))
            )

        libraries["simplejpeg (reduced-scale)"] = simple
    except ImportError:
        pass
    try:
        import cv2

        def opencv(blob: bytes) -> np.ndarray:
            bgr = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
            assert bgr is not None
            return finish(Image.fromarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)))

        libraries["opencv (full decode)"] = opencv
    except ImportError:
        pass
    runs = []
    for name, decode in libraries.items():
        for n in sorted({1, threads}):
            with ThreadPoolExecutor(n) as pool:

                def step(decode: Callable[[bytes], np.ndarray] = decode, pool: ThreadPoolExecutor = pool) -> int:
                    return len(list(pool.map(decode, images)))

                ips, done = rate(step, min_s)
            runs.append(Run("vision", "decode-candidate", f"{name}, {n} thr", done, ips))
    return runs


async def vision(bench: BenchLike, topic: str) -> None:
    """Every vision run, appended to ``bench.runs``."""
    from consumer.model.runner import OnnxRunner
    from consumer.model.session import SessionOptions

    a = bench.args
    plain, fused = model_paths(a.vision_dir)
    images = [blob for _, blob in sample_images()]
    threads = cpus_given()
    min_s = 0.3 if a.quick else DECODE_MIN_S
    bench.runs += candidates(images, threads, min_s)
    runner = OnnxRunner.load(plain, SessionOptions(execution_provider="cpu"))
    prep = runner.signature.image
    assert prep is not None
    encoder = ImageEncoder(prep, threads=threads)
    try:
        tensors = np.stack([encoder.preprocess(images[i % len(images)]) for i in range(BATCH)])
        batches = [{prep.input: tensors} for _ in range(max(1, a.images // (4 * BATCH)))]
        bench.step("vision: decoders")
        n = a.images
        settings: dict[str, Any] = {"image_threads": 0}
        for i in range(a.rounds):
            order = ("decode-alone", "bare-ort", "streaminfer")
            for mode in order[i % 3 :] + order[: i % 3]:
                if mode == "decode-alone":
                    run = decode_alone(encoder, images * 4, f"pillow, {threads} thr", min_s)
                elif mode == "bare-ort":
                    run = bench.bare_ort("vision", plain, batches, f"b{BATCH} preprocessed")
                else:
                    run = await bench.closed_streaminfer("vision", plain, topic, n, f"b{BATCH}/d5ms jpeg", **settings)
                    run.extra["default"] = i == 0
                if i:
                    run.setting = f"{run.setting}, round {i + 1}"
                    run.extra["round"] = i + 1
                bench.runs.append(run)
            bench.step(f"vision: round {i + 1}")
    finally:
        encoder.close()
    uint8 = await bench.closed_streaminfer("vision", fused, topic, n, f"b{BATCH}/d5ms uint8 graph", **settings)
    uint8.mode = "streaminfer-uint8"
    bench.runs.append(uint8)
    bench.runs.append(await bench.closed_worker("naive-vision", plain, topic, n, a.naive_s, model_name="vision"))
    bench.step("vision: fused and naive")


def ceilings(runs: list[Run]) -> list[tuple[Run, Run, Run]]:
    """(decode-alone, bare-ort, streaminfer) of each complete round, round 1 first."""
    by_round: dict[int, dict[str, Run]] = {}
    for run in runs:
        if run.model == "vision" and run.mode in ("decode-alone", "bare-ort", "streaminfer"):
            by_round.setdefault(int(run.extra.get("round", 1)), {})[run.mode] = run
    return [(r["decode-alone"], r["bare-ort"], r["streaminfer"]) for _, r in sorted(by_round.items()) if len(r) == 3]


def vision_ratio(runs: list[Run]) -> float:
    """Median over the rounds of streaminfer / min(decode-alone, bare-ort) (nan without a round)."""
    ratios = [s.throughput_rps / min(d.throughput_rps, b.throughput_rps) for d, b, s in ceilings(runs)]
    return float(np.median(ratios)) if ratios else math.nan


def vision_line(runs: list[dict[str, Any]]) -> str | None:
    """The vision figures in one line: both ceilings, the library, streaminfer, fused, naive; None without them."""
    first = {r["mode"]: r for r in runs if r["model"] == "vision" and not r["extra"].get("round")}
    if not {"decode-alone", "bare-ort", "streaminfer"} <= set(first):
        return None
    decode, bare, ours = first["decode-alone"], first["bare-ort"], first["streaminfer"]
    ceiling = min(decode["throughput_rps"], bare["throughput_rps"])
    shared = 1.0 / (1.0 / decode["throughput_rps"] + 1.0 / bare["throughput_rps"])
    parts = [
        f"vision (EfficientNet-Lite0, images/s, round 1): decode_alone={decode['throughput_rps']:.0f} "
        f"({decode['setting']}; library Pillow {_pillow()})",
        f"bare_ort={bare['throughput_rps']:.0f} (b{BATCH})",
        f"ceiling={ceiling:.0f}",
        f"shared_cpu_bound={shared:.0f}",  # both parts on the same cores, as on a machine without a GPU
        f"streaminfer={ours['throughput_rps']:.0f}",
    ]
    if "streaminfer-uint8" in first:
        parts.append(f"streaminfer_uint8_graph={first['streaminfer-uint8']['throughput_rps']:.0f}")
    if "naive-vision" in first:
        naive = first["naive-vision"]["throughput_rps"]
        parts.append(f"naive={naive:.0f} vs_naive={ours['throughput_rps'] / naive:.2f}" if naive else "naive=0")
    return " ".join(parts)


def _pillow() -> str:
    import PIL

    return str(PIL.__version__)
