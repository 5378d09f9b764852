"""What the local broker's cluster says about itself, through Kafka's admin API (aiokafka): which brokers are
registered, which topics exist, each partition's leader and replicas."""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

#: (topic, partition) -> (leader, replicas, in-sync replicas), broker IDs (leader -1: none).
Partitions = dict[tuple[str, int], tuple[int, list[int], list[int]]]


async def broker_ids(bootstrap: str, timeout_s: float) -> set[int]:
    """The broker IDs in a metadata response from ``bootstrap`` (KRaft lists only registered, unfenced brokers)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="localkafka", request_timeout_ms=int(timeout_s * 1000)
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        described = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
        return {int(b["node_id"]) for b in described["brokers"]}
    finally:
        with contextlib.suppress(KafkaError, OSError):
            await admin.close()


async def partitions(bootstrap: str) -> Partitions:
    """Every partition of every topic: (leader, replicas, in-sync replicas)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="localkafka")
    await admin.start()
    try:
        out = {}
        for topic in await admin.describe_topics():
            for part in topic["partitions"]:
                out[(topic["topic"], int(part["partition"]))] = (
                    int(part["leader"]),
                    [int(r) for r in part["replicas"]],
                    [int(r) for r in part["isr"]],
                )
        return out
    finally:
        await admin.close()


async def topic_names(bootstrap: str) -> list[str]:
    """The topic names, sorted (internal ones included)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="localkafka")
    await admin.start()
    try:
        return sorted(await admin.list_topics())
    finally:
        await admin.close()
