"""at_least_once commits: each partition's highest contiguous acknowledged offset, at most every commit_interval_ms.

The rule itself (a commit never passes a record whose answer is not acknowledged) is :mod:`consumer.offsets`';
this stage decides when to commit: after acknowledgements, throttled to one commit per ``commit_interval_ms``, on
revoke for the revoked partitions, and once more at shutdown. A failed commit (a rebalance in progress) is
counted and logged, never fatal: the next one carries the same offsets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from consumer.kafka.clients import ConsumerClient
from consumer.offsets import OffsetTracker
from consumer.ops.metrics import Metrics
from consumer.ops.progress import Progress

log = logging.getLogger(__name__)


class Committer:
    """Commits what the offset tracker says may be committed.

    Args:
        consumer: the group's consumer.
        tracker: done-tracking of the assigned partitions.
        metrics: commits, commit failures, commit time.
        progress: marked on every successful commit.
        interval_ms: least time between two commits, ms (0: commit after every acknowledgement round).
        on_commit: called after a successful commit (the source refreshes the lag).
        clock: monotonic seconds.
        sleep: ``asyncio.sleep`` or a fake.
    """

    def __init__(
        self,
        consumer: ConsumerClient,
        tracker: OffsetTracker[TopicPartition],
        metrics: Metrics,
        progress: Progress,
        *,
        interval_ms: int,
        on_commit: Callable[[], None],
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._consumer = consumer
        self._tracker = tracker
        self._metrics = metrics
        self._progress = progress
        self._interval_s = interval_ms / 1000.0
        self._on_commit = on_commit
        self._clock = clock
        self._sleep = sleep
        self._wanted = asyncio.Event()
        self._commit_seconds = metrics.stage_seconds.labels("commit")

    def want(self) -> None:
        """Answers were acknowledged: commit soon."""
        self._wanted.set()

    async def run(self) -> None:
        """Commit whenever wanted, at most once per interval; runs until cancelled."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self.commit()
            if self._interval_s:
                await self._sleep(self._interval_s)

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit the committable positions (of ``only``, when given)."""
        offsets = self._tracker.committable(only)
        if not offsets:
            return
        started = self._clock()
        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            self._metrics.commit_failures.labels(type(exc).__name__).inc()
            log.warning("commit of %s failed: %r", offsets, exc)
            return
        finally:
            self._commit_seconds.inc(self._clock() - started)
        self._tracker.mark_committed(offsets)
        self._metrics.commits.inc()
        self._progress.mark()
        self._on_commit()
