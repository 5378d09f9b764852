"""What may be committed: the highest contiguous finished offset per partition.

Every fetched record is *tracked* in fetch order (ascending offsets, with gaps where Kafka skips offsets: compacted
records, transaction markers). A record is *done* once the broker acknowledged its result or dead letter. The
commit position of a partition is one past the last record of the longest done prefix: records done out of
order wait behind an unfinished one, so a commit never passes a record that has no acknowledged answer.
Pattern after faust ``transport/consumer.py`` (acked offsets up to the first gap).

A :class:`PartitionOffsets` belongs to one assignment of its partition: on revoke the tracker forgets it, and
late ``done`` calls from work of the old assignment land on the detached object, harmlessly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class PartitionOffsets:
    """Done-tracking for one partition during one assignment.

    Offsets must be tracked in increasing order. ``commit_position`` is the Kafka commit offset
    (next offset to read), or None when nothing has finished since the assignment.
    """

    __slots__ = ("_done", "_order", "commit_position", "committed", "first_tracked", "next_offset")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: set[int] = set()
        self.commit_position: int | None = None
        self.committed: int | None = None
        self.first_tracked: int | None = None
        self.next_offset: int | None = None  # one past the last tracked offset

    def track(self, offset: int) -> None:
        """Register a fetched record.

        Raises:
            ValueError: ``offset`` is not above the last tracked or committed position.
        """
        last = self._order[-1] if self._order else (self.commit_position or 0) - 1
        if offset <= last:
            raise ValueError(f"offset {offset} tracked out of order (last {last})")
        self._order.append(offset)
        self.next_offset = offset + 1
        if self.first_tracked is None:
            self.first_tracked = offset

    def done(self, offset: int) -> None:
        """Mark a tracked record as answered; advances ``commit_position`` over the done prefix."""
        order, done = self._order, self._done
        if order and order[0] == offset:  # the first unfinished one (answers mostly come in order): no set
            order.popleft()
            self.commit_position = offset + 1
            if not done:
                return
        else:
            done.add(offset)
        while order and order[0] in done:
            first = order.popleft()
            done.discard(first)
            self.commit_position = first + 1

    @property
    def unanswered_from(self) -> int | None:
        """The first offset of this assignment not yet committed (the group's position for lag), or None."""
        return self.committed if self.committed is not None else self.first_tracked

    @property
    def pending(self) -> int:
        """Records tracked but not yet done, or done but waiting behind an unfinished one."""
        return len(self._order)

    @property
    def unfinished(self) -> int:
        """Records tracked and not yet done."""
        return len(self._order) - len(self._done)

    @property
    def needs_commit(self) -> bool:
        """Whether ``commit_position`` moved past the last committed position."""
        return self.commit_position is not None and self.commit_position != self.committed


class OffsetTracker(Generic[K]):
    """Per-partition :class:`PartitionOffsets` for the partitions currently assigned.

    Keys are whatever identifies a partition (aiokafka's ``TopicPartition``).
    """

    def __init__(self) -> None:
        self._partitions: dict[K, PartitionOffsets] = {}
        self._epochs: dict[K, int] = {}  # per partition: how often it was forgotten or rewound

    def epoch(self, tp: K) -> int:
        """How often ``tp`` was forgotten (revoked) or rewound: records fetched before the number moved belong to an
        assignment (or a read position) that is gone, and must not be tracked in the new one."""
        return self._epochs.get(tp, 0)

    def partition(self, tp: K) -> PartitionOffsets:
        """The tracker of ``tp``'s current assignment, created on first use."""
        offsets = self._partitions.get(tp)
        if offsets is None:
            offsets = self._partitions[tp] = PartitionOffsets()
        return offsets

    def committable(self, only: set[K] | None = None) -> dict[K, int]:
        """``{tp: commit_position}`` for partitions whose position moved since their last commit."""
        return {
            tp: p.commit_position
            for tp, p in self._partitions.items()
            if p.needs_commit and p.commit_position is not None and (only is None or tp in only)
        }

    def mark_committed(self, offsets: dict[K, int]) -> None:
        """Record a successful commit of ``offsets``."""
        for tp, position in offsets.items():
            p = self._partitions.get(tp)
            if p is not None:
                p.committed = position

    def items(self) -> list[tuple[K, PartitionOffsets]]:
        """(partition, tracker) pairs of the current assignment."""
        return list(self._partitions.items())

    def rewind(self, tp: K) -> None:
        """Start ``tp`` afresh (its records will be fetched again) but keep its committed position."""
        old = self._partitions.get(tp)
        self._epochs[tp] = self._epochs.get(tp, 0) + 1
        fresh = self._partitions[tp] = PartitionOffsets()
        if old is not None:
            fresh.committed = fresh.commit_position = old.committed

    def forget(self, tps: set[K]) -> None:
        """Drop revoked partitions; their detached trackers ignore late completions."""
        for tp in tps:
            self._partitions.pop(tp, None)
            self._epochs[tp] = self._epochs.get(tp, 0) + 1

    @property
    def pending(self) -> int:
        """Records tracked and not yet committable, across assigned partitions."""
        return sum(p.pending for p in self._partitions.values())
