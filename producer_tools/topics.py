"""Create the requests, results and dead-letter topics (idempotent), with Kafka's own admin API via aiokafka."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

log = logging.getLogger(__name__)


async def ensure_topics(
    bootstrap_servers: str,
    partitions: dict[str, int],
    replication_factor: int = 1,
    configs: dict[str, dict[str, str]] | None = None,
) -> None:
    """Create each topic in ``partitions`` (name -> partition count) unless it exists.

    ``configs`` gives per-topic configs (e.g. ``message.timestamp.type=LogAppendTime`` for the results topic,
    so a result's timestamp is the broker's append time).

    Raises:
        aiokafka.errors.KafkaError: the broker refused for another reason than "already exists".
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="streaminfer-admin")
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
                    raise RuntimeError(f"cannot create topic {name!r}: Kafka error code {code}")
            log.info("created topics %s", [t.name for t in new])
    finally:
        await admin.close()
