"""Create the requests, results and dead-letter topics (idempotent), with Kafka's own admin API via aiokafka, and
check that a topic exists before the tools write to it (brokers that create no topic on first use are the norm)."""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from producer_tools.cli import UserFault
from producer_tools.security import Security

log = logging.getLogger(__name__)


class TopicMissingError(UserFault):
    """A tool was asked to write to a topic that does not exist on the cluster."""


async def require_topic(producer: AIOKafkaProducer, topic: str) -> None:
    """Raise unless ``topic`` is in the cluster's metadata (one metadata request of the started ``producer``).

    Raises:
        TopicMissingError: it is not; the message says how to create it.
        aiokafka.errors.KafkaError: the metadata request failed.
    """
    metadata = await producer.client.fetch_all_metadata()
    if topic not in metadata.topics():
        raise TopicMissingError(
            f"topic {topic!r} does not exist on the cluster: create it first (e.g. scripts/kafka-local topics create "
            f"{topic} 4), or fix the name"
        )


async def ensure_topics(
    bootstrap_servers: str,
    partitions: dict[str, int],
    replication_factor: int = 1,
    configs: dict[str, dict[str, str]] | None = None,
    *,
    security: Security = None,
) -> None:
    """Create each topic in ``partitions`` (name -> partition count) unless it exists.

    ``configs`` gives per-topic configs (e.g. ``message.timestamp.type=LogAppendTime`` for the results topic,
    so a result's timestamp is the broker's append time). ``security``: aiokafka's TLS/SASL keyword arguments
    (:meth:`producer_tools.security.ClientSecurity.kwargs`).

    Raises:
        aiokafka.errors.KafkaError: the broker refused for another reason than "already exists".
    """
    admin = AIOKafkaAdminClient(**(security or {}), bootstrap_servers=bootstrap_servers, client_id="streaminfer-admin")
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        configs = configs or {}
        new = [
            NewTopic(name, n, replication_factor, topic_configs=configs.get(name, {}))
            for name, n in partitions.items()
            if name not in existing
        ]
        if new:
            response = await admin.create_topics(new)
            for name, code, *_ in getattr(response, "topic_errors", getattr(response, "topics", [])):
                if code not in (0, TopicAlreadyExistsError.errno):
                    reason = for_code(code)
                    raise RuntimeError(f"cannot create topic {name!r}: {reason.__name__} (Kafka error code {code}: "
                                       f"{reason.description})")  # fmt: skip
            log.info("created topics %s", [t.name for t in new])
    finally:
        await admin.close()


async def partitions_of(bootstrap_servers: str, topic: str, security: Security = None) -> set[int]:
    """``topic``'s partitions. The consumer's own metadata covers only topics it subscribed to, and a group
    subscription would rebalance, so the partitions are asked of the cluster (the admin client's metadata request).

    Raises:
        TopicMissingError: the topic does not exist.
        KafkaError: the broker cannot be reached.
    """
    admin = AIOKafkaAdminClient(**(security or {}), bootstrap_servers=bootstrap_servers, client_id="streaminfer-admin")
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    found = [t for t in described if t["topic"] == topic and t["error_code"] == 0 and t["partitions"]]
    if not found:
        raise TopicMissingError(f"topic {topic!r} does not exist on the cluster; fix the name")
    return {int(p["partition"]) for p in found[0]["partitions"]}
