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
- **Answer**: outputs cut back per request (per-token outputs of sequence models also to the request's own
  length); a record whose outputs hold NaN or Inf is ``non_finite_output``; responses are encoded for the whole
  batch at once (:class:`~consumer.oip.encode.BatchEncoder`), record by record only where a request asked for some
  outputs or the binary extension.

Time goes to ``streaminfer_stage_seconds_total`` (assemble, infer, encode); ``streaminfer_inference_seconds`` and
``streaminfer_batch_rows`` are observed once per batch that ran.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from consumer import fate
from consumer.errors import DeadLetterReason, InferenceError, RecordError
from consumer.events.enrich import EnrichedAnswers
from consumer.model.buffers import BatchBuffers
from consumer.model.runner import OnnxRunner, split
from consumer.model.sequence import CPU_BUCKETS, GPU_BUCKETS, bucket, length_buckets
from consumer.model.session import CPU
from consumer.oip.encode import BatchEncoder, encode_response, encode_response_binary
from consumer.oip.proto import response as proto_response
from consumer.ops.metrics import Metrics
from consumer.ops.tracing import Tracing
from consumer.schema import floating
from consumer.timeouts import Backoff
from consumer.work import DecodedRequest, Work, loggable

log = logging.getLogger(__name__)

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
        enriched: events with enriched results: their encoder (:class:`consumer.events.enrich.EnrichedAnswers`);
            None: OIP responses.

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
        enriched: EnrichedAnswers | None = None,
    ) -> None:
        self.runner = runner
        self._enriched = enriched
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
        self._names = runner.signature.output_names
        self._per_token = {o.name for o in runner.signature.outputs if len(o.shape) >= 2 and o.shape[1] is None}
        self._encoder = BatchEncoder(runner.signature)
        self._executor: ThreadPoolExecutor | None = None
        #: Run batches on the event loop: the largest batch computed in under INLINE_BELOW_S at warmup.
        self.inline = runner.batch_seconds is not None and runner.batch_seconds < INLINE_BELOW_S
        self._stages = {name: metrics.stage_seconds.labels(name) for name in ("assemble", "infer", "encode")}

    def group(self, request: DecodedRequest) -> tuple[Hashable, int]:
        """The micro-batching group of a request and its cost in tokens: its non-batch shape (tokens 0), or for a
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

    async def run(self, batch: Sequence[Work], buffers: BatchBuffers) -> None:
        """Run ``batch`` (every item holds a request) and set each item's ``result`` or ``error``.

        Never raises for a record's fault: a failing batch is bisected so that only the culprit is dead-lettered.
        """
        if self._tracing is None:
            await self._run(batch, buffers)
            return
        rows = sum(w.request.rows for w in batch if w.request is not None)
        with self._tracing.batch(batch, rows, self.runner.signature.name, self.runner.provider):
            await self._run(batch, buffers)

    async def _run(self, batch: Sequence[Work], buffers: BatchBuffers) -> None:
        requests = [w.request for w in batch if w.request is not None]
        started = self._clock()
        feeds, rows, length = self._assemble(requests, buffers)
        ran = self._clock()
        self._stages["assemble"].inc(ran - started)
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
                await self.run(batch[:mid], buffers)
                await self.run(batch[mid:], buffers)
                return
        done = self._clock()
        self._stages["infer"].inc(done - ran)
        self._metrics.inference_seconds.observe(done - ran)
        self._metrics.batch_rows.observe(rows)
        self._answer(batch, requests, outputs, length)
        self._stages["encode"].inc(self._clock() - done)

    def _assemble(self, requests: Sequence[DecodedRequest], buffers: BatchBuffers) -> tuple[dict[str, Any], int, int]:
        """Feeds for ONNX Runtime and (rows, padded length in tokens or 0)."""
        if self._sequence is None:
            if len(requests) == 1:
                return dict(requests[0].inputs), requests[0].rows, 0
            runs = _block_runs(requests)
            if runs is not None and len(runs) == 1:  # consecutive rows of one block: a view, no copy
                block, start, stop = runs[0]
                return {name: arr[start:stop] for name, arr in block.items()}, stop - start, 0
            if runs is not None:  # runs of a few blocks (a micro-batch across fetched chunks): a copy per run
                feeds, rows = buffers.stack(
                    [{n: a[start:stop] for n, a in block.items()} for block, start, stop in runs]
                )
                return feeds, rows, 0
            feeds, rows = buffers.stack([r.inputs for r in requests])
            return feeds, rows, 0
        if len(requests) == 1:
            feeds, rows, length = dict(requests[0].inputs), requests[0].rows, requests[0].length
        else:
            feeds, rows, length = buffers.pad([r.inputs for r in requests])
        real = sum(r.rows * r.length for r in requests)
        self._metrics.batch_padding_ratio.observe(rows * length / max(1, real))
        return feeds, rows, length

    def _answer(
        self, batch: Sequence[Work], requests: Sequence[DecodedRequest], outputs: dict[str, np.ndarray], length: int
    ) -> None:
        """Set each item's result (or error) from the batch's outputs."""
        if self._enriched is not None:  # events: one row each, every output, enriched
            self._answer_batch(batch, requests, outputs)
            return
        if self._sequence is None and all(r.outputs is None and not r.binary_output for r in requests):
            try:
                self._answer_batch(batch, requests, outputs)
                return
            except (KeyError, TypeError, ValueError):  # an output OIP JSON cannot carry: say so record by record
                pass
        names = self._names
        signature = self.runner.signature
        parts = split(outputs, [r.rows for r in requests], signature.whole_outputs)
        for work, request, part in zip(batch, requests, parts, strict=True):
            chosen = [(n, self._unpad(n, part[n], length, request.length)) for n in (request.outputs or names)]
            bad = non_finite(chosen, [request.rows], signature.whole_outputs)
            if bad is not None:
                work.error = non_finite_error(bad[0])
                continue
            response_id = work.correlation_id.decode("utf-8", "backslashreplace")
            try:
                if request.protobuf:
                    work.result = proto_response(*encode_response_binary(response_id, signature, chosen))
                elif request.binary_output:
                    work.result, work.result_json_length = encode_response_binary(response_id, signature, chosen)
                else:
                    work.result = encode_response(response_id, signature, chosen)
            except (KeyError, TypeError, ValueError) as exc:  # an output dtype OIP JSON cannot carry
                work.error = InferenceError(
                    DeadLetterReason.INFERENCE_ERROR, f"response cannot be encoded: {type(exc).__name__}: {exc}"
                )

    def _answer_batch(
        self, batch: Sequence[Work], requests: Sequence[DecodedRequest], outputs: dict[str, np.ndarray]
    ) -> None:
        """Every output for every request, encoded for the whole batch; non-finite rows found with one check."""
        rows = [r.rows for r in requests]
        chosen = [(name, outputs[name]) for name in self._names]
        results: Sequence[bytes | RecordError]
        if self._enriched is not None:
            results = self._enriched.encode(batch, outputs)
        else:
            ids = [w.correlation_id.decode("utf-8", "backslashreplace") for w in batch]
            results = self._encoder.encode(ids, rows, chosen)
        bad = non_finite(chosen, rows, self.runner.signature.whole_outputs)
        for i, (work, result) in enumerate(zip(batch, results, strict=True)):
            if bad is not None and bad[i]:
                work.error = non_finite_error(bad[i])
            elif isinstance(result, RecordError):  # the enriched encoder's
                work.error = result
            else:
                work.result = result

    def _unpad(self, name: str, arr: Any, padded: int, length: int) -> Any:
        """A per-token output (axis 1 dynamic in the graph and equal to the padded length, e.g. token embeddings
        ``[rows, sequence, dim]``) cut back to the request's own length."""
        if not padded or length >= padded or arr.ndim < 2 or arr.shape[1] != padded:
            return arr
        return arr[:, :length] if name in self._per_token else arr


def non_finite(
    outputs: Sequence[tuple[str, np.ndarray]], rows: Sequence[int], whole: Collection[str]
) -> list[list[str]] | None:
    """Which float outputs (bfloat16 included) hold NaN or Inf, per request: JSON cannot carry them.

    Args:
        outputs: (name, array) of a batch: ``[sum(rows), ...]``, or the model's own shape for a name in ``whole``
            (no batch axis: NaN in it spoils every request).
        rows: each request's rows, in order.

    Returns:
        None when every value is finite (one vectorised check per output); else per request the names of its
        outputs that are not (an empty list for a request whose outputs are finite).
    """
    total = sum(rows)
    bad_rows: np.ndarray | None = None
    for name, arr in outputs:
        if floating(arr.dtype):
            if name in whole:
                finite = np.full(total, bool(np.isfinite(arr).all()))
            else:
                finite = np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1)
            if not bool(finite.all()):
                bad_rows = ~finite if bad_rows is None else bad_rows | ~finite
    if bad_rows is None:
        return None
    named: list[list[str]] = []
    start = 0
    for n in rows:
        named.append(
            [
                name
                for name, arr in outputs
                if floating(arr.dtype)
                and bool(bad_rows[start : start + n].any())
                and not bool(np.isfinite(arr if name in whole else arr[start : start + n]).all())
            ]
        )
        start += n
    return named


def non_finite_error(names: Sequence[str]) -> InferenceError:
    """The ``non_finite_output`` dead-letter error of a record whose outputs ``names`` hold NaN or Inf."""
    return InferenceError(DeadLetterReason.NON_FINITE_OUTPUT, f"outputs {list(names)} hold NaN or Inf for this record")


def _block_runs(requests: Sequence[DecodedRequest]) -> list[tuple[Mapping[str, np.ndarray], int, int]] | None:
    """The batch's rows as runs of consecutive rows of their decoded blocks: (block, first row, row after the last),
    in order; None when a request has no block."""
    runs: list[tuple[Mapping[str, np.ndarray], int, int]] = []
    block: Mapping[str, np.ndarray] | None = None
    start = stop = 0
    for request in requests:
        if request.block is None:
            return None
        if request.block is block and request.start == stop:
            stop += request.rows
            continue
        if block is not None:
            runs.append((block, start, stop))
        block, start, stop = request.block, request.start, request.start + request.rows
    assert block is not None
    runs.append((block, start, stop))
    return runs
