"""Kafka in: the group member that fetches request records under a budget.

- **Fetch** (:meth:`Source.fetch`): ``getmany`` for at most as many records as the caller has room for; the time of
  calls that returned records goes to ``streaminfer_stage_seconds_total{stage="fetch"}`` (the client parses records
  inside this call).
- **Backpressure** (:meth:`Source.throttle`): every assigned partition is paused while the caller is full, and
  resumed below it. Fetch calls go on while paused, so the member stays in the group however slow the model is.
- **Undecodable records**: when the client raises while parsing a fetched batch (e.g. a header key that is not
  UTF-8) without saying which record, the partitions are rewound and read one record at a time until the culprit
  raises again; it becomes an :class:`~consumer.work.UndecodableRecord` and the partition skips it.
- **Lag** (:meth:`Source.update_lag`): per partition, the high watermark of the last fetch minus the first
  uncommitted offset, exported as ``streaminfer_consumer_lag_records``; after each commit, and from the fetch loops
  at most every :data:`LAG_REFRESH_S` (:meth:`Source.refresh_lag`: a walk over every assigned partition per fetch
  cost 0.3 ms at 128 partitions).
- **Rebalances**: :class:`~consumer.kafka.rebalance.RebalanceListener` forwards them to the delivery mode's
  handlers and times each phase (:attr:`Source.rebalance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from aiokafka import TopicPartition

from consumer.errors import TopicMissingError
from consumer.kafka.clients import ConsumerClient
from consumer.kafka.rebalance import RebalanceHandler, RebalanceListener
from consumer.offsets import OffsetTracker
from consumer.ops.metrics import Metrics
from consumer.ops.progress import Progress
from consumer.work import UndecodableRecord

log = logging.getLogger(__name__)

#: Records read one by one per partition while isolating an undecodable record, at most.
ISOLATION_STEP_LIMIT = 10_000
#: Least time between two lag refreshes from the fetch loops (:meth:`Source.refresh_lag`), s: the lag is read by
#: scrapes and by the stall check (seconds), and a refresh walks every assigned partition.
LAG_REFRESH_S = 0.1

Fetched = dict[TopicPartition, list[Any]]


#: How long start-up waits for the requests topic to show in the cluster's metadata, and how often it asks, s.
TOPIC_WAIT_S, TOPIC_POLL_S = 5.0, 0.25


def _named(topics: Mapping[str, str], singular: str, plural: str) -> str:
    """``results_topic 'x', dead_letter_topic 'y'`` and the verb that agrees with their number."""
    return ", ".join(f"{k} {t!r}" for k, t in topics.items()) + f" {singular if len(topics) == 1 else plural}"


class Source:
    """The requests topic's consumer, as the delivery modes use it.

    Args:
        consumer: the Kafka consumer (not started).
        topic: the requests topic.
        tracker: the offsets of the assigned partitions (fetch positions for isolation, committed ones for lag).
        metrics: lag, pause and fetch-time metrics.
        progress: marked whenever records are fetched, if ``fetch_is_progress`` (exactly_once counts only
            committed transactions: a window can fail and be fetched again and again).
        fetch_timeout_ms: longest wait of one fetch call, ms.
        clock: monotonic seconds.
        auto_create: start even when the topics do not exist (``allow_auto_create_topics``).
        required: setting name -> topic of the other topics that must exist at start-up (results, dead letters):
            with auto-creation off on the broker, answers to a missing topic could never be written.
        sleep: ``asyncio.sleep`` or a test's fake (the wait for the topics).
    """

    def __init__(
        self,
        consumer: ConsumerClient,
        topic: str,
        tracker: OffsetTracker[TopicPartition],
        metrics: Metrics,
        progress: Progress,
        *,
        fetch_timeout_ms: int,
        fetch_is_progress: bool = True,
        clock: Callable[[], float],
        auto_create: bool = False,
        required: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.consumer = consumer
        self._topic = topic
        self._required = {"requests_topic": topic, **(required or {})}
        self._auto_create = auto_create
        self._sleep = sleep
        self._tracker = tracker
        self._metrics = metrics
        self._progress = progress
        self._fetch_timeout_ms = fetch_timeout_ms
        self._fetch_is_progress = fetch_is_progress
        self._clock = clock
        self._fetch_seconds = metrics.stage_seconds.labels("fetch")
        self.lag = 0
        self._throttled = False  # throttle() paused the assignment and has not resumed it since
        self._throttled_of: AbstractSet[TopicPartition] | None = None  # the assignment it paused (its identity)
        self._lag_refreshed = -math.inf  # clock() of the last update_lag, s
        self._lag_series: dict[TopicPartition, Any] = {}  # each partition's lag gauge child (labels() is costly)
        #: The group's listener, set by :meth:`start` (a delivery mode adds its figures to a rebalance's line).
        self.rebalance: RebalanceListener | None = None

    async def start(self, on_revoked: RebalanceHandler, on_assigned: RebalanceHandler) -> None:
        """Subscribe (rebalances go to the handlers) and join the group.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
            TopicMissingError: the requests, results or dead-letter topic does not exist and
                ``allow_auto_create_topics`` is off.
        """
        try:
            await self.consumer.start()
            if not self._auto_create:  # before subscribing: a subscription's metadata request creates the topic
                await self._require_topics()
            elif missing := await self._missing_topics():
                log.warning(
                    "%s not exist yet (allow_auto_create_topics: starting anyway; a broker that does not create "
                    "topics on first use cannot take their records)",
                    _named(missing, "does", "do"),
                )
            self.rebalance = RebalanceListener(on_revoked, on_assigned, self._metrics, self._clock)
            self.consumer.subscribe([self._topic], listener=self.rebalance)
        except BaseException:
            await self.consumer.stop()
            raise

    async def _missing_topics(self) -> dict[str, str]:
        """Setting name -> topic of the required topics the cluster's metadata lacks (one metadata request)."""
        existing = await self.consumer.topics()
        return {k: t for k, t in self._required.items() if t not in existing}

    async def _require_topics(self) -> None:
        """Wait up to :data:`TOPIC_WAIT_S` for the requests, results and dead-letter topics to appear in the
        cluster's metadata (a topic created just before reaches every broker's metadata a moment later).

        Raises:
            TopicMissingError: one did not; the message names each missing topic and its setting.
        """
        deadline = self._clock() + TOPIC_WAIT_S
        while missing := await self._missing_topics():
            if self._clock() >= deadline:
                one = len(missing) == 1
                raise TopicMissingError(
                    f"{_named(missing, 'does', 'do')} not exist on the cluster: create {'it' if one else 'them'} "
                    f"(or fix the {'name' if one else 'names'}), or set allow_auto_create_topics=true "
                    "(--allow-auto-create-topics) to start anyway"
                )
            await self._sleep(TOPIC_POLL_S)

    async def stop(self) -> None:
        """Leave the group."""
        await self.consumer.stop()

    async def fetch(self, max_records: int, *, wait: bool = True) -> Fetched:
        """At most ``max_records`` records (>= 1), grouped by partition in offset order; {} after the fetch timeout
        (at once when not ``wait``)."""
        started = self._clock()
        try:
            fetched: Fetched = await self.consumer.getmany(
                timeout_ms=self._fetch_timeout_ms if wait else 0, max_records=max(1, max_records)
            )
        except UnicodeDecodeError as exc:  # the client cannot parse a record: find it and dead-letter it
            fetched = await self._isolate_undecodable(exc)
        if fetched:  # a call that only waited for records costs the loop nothing
            self._fetch_seconds.inc(self._clock() - started)
            if self._fetch_is_progress:
                self._progress.mark()
        return fetched

    async def idle(self, seconds: float) -> None:
        """Wait about ``seconds`` while fetched records are held (for the schema registry), the group membership kept:
        every assigned partition is paused and the client polled (so ``max_poll_interval_ms`` does not pass), then
        the partitions this call paused are resumed. Records a rebalance let through meanwhile are sought back to."""
        consumer = self.consumer
        paused_here = consumer.assignment() - consumer.paused()
        if paused_here:
            consumer.pause(*paused_here)
        try:
            slipped = await consumer.getmany(timeout_ms=max(1, int(seconds * 1000)), max_records=1)
        finally:
            assigned = consumer.assignment()
            consumer.resume(*(paused_here & assigned))
        for tp, records in slipped.items():  # a partition assigned during the wait: read it again from there
            if records and tp in consumer.assignment():
                consumer.seek(tp, records[0].offset)

    def caught_up(self, fetched: Fetched, asked: int) -> bool:
        """Whether the fetch that returned ``fetched`` (``asked``: its ``max_records``) left nothing behind: fewer
        records than asked (the client's buffer is empty) and, for each partition in it, its last record is the
        last the broker had (offset + 1 == the high watermark the fetch response carried)."""
        if not fetched or sum(len(records) for records in fetched.values()) >= asked:
            return False
        for tp, records in fetched.items():
            highwater = self.consumer.highwater(tp)
            if highwater is None or records[-1].offset + 1 < highwater:
                return False
        return True

    def throttle(self, full: bool) -> None:
        """Pause every assigned partition while ``full``; resume them once not.

        Nothing else keeps a partition paused across fetches (:meth:`idle` and the isolation of an undecodable
        record put back what they found), so neither direction walks the client's paused set (a walk over every
        assigned partition's state, 13 us at 128 partitions): pausing or resuming one that already is changes
        nothing in the client. While throttled, a call on the same assignment (the client's frozenset, replaced at
        every rebalance) returns at once."""
        consumer = self.consumer
        if full:
            assigned = consumer.assignment()
            if self._throttled and assigned is self._throttled_of and isinstance(assigned, frozenset):
                return
            if assigned:
                consumer.pause(*assigned)
                self._metrics.paused.set(1)
            self._throttled = True
            self._throttled_of = assigned
        elif self._throttled:  # no walk over every assigned partition's state per fetch while nothing is paused
            self._throttled = False
            self._throttled_of = None
            if assigned := consumer.assignment():
                consumer.resume(*assigned)
            self._metrics.paused.set(0)

    def update_lag(self) -> None:
        """Refresh the lag of every tracked partition (``lag``: their total, records)."""
        self._lag_refreshed = self._clock()
        total = 0
        highwater_of = self.consumer.highwater
        series = self._lag_series
        for tp, offsets in self._tracker.items():
            highwater = highwater_of(tp)
            position = offsets.unanswered_from
            if highwater is None or position is None:
                continue
            lag = max(0, highwater - position)
            total += lag
            gauge = series.get(tp)
            if gauge is None:
                gauge = series[tp] = self._metrics.consumer_lag.labels(tp.topic, str(tp.partition))
            gauge.set(lag)
        self.lag = total

    def refresh_lag(self) -> None:
        """:meth:`update_lag` if it last ran :data:`LAG_REFRESH_S` ago or more (the fetch loops call this after every
        fetch)."""
        if self._clock() - self._lag_refreshed >= LAG_REFRESH_S:
            self.update_lag()

    def forget_lag(self, tps: set[TopicPartition]) -> None:
        """Remove the lag series of revoked partitions."""
        for tp in tps:
            self._lag_series.pop(tp, None)
            with contextlib.suppress(KeyError):
                self._metrics.consumer_lag.remove(tp.topic, str(tp.partition))

    async def committed(self, tps: set[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The committed offsets of ``tps`` as the group coordinator has them now (one fresh OffsetFetch each,
        concurrently; None: nothing committed). aiokafka's own fetch of them at an assignment may precede the end
        of a transaction that commits them (it sends OffsetFetch v3, without KIP-447's ``require_stable``).

        Raises:
            aiokafka.errors.KafkaError: the group coordinator cannot be reached.
        """
        ordered = sorted(tps, key=lambda tp: (tp.topic, tp.partition))
        offsets = await asyncio.gather(*(self.consumer.committed(tp) for tp in ordered))
        return dict(zip(ordered, offsets, strict=True))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` if it is still assigned (records fetched before from elsewhere are dropped
        by the client: their position no longer matches)."""
        if tp in self.consumer.assignment():
            self.consumer.seek(tp, offset)

    def rewind(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` again from ``offset`` if it is still assigned (its committed position, so its lag and the
        stall check, stay as they were); otherwise forget it."""
        if tp in self.consumer.assignment():
            self._tracker.rewind(tp)
            self.consumer.seek(tp, offset)
        else:
            self._tracker.forget({tp})

    async def _isolate_undecodable(self, exc: Exception) -> Fetched:
        """Find the record the client cannot parse (see the module docstring).

        Returns:
            The records read meanwhile, the stand-in included, to be answered as usual.
        """
        consumer = self.consumer
        log.error("the Kafka client cannot decode a fetched record (%r); isolating it", exc)
        assigned = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
        for tp in assigned:
            resume_at = self._tracker.partition(tp).next_offset
            if resume_at is not None:
                consumer.seek(tp, resume_at)  # what the failed fetch swallowed is read again
        was_paused = consumer.paused()
        consumer.pause(*assigned)
        found: Fetched = {}
        try:
            for tp in assigned:
                consumer.resume(tp)
                try:
                    for _ in range(ISOLATION_STEP_LIMIT):
                        got = await consumer.getmany(tp, timeout_ms=self._fetch_timeout_ms, max_records=1)
                        if not got:
                            break
                        found.setdefault(tp, []).extend(got.get(tp, []))
                except UnicodeDecodeError as bad:
                    offset = await consumer.position(tp)
                    stand_in = UndecodableRecord(tp.topic, tp.partition, offset, error=f"{type(bad).__name__}: {bad}")
                    found.setdefault(tp, []).append(stand_in)
                    consumer.seek(tp, offset + 1)
                    log.error("record %s:%d cannot be decoded by the Kafka client; dead-lettering it", tp, offset)
                    return found
                finally:
                    consumer.pause(tp)
            return found
        finally:
            consumer.resume(*(set(assigned) - was_paused))
