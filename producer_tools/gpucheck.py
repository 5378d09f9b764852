"""``scripts/gpu-check``'s measurement: MiniLM through bare ONNX Runtime and through streaminfer's pipeline, per
execution provider, without a broker (a GPU machine here reaches nothing, Kafka included).

The pipeline is the consumer's own code path from record value to encoded result: :class:`StreamInferApp`'s
decode (tokenizing the text), length bucketing, micro-batching, padding into the pipeline's buffers, ONNX Runtime
in its thread (IO binding on CUDA) and response encoding; only the Kafka fetch and produce are left out (records
come from memory, results are counted). Bare ONNX Runtime runs the same texts, tokenized beforehand, sorted by
length and padded per batch of ``--batch`` rows (its best case). Prints one line per run and::

    gpu-check: provider=CUDAExecutionProvider pipeline_vs_bare_ort=R cuda_vs_cpu=S

Exit 1 when CUDA was asked for and is not active (``require_gpu``), so a silent CPU fallback cannot pass.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, cast

from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from consumer.app import StreamInferApp, Work
from consumer.codec import encode_request
from consumer.config import Settings
from consumer.errors import ModelError
from consumer.metrics import Metrics
from consumer.offsets import OffsetTracker
from consumer.runner import OnnxRunner, warmup_plan
from producer_tools.bench import corpus, sorted_batches


class OfflineApp(StreamInferApp):
    """The consumer with its Kafka ends cut off: results are counted instead of produced."""

    answered = 0

    def _spawn_publish(self, items: list[Work]) -> None:
        self.answered += len(items)


async def pipeline(settings: Settings, runner: OnnxRunner, values: Sequence[bytes]) -> float:
    """Push ``values`` through the consumer's decode -> batch -> infer -> encode path; returns records/s."""
    app = OfflineApp(settings, runner, Metrics(CollectorRegistry()))
    app._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streaminfer-ort")
    tracker: OffsetTracker[str] = OffsetTracker()
    offsets = tracker.partition("p0")
    started = time.perf_counter()
    loop = asyncio.create_task(app._batch_loop())
    for i, value in enumerate(values):
        rec = ConsumerRecord("t", 0, i, 0, 0, None, value, None, 0, len(value), [])
        work = app._decode(rec, offsets, app._parse(rec))
        if work.request is not None:
            app._queue(app._batcher, work)
        if i % 256 == 0:
            await asyncio.sleep(0)  # let batches start while records still arrive, as a fetch loop would
    app._batcher.close()
    await loop
    elapsed = time.perf_counter() - started
    app._executor.shutdown()
    app._decoder.shutdown()
    if app.answered != len(values):
        raise RuntimeError(f"pipeline answered {app.answered} of {len(values)} records")
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
        execution_provider=provider,
        require_gpu=provider == "cuda",
        max_batch_size=batch,
        tensorrt=tensorrt,
        fp16=fp16,
    )
    sizes, lengths = warmup_plan(runner, batch)
    runner.warmup(sizes, 1, lengths)
    settings = Settings(model_path=model, tokenizer_path=tokenizer, max_batch_size=batch, http_port=0)
    values = [encode_request(None, {"text": [t]}) for t in texts]
    bare_rps = bare(runner, tokenizer, texts, batch)
    pipe_rps = asyncio.run(pipeline(settings, runner, values))
    return {"provider": runner.provider, "bare_ort_rps": bare_rps, "pipeline_rps": pipe_rps}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m producer_tools.gpucheck --model M --tokenizer T``."""
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--texts", type=int, default=4000)
    p.add_argument("--cpu-texts", type=int, default=500, help="texts for the (slow) CPU runs")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--providers", default="cuda,cpu", help="comma-separated: cuda, cpu")
    p.add_argument("--tensorrt", action="store_true")
    p.add_argument("--fp16", action="store_true")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
