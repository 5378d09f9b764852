"""Rebalances, timed: the listener the group calls, the time of each phase, one log line per rebalance.

aiokafka speaks the classic (eager) group protocol: on every rebalance each member first gives up all its
partitions (``on_partitions_revoked``), then rejoins (JoinGroup and SyncGroup: the coordinator waits for every
member), then receives its new partitions (``on_partitions_assigned``). A group serves nothing between the first
revoke and the last assignment, so the time of each phase is what a scale step costs::

    revoke   the delivery mode's revoke handler: finish (exactly_once: commit) the work of the partitions, s
    join     from the end of the revoke to the assignment: JoinGroup and SyncGroup, waiting for the other members
             (a member learns of a rebalance at its next heartbeat, ``heartbeat_interval_ms``), s
    assign   the delivery mode's assignment handler (exactly_once: the transactional producers opened), s

Each is observed in ``streaminfer_rebalance_seconds{phase}``; assignments are counted in
``streaminfer_rebalances_total``; and one INFO line per rebalance says them all, with what the delivery mode added
(:meth:`RebalanceListener.note`), e.g.::

    rebalance: revoke 0.132 s (4 partitions), join 0.815 s, assign 0.094 s (8 partitions; producers: 4 kept, 4 opened)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiokafka import ConsumerRebalanceListener, TopicPartition

from consumer.ops.metrics import Metrics

log = logging.getLogger(__name__)

RebalanceHandler = Callable[[set[TopicPartition]], Awaitable[None]]


class RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    """Forwards revokes and assignments to the delivery mode's handlers and times them.

    Args:
        on_revoked: the delivery mode's revoke handler.
        on_assigned: the delivery mode's assignment handler.
        metrics: ``rebalance_seconds`` and ``rebalances``.
        clock: monotonic seconds.
    """

    def __init__(
        self, on_revoked: RebalanceHandler, on_assigned: RebalanceHandler, metrics: Metrics, clock: Callable[[], float]
    ) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned
        self._metrics = metrics
        self._clock = clock
        self._revoke_s = 0.0
        self._revoked = 0
        self._revoke_ended: float | None = None  # None: no revoke since the last assignment
        self._notes: list[str] = []

    def note(self, text: str) -> None:
        """Add ``text`` to the line of the rebalance in progress (the delivery mode's own figures)."""
        self._notes.append(text)

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """The group takes every partition back before it rejoins (also called, with none, before the first
        join): the revoke handler, timed."""
        started = self._clock()
        try:
            await self._on_revoked(set(revoked))
        finally:
            ended = self._clock()
            self._revoke_s, self._revoked, self._revoke_ended = ended - started, len(revoked), ended

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """The group's new assignment: the assignment handler, timed; then the rebalance's line."""
        started = self._clock()
        join_s = started - self._revoke_ended if self._revoke_ended is not None else 0.0
        try:
            await self._on_assigned(set(assigned))
        finally:
            assign_s = self._clock() - started
            seconds = self._metrics.rebalance_seconds
            seconds.labels("revoke").observe(self._revoke_s)
            seconds.labels("join").observe(join_s)
            seconds.labels("assign").observe(assign_s)
            self._metrics.rebalances.inc()
            notes = "".join(f"; {n}" for n in self._notes)
            log.info(
                "rebalance: revoke %.3f s (%d partitions), join %.3f s, assign %.3f s (%d partitions%s)",
                self._revoke_s, self._revoked, join_s, assign_s, len(assigned), notes,
            )  # fmt: skip
            self._revoke_s, self._revoked, self._revoke_ended, self._notes = 0.0, 0, None, []
