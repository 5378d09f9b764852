"""The shadow scorer: micro-batches the serving model answered -> a bounded queue -> the candidate, in its own
thread -> the comparison (and the candidate's answers, where ``shadow_results_topic`` is set).

The delivery modes :meth:`~ShadowScorer.offer` a micro-batch's :class:`~consumer.inference.Scored` parts once its
answers were handed to the publisher (at_least_once) or written into their transactions (exactly_once). Offering
is one counter check and a queue put on the event loop: it never waits, and never touches what is served. When
``shadow_max_pending`` batches are offered and not yet scored, the next one is shed whole
(``streaminfer_shadow_shed_batches_total`` and ``_shed_rows_total``): a candidate slower than the stream gets a
sample of it instead of slowing the consumer. After each run the thread rests (:func:`rest_seconds`) so that it
scores at most ``shadow_max_busy_share`` of the time: a candidate slower than the stream then takes at most that
share of a core from the serving path, and sheds the rest.

The thread (``streaminfer-shadow``, neither the serving model's inference thread nor its session) assembles the
candidate's feeds from the parts' block runs (views of the decoded blocks, or one concatenation), else from the
requests (its own buffers: the serving path reuses its own as soon as a batch ran),
runs the candidate (``OnnxRunner.run`` releases the GIL), compares its outputs with the serving model's
(:mod:`consumer.shadow.compare`) and counts (:mod:`consumer.shadow.metrics`). A candidate that fails on a batch
is counted (``streaminfer_shadow_failures_total``), never retried, never bisected.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from consumer.answers.records import AnswerRecords
from consumer.config import Settings
from consumer.errors import InferenceError
from consumer.inference import BlockRun, RunSpan, Scored, join_runs
from consumer.kafka.clients import Clients
from consumer.model.buffers import BatchBuffers
from consumer.model.runner import OnnxRunner
from consumer.oip.encode import BatchEncoder
from consumer.shadow.answers import ShadowAnswers
from consumer.shadow.compare import Plan, compare, plan
from consumer.shadow.metrics import ShadowMetrics
from consumer.signature import ModelSignature
from consumer.work import DecodedRequest, Work

log = logging.getLogger(__name__)

#: The thread is woken once this share of ``shadow_max_pending`` batches is queued (a quarter: the rest absorbs the
#: batches that arrive while it waits for the GIL) (or :data:`FLUSH_S` after the
#: first one), and scores them in one run: a wake-up per micro-batch would make the thread and a busy event loop
#: hand the GIL to each other hundreds of times a second (each hand-over costs both threads CPU).
WAKE_SHARE = 0.25
#: Longest time a queued micro-batch waits for others before the thread scores what is queued, seconds.
FLUSH_S = 0.05


def rest_seconds(busy: float, max_busy_share: float) -> float:
    """How long the thread rests after scoring for ``busy`` seconds so that it scores at most ``max_busy_share``
    of the time (``shadow_max_busy_share``, in (0, 1]): ``busy * (1 / share - 1)``, seconds (0 for a share of 1)."""
    return max(0.0, busy) * (1.0 / max_busy_share - 1.0)


#: Longest wait at stop for the batch the candidate is scoring, seconds (the thread is a daemon: a longer one is
#: left behind, its answers unsent).
STOP_WAIT_S = 5.0


class ShadowScorer:
    """Scores offered micro-batches with the candidate and compares them with the serving model's outputs.

    Args:
        candidate: the loaded, checked candidate (:func:`consumer.shadow.candidate.load_candidate`).
        serving: the serving model's signature (its inputs' dtypes and padding, its outputs).
        registry: where ``streaminfer_shadow_*`` are registered (the service's).
        max_pending: ``shadow_max_pending``: batches offered and not yet scored, at most; one more is shed.
        max_busy_share: ``shadow_max_busy_share``: the share of the time the thread may score (:func:`rest_seconds`
            after each run, of the thread's own CPU time: the candidate's one intra-op thread is the calling thread,
            and the time it waits for the GIL is not counted); 1: no rest.
        clock: monotonic seconds (``streaminfer_shadow_seconds``).
        answers: ``shadow_results_topic``'s producer, or None when the candidate's answers are only compared.
        records: builds the answers' records (key, correlation ID, request timestamp and trace headers).
    """

    def __init__(
        self,
        candidate: OnnxRunner,
        serving: ModelSignature,
        registry: CollectorRegistry,
        *,
        max_pending: int,
        max_busy_share: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        answers: ShadowAnswers | None = None,
        records: AnswerRecords | None = None,
    ) -> None:
        self.candidate = candidate
        self.plan: Plan = plan(serving, candidate.signature)
        self.metrics = ShadowMetrics(registry, self.plan)
        self.answers = answers
        self.records = records
        self._encoder = BatchEncoder(candidate.signature)
        self._max_pending = max_pending
        self._max_busy_share = max_busy_share
        self._wake = max(1, int(max_pending * WAKE_SHARE))
        self._clock = clock
        self._names = [spec.name for spec in candidate.signature.inputs]
        self._outputs = list(candidate.signature.output_names)
        sequence = serving.sequence
        self._sequence = sequence is not None
        #: Micro-batches queued together may run as one: every output of both models has a batch axis.
        self._mergeable = all(o.batched for o in (*serving.outputs, *candidate.signature.outputs))
        pads = sequence.pad_values if sequence is not None else None
        self._buffers = BatchBuffers({spec.name: spec.dtype for spec in serving.inputs}, pads)
        self._queue: deque[Scored] = deque()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._pending = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Batches offered and not yet scored (queued or in the candidate)."""
        return self._pending

    async def start(self) -> None:
        """Start the thread (and the answers' producer).

        Raises:
            aiokafka.errors.KafkaError: ``shadow_results_topic``'s producer cannot reach the broker.
        """
        if self.answers is not None:
            await self.answers.start()
        self._thread = threading.Thread(target=self._work, name="streaminfer-shadow", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Drop what is queued, wait for the batch in the candidate (at most :data:`STOP_WAIT_S`), close the
        answers' producer (what it holds is flushed within its own timeout)."""
        with self._lock:
            self._closing = True
            dropped = len(self._queue)
            self._queue.clear()
            self._pending -= dropped
            self._ready.notify()
        if dropped:
            log.info("shadow: %d offered batches left unscored at stop", dropped)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, STOP_WAIT_S)
        if self.answers is not None:
            await self.answers.stop()

    def offer(self, scored: Sequence[Scored]) -> None:
        """Queue each part for the candidate, or shed it when ``max_pending`` are pending. Never blocks."""
        with self._lock:
            was_empty = not self._queue
            for part in scored:
                if self._closing:
                    return
                if self._pending >= self._max_pending:
                    self.metrics.shed_batches.inc()
                    self.metrics.shed_rows.inc(sum(r.rows for r in part.requests))
                    continue
                self._pending += 1
                self._queue.append(part)
            self.metrics.pending.set(self._pending)
            if self._queue and (was_empty or len(self._queue) >= self._wake):  # the first ones (its timer), or enough
                self._ready.notify()

    def run_pending(self) -> int:
        """Score what is queued in the calling thread (tests; the thread does this itself), as the thread would:
        what is queued together is scored together. Returns batches scored."""
        parts = self._take(wait=False)
        if parts:
            self._score_counted(parts)
        return len(parts)

    def _work(self) -> None:
        while parts := self._take(wait=True):
            started = time.thread_time()  # this thread's CPU: not the time it waited for the GIL
            self._score_counted(parts)
            self._rest(rest_seconds(time.thread_time() - started, self._max_busy_share))

    def _rest(self, seconds: float) -> None:
        """Score nothing for ``seconds`` (offers queue meanwhile, and are shed beyond ``max_pending``); stop ends
        the rest at once."""
        if seconds > 0:
            with self._lock:
                self._ready.wait_for(lambda: self._closing, timeout=seconds)

    def _take(self, *, wait: bool) -> list[Scored]:
        """Everything queued (empty when closing, or when nothing is and ``wait`` is False); ``wait``: once the
        wake-up share is queued, or :data:`FLUSH_S` after the first batch was (monotonic time: the thread's own)."""
        with self._lock:
            deadline: float | None = None
            while wait and not self._closing and len(self._queue) < self._wake:
                if not self._queue:
                    deadline = None
                    self._ready.wait()
                    continue
                now = time.monotonic()
                deadline = now + FLUSH_S if deadline is None else deadline
                if now >= deadline:
                    break
                self._ready.wait(deadline - now)
            if self._closing:
                return []
            parts = list(self._queue)
            self._queue.clear()
            return parts

    def _score_counted(self, parts: list[Scored]) -> None:
        try:
            for group in self._groups(parts):
                self.score(group)
        except Exception:  # a bug here must not end the thread: the serving path never waits on it
            log.exception("shadow: scoring a batch failed")
            self.metrics.failures.inc()
        finally:
            with self._lock:
                self._pending -= len(parts)
                self.metrics.pending.set(self._pending)

    def _groups(self, parts: list[Scored]) -> list[list[Scored]]:
        """The parts scored in one run each: all together, unless a sequence model's (padded lengths differ) or
        an output without a batch axis keeps them apart."""
        if len(parts) == 1 or self._sequence or not self._mergeable:
            return [[part] for part in parts]
        return [parts]

    def score(self, parts: Sequence[Scored]) -> None:
        """Run the candidate once on ``parts``' requests together (micro-batches queued together: one run, so the
        thread takes the GIL back from a busy event loop once, not once per batch), compare, count, and hand its
        answers to the producer.

        Raises:
            Exception: a bug of this module's own (the thread logs and counts it); the candidate's own failures
                are counted here.
        """
        started = self._clock()
        feeds, rows = self._feeds(parts)
        serving: Mapping[str, np.ndarray] = parts[0].outputs
        if len(parts) > 1:
            serving = {name: np.concatenate([p.outputs[name] for p in parts]) for name in parts[0].outputs}
        try:
            outputs = self.candidate.run(feeds, rows)
        except InferenceError as err:
            self.metrics.failures.inc()
            log.warning("shadow: the candidate failed on %d rows: %s", rows, err)
            return
        seconds = self._clock() - started
        self.metrics.observe(compare(self.plan, serving, outputs, rows), seconds)
        if self.answers is not None:
            requests = [r for p in parts for r in p.requests]
            self._answer([w for p in parts for w in p.batch], requests, outputs)

    def _feeds(self, parts: Sequence[Scored]) -> tuple[dict[str, np.ndarray], int]:
        """The candidate's inputs of ``parts``' requests, in order, assembled as the serving model's were.

        Where every part knows its block runs (:attr:`~consumer.inference.Scored.runs`: OIP chunks and events,
        decoded into blocks that are never reused), no request is looked at: runs that continue each other are
        joined, one run is a view of its block (no copy), several are concatenated (one copy per input). Otherwise
        the requests' own inputs are stacked into this thread's buffers (padded to the longest row for a sequence
        model).

        Returns:
            (feeds, rows): candidate input name -> ``[rows, ...]`` of the serving model's dtype, and the rows.
        """
        runs = block_runs(parts)
        if runs is not None:
            if len(runs) == 1:
                block, start, stop = runs[0]
                return {name: block[name][start:stop] for name in self._names}, stop - start
            feeds = {name: np.concatenate([b[name][start:stop] for b, start, stop in runs]) for name in self._names}
            return feeds, sum(stop - start for _, start, stop in runs)
        requests = [r for p in parts for r in p.requests]
        mapping: Mapping[str, np.ndarray]
        if len(requests) == 1:
            mapping, rows = requests[0].inputs, requests[0].rows
        elif self._sequence:
            mapping, rows, _ = self._buffers.pad([r.inputs for r in requests])
        else:
            mapping, rows = self._buffers.stack([r.inputs for r in requests])
        return {name: mapping[name] for name in self._names}, rows

    def _answer(self, batch: Sequence[Work], requests: Sequence[DecodedRequest], outputs: Mapping[str, Any]) -> None:
        """The candidate's OIP responses, one per request, to ``shadow_results_topic``."""
        assert self.answers is not None
        assert self.records is not None
        ids = [w.correlation_id.decode("utf-8", "backslashreplace") for w in batch]
        try:
            values = self._encoder.encode(ids, [r.rows for r in requests], [(n, outputs[n]) for n in self._outputs])
        except (KeyError, TypeError, ValueError) as exc:  # an output OIP JSON cannot carry
            log.warning("shadow: the candidate's answers cannot be encoded: %r", exc)
            self.metrics.answers.labels("failed").inc(len(ids))
            return
        result = self.records.result
        self.answers.put([result(w.record, w.correlation_id, v) for w, v in zip(batch, values, strict=True)])


def block_runs(parts: Sequence[Scored]) -> list[BlockRun] | None:
    """The parts' rows as runs of consecutive block rows, in order, a run that continues the previous one joined
    to it (:func:`~consumer.inference.join_runs`); None when a part has no runs
    (:attr:`~consumer.inference.Scored.runs`)."""
    if any(part.runs is None for part in parts):
        return None
    return join_runs(RunSpan(block, start, stop - start) for part in parts for block, start, stop in part.runs or ())


def build_shadow(
    settings: Settings,
    candidate: OnnxRunner,
    serving: ModelSignature,
    registry: CollectorRegistry,
    clients: Clients,
    clock: Callable[[], float] = time.monotonic,
) -> ShadowScorer:
    """The scorer of the settings (``shadow_max_pending``; ``shadow_results_topic``'s producer when it is set)."""
    s = settings
    scorer = ShadowScorer(
        candidate,
        serving,
        registry,
        max_pending=s.shadow_max_pending,
        max_busy_share=s.shadow_max_busy_share,
        clock=clock,
    )
    if s.shadow_results_topic is not None:
        scorer.answers = ShadowAnswers(
            clients,
            s.shadow_results_topic,
            scorer.metrics,
            max_pending=s.shadow_max_pending,
            client_id=f"{s.client_id}-shadow",
        )
        scorer.records = AnswerRecords(
            results_topic=s.shadow_results_topic,
            dead_letter_topic=s.dead_letter_topic,
            group_id=s.group_id,
        )
    return scorer
