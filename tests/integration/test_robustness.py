"""Records that once stalled or crashed the consumer: compressed batches, answers too large to write."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from consumer.__main__ import EXIT_KAFKA, main
from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import REASON_HEADER, VALUE_DROPPED_HEADER
from consumer.oip.client import encode_request
from producer_tools.produce import Outgoing, digits_requests
from producer_tools.topics import ensure_topics
from tests.integration.conftest import AppFactory, answers

pytestmark = pytest.mark.integration


async def send(bootstrap: str, topic: str, records: list[Outgoing], **producer_options: object) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **producer_options)
    await producer.start()
    try:
        for rec in records:
            cid = rec.correlation_id.encode()
            await producer.send_and_wait(topic, rec.value, key=cid, headers=[(CORRELATION_HEADER, cid)])
    finally:
        await producer.stop()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_compressed_batches_are_answered(
    codec: str, kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    app = await start_app()
    records = list(digits_requests(f"{codec}-{uuid.uuid4().hex[:6]}", digits_model / "heldout.npz", limit=20))
    await send(kafka_bootstrap, topics["requests"], records, compression_type=codec)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.results == 20
    assert app.failed is None


async def test_answers_too_large_to_write_never_block_the_partition(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    app = await start_app(producer_max_request_bytes=2048)
    x = np.load(digits_model / "heldout.npz")["x"]
    run = uuid.uuid4().hex[:6]
    big_result = Outgoing(f"{run}-big-result", encode_request(None, {"input": x[:64]}))  # ~10 KB response
    big_poison = Outgoing(f"{run}-big-poison", b"\xff" * 4000)  # its dead letter exceeds 2048 bytes
    small = list(digits_requests(run, digits_model / "heldout.npz", limit=5))
    records = [big_result, big_poison, *small]
    await send(kafka_bootstrap, topics["requests"], records)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.results == 5

    result_dl = report.answers[big_result.correlation_id]
    assert result_dl.kind == "dead_letter"
    assert result_dl.reason == "result_too_large"
    poison_dl = report.answers[big_poison.correlation_id]
    assert poison_dl.headers[REASON_HEADER] == b"invalid_json"
    assert poison_dl.headers[VALUE_DROPPED_HEADER] == b"4000"  # the reduced dead letter: no value, size noted

    # Everything was answered, so everything gets committed: the partitions are not blocked.
    async def caught_up() -> bool:
        return app.lag == 0 and app.in_flight_rows == 0

    for _ in range(100):
        if await caught_up():
            break
        await asyncio.sleep(0.1)
    assert await caught_up()


def test_unreachable_broker_exits_4(digits_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--bootstrap-servers", "127.0.0.1:1",
            "--model-path", str(digits_model / "digits.onnx"),
            "--http-port", "0",
            "--execution-provider", "cpu",
        ]
    )  # fmt: skip
    assert code == EXIT_KAFKA
    assert "bootstrap_servers=127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
async def test_results_the_broker_refuses_become_dead_letters_not_loops(
    delivery: str, kafka_bootstrap: str, start_app: AppFactory, digits_model: Path
) -> None:
    """The results topic takes at most 5000 bytes per batch: a 100-row response (~14 KB) is refused by the broker
    (not by the producer, whose limit is 1 MiB). Only that record is dead-lettered; its neighbours get results."""
    tag = uuid.uuid4().hex[:8]
    topics = {"requests": f"big-{tag}.requests", "results": f"big-{tag}.results", "dlq": f"big-{tag}.dlq"}
    await ensure_topics(
        kafka_bootstrap,
        {topics["requests"]: 1, topics["results"]: 1, topics["dlq"]: 1},
        configs={topics["results"]: {"max.message.bytes": "5000"}},
    )
    await start_app(
        delivery=delivery,
        requests_topic=topics["requests"],
        results_topic=topics["results"],
        dead_letter_topic=topics["dlq"],
        transactional_id_prefix=f"big-{tag}",
    )
    x = np.load(digits_model / "heldout.npz")["x"]
    big = Outgoing(f"{tag}-big", encode_request(None, {"input": x[:100]}))
    small = list(digits_requests(tag, digits_model / "heldout.npz", limit=20))
    records = [*small[:10], big, *small[10:]]
    await send(kafka_bootstrap, topics["requests"], records)
    report = await answers(kafka_bootstrap, topics, records, isolation_level="read_committed", settle_s=1)
    assert report.missing == []
    assert report.results == 20
    assert report.answers[big.correlation_id].reason == "result_too_large"
    if delivery == "exactly_once":
        assert report.duplicates == 0
