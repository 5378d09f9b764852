"""Exactly-once delivery: one transactional producer per assigned input partition.

For each transaction window of a partition (``commit_interval_ms``), the answers (results and dead letters) and
the partition's next offset are written in one Kafka transaction (``send_offsets_to_transaction``); a reader with
``isolation.level=read_committed`` sees each answer exactly once, and a crash before the commit leaves nothing
visible and nothing committed.

Zombie fencing follows Kafka Streams' original exactly-once design (EOS v1): the transactional.id is derived from
the input partition, ``<transactional_id_prefix>-<group_id>-<topic>-<partition>``. Whoever owns the partition next
(after a rebalance, or the same pod restarted after ``kill -9``) starts a producer with the same transactional.id;
its ``InitProducerId`` bumps the epoch, aborts the old owner's open transaction and fences the old producer, whose
later sends and commits fail with ``ProducerFenced``. (The group-generation-aware variant, KIP-447, needs
``TxnOffsetCommit`` v3, which aiokafka does not send.) The price is a producer per assigned partition.

Rebalances (aiokafka's protocol is eager: every member gives up every partition each time): a revoked partition's
producer is *parked*, not closed (:meth:`PartitionTransactions.park`); if the new assignment gives the partition
back, as the sticky assignor mostly does, its producer is kept, with no InitProducerId and nothing for the broker
to fence; the others are closed (:meth:`PartitionTransactions.reassign`). The new partitions' producers are started
concurrently, each InitProducerId on its own. A kept producer that someone fenced meanwhile (this member was out
of the group for a while and another owned the partition) fails its next transaction with ``ProducerFenced``: the
window is dropped and read again with a new producer, as after any fencing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiokafka import TopicPartition

from consumer.config import Settings
from consumer.kafka.clients import Clients, ProducerClient

log = logging.getLogger(__name__)

#: Longest wait to close one producer (a broker that is gone must not hold a shutdown), seconds.
CLOSE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Reassigned:
    """What :meth:`PartitionTransactions.reassign` did with the producers, counts."""

    kept: int
    opened: int
    closed: int
    failed: int
    #: The partitions whose parked producers were kept, and those whose new producers did not start.
    kept_partitions: frozenset[TopicPartition] = frozenset()
    failed_partitions: frozenset[TopicPartition] = frozenset()


def transactional_id(settings: Settings, tp: TopicPartition) -> str:
    """The transactional.id owning ``tp``'s answers: stable across restarts and members."""
    return f"{settings.transactional_id_prefix}-{settings.group_id}-{tp.topic}-{tp.partition}"


class PartitionTransactions:
    """Transactional producers keyed by input partition.

    Args:
        settings: the consumer settings (client id, group, transaction timeout).
        clients: opens the producers.
    """

    def __init__(self, settings: Settings, clients: Clients) -> None:
        self._settings = settings
        self._clients = clients
        self._producers: dict[TopicPartition, ProducerClient] = {}
        #: Producers of revoked partitions, until the next assignment says which come back.
        self._parked: dict[TopicPartition, ProducerClient] = {}
        # One producer per transactional.id in this process (a second one would fence the first): one lock per
        # partition, so different partitions' producers start concurrently.
        self._opening: dict[TopicPartition, asyncio.Lock] = {}

    async def open(self, tp: TopicPartition) -> ProducerClient:
        """``tp``'s producer, started if it is not yet; starting fences any other producer with its
        transactional.id.

        Raises:
            aiokafka.errors.KafkaError: the transaction coordinator cannot be reached.
        """
        async with self._opening.setdefault(tp, asyncio.Lock()):
            producer = self._producers.get(tp)
            if producer is None:
                s = self._settings
                producer = self._producers[tp] = await self._clients.producer(
                    f"{s.client_id}-txn-{tp.partition}",
                    transactional_id=transactional_id(s, tp),
                    transaction_timeout_ms=s.transaction_timeout_ms,
                )
                log.debug("transactional producer for %s started (%s)", tp, transactional_id(s, tp))
            return producer

    def producer(self, tp: TopicPartition) -> ProducerClient:
        """``tp``'s producer (KeyError when it is not open)."""
        return self._producers[tp]

    def is_open(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` has a started producer (its InitProducerId done)."""
        return tp in self._producers

    def owns(self, tp: TopicPartition, producer: ProducerClient) -> bool:
        """Whether ``producer`` is still ``tp``'s (not closed by a revoke, nor replaced since)."""
        return self._producers.get(tp) is producer

    def park(self, tps: set[TopicPartition]) -> None:
        """Set the producers of revoked partitions aside (no open transaction: the revoke finished the window) until
        :meth:`reassign` says which partitions come back."""
        for tp in tps:
            producer = self._producers.pop(tp, None)
            if producer is not None:
                self._parked[tp] = producer

    async def reassign(self, assigned: set[TopicPartition]) -> Reassigned:
        """Take the new assignment: keep the parked producers of partitions that came back, close the other parked
        ones and start the new partitions' producers, all concurrently. A producer that cannot start is left to the
        partition's first window (which tries again); its error is returned.
        """
        kept = {tp for tp in self._parked if tp in assigned}
        for tp in kept:
            self._producers[tp] = self._parked.pop(tp)
        gone, self._parked = self._parked, {}
        new = sorted(assigned - set(self._producers), key=lambda tp: (tp.topic, tp.partition))
        results = await asyncio.gather(
            *(self.open(tp) for tp in new), *(self._stop(tp, p) for tp, p in gone.items()), return_exceptions=True
        )
        failed = {tp: r for tp, r in zip(new, results, strict=False) if isinstance(r, BaseException)}
        for tp, exc in failed.items():
            if not isinstance(exc, Exception):
                raise exc  # cancelled: the rebalance itself is being torn down
            log.warning("transactional producer for %s did not start (%r); its first window tries again", tp, exc)
        return Reassigned(
            kept=len(kept), opened=len(new) - len(failed), closed=len(gone), failed=len(failed),
            kept_partitions=frozenset(kept), failed_partitions=frozenset(failed),
        )  # fmt: skip

    async def close(self, tp: TopicPartition) -> None:
        """Stop ``tp``'s producer (an open transaction is aborted by the next owner or the timeout)."""
        producer = self._producers.pop(tp, None)
        if producer is not None:
            await self._stop(tp, producer)

    async def close_many(self, tps: set[TopicPartition]) -> None:
        """Stop the producers of ``tps``, concurrently."""
        await asyncio.gather(*(self.close(tp) for tp in tps))

    async def discard(self, tp: TopicPartition, producer: ProducerClient) -> None:
        """Stop ``producer`` and forget it as ``tp``'s if it still is: a window that held it must not close the
        producer a later assignment opened. The next :meth:`open` starts a new one, which fences whatever the old
        one left."""
        if self.owns(tp, producer):
            del self._producers[tp]
        await self._stop(tp, producer)

    async def close_all(self) -> None:
        """Stop every producer (parked ones too), concurrently."""
        everything = [*self._producers.items(), *self._parked.items()]
        self._producers, self._parked = {}, {}
        await asyncio.gather(*(self._stop(tp, p) for tp, p in everything))

    @staticmethod
    async def _stop(tp: TopicPartition, producer: ProducerClient) -> None:
        """Stop within :data:`CLOSE_TIMEOUT_S`. aiokafka's stop first waits for queued batches to be delivered;
        cut short, the old instance's sender lives on until the next producer with its transactional.id fences it."""
        try:
            await asyncio.wait_for(producer.stop(), timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 (closing a fenced or disconnected producer may fail)
            log.warning("closing the transactional producer of %s: %r", tp, exc)
