"""A record the Kafka client cannot parse (a header key that is not UTF-8, which librdkafka-based producers can
write) must not crash-loop the consumer: it is found, dead-lettered as undecodable_record, and skipped."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiokafka.producer.message_accumulator as accumulator
import aiokafka.producer.producer as producer_module
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import OFFSET_HEADER, REASON_HEADER
from producer_tools.produce import digits_requests
from producer_tools.results import collect
from tests.integration.conftest import AppFactory

pytestmark = pytest.mark.integration


class NotUtf8Key(str):
    """A header key whose wire bytes are not UTF-8 (aiokafka's own producer would refuse to write one)."""

    def encode(self, *_args: object, **_kwargs: object) -> bytes:  # type: ignore[override]
        return b"\xff\xfe-key"


async def test_undecodable_record_is_dead_lettered_and_skipped(
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
    digits_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = uuid.uuid4().hex[:6]
    good = list(digits_requests(run, digits_model / "heldout.npz", limit=10))
    # The pure-Python batch builder encodes header keys through str.encode, so the key above reaches the wire.
    monkeypatch.setattr(accumulator, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
    monkeypatch.setattr(producer_module, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i, rec in enumerate(good):
            cid = rec.correlation_id.encode()
            await producer.send_and_wait(
                topics["requests"], rec.value, partition=0, headers=[(CORRELATION_HEADER, cid)]
            )
            if i == 4:
                await producer.send_and_wait(topics["requests"], b"{}", partition=0, headers=[(NotUtf8Key("k"), b"v")])
    finally:
        await producer.stop()
    monkeypatch.undo()

    app = await start_app()
    expected = {r.correlation_id: r.manifest() for r in good}
    expected[f"{topics['requests']}:0:5"] = {}  # no header, key or id: the fallback correlation ID
    report = await collect(kafka_bootstrap, topics["results"], topics["dlq"], expected, 60, progress=False)
    assert report.missing == []
    assert report.results == 10
    dead = report.answers[f"{topics['requests']}:0:5"]
    assert dead.headers[REASON_HEADER] == b"undecodable_record"
    assert dead.headers[OFFSET_HEADER] == b"5"
    assert app.failed is None
