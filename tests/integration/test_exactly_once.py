"""exactly_once: answers and offsets commit in one transaction per partition; read_committed sees each once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from producer_tools.produce import digits_requests, interleave, poison_requests, send_all
from producer_tools.results import collect
from tests.integration.conftest import AppFactory

pytestmark = pytest.mark.integration


async def test_each_answer_exactly_once_with_offsets_in_the_transaction(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    app = await start_app(delivery="exactly_once", transactional_id_prefix=f"it-{uuid.uuid4().hex[:6]}")
    run = uuid.uuid4().hex[:6]
    poison = poison_requests(run)[:5]
    records = interleave(list(digits_requests(run, digits_model / "heldout.npz", limit=120)), poison)
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    expected = {r.correlation_id: r.manifest() for r in records}
    report = await collect(
        kafka_bootstrap,
        topics["results"],
        topics["dlq"],
        expected,
        60,
        progress=False,
        isolation_level="read_committed",
        settle_s=2,
    )
    assert report.missing == []
    assert report.duplicates == 0
    assert report.results == 120
    assert report.dead_letters == 5
    assert report.reason_mismatches == []

    # The offsets went with the transactions: the group's committed positions are the log ends.
    probe = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=app.settings.group_id)
    await probe.start()
    try:
        tps = [TopicPartition(topics["requests"], p) for p in range(4)]
        ends = await probe.end_offsets(tps)
        for tp in tps:
            assert await probe.committed(tp) == ends[tp]
    finally:
        await probe.stop()
