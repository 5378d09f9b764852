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
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition

from consumer.config import Settings
from consumer.kafka.clients import Clients, ProducerClient

log = logging.getLogger(__name__)

#: Longest wait to close one producer (a broker that is gone must not hold a shutdown), seconds.
CLOSE_TIMEOUT_S = 2.0


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
        # One producer per transactional.id in this process: a second one would fence the first.
        self._opening = asyncio.Lock()

    async def open(self, tp: TopicPartition) -> ProducerClient:
        """``tp``'s producer, started if it is not yet; starting fences any other producer with its
        transactional.id.

        Raises:
            aiokafka.errors.KafkaError: the transaction coordinator cannot be reached.
        """
        async with self._opening:
            producer = self._producers.get(tp)
            if producer is None:
                s = self._settings
                producer = self._producers[tp] = await self._clients.producer(
                    f"{s.client_id}-txn-{tp.partition}",
                    transactional_id=transactional_id(s, tp),
                    transaction_timeout_ms=s.transaction_timeout_ms,
                )
                log.info("transactional producer for %s started (%s)", tp, transactional_id(s, tp))
            return producer

    def producer(self, tp: TopicPartition) -> ProducerClient:
        """``tp``'s producer (KeyError when it is not open)."""
        return self._producers[tp]

    def owns(self, tp: TopicPartition, producer: ProducerClient) -> bool:
        """Whether ``producer`` is still ``tp``'s (not closed by a revoke, nor replaced since)."""
        return self._producers.get(tp) is producer

    async def close(self, tp: TopicPartition) -> None:
        """Stop ``tp``'s producer (an open transaction is aborted by the next owner or the timeout)."""
        producer = self._producers.pop(tp, None)
        if producer is not None:
            await self._stop(tp, producer)

    async def discard(self, tp: TopicPartition, producer: ProducerClient) -> None:
        """Stop ``producer`` and forget it as ``tp``'s if it still is: a window that held it must not close the
        producer a later assignment opened. The next :meth:`open` starts a new one, which fences whatever the old
        one left."""
        if self.owns(tp, producer):
            del self._producers[tp]
        await self._stop(tp, producer)

    async def close_all(self) -> None:
        """Stop every producer."""
        for tp in list(self._producers):
            await self.close(tp)

    @staticmethod
    async def _stop(tp: TopicPartition, producer: ProducerClient) -> None:
        """Stop within :data:`CLOSE_TIMEOUT_S`. aiokafka's stop first waits for queued batches to be delivered;
        cut short, the old instance's sender lives on until the next producer with its transactional.id fences it."""
        try:
            await asyncio.wait_for(producer.stop(), timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 (closing a fenced or disconnected producer may fail)
            log.warning("closing the transactional producer of %s: %r", tp, exc)
