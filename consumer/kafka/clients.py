"""The narrow interfaces streaminfer uses of its Kafka clients, and the factory that makes the real ones.

Every stage that talks to Kafka takes a :class:`ConsumerClient` or a :class:`ProducerClient`: the parts of
aiokafka's ``AIOKafkaConsumer`` and ``AIOKafkaProducer`` it calls, and nothing else. :class:`KafkaClients` builds
the real clients from the settings; unit tests pass in-memory fakes of the same interfaces (``tests/unit/fakes.py``)
to drive the delivery logic without a broker. Pattern after encode/httpx ``_transports/base.py`` and ``mock.py``.

Answers are produced through the client's batch API (``create_batch`` / ``send_batch``): many records under one
future, the destination partition chosen by the same partitioner (murmur2 of the key) ``send`` would use.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from consumer.config import Settings
from consumer.kafka.unpack import install


class BatchLike(Protocol):
    """aiokafka's ``BatchBuilder``: records appended to one producer batch."""

    def append(
        self, *, timestamp: int | None, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]
    ) -> Any:
        """Add a record; None when the batch is full (the first record always fits)."""
        ...

    def record_count(self) -> int:
        """Records appended so far."""
        ...


class ProducerClient(Protocol):
    """The part of ``AIOKafkaProducer`` used here (results, dead letters, transactions)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def create_batch(self) -> BatchLike: ...

    async def send_batch(self, batch: BatchLike, topic: str, *, partition: int) -> asyncio.Future[Any]:
        """Queue a batch; the future resolves when the broker acknowledged it (or fails)."""
        ...

    async def partitions_for(self, topic: str) -> set[int]: ...

    async def begin_transaction(self) -> None: ...

    async def commit_transaction(self) -> None: ...

    async def abort_transaction(self) -> None: ...

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group_id: str) -> None: ...


class ConsumerClient(Protocol):
    """The part of ``AIOKafkaConsumer`` used here."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None: ...

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]: ...

    def assignment(self) -> set[TopicPartition]: ...

    def paused(self) -> set[TopicPartition]: ...

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    async def position(self, partition: TopicPartition) -> int: ...

    def highwater(self, partition: TopicPartition) -> int | None: ...

    async def topics(self) -> set[str]: ...

    async def commit(self, offsets: dict[TopicPartition, int]) -> None: ...


class Clients(Protocol):
    """Makes the Kafka clients of one consumer process."""

    def consumer(self) -> ConsumerClient:
        """A consumer in the settings' group (not started)."""
        ...

    async def producer(self, client_id: str, **options: Any) -> ProducerClient:
        """A started idempotent ``acks=all`` producer (``options``: ``transactional_id``, ...).

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        ...


class KafkaClients:
    """The real aiokafka clients, configured from the settings.

    Args:
        settings: bootstrap servers, group, timeouts and producer limits.
        security: aiokafka TLS/SASL keyword arguments (:func:`consumer.kafka.security.kafka_security_kwargs`).
    """

    def __init__(self, settings: Settings, security: dict[str, Any]) -> None:
        self._settings = settings
        self._security = security

    def consumer(self) -> ConsumerClient:
        """The group member on the requests topic; the client's unpacking of record batches is bounded first
        (:func:`consumer.kafka.unpack.install`).

        Raises:
            ConfigError: the installed aiokafka cannot be bounded.
        """
        s = self._settings
        install(s.max_batch_unpacked_bytes, s.max_record_bytes)
        return AIOKafkaConsumer(  # type: ignore[no-any-return]
            **self._security,
            bootstrap_servers=s.bootstrap_servers,
            group_id=s.group_id,
            group_instance_id=s.group_instance_id,
            client_id=f"{s.client_id}-consumer",
            enable_auto_commit=False,
            auto_offset_reset=s.auto_offset_reset,
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
            isolation_level="read_committed" if s.delivery == "exactly_once" else "read_uncommitted",
        )

    async def producer(self, client_id: str, **options: Any) -> ProducerClient:
        s = self._settings
        producer = AIOKafkaProducer(
            **self._security,
            **options,
            bootstrap_servers=s.bootstrap_servers,
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=s.producer_linger_ms,
            max_request_size=s.producer_max_request_bytes,
            max_batch_size=s.producer_batch_bytes,
            request_timeout_ms=s.producer_request_timeout_ms,
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()  # a failed start leaves open connections behind
            raise
        return producer  # type: ignore[no-any-return]
