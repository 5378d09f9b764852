"""``scripts/gpu-check``'s measurement: MiniLM through bare ONNX Runtime and through streaminfer's pipeline, per
execution provider, without a broker (a GPU machine here reaches nothing, Kafka included).

The pipeline is the consumer's own code path from record value to encoded result, through the stages the service
builds (:func:`consumer.delivery.stages.build_stages`): the intake's decode (tokenizing the text), length
bucketing, micro-batching, padding into the pipeline's buffers, ONNX Runtime in its thread (IO binding on CUDA) and
response encoding; only the Kafka fetch and produce are left out (records come from memory). Every record must be
answered with a result: a record dead-lettered at decode or by inference fails the check. Bare ONNX Runtime runs
the same texts, tokenized beforehand, sorted by length and padded per batch of ``--batch`` rows (its best case).
Prints one line per run and::

    gpu-check: provider=CUDAExecutionProvider pipeline_vs_bare_ort=R cuda_vs_cpu=S

Exit 1 when CUDA was asked for and is not active (``require_gpu``), so a silent CPU fallback cannot pass.

With ``--vision-dir`` (models/efficientnet_lite0/build.py's output) it also checks the image path
(:func:`vision`): EfficientNet-Lite0 and its uint8 twin (normalisation in the graph) on each provider, on the sample
photographs preprocessed by the consumer's own :class:`~consumer.model.vision.ImageEncoder`; every provider's
probabilities must equal the CPU plain model's within :data:`GPU_TOLERANCE` with the same top-1 class::

    gpu-check: vision provider=P plain=X/s uint8_graph=Y/s max_diff_vs_cpu=D top1_agree=true
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from consumer.config import Settings
from consumer.delivery.at_least_once import PIPELINE_DEPTH
from consumer.delivery.stages import build_stages
from consumer.errors import ModelError
from consumer.kafka.clients import KafkaClients
from consumer.model.buffers import BatchBuffers
from consumer.model.runner import OnnxRunner, warmup_plan
from consumer.model.session import SessionOptions
from consumer.oip.client import encode_request
from consumer.ops.metrics import Metrics
from consumer.work import Work
from harness.bench import corpus, sorted_batches

#: Records decoded at once, as one fetched chunk.
CHUNK = 256
#: Largest difference between a provider's probabilities and the CPU plain model's on the same images (cuDNN's
#: convolution algorithms and TF32 reorder float32 sums; a probability moves by far less than this).
GPU_TOLERANCE = 2e-3


async def pipeline(settings: Settings, runner: OnnxRunner, values: Sequence[bytes]) -> float:
    """Push ``values`` through the consumer's own stages, built by :func:`consumer.delivery.stages.build_stages` as
    the service builds them and driven through their public methods as at_least_once drives them (the intake's
    decode of fetched chunks, ``Stages.batcher`` / ``Stages.queue``, inference with PIPELINE_DEPTH micro-batches in
    flight in the pipeline slots' buffers); only the Kafka fetch and produce are left out (the Kafka clients are
    built, never connected). Returns records/s.

    Raises:
        RuntimeError: a record was not answered with a result (dead-lettered at decode or by inference): the count
            and the first one's reason are named.
    """
    metrics = Metrics(CollectorRegistry())
    failures: list[BaseException] = []
    stages = build_stages(
        settings,
        runner,
        metrics,
        KafkaClients(settings, {}),
        clock=time.monotonic,
        wall_clock=time.time,
        sleep=asyncio.sleep,
        fail=lambda exc, _name: failures.append(exc),
    )
    batcher = stages.batcher(settings.max_batch_delay_ms)
    slots: asyncio.Queue[BatchBuffers] = asyncio.Queue()
    for _ in range(PIPELINE_DEPTH):
        slots.put_nowait(stages.inference.buffers())
    running: list[asyncio.Task[None]] = []

    async def run(batch: list[Work], buffers: BatchBuffers) -> None:
        try:
            await stages.inference.run(batch, buffers)
        finally:
            slots.put_nowait(buffers)

    async def batches() -> None:
        while (batch := await batcher.next_batch()) is not None:
            running.append(asyncio.create_task(run(batch, await slots.get())))
        await asyncio.gather(*running)

    stages.inference.start()
    tp = TopicPartition("gpu-check", 0)
    works: list[Work] = []
    started = time.perf_counter()
    loop = asyncio.create_task(batches())
    try:
        for first in range(0, len(values), CHUNK):
            records = [
                ConsumerRecord(tp.topic, 0, i, 0, 0, None, v, None, 0, len(v), [])
                for i, v in enumerate(values[first : first + CHUNK], start=first)
            ]
            chunk = await stages.intake.decode({tp: records}, stages.tracker)
            works += chunk
            stages.queue(batcher, [w for w in chunk if w.request is not None])
            await asyncio.sleep(0)  # let batches start while records still arrive, as the fetch task would
        batcher.close()
        await loop
    finally:
        elapsed = time.perf_counter() - started
        stages.inference.close()
        stages.intake.close()
        await stages.source.consumer.stop()
    if failures:
        raise RuntimeError(f"pipeline: a stage failed: {failures[0]!r}")
    unanswered = [w for w in works if w.result is None or w.error is not None]
    if unanswered or len(works) != len(values):
        first_error = next((w.error for w in unanswered if w.error is not None), None)
        why = f"; first: {first_error.reason}: {first_error}" if first_error is not None else ""
        raise RuntimeError(
            f"pipeline answered {len(works) - len(unanswered)} of {len(values)} records with a result{why}"
        )
    return len(values) / elapsed


def bare(runner: OnnxRunner, tokenizer: Path, texts: Sequence[str], batch: int) -> float:
    """Bare ONNX Runtime over the tokenized texts, sorted by length, ``batch`` rows per run; returns rows/s."""
    feeds, _ = sorted_batches(runner, tokenizer, texts, batch)
    runner.run(feeds[0], feeds[0]["input_ids"].shape[0])
    started = time.perf_counter()
    for f in feeds:
        runner.run(f, f["input_ids"].shape[0])
    return len(texts) / (time.perf_counter() - started)


def measure(
    model: Path,
    tokenizer: Path,
    provider: Literal["cuda", "cpu"],
    texts: Sequence[str],
    batch: int,
    tensorrt: bool = False,
    fp16: bool = False,
) -> dict[str, Any]:
    """Bare ORT and pipeline throughput on ``provider`` (``cuda`` or ``cpu``), texts/s.

    Raises:
        ModelError: ``cuda`` was asked for and is not active.
    """
    runner = OnnxRunner.load(
        model,
        SessionOptions(
            execution_provider=provider,
            require_gpu=provider == "cuda",
            max_batch_size=batch,
            tensorrt=tensorrt,
            fp16=fp16,
        ),
    )
    sizes, lengths = warmup_plan(runner, batch)
    runner.warmup(sizes, 1, lengths)
    settings = Settings(model_path=model, tokenizer_path=tokenizer, max_batch_size=batch, http_port=0)
    values = [encode_request(None, {"text": [t]}) for t in texts]
    bare_rps = bare(runner, tokenizer, texts, batch)
    pipe_rps = asyncio.run(pipeline(settings, runner, values))
    return {"provider": runner.provider, "bare_ort_rps": bare_rps, "pipeline_rps": pipe_rps}


def vision(folder: Path, providers: Sequence[str], batch: int) -> bool:
    """The image path per provider (module docstring); True when every provider agrees with the CPU."""
    import numpy as np

    from consumer.model.vision import ImageEncoder

    images = [p.read_bytes() for p in sorted((folder / "samples").glob("*.jpg"))]
    reference: Any = None
    agreed = True
    for provider in ("cpu", *[p for p in providers if p != "cpu"]):
        which = cast(Literal["cuda", "cpu"], provider)
        outputs, rates = [], []
        for name in ("efficientnet_lite0.onnx", "efficientnet_lite0_uint8.onnx"):
            runner = OnnxRunner.load(
                folder / name, SessionOptions(execution_provider=which, require_gpu=which == "cuda")
            )
            prep = runner.signature.image
            assert prep is not None
            encoder = ImageEncoder(prep, threads=1)
            rows = np.stack([encoder.preprocess(images[i % len(images)]) for i in range(batch)])
            encoder.close()
            outputs.append(runner.run({prep.input: rows}, batch)["probabilities"])
            started, runs = time.perf_counter(), 0
            while time.perf_counter() - started < 2.0:
                runner.run({prep.input: rows}, batch)
                runs += 1
            rates.append(runs * batch / (time.perf_counter() - started))
            active = runner.provider
        if reference is None:
            reference = outputs[0]
        diff = max(float(np.abs(o - reference).max()) for o in outputs)
        top1 = all(bool((o.argmax(axis=1) == reference.argmax(axis=1)).all()) for o in outputs)
        agreed = agreed and diff <= GPU_TOLERANCE and top1
        print(
            f"gpu-check: vision provider={active} plain={rates[0]:.0f}/s uint8_graph={rates[1]:.0f}/s "
            f"max_diff_vs_cpu={diff:.2g} top1_agree={str(top1).lower()}"
        )
    return agreed


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m harness.gpucheck --model M --tokenizer T [--vision-dir D]``."""
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--texts", type=int, default=4000)
    p.add_argument("--cpu-texts", type=int, default=500, help="texts for the (slow) CPU runs")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--providers", default="cuda,cpu", help="comma-separated: cuda, cpu")
    p.add_argument("--tensorrt", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--vision-dir", type=Path, default=None, help="EfficientNet-Lite0 and its uint8 twin: check them")
    args = p.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for provider in args.providers.split(","):
        n = args.texts if provider == "cuda" else args.cpu_texts
        on_gpu = provider == "cuda"
        try:
            which = cast(Literal["cuda", "cpu"], provider)
            results[provider] = r = measure(
                args.model, args.tokenizer, which, corpus(n), args.batch, args.tensorrt and on_gpu, args.fp16 and on_gpu
            )
        except ModelError as exc:
            print(f"gpu-check: {provider}: {exc}", file=sys.stderr)
            return 1
        print(
            f"gpu-check: {provider} active={r['provider']} texts={n} bare_ort={r['bare_ort_rps']:.0f}/s "
            f"pipeline={r['pipeline_rps']:.0f}/s ratio={r['pipeline_rps'] / r['bare_ort_rps']:.2f}"
        )
    first = next(iter(results.values()))
    cpu = results.get("cpu")
    speedup = first["pipeline_rps"] / cpu["pipeline_rps"] if cpu and "cuda" in results else float("nan")
    print(
        f"gpu-check: provider={first['provider']} "
        f"pipeline_vs_bare_ort={first['pipeline_rps'] / first['bare_ort_rps']:.2f} cuda_vs_cpu={speedup:.2f}"
    )
    if args.vision_dir is not None:
        try:
            if not vision(args.vision_dir, args.providers.split(","), args.batch):
                print(
                    f"gpu-check: vision: a provider differs from the CPU by more than {GPU_TOLERANCE}", file=sys.stderr
                )
                return 1
        except ModelError as exc:
            print(f"gpu-check: vision: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
