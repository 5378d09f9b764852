"""exactly_once: answers and offsets commit in one transaction per partition; read_committed sees each once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumer.delivery.transactions import PartitionTransactions
from consumer.kafka.clients import KafkaClients
from producer_tools.produce import digits_requests, interleave, poison_requests, send_all
from tests.integration.conftest import MODEL_PLACEHOLDER, AppFactory, answers, group_offsets, settings_for

pytestmark = pytest.mark.integration


async def test_each_answer_exactly_once_with_offsets_in_the_transaction(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    app = await start_app(delivery="exactly_once", transactional_id_prefix=f"it-{uuid.uuid4().hex[:6]}")
    run = uuid.uuid4().hex[:6]
    poison = poison_requests(run)[:5]
    records = interleave(list(digits_requests(run, digits_model / "heldout.npz", limit=120)), poison)
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records, isolation_level="read_committed", settle_s=2)
    assert report.missing == []
    assert report.duplicates == 0
    assert report.results == 120
    assert report.dead_letters == 5
    assert report.reason_mismatches == []

    # The offsets went with the transactions: the group's committed positions are the log ends.
    committed, ends = await group_offsets(kafka_bootstrap, app.settings.group_id, topics["requests"])
    assert committed == ends


async def test_zombie_is_fenced_by_the_partitions_next_owner(kafka_bootstrap: str, topics: dict[str, str]) -> None:
    """Two members believe they own partition 0: the older producer (the zombie) can no longer commit, and a
    read_committed reader never sees what it wrote."""
    settings = settings_for(kafka_bootstrap, topics, MODEL_PLACEHOLDER, delivery="exactly_once")
    tp = TopicPartition(topics["requests"], 0)
    clients = KafkaClients(settings, {})
    zombie, owner = PartitionTransactions(settings, clients), PartitionTransactions(settings, clients)
    await zombie.open(tp)
    try:
        old = zombie.producer(tp)
        await old.begin_transaction()
        await old.send_and_wait(topics["results"], b"zombie", key=b"z")
        await owner.open(tp)  # the new owner's InitProducerId bumps the epoch: the zombie is fenced
        new = owner.producer(tp)
        await new.begin_transaction()
        await new.send_and_wait(topics["results"], b"owner", key=b"o")
        await new.commit_transaction()
        with pytest.raises(KafkaError):
            await old.commit_transaction()
    finally:
        await zombie.close_all()
        await owner.close_all()

    reader = AIOKafkaConsumer(
        topics["results"],
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await reader.start()
    try:
        seen = []
        for _ in range(10):
            batch = await reader.getmany(timeout_ms=500)
            seen += [r.value for records in batch.values() for r in records]
            if seen:
                break
    finally:
        await reader.stop()
    assert seen == [b"owner"]
