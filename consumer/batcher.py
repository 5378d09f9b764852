"""Micro-batching by rows or deadline, whichever comes first, on an injected monotonic clock.

A batch is flushed when the pending rows of one lane (the items that can share a batch: one shape, or one length
bucket) reach ``max_batch_rows`` (or its tokens reach ``max_batch_tokens``, for sequence models), or when the oldest
pending item has waited ``max_batch_delay_ms``. Items whose non-batch shapes differ (``key``) are never put in one
batch, because their tensors cannot be stacked. Waiting is event-driven: :meth:`MicroBatcher.next_batch` sleeps until an
item arrives or the oldest item's deadline passes, never in polling ticks.

Pattern after ray ``serve/batching.py`` (``_BatchQueue.wait_for_batch``) and aiokafka's message accumulator
(linger on a monotonic clock); the deadline is measured with ``clock`` (``time.monotonic`` by default, seconds),
never the wall clock, and the wait for a deadline is ``sleep`` (``asyncio.sleep`` by default), so unit tests drive
both with a fake clock and no sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


#: A queued item: (item, rows, tokens, enqueued at clock() seconds).
_Pending = tuple[T, int, int, float]


#: A lane key no caller passes (put_many's "no lane yet").
_NO_KEY = object()


class _Lane(Generic[T]):
    __slots__ = ("items", "rows", "tokens")

    def __init__(self) -> None:
        self.items: deque[_Pending[T]] = deque()
        self.rows = 0
        self.tokens = 0


class MicroBatcher(Generic[T]):
    """Collects items into row-bounded batches.

    Args:
        max_batch_rows: flush a lane once it holds this many rows (>= 1). A single item with more rows than
            this is flushed alone, unsplit.
        max_batch_delay_ms: flush the oldest item's lane once that item has waited this long, milliseconds (>= 0).
        clock: monotonic time source in seconds.
        max_batch_tokens: also flush a lane once its items' ``tokens`` reach this (sequence models: rows x the
            length bucket, so a batch of long sequences holds fewer rows); None = rows only.
        sleep: waits the given seconds (the oldest item's deadline): ``asyncio.sleep`` or a fake clock's.

    Raises:
        ValueError: a limit is out of range.
    """

    def __init__(
        self,
        max_batch_rows: int,
        max_batch_delay_ms: float,
        clock: Callable[[], float] = time.monotonic,
        max_batch_tokens: int | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        if max_batch_delay_ms < 0:
            raise ValueError(f"max_batch_delay_ms must be >= 0, got {max_batch_delay_ms}")
        self._max_rows = max_batch_rows
        self._max_tokens = max_batch_tokens
        self._delay_s = max_batch_delay_ms / 1000.0
        self._clock = clock
        self._sleep = sleep
        self._lanes: dict[Hashable, _Lane[T]] = {}
        self._rows = 0
        self._closed = False
        self._caught_up_at = float("-inf")  # items queued at or before this clock reading are due (caught_up())
        self._wakeup = asyncio.Event()

    @property
    def pending_rows(self) -> int:
        """Rows waiting, across all lanes."""
        return self._rows

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def put(self, item: T, rows: int, key: Hashable = None, tokens: int = 0) -> None:
        """Queue ``item`` (contributing ``rows`` rows and ``tokens`` tokens) in the lane ``key``.

        Raises:
            RuntimeError: the batcher is closed.
        """
        self.put_many([(item, rows, key, tokens)])

    def put_many(self, entries: Iterable[tuple[T, int, Hashable, int]]) -> None:
        """Queue several items at once (one clock reading, one wake-up): each ``(item, rows, key, tokens)``.

        Raises:
            RuntimeError: the batcher is closed.
        """
        if self._closed:
            raise RuntimeError("MicroBatcher is closed")
        now = self._clock()
        lanes = self._lanes
        added = 0
        # A chunk's requests mostly share one key object: the lane is looked up again only when the key changes,
        # and its row and token counts are added once per run of one lane.
        lane: _Lane[T] | None = None
        last: Hashable = _NO_KEY
        run_rows = run_tokens = 0
        items: deque[_Pending[T]] = deque()
        for item, rows, key, tokens in entries:
            if key is not last:
                if lane is not None:
                    lane.rows += run_rows
                    lane.tokens += run_tokens
                    added += run_rows
                lane = lanes.get(key)
                if lane is None:
                    lane = lanes[key] = _Lane()
                last, items = key, lane.items
                run_rows = run_tokens = 0
            items.append((item, rows, tokens, now))
            run_rows += rows
            run_tokens += tokens
        if lane is not None:
            lane.rows += run_rows
            lane.tokens += run_tokens
            added += run_rows
        if added:
            self._rows += added
            self._wakeup.set()

    def discard(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return every pending item for which ``predicate`` is true (e.g. revoked partitions)."""
        removed: list[T] = []
        for key in list(self._lanes):
            lane = self._lanes[key]
            kept: deque[_Pending[T]] = deque()
            for pending in lane.items:
                item, rows, tokens, _ = pending
                if predicate(item):
                    removed.append(item)
                    lane.rows -= rows
                    lane.tokens -= tokens
                    self._rows -= rows
                else:
                    kept.append(pending)
            lane.items = kept
            if not kept:
                del self._lanes[key]
        return removed

    def caught_up(self) -> None:
        """Make every pending item due now, whatever its deadline (items queued later wait as usual): the source
        knows no more records are on their way, so waiting would only add latency."""
        if self._lanes:
            self._caught_up_at = self._clock()
            self._wakeup.set()

    def close(self) -> None:
        """Stop accepting items; everything pending is flushed by the next calls regardless of deadlines."""
        self._closed = True
        self._wakeup.set()

    def time_to_deadline(self, now: float) -> float | None:
        """Seconds until the oldest pending item's deadline (<= 0: due now, caught-up ones too); None when nothing
        is pending."""
        heads = [g.items[0][3] for g in self._lanes.values() if g.items]
        if not heads:
            return None
        oldest = min(heads)
        return 0.0 if oldest <= self._caught_up_at else oldest + self._delay_s - now

    def pop_ready(self, now: float) -> list[T] | None:
        """Remove and return the next batch that is due at time ``now``, or None if none is due.

        A full lane (rows >= max_batch_rows) is due at once; otherwise the lane of the oldest item is due
        when that item's deadline has passed, or at once after :meth:`close`, or when :meth:`caught_up` was called
        after that item was queued.
        """
        full = [(k, g) for k, g in self._lanes.items() if self._full(g.rows, g.tokens)]
        if full:
            key = min(full, key=lambda kg: kg[1].items[0][3])[0]
            return self._take(key)
        oldest: tuple[Hashable, float] | None = None
        for k, g in self._lanes.items():
            if g.items and (oldest is None or g.items[0][3] < oldest[1]):
                oldest = (k, g.items[0][3])
        if oldest is None:
            return None
        if self._closed or now >= oldest[1] + self._delay_s or oldest[1] <= self._caught_up_at:
            return self._take(oldest[0])
        return None

    def _full(self, rows: int, tokens: int) -> bool:
        return rows >= self._max_rows or (self._max_tokens is not None and tokens >= self._max_tokens)

    def _take(self, key: Hashable) -> list[T]:
        lane = self._lanes[key]
        items = lane.items
        batch: list[T] = []
        rows = tokens = 0
        max_rows, max_tokens = self._max_rows, self._max_tokens
        if lane.rows <= max_rows and (max_tokens is None or lane.tokens <= max_tokens):  # the whole lane fits
            batch = [pending[0] for pending in items]
            rows, tokens = lane.rows, lane.tokens
            items.clear()
        else:
            popleft, append = items.popleft, batch.append
            while items:
                item, item_rows, item_tokens, _ = items[0]
                if batch and (
                    rows + item_rows > max_rows or (max_tokens is not None and tokens + item_tokens > max_tokens)
                ):
                    break
                popleft()
                append(item)
                rows += item_rows
                tokens += item_tokens
        lane.rows -= rows
        lane.tokens -= tokens
        self._rows -= rows
        if not items:
            del self._lanes[key]
        return batch

    async def next_batch(self) -> list[T] | None:
        """Wait for the next due batch; None once closed and empty.

        Wakes when an item arrives (a lane may fill) or when the oldest item's deadline passes.
        """
        while True:
            now = self._clock()
            batch = self.pop_ready(now)
            if batch is not None:
                return batch
            if self._closed:
                return None
            self._wakeup.clear()
            timeout = self.time_to_deadline(now)
            if timeout is None:
                await self._wakeup.wait()
                continue
            waiter = asyncio.ensure_future(self._wakeup.wait())
            timer = asyncio.ensure_future(self._sleep(timeout))
            try:
                await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                timer.cancel()
