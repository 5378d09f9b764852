"""A micro-batch of work items -> input tensors -> ONNX Runtime (in its thread) -> a result or error per item.

- **Assemble**: fixed-shape requests decoded from one chunk are rows of one array, so a batch of consecutive
  ones is fed as a slice of it (no copy); other batches are copied into the pipeline slot's preallocated buffers,
  a run of consecutive rows of one chunk at a time (a batch across two fetched chunks: two copies per input), else
  request by request, sequence models padded to the batch's longest row
  (:class:`~consumer.model.buffers.BatchBuffers`).
- **Infer**: ``OnnxRunner.run`` in the dedicated inference thread, off the event loop (on the loop for a model
  whose largest batch computes in under a millisecond, :data:`INLINE_BELOW_S`); it checks every output's first
  dimension against the batch's rows. A batch whose failure is transient (out of memory) runs again after a
  capped exponential backoff, ``inference_retries`` times; a batch that still fails is bisected until the culprit
  is alone: its neighbours get their results, only it is dead-lettered (``inference_error``).
- **Answer**: the batch's outputs go to the answers room (:class:`consumer.answers.outputs.Answers`), which cuts
  them per request, dead-letters non-finite ones and encodes the responses (or enriched events).

Time goes to ``streaminfer_stage_seconds_total`` (assemble, infer, encode); ``streaminfer_inference_seconds`` and
``streaminfer_batch_rows`` are observed once per batch that ran.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from consumer import fate
from consumer.answers.outputs import Answers
from consumer.errors import InferenceError
from consumer.model.buffers import BatchBuffers
from consumer.model.runner import OnnxRunner
from consumer.model.sequence import CPU_BUCKETS, GPU_BUCKETS, bucket, length_buckets
from consumer.model.session import CPU
from consumer.ops.metrics import Metrics
from consumer.ops.tracing import Tracing
from consumer.timeouts import Backoff
from consumer.work import DecodedRequest, Work, loggable

log = logging.getLogger(__name__)

#: Consecutive rows of one decoded block: (the block, input name -> ``[chunk rows, ...]``; first row; row after
#: the last).
BlockRun = tuple[Mapping[str, np.ndarray], int, int]

#: A model whose largest batch computes in less than this at warmup (seconds) runs on the event loop: handing such
#: a batch to the inference thread and back costs more than the run itself, since the thread must take the GIL
#: back from a busy loop twice per batch (up to the interpreter's 5 ms switch interval each time).
INLINE_BELOW_S = 0.001
#: Sequence models: ``max_batch_tokens`` when the setting is unset, padded tokens per micro-batch. On CPU a batch
#: beyond a few thousand tokens runs slower per token, its activations no longer fit in cache (MiniLM, bench corpus
#: sorted by length, 64 rows at most, 2 cores: about 150 texts/s at 512 to 2048 tokens, 120 at 4096, 100 at 8192);
#: a GPU wants the larger batches.
CPU_BATCH_TOKENS = 2048
GPU_BATCH_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class Scored:
    """A micro-batch (or a bisected part of one) that ran, as a shadow model sees it (:mod:`consumer.shadow`).

    Attributes:
        batch: its items, in order (their results or errors already set).
        requests: their requests, in the same order.
        outputs: the serving model's outputs, name -> ``[sum of the requests' rows, ...]``.
        length: sequence models: the padded length, tokens (0 otherwise).
        runs: the requests' rows as runs of consecutive rows of their decoded blocks (never reused, so a shadow
            model may read them later), in order: (block, first row, row after the last); None when a request has
            no block, or for a sequence model (its feeds are padded).
    """

    batch: Sequence[Work]
    requests: Sequence[DecodedRequest]
    outputs: Mapping[str, np.ndarray]
    length: int
    runs: Sequence[BlockRun] | None = None


class BatchRunner:
    """Runs micro-batches of work items through the model.

    Args:
        runner: a loaded, warmed ONNX runner.
        metrics: stage times, inference time, batch rows, batch failures, padding ratio.
        clock: monotonic seconds.
        max_batch_tokens: sequence models: the micro-batch budget in padded tokens; None: :data:`CPU_BATCH_TOKENS`
            on CPU, :data:`GPU_BATCH_TOKENS` on CUDA and TensorRT.
        retries: runs again of a batch whose failure is transient (``InferenceError.transient``: out of memory),
            after ``backoff``'s pause (awaited with ``sleep``: the event loop, heartbeats included, runs meanwhile),
            before it is bisected.
        tracing: a span per batch run (:mod:`consumer.ops.tracing`), or None.
        answers: turns the batch's outputs into each record's answer (:class:`consumer.answers.outputs.Answers`);
            None: OIP responses for ``runner``'s model.

    Attributes:
        batch_tokens: the batcher's token budget (rows x length bucket), tokens; None for other models.
        buckets: sequence models: the length bucket bounds, tokens (:data:`~consumer.model.sequence.CPU_BUCKETS` on CPU,
            :data:`~consumer.model.sequence.GPU_BUCKETS` otherwise, capped at ``max_sequence_length``); () otherwise.
    """

    def __init__(
        self,
        runner: OnnxRunner,
        metrics: Metrics,
        clock: Callable[[], float],
        max_batch_tokens: int | None = None,
        *,
        retries: int = 0,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tracing: Tracing | None = None,
        answers: Answers | None = None,
    ) -> None:
        self.runner = runner
        self._answers = answers or Answers(runner.signature)
        self._tracing = tracing
        self._retries = retries
        self._backoff = backoff or Backoff()
        self._sleep = sleep
        self._metrics = metrics
        self._clock = clock
        self._sequence = runner.signature.sequence
        cpu = runner.provider == CPU
        self.batch_tokens: int | None = None
        self.buckets: tuple[int, ...] = ()
        if self._sequence is not None:
            default = CPU_BATCH_TOKENS if cpu else GPU_BATCH_TOKENS
            self.batch_tokens = default if max_batch_tokens is None else max_batch_tokens
            self.buckets = length_buckets(self._sequence.max_length, CPU_BUCKETS if cpu else GPU_BUCKETS)
        self._executor: ThreadPoolExecutor | None = None
        #: Run batches on the event loop: the largest batch computed in under INLINE_BELOW_S at warmup.
        self.inline = runner.batch_seconds is not None and runner.batch_seconds < INLINE_BELOW_S
        self._stage_seconds = {name: metrics.stage_seconds.labels(name) for name in ("assemble", "infer", "encode")}

    def lane(self, request: DecodedRequest) -> tuple[Hashable, int]:
        """The micro-batching lane of a request and its cost in tokens: its non-batch shape (tokens 0), or for a
        sequence model its length bucket (tokens: rows x the bucket's length; its exact length where padding is
        not safe for the model)."""
        sequence = self.runner.signature.sequence
        if sequence is None:
            return request.shape_key, 0
        bound = bucket(request.length, self.buckets) if sequence.padding_safe else request.length
        return bound, request.rows * bound

    def buffers(self) -> BatchBuffers:
        """A fresh set of input buffers for one pipeline slot."""
        signature = self.runner.signature
        pads = self._sequence.pad_values if self._sequence is not None else None
        return BatchBuffers({spec.name: spec.dtype for spec in signature.inputs}, pads)

    def start(self) -> None:
        """Start the inference thread."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streaminfer-ort")

    def close(self) -> None:
        """Stop the inference thread once the batch it runs is done."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    async def run(self, batch: Sequence[Work], buffers: BatchBuffers, scored: list[Scored] | None = None) -> None:
        """Run ``batch`` (every item holds a request) and set each item's ``result`` or ``error``.

        Args:
            scored: a shadow model is on: every part of the batch that ran is appended (one :class:`Scored`, more
                after a bisection), for the delivery mode to offer once the answers are handed to the publisher.

        Never raises for a record's fault: a failing batch is bisected so that only the culprit is dead-lettered.
        """
        if self._tracing is None:
            await self._run(batch, buffers, scored)
            return
        rows = sum(w.request.rows for w in batch if w.request is not None)
        with self._tracing.batch(batch, rows, self.runner.signature.name, self.runner.provider):
            await self._run(batch, buffers, scored)

    async def _run(self, batch: Sequence[Work], buffers: BatchBuffers, scored: list[Scored] | None) -> None:
        requests = [w.request for w in batch if w.request is not None]
        started = self._clock()
        feeds, rows, length, runs = self._assemble(requests, buffers)
        ran = self._clock()
        self._stage_seconds["assemble"].inc(ran - started)
        attempt = 0
        while True:
            try:
                if self.inline:
                    outputs = self.runner.run(feeds, rows)
                else:
                    loop = asyncio.get_running_loop()
                    outputs = await loop.run_in_executor(self._executor, self.runner.run, feeds, rows)
                break
            except InferenceError as err:
                action = fate.of_inference(err, attempt, self._retries, alone=len(batch) == 1)
                if action is fate.Action.RETRY:
                    # The same batch again: its records keep their place (answers are published in offset order).
                    delay = self._backoff.delay(attempt)
                    log.warning("inference failed transiently (%s), retry %d of %d in %.2f s: %s",
                                err.transient, attempt + 1, self._retries, delay, err)  # fmt: skip
                    self._metrics.retries.labels("inference", err.transient).inc()
                    attempt += 1
                    await self._sleep(delay)
                    ran = self._clock()
                    continue
                if action is fate.Action.DEAD_LETTER:
                    batch[0].error = err
                    log.warning("inference failed for correlation_id=%s: %s", loggable(batch[0].correlation_id), err)
                    return
                # Bisect: halves that run get their results; only a record that fails alone is dead-lettered. A
                # model whose batch axis is declared dynamic but only runs at batch 1 ends up answered record by
                # record (and a batch too large for the memory left runs as smaller ones).
                self._metrics.batch_failures.inc()
                mid = len(batch) // 2
                await self.run(batch[:mid], buffers, scored)
                await self.run(batch[mid:], buffers, scored)
                return
        done = self._clock()
        self._stage_seconds["infer"].inc(done - ran)
        self._metrics.inference_seconds.observe(done - ran)
        self._metrics.batch_rows.observe(rows)
        self._answers.shape(batch, requests, outputs, length)
        self._stage_seconds["encode"].inc(self._clock() - done)
        if scored is not None:
            scored.append(Scored(batch, requests, outputs, length, runs))

    def _assemble(
        self, requests: Sequence[DecodedRequest], buffers: BatchBuffers
    ) -> tuple[dict[str, Any], int, int, list[BlockRun] | None]:
        """Feeds for ONNX Runtime, rows, the padded length in tokens (or 0), and the requests' block runs
        (:attr:`Scored.runs`)."""
        if self._sequence is None:
            if len(requests) == 1:
                one = requests[0]
                single = [(one.block, one.start, one.start + one.rows)] if one.block is not None else None
                return dict(one.inputs), one.rows, 0, single
            runs = join_runs(requests)
            if runs is not None and len(runs) == 1:  # consecutive rows of one block: a view, no copy
                block, start, stop = runs[0]
                return {name: arr[start:stop] for name, arr in block.items()}, stop - start, 0, runs
            if runs is not None:  # runs of a few blocks (a micro-batch across fetched chunks): a copy per run
                feeds, rows = buffers.stack(
                    [{n: a[start:stop] for n, a in block.items()} for block, start, stop in runs]
                )
                return feeds, rows, 0, runs
            feeds, rows = buffers.stack([r.inputs for r in requests])
            return feeds, rows, 0, None
        if len(requests) == 1:
            feeds, rows, length = dict(requests[0].inputs), requests[0].rows, requests[0].length
        else:
            feeds, rows, length = buffers.pad([r.inputs for r in requests])
        real = sum(r.rows * r.length for r in requests)
        self._metrics.batch_padding_ratio.observe(rows * length / max(1, real))
        return feeds, rows, length, None


class Span(Protocol):
    """Rows of a decoded block, as :func:`join_runs` reads them: a :class:`~consumer.work.DecodedRequest`, or a
    :class:`RunSpan`."""

    @property
    def block(self) -> Mapping[str, np.ndarray] | None:
        """The block (input name -> ``[chunk rows, ...]``), or None: rows of no block."""

    @property
    def start(self) -> int:
        """The first row."""

    @property
    def rows(self) -> int:
        """How many rows."""


class RunSpan(NamedTuple):
    """A :data:`BlockRun`'s rows as a :class:`Span`."""

    block: Mapping[str, np.ndarray] | None
    start: int
    rows: int


def join_runs(spans: Iterable[Span]) -> list[BlockRun] | None:
    """Spans of decoded blocks joined into runs of consecutive rows: (block, first row, row after the last), in
    order, a span that continues the previous one (the same block object, from the row after its last) joined to
    it. It serves the batch's requests (:meth:`BatchRunner._assemble`) and the shadow scorer's parts (their runs).

    Returns:
        the runs; None when a span has no block, or there are no spans.
    """
    runs: list[BlockRun] = []
    block: Mapping[str, np.ndarray] | None = None
    start = stop = 0
    for span in spans:
        if span.block is None:
            return None
        if span.block is block and span.start == stop:
            stop += span.rows
            continue
        if block is not None:
            runs.append((block, start, stop))
        block, start, stop = span.block, span.start, span.start + span.rows
    if block is None:
        return None
    runs.append((block, start, stop))
    return runs
