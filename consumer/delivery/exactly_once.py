"""exactly_once: per partition, the answers of a window of fetched records and the next offset in one transaction.

One task runs windows back to back. A window fetches chunks for up to ``commit_interval_ms`` (or until the
in-flight budget of :mod:`consumer.budget` is full, a rebalance or a stop is pending), decodes them, runs their
micro-batches and writes each partition's answers, in offset order, into that partition's open transaction (its
transactional producer, :mod:`consumer.delivery.transactions`). Then every partition's transaction gets its next offset
(``send_offsets_to_transaction``) and is committed. Kafka Streams' ``commit.interval.ms`` plays the same role:
a reader with ``isolation.level=read_committed`` sees a window's answers when it commits.

A transaction that fails is aborted and its partition rewound to the window's first offset, so the window's records
are fetched and answered again (a record the broker refused as too large climbs the size ladder meanwhile); a
fenced producer means the partition has a new owner. Nothing of an aborted window becomes visible. No wait on the
broker is unbounded: a commit (or abort) that has not finished within ``producer_request_timeout_ms`` (a coordinator
unreachable behind a network partition) counts as failed, and its producer is discarded; the next window's new
producer with the same transactional.id fences it and aborts what it left (Java's ``commitTransaction`` gives up
after ``max.block.ms`` the same way).

Rebalance: the revoke waits (within ``revoke_timeout_ms``) for the window in progress, which ends at once (its
fetch is cut short: once a rebalance has begun, aiokafka's fetch waits for the new assignment, which waits for
this revoke) and commits; the revoked partitions' producers are parked, and the assignment keeps those of the
partitions that came back and starts the new ones' concurrently (:mod:`consumer.delivery.transactions`). A window
the revoke gave up on stops waiting for its producers, which are closed, and is dropped; what it did not commit is
fenced by the partitions' next producers and answered again.

Positions after a rebalance (:meth:`ExactlyOnce._settle`): windows fetch only once the assignment handler has read
every partition's committed offset again, after its producer started, and sought there. aiokafka's own read at the
assignment (OffsetFetch v3, no KIP-447 ``require_stable``) can come before the previous owner's last transaction
is complete (its offsets apply once its markers are written, after ``commit_transaction`` returned), and reading
from there answers that transaction's records a second time; the new producer's InitProducerId waits for that
transaction. A kept producer's own last commit can lag the same way: its remembered next offset wins. A partition
whose producer cannot start, or was fenced, is paused until a new producer of ours has started and its offset has
been read after it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from itertools import groupby

from aiokafka import TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError

from consumer import fate
from consumer.budget import InFlight
from consumer.delivery.stages import Stages, backoff
from consumer.delivery.transactions import PartitionTransactions
from consumer.delivery.writer import OpenBatches, Routed, Sent
from consumer.inference import Scored
from consumer.kafka.clients import ProducerClient
from consumer.kafka.source import Fetched
from consumer.work import Work

log = logging.getLogger(__name__)


class StuckTransaction(KafkaError):  # type: ignore[misc]  # aiokafka is untyped
    """A partition's transaction did not finish within ``producer_request_timeout_ms`` (a coordinator that does not
    answer, a producer closed below it), or its producer is in aiokafka's FATAL_ERROR state: only a new producer
    with its transactional.id, which fences this one and aborts what it left, writes again."""


class Abandoned(Exception):
    """A revoke gave up waiting for the window (``revoke_timeout_ms``) and closed the partitions' producers."""


@dataclass
class _Transaction:
    """One partition's open transaction in a window."""

    producer: ProducerClient | None
    error: BaseException | None = None
    works: list[Work] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    #: Batches not yet full, appended to by the window's next chunks, handed over before the commit: one produce
    #: request per destination and window rather than one per chunk (nothing is visible before the commit anyway).
    open: OpenBatches = field(default_factory=OpenBatches)


class ExactlyOnce:
    """The exactly_once delivery mode.

    Args:
        stages: the shared stages.
    """

    def __init__(self, stages: Stages) -> None:
        self._stages = stages
        self._settings = stages.settings
        self.txns = PartitionTransactions(stages.settings, stages.clients)
        self._buffers = stages.inference.buffers()
        self._backoff = backoff(stages.settings)
        self._limit_s = stages.settings.producer_request_timeout_ms / 1000.0  # a commit's or an abort's, s
        self._window_lock = asyncio.Lock()  # a revoke waits for the window in its transactions
        self._stop = asyncio.Event()
        self._revoking = asyncio.Event()  # a revoke waits for the window: it ends at once
        self._abandon = asyncio.Event()  # a revoke gave up waiting for the window in progress
        #: Set from the end of an assignment (every partition's position settled, :meth:`_settle`) to the next
        #: revoke: windows fetch only then. aiokafka lets fetches through while the assignment handler runs.
        self._settled = asyncio.Event()
        #: Assigned partitions, paused, whose position is not settled yet: their producer did not start, their
        #: committed offset could not be read, or their producer was fenced. Each window tries again first.
        self._unsettled: set[TopicPartition] = set()
        #: The next offset of each partition's last transaction this member committed (kept across a rebalance
        #: for the partitions whose producers are kept).
        self._next_offsets: dict[TopicPartition, int] = {}
        self.tasks: list[asyncio.Task[None]] = []
        s = stages.settings
        self.held = InFlight(stages.max_in_flight_rows, s.max_in_flight_bytes, s.max_record_bytes, stages.metrics)
        self.joined = False

    @property
    def in_flight_rows(self) -> int:
        """Rows of the window in progress."""
        return self.held.rows

    async def start(self) -> None:
        """Join the group (partitions' producers are opened as they are assigned), start the task.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        try:
            await self._stages.start_shadow()
        except BaseException:
            await self._stages.source.stop()  # never started: closes what the client opened in its constructor
            await self._stages.stop_shadow()
            raise
        try:
            await self._stages.source.start(self.on_revoked, self.on_assigned)
        except BaseException:
            await self._stages.stop_shadow()
            raise
        self._stages.inference.start()
        self.tasks = [asyncio.create_task(self._loop(), name="streaminfer-transactional")]

    async def stop(self, drain_budget_s: float) -> None:
        """Let the window in progress commit (within ``drain_budget_s``), then leave the group and close."""
        st = self._stages
        self._stop.set()
        if self.tasks:
            loop_task = self.tasks[0]
            try:
                if not await st.within(asyncio.shield(loop_task), drain_budget_s):
                    log.warning("shutdown grace exceeded; the open transactions are aborted, their records redelivered")
            except Exception as exc:  # noqa: BLE001 (the loop's own failure is already recorded)
                log.debug("transactional loop ended with %r", exc)
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
        await st.quietly("closing the transactional producers", self.txns.close_all())
        if self.tasks:
            await st.quietly("leaving the group", st.source.stop())
        st.inference.close()
        await st.stop_shadow()
        st.intake.close()

    async def _loop(self) -> None:
        st = self._stages
        while not self._stop.is_set():
            async with self._window_lock:
                if self._unsettled:
                    await self._settle_held()
                await self._window()
            st.source.refresh_lag()
            await asyncio.sleep(0)  # a revoke waiting for the lock takes it here

    async def _window(self) -> None:
        """Fetch, answer and write chunks into per-partition transactions for one window, then commit them."""
        st = self._stages
        s = self._settings
        deadline = st.clock() + s.commit_interval_ms / 1000.0
        transactions: dict[TopicPartition, _Transaction] = {}
        self._abandon.clear()
        while not self._stop.is_set() and not self._revoking.is_set():
            fetched = await self._fetch(self.held.room(s.fetch_max_records))
            if not fetched and not transactions:
                return  # nothing open: let a rebalance or a stop in between windows
            if fetched:
                works = st.mine(await st.intake.decode(fetched, st.tracker, st.source.idle), fetched)
                for work in works:
                    st.writer.ladder.resume(work)
                self.held.add(works)
                scored = await self._answer(works)
                await self._write(transactions, works)
                if scored:  # after the answers are in their transactions; never waits: consumer.shadow.scorer
                    assert st.shadow is not None
                    st.shadow.offer(scored)
            if st.clock() >= deadline or self.held.full:
                break
        await asyncio.gather(*(self._commit(tp, txn) for tp, txn in transactions.items()))
        self.held.clear()

    async def _fetch(self, room: int) -> Fetched:
        """A fetch that a revoke or a stop cuts short ({}): once a rebalance has begun, aiokafka's fetch waits for the
        new assignment, and the rebalance waits for the revoke, which waits for this window. What a fetch cut short
        had taken is read again: positions restart from the committed offsets after a rebalance."""
        fetch = asyncio.ensure_future(self._fetch_settled(room))
        cut = [asyncio.ensure_future(self._revoking.wait()), asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait([fetch, *cut], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in cut:
                waiter.cancel()
            if not fetch.done():
                fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        return fetch.result() if not fetch.cancelled() else {}

    async def _fetch_settled(self, room: int) -> Fetched:
        """A fetch once the assignment's positions are settled (:meth:`_settle`)."""
        await self._settled.wait()
        return await self._stages.source.fetch(room)

    async def _answer(self, works: list[Work]) -> list[Scored] | None:
        """Run every request of a chunk, micro-batch after micro-batch; what ran, for the shadow model (None when
        there is none)."""
        st = self._stages
        batcher = st.batcher(0)
        st.queue(batcher, [w for w in works if w.request is not None])
        batcher.close()
        scored: list[Scored] | None = [] if st.shadow is not None else None
        while (batch := batcher.pop_ready(st.clock())) is not None:
            await st.inference.run(batch, self._buffers, scored)
        return scored

    async def _write(self, transactions: dict[TopicPartition, _Transaction], works: list[Work]) -> None:
        """Append a chunk's answers, partition by partition (offset order), to each partition's transaction,
        beginning it with its first ones. The chunk is routed once (:meth:`AnswerWriter.route`), with the first
        producer that can write."""
        writer = self._stages.writer
        routed: Routed | None = None
        start = 0
        for tp, group in groupby(works, key=lambda w: w.tp):
            part = list(group)
            end = start + len(part)
            txn = transactions.get(tp)
            if txn is None:
                txn = transactions[tp] = await self._begin(tp)
            txn.works += part
            if txn.producer is not None and txn.error is None:
                if routed is None:
                    routed = await writer.route(txn.producer, works)
                txn.sent += await writer.write(txn.producer, part, txn.open, routed.slice(start, end))
            start = end

    async def _begin(self, tp: TopicPartition) -> _Transaction:
        try:
            producer = await self.txns.open(tp)
        except KafkaError as exc:
            return _Transaction(None, error=exc)
        try:
            await producer.begin_transaction()
        except (KafkaError, IllegalOperation) as exc:
            return _Transaction(producer, error=exc)
        except AssertionError as exc:  # aiokafka's transaction manager in FATAL_ERROR: its sender failed
            return _Transaction(producer, error=StuckTransaction(f"the producer cannot begin: {exc}"))
        return _Transaction(producer)

    async def _commit(self, tp: TopicPartition, txn: _Transaction) -> None:
        """Commit ``tp``'s answers with its next offset, within ``producer_request_timeout_ms``. A fenced producer
        means the partition has a new owner: drop it. Any other failure (the time limit included) aborts and
        rewinds the partition to the window's first offset."""
        st = self._stages
        works = txn.works
        first, next_offset = works[0].record.offset, works[-1].record.offset + 1
        started = st.clock()
        try:
            if txn.error is not None:
                raise txn.error
            if not await st.within(self._finish(tp, txn, next_offset), self._limit_s, unless=self._abandon):
                if self._abandon.is_set():
                    raise Abandoned()
                raise StuckTransaction(f"the transaction did not finish within {self._limit_s:.0f} s")
        except (*fate.FENCED, Abandoned, KafkaError) as exc:
            if isinstance(exc, Abandoned) or fate.of_transaction(exc) is fate.Action.DROP:
                # Another producer with this transactional.id exists: the partition's new owner (we are about to be
                # revoked) or a restarted instance; or a revoke gave up waiting for this window and closed it (sends
                # on a closed producer: ProducerClosed; there is nothing to abort). Nothing of this window became
                # visible; if the partition is still ours, rewind so a fresh producer answers it.
                log.warning("producer of %s fenced or closed: %r", tp, exc)
                if txn.producer is not None:
                    await self.txns.discard(tp, txn.producer)
                st.source.rewind(tp, first)
                # Whoever fenced us may have committed beyond ``first``: read the partition again only from the
                # offset committed once a new producer of ours has fenced them in turn (:meth:`_settle_held`).
                self._next_offsets.pop(tp, None)
                self._hold({tp})
                return
            log.warning("transaction for %s failed, aborting and re-reading %d records: %r", tp, len(works), exc)
            st.metrics.produce_retries.inc(len(works))
            st.metrics.retries.labels("produce", type(exc).__name__).inc(len(works))
            await self._abort(tp, txn, exc)
            st.source.rewind(tp, first)
            await st.sleep(self._backoff.first_s)
            return
        finally:
            st.metrics.stage_seconds.labels("commit").inc(st.clock() - started)
        st.done(works)
        self._next_offsets[tp] = next_offset
        st.tracker.mark_committed({tp: next_offset})
        st.metrics.commits.inc()
        st.progress.mark()

    async def _finish(self, tp: TopicPartition, txn: _Transaction, next_offset: int) -> None:
        """Wait for the window's writes to ``tp``'s transaction, add its next offset and commit.

        Raises:
            aiokafka.errors.KafkaError: the first failed write (a too-large answer climbs the ladder), or the
                failed offset add or commit; :class:`StuckTransaction` for a producer in aiokafka's FATAL_ERROR.
        """
        st = self._stages
        producer = txn.producer
        assert producer is not None
        if len(txn.open):
            txn.sent += await st.writer.flush(producer, txn.open)
        if txn.sent:
            await asyncio.wait([sent.future for sent in txn.sent])
        failure: BaseException | None = None
        for sent in txn.sent:
            error = sent.future.exception()
            if error is None:
                continue
            failure = failure or error
            st.writer.judge(sent.works, error)  # a too-large refusal climbs the ladder
        if failure is not None:
            raise failure
        try:
            await producer.send_offsets_to_transaction({tp: next_offset}, self._settings.group_id)
            await producer.commit_transaction()
        except AssertionError as exc:  # "Invalid state transition": its sender failed after the writes
            raise StuckTransaction(f"the producer cannot commit: {exc}") from exc

    async def _abort(self, tp: TopicPartition, txn: _Transaction, exc: BaseException) -> None:
        """Abort ``tp``'s transaction (within ``producer_request_timeout_ms``). A producer whose sequence state is
        lost, that is stuck, or that cannot abort is discarded instead: the next window's new producer fences it,
        which aborts its transaction."""
        producer = txn.producer
        if producer is None:
            return  # it never opened: nothing to abort
        try:
            if isinstance(exc, StuckTransaction) or fate.needs_new_producer(exc):
                raise exc
            if not await self._stages.within(producer.abort_transaction(), self._limit_s):
                raise StuckTransaction(f"the abort did not finish within {self._limit_s:.0f} s")
        except (KafkaError, KeyError, AssertionError) as abort_exc:
            # AssertionError: aiokafka's refusal to abort from FATAL_ERROR ("Invalid state transition"), the state its
            # sender leaves after an unexpected error (a connection that timed out through a network partition).
            log.warning("abort for %s failed (%r); replacing its producer", tp, abort_exc)
            await self.txns.discard(tp, producer)

    # -- rebalances
    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Wait (within revoke_timeout_ms) for the window in its transactions, which ends at once and commits, then
        park the revoked partitions' producers until the assignment says which come back. A window the revoke gave
        up on is dropped and its partitions' producers closed: their next producers fence what it left."""
        self.joined = False
        self._settled.clear()
        if not revoked:
            return
        st = self._stages
        self._revoking.set()
        try:
            finished = await st.within(self._window_lock.acquire(), self._settings.revoke_timeout_ms / 1000.0)
            if finished:
                self._window_lock.release()
            else:
                log.warning("revoke: the current transactions did not finish in time; the new owner fences them")
                self._abandon.set()  # the window stops waiting for producers closed below it
        finally:
            self._revoking.clear()
        if finished:
            self.txns.park(revoked)
        else:
            await self.txns.close_many(revoked)
        st.tracker.forget(set(revoked))
        st.source.forget_lag(set(revoked))
        log.debug("partitions revoked: %s", sorted(str(tp) for tp in revoked))

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Keep the producers of the partitions that came back, close the other parked ones and start the new
        partitions' (concurrently; starting fences any zombie still writing for them); mark the group joined."""
        st = self._stages
        started = st.clock()
        done = await self.txns.reassign(assigned)
        took = st.clock() - started
        self._next_offsets = {tp: n for tp, n in self._next_offsets.items() if tp in done.kept_partitions}
        self._unsettled = set()
        lagging = await self._settle(assigned, done.kept_partitions)
        events = st.metrics.transactional_producers
        events.labels("kept").inc(done.kept)
        events.labels("opened").inc(done.opened)
        events.labels("closed").inc(done.closed)
        if st.source.rebalance is not None:
            failed = f", {done.failed} failed" if done.failed else ""
            st.source.rebalance.note(
                f"producers: {done.kept} kept, {done.opened} opened in {took:.3f} s{failed}, {done.closed} closed"
            )
            if lagging:
                st.source.rebalance.note(f"{lagging} committed offsets read behind this member's own last commits")
        self.joined = True
        st.assigned(assigned)
        self._settled.set()

    async def _settle(self, tps: set[TopicPartition], kept: frozenset[TopicPartition] = frozenset()) -> int:
        """Set the fetch position of (re)assigned partitions from their committed offsets as read *after* their
        producers started; hold (pause) the rest until :meth:`_settle_held` can.

        aiokafka reads an assignment's committed offsets before the assignment handler runs (OffsetFetch v3, no
        KIP-447 ``require_stable``): a read that can precede the end of the previous owner's last transaction,
        whose offsets the broker applies only once its commit markers are written, after ``commit_transaction``
        returned. Reading from there would answer that transaction's records again: duplicates. A new producer's
        InitProducerId returns only once its transactional.id's previous transaction is complete (or aborted),
        so a read after it is stable. A kept producer's own last commit may still be pending: its next offset,
        remembered, is taken when the read is behind it.

        Returns:
            How many committed offsets read were behind this member's own last commits (the read lagged).
        """
        st = self._stages
        assigned = st.source.consumer.assignment()
        tps = {tp for tp in tps if tp in assigned}
        ready = {tp for tp in tps if self.txns.is_open(tp)}
        self._hold(tps - ready)
        if not ready:
            return 0
        reading = asyncio.ensure_future(st.source.committed(ready))
        try:  # aiokafka retries a retriable failure for ever: a coordinator that is gone must not hold the group
            if not await st.within(reading, self._limit_s):
                raise StuckTransaction(f"no answer within {self._limit_s:.0f} s")
        except KafkaError as exc:
            log.warning("committed offsets of %d partitions not read (%r); next window tries again", len(ready), exc)
            self._hold(ready)
            return 0
        offsets = reading.result()
        lagging = 0
        for tp, offset in offsets.items():
            mine = self._next_offsets.get(tp) if tp in kept else None
            if mine is not None and (offset is None or offset < mine):
                log.info("committed offset of %s read as %s, behind this member's last commit %d", tp, offset, mine)
                offset, lagging = mine, lagging + 1
            if offset is not None:  # None: nothing committed, the client's auto_offset_reset applies
                st.source.seek(tp, offset)
        released = ready & self._unsettled
        self._unsettled -= ready
        if released:
            st.source.consumer.resume(*released)
        return lagging

    def _hold(self, tps: set[TopicPartition]) -> None:
        """Pause ``tps`` until :meth:`_settle` sets their positions."""
        tps = (tps & self._stages.source.consumer.assignment()) - self._unsettled
        if tps:
            self._stages.source.consumer.pause(*tps)
            self._unsettled |= tps

    async def _settle_held(self) -> None:
        """Start the held partitions' producers (each InitProducerId fences the previous owner's and waits for
        its transaction to end), then settle them."""
        held = self._unsettled & self._stages.source.consumer.assignment()
        self._unsettled &= held
        results = await asyncio.gather(*(self.txns.open(tp) for tp in held), return_exceptions=True)
        for exc in results:
            if isinstance(exc, BaseException) and not isinstance(exc, Exception):
                raise exc
        await self._settle(held)
