"""at_least_once: fetch -> decode -> micro-batch -> infer -> publish in order -> commit, as concurrent stages.

Tasks (created in :meth:`AtLeastOnce.start`, cancelled and drained in :meth:`AtLeastOnce.stop`)::

    fetch    source.fetch() sized by the in-flight budget (:mod:`consumer.budget`: rows and bytes) -> intake ->
             requests to the batcher, poison to the publisher; every assigned partition is paused while it is full;
             a fetch that reached its partitions' high watermark calls batcher.caught_up() (``flush_when_caught_up``)
    batch    batcher.next_batch() -> inference (ORT in its thread; PIPELINE_DEPTH batches in flight)
             -> the publisher
    publish  the publisher writes each partition's answers in offset order and retries failed writes
    commit   the committer commits each partition's highest contiguous acknowledged offset

An offset is committed only after the answer of that record and of every record before it in its partition was
acknowledged (acks=all, idempotent producer). A crash replays what was not committed: duplicates are possible,
losses are not.

Rebalance (:meth:`AtLeastOnce.on_revoked`): queued records of revoked partitions are dropped (their new owner
answers them); records already running or written get ``revoke_timeout_ms`` to be acknowledged; what is done is
committed, the rest forgotten.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Collection

from aiokafka import TopicPartition

from consumer import fate
from consumer.budget import InFlight
from consumer.delivery.committer import Committer
from consumer.delivery.publisher import Publisher
from consumer.delivery.stages import Stages, backoff, wait_until
from consumer.inference import Scored
from consumer.model.buffers import BatchBuffers
from consumer.work import Work

log = logging.getLogger(__name__)

#: Micro-batches in flight at once: one running in the ONNX Runtime thread while the next is assembled into the
#: other set of input buffers and the previous one's responses are encoded on the event loop.
PIPELINE_DEPTH = 2


class AtLeastOnce:
    """The at_least_once delivery mode.

    Args:
        stages: the shared stages.
    """

    def __init__(self, stages: Stages) -> None:
        self._stages = stages
        s = stages.settings
        self._settings = s
        self.batcher = stages.batcher(s.max_batch_delay_ms)
        self.publisher = Publisher(
            stages.clients,
            stages.writer,
            stages.metrics,
            self._acked,
            client_id=f"{s.client_id}-producer",
            sleep=stages.sleep,
            backoff=backoff(s),
        )
        self.committer = Committer(
            stages.source.consumer,
            stages.tracker,
            stages.metrics,
            stages.progress,
            interval_ms=s.commit_interval_ms,
            on_commit=stages.source.update_lag,
            clock=stages.clock,
            sleep=stages.sleep,
        )
        self._slots: asyncio.Queue[BatchBuffers] = asyncio.Queue()
        for _ in range(PIPELINE_DEPTH):
            self._slots.put_nowait(stages.inference.buffers())
        self._batches: set[asyncio.Task[None]] = set()
        self._acks = asyncio.Event()  # set whenever answers were acknowledged (a revoke waits on it)
        self.tasks: list[asyncio.Task[None]] = []
        s = stages.settings
        self.held = InFlight(stages.max_in_flight_rows, s.max_in_flight_bytes, s.max_record_bytes, stages.metrics)
        self.joined = False

    async def start(self) -> None:
        """Open the producer, join the group, start the tasks.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        st = self._stages
        try:
            await st.start_shadow()
            await self.publisher.start()
        except BaseException:
            await st.source.stop()  # never started: closes what the client opened in its constructor
            await st.stop_shadow()
            raise
        try:
            await st.source.start(self.on_revoked, self.on_assigned)
        except BaseException:
            await self.publisher.close()
            await st.stop_shadow()
            raise
        st.inference.start()
        self.tasks = [
            asyncio.create_task(self._fetch_loop(), name="streaminfer-fetch"),
            asyncio.create_task(self._batch_loop(), name="streaminfer-batch"),
            asyncio.create_task(self.publisher.run(), name="streaminfer-publish"),
            asyncio.create_task(self.committer.run(), name="streaminfer-commit"),
        ]

    async def stop(self, drain_budget_s: float) -> None:
        """Stop fetching, answer what was fetched within ``drain_budget_s``, commit, leave the group, close."""
        st = self._stages
        fetch: asyncio.Task[None] | None = None
        batch: asyncio.Task[None] | None = None
        rest: list[asyncio.Task[None]] = []
        if self.tasks:
            fetch, batch, *rest = self.tasks
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        self.batcher.close()
        if not await st.within(self._drain(batch), drain_budget_s):
            log.warning(
                "shutdown grace of %.1f s exceeded; unanswered records stay uncommitted and will be redelivered",
                self._settings.shutdown_grace_s,
            )
        pending = [t for t in (batch, *rest) if t is not None] + list(self._batches)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self.tasks:
            await st.quietly("final commit", self.committer.commit())
            await st.quietly("leaving the group", st.source.stop())
        await st.quietly("closing the producer", self.publisher.close())
        st.inference.close()
        await st.stop_shadow()
        st.intake.close()

    async def _drain(self, batch: asyncio.Task[None] | None) -> None:
        if batch is not None:
            await batch
        await self.publisher.drain()

    # -- fetch
    async def _fetch_loop(self) -> None:
        st = self._stages
        s = self._settings
        held = self.held
        while True:
            if held.full:
                st.source.throttle(True)
                # Wait for acknowledgements to free room, at most one fetch timeout: fetch calls go on while
                # paused, so the member stays in the group (max_poll_interval_ms) however slow the model is.
                deadline = st.clock() + s.fetch_timeout_ms / 1000.0
                await wait_until(lambda: not held.full, self._acks, deadline, st.clock, st.sleep)
            full = held.full
            st.source.throttle(full)
            asked = held.room(s.fetch_max_records)
            fetched = await st.source.fetch(asked, wait=not full)
            if fetched:
                self._ingest(await st.intake.decode(fetched, st.tracker, st.source.idle), fetched.keys())
                if s.flush_when_caught_up and st.source.caught_up(fetched, asked):
                    self.batcher.caught_up()  # nothing more is on the broker: waiting could only add latency
            st.source.refresh_lag()
            await asyncio.sleep(0)  # the client returns fetched records without yielding: let the others run

    def _ingest(self, works: list[Work], fetched: Collection[TopicPartition] | None = None) -> None:
        """Requests to the batcher, poison straight to the publisher, all in their partitions' order (``fetched``:
        the chunk's partitions, :meth:`~consumer.delivery.stages.Stages.mine`)."""
        st = self._stages
        works = st.mine(works, fetched)
        self.publisher.track(works)
        requests: list[Work] = []
        dead: list[Work] = []
        for work in works:
            (dead if work.request is None else requests).append(work)
        self.held.add(works)
        st.queue(self.batcher, requests)
        if dead:
            self.publisher.answered(dead)

    # -- batch
    async def _batch_loop(self) -> None:
        """Take due micro-batches and keep up to PIPELINE_DEPTH of them in flight; when closed and empty, wait for
        the last ones."""
        st = self._stages
        while (batch := await self.batcher.next_batch()) is not None:
            st.metrics.batch_queue_wait_seconds.observe(st.clock() - batch[0].enqueued_at)
            buffers = await self._slots.get()
            task = asyncio.create_task(self._run_batch(batch, buffers), name="streaminfer-batch-run")
            self._batches.add(task)
            task.add_done_callback(self._batch_done)
        while self._batches:
            await asyncio.gather(*list(self._batches))

    async def _run_batch(self, batch: list[Work], buffers: BatchBuffers) -> None:
        shadow = self._stages.shadow
        scored: list[Scored] | None = [] if shadow is not None else None
        try:
            await self._stages.inference.run(batch, buffers, scored)
        finally:
            self._slots.put_nowait(buffers)
        self.publisher.answered(batch)
        if shadow is not None and scored:
            shadow.offer(scored)  # after the hand-over, never waits: consumer.shadow.scorer

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._batches.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._stages.fail(task.exception() or RuntimeError("batch failed"), task.get_name())

    # -- acknowledgements
    def _acked(self, works: list[Work]) -> None:
        self._stages.done(works)
        self.held.remove(works)
        self.committer.want()
        self._acks.set()

    @property
    def in_flight_rows(self) -> int:
        """Rows fetched and not yet answered."""
        return self.held.rows

    # -- rebalances
    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Drop queued records of revoked partitions (their new owner answers them), give records already running
        or written ``revoke_timeout_ms`` to be acknowledged, commit what is done, forget the rest."""
        self.joined = False  # not ready while the group rebalances
        if not revoked:
            return
        st = self._stages
        gone = set(revoked)
        queued = self.batcher.discard(lambda w: fate.of_partition(w.tp, gone) is fate.Action.DROP)
        first_queued: dict[TopicPartition, int] = {}
        for work in queued:
            first_queued[work.tp] = min(work.record.offset, first_queued.get(work.tp, work.record.offset))
        dropped: list[Work] = []
        for tp, offset in first_queued.items():
            dropped += self.publisher.cut(tp, offset)
        never = Counter(w.tp for w in dropped)  # records that will never be acknowledged

        def answered() -> bool:
            return all(st.tracker.partition(tp).unfinished <= never[tp] for tp in gone)

        deadline = st.clock() + self._settings.revoke_timeout_ms / 1000.0
        await wait_until(answered, self._acks, deadline, st.clock, st.sleep)
        await self.committer.commit(gone)
        dropped += self.publisher.forget(gone)
        if dropped:
            self.held.remove(dropped)
            st.metrics.revoked_dropped.inc(len(dropped))
        st.tracker.forget(gone)
        st.source.forget_lag(gone)
        log.info("partitions revoked: %s (%d records dropped unanswered)", sorted(map(str, gone)), len(dropped))

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Mark the group joined."""
        self.joined = True
        self._stages.assigned(assigned)
