"""The narrow interfaces streaminfer uses of its Kafka clients, and the factory that makes the real ones.

Every stage that talks to Kafka takes a :class:`ConsumerClient` or a :class:`ProducerClient`: the parts of
aiokafka's ``AIOKafkaConsumer`` and ``AIOKafkaProducer`` it calls, and nothing else. :class:`KafkaClients` builds
the real clients from the settings; unit tests pass in-memory fakes of the same interfaces (``tests/unit/fakes.py``)
to drive the delivery logic without a broker. Pattern after encode/httpx ``_transports/base.py`` and ``mock.py``.

Answers are produced through the client's batch API (``create_batch`` / ``send_batch``): many records under one
future, the destination partition chosen by the same partitioner (murmur2 of the key) ``send`` would use.

Group membership (:meth:`KafkaClients.consumer`):

- **Assignor** (``partition_assignor``): round robin, or sticky (:func:`sticky_assignor`: a rebalance moves as few
  partitions as balance allows, so a member mostly gets its partitions back and keeps their transactional
  producers). One only: aiokafka (0.14) sends one JoinGroup per assignor it is given, each a change of the
  member's metadata that starts the rebalance again, so a group whose members offer two can rebalance for ever
  when they join together; and so no fallback protocol lets a rolling update switch a running group.
- **Static members leave** on a graceful stop (``leave_group_on_shutdown``, :class:`LeavingConsumer`); aiokafka,
  like the Java client before KIP-1092, keeps a static member in the group until its session times out.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

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

    async def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset of ``partition`` now (a fresh OffsetFetch; None: none committed)."""
        ...

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


def sticky_assignor() -> type[AbstractPartitionAssignor]:
    """aiokafka's sticky assignor (kafka-python's, KIP-54) with state of its own.

    The assignor keeps the member's last assignment, which it sends with every JoinGroup so the leader can keep each
    partition where it was, in *class* attributes: every consumer of a process would share them. A subclass made
    per consumer holds them apart. aiokafka never tells it the group's generation, so every member reports -1; a
    partition two members claim (one of them out of the group meanwhile) goes to one of them, and fencing keeps
    exactly-once correct whichever it is.
    """
    return type(
        "StreaminferStickyAssignor",
        (StickyPartitionAssignor,),
        {"member_assignment": None, "generation": StickyPartitionAssignor.DEFAULT_GENERATION_ID,
         "_latest_partition_movements": None},
    )  # fmt: skip


class LeavingConsumer(AIOKafkaConsumer):  # type: ignore[misc]  # aiokafka is untyped
    """An ``AIOKafkaConsumer`` whose static member (``group_instance_id``) sends LeaveGroup when it stops.

    aiokafka's coordinator skips LeaveGroup for a static member; on stop, once its coordination task has ended, this
    one forgets the instance id just before aiokafka's own leave step, which then sends LeaveGroup with the member
    id (the broker removes the static member with it). A member killed (SIGKILL, OOM) sends nothing and keeps its
    partitions while it restarts with the same id. Checked against aiokafka 0.12 to 0.14 (``_coordinator``,
    ``_group_instance_id``, ``_maybe_leave_group``): :func:`leaves_static_members` says whether the installed one
    has them.
    """

    async def stop(self) -> None:
        coordinator = getattr(self, "_coordinator", None)
        if coordinator is not None and leaves_static_members(coordinator):
            aiokafka_leave = getattr(coordinator, LEAVE_STEP)

            async def leave() -> None:
                setattr(coordinator, INSTANCE_ID, None)  # the coordination task has ended: only the leave reads it
                await aiokafka_leave()

            setattr(coordinator, LEAVE_STEP, leave)
        await super().stop()


#: aiokafka's ``GroupCoordinator`` attributes :class:`LeavingConsumer` uses: the static member's id, and the leave
#: step ``close()`` awaits last.
INSTANCE_ID, LEAVE_STEP = "_group_instance_id", "_maybe_leave_group"


def leaves_static_members(coordinator: object) -> bool:
    """Whether ``coordinator`` (aiokafka's ``GroupCoordinator``) has what :class:`LeavingConsumer` relies on."""
    return hasattr(coordinator, INSTANCE_ID) and callable(getattr(coordinator, LEAVE_STEP, None))


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
        leaving = s.group_instance_id is not None and s.leave_group_on_shutdown
        consumer_class: type[AIOKafkaConsumer] = LeavingConsumer if leaving else AIOKafkaConsumer
        assignor = sticky_assignor() if s.partition_assignor == "sticky" else RoundRobinPartitionAssignor
        consumer: ConsumerClient = consumer_class(
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
            partition_assignment_strategy=(assignor,),  # one: see the module docstring
        )
        return consumer

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
