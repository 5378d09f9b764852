"""The vertical slice against a real broker: requests in, results and dead letters out, offsets committed."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import (
    CLASS_HEADER,
    GROUP_HEADER,
    MESSAGE_HEADER,
    OFFSET_HEADER,
    PARTITION_HEADER,
    REASON_HEADER,
    TOPIC_HEADER,
)
from consumer.oip.client import encode_request
from producer_tools.produce import Outgoing, digits_requests, interleave, poison_requests, send_all
from producer_tools.results import collect
from tests.integration.conftest import AppFactory, answers, group_offsets, read_all

pytestmark = pytest.mark.integration


async def test_correlation_ids_preserved_across_partitions(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    await start_app()
    run = uuid.uuid4().hex[:6]
    records = list(digits_requests(run, digits_model / "heldout.npz", limit=300))
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)

    # Three more whose correlation ID comes from the request id and the key alone (no header).
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    x = np.load(digits_model / "heldout.npz")["x"][:2]
    try:
        await producer.send_and_wait(topics["requests"], encode_request(f"{run}-by-id", {"input": x[:1]}))
        await producer.send_and_wait(topics["requests"], encode_request(None, {"input": x[1:2]}), key=b"\xffby-key")
    finally:
        await producer.stop()

    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.results == 300
    assert report.dead_letters == 0
    assert report.accuracy is not None
    assert report.accuracy >= 0.9

    # Responses equal a direct ONNX Runtime run on the same rows, and echo the ID in body and header.
    session = ort.InferenceSession(str(digits_model / "digits.onnx"), providers=["CPUExecutionProvider"])
    heldout = np.load(digits_model / "heldout.npz")["x"]
    _, probs = session.run(None, {"input": heldout[:300]})
    for i, rec in enumerate(records):
        answer = report.answers[rec.correlation_id]
        assert answer.body is not None
        assert answer.body["id"] == rec.correlation_id
        assert answer.headers[CORRELATION_HEADER] == rec.correlation_id.encode()
        np.testing.assert_allclose(answer.body["outputs"]["probabilities"][0], probs[i], rtol=1e-5, atol=1e-6)

    extra = await collect(
        kafka_bootstrap,
        topics["results"],
        topics["dlq"],
        {f"{run}-by-id": {}, "\\xffby-key": {}},
        timeout_s=30,
        progress=False,
    )
    assert extra.missing == [], "correlation ID from the request id / record key was not echoed"


async def test_results_keep_request_key_and_partitions_all_used(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    await start_app()
    records = list(digits_requests(uuid.uuid4().hex[:6], digits_model / "heldout.npz", limit=80))
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []

    consumer = AIOKafkaConsumer(topics["results"], bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    seen: dict[bytes, bytes | None] = {}
    try:
        while len(seen) < len(records):
            for recs in (await consumer.getmany(timeout_ms=1000)).values():
                for rec in recs:
                    seen[dict(rec.headers)[CORRELATION_HEADER]] = rec.key
    finally:
        await consumer.stop()
    assert all(seen[r.correlation_id.encode()] == r.correlation_id.encode() for r in records)
    # The requests were spread over all four partitions, so every partition was consumed and answered.
    probe = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
    await probe.start()
    try:
        ends = await probe.end_offsets([TopicPartition(topics["requests"], p) for p in range(4)])
    finally:
        await probe.stop()
    assert all(end > 0 for end in ends.values())


async def test_poison_dead_lettered_with_headers_and_neighbours_answered(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    app = await start_app()
    run = uuid.uuid4().hex[:6]
    poison = poison_requests(run)
    good = list(digits_requests(run, digits_model / "heldout.npz", limit=100))
    records = interleave(good, poison)
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)

    assert report.missing == []
    assert report.results == len(good)
    assert report.dead_letters == len(poison)
    assert report.reason_mismatches == []
    where = {  # each request's own partition and offset, read back from the requests topic
        dict(r.headers)[CORRELATION_HEADER].decode(): (r.partition, r.offset)
        for r in await read_all(kafka_bootstrap, topics["requests"])
    }
    for rec in poison:
        dl = report.answers[rec.correlation_id]
        h = dl.headers
        assert h[REASON_HEADER].decode() == rec.expected_reason
        assert h[TOPIC_HEADER].decode() == topics["requests"]
        assert (int(h[PARTITION_HEADER]), int(h[OFFSET_HEADER])) == where[rec.correlation_id]
        assert h[GROUP_HEADER].decode() == app.settings.group_id
        assert h[CLASS_HEADER].startswith(b"consumer.errors.")
        assert h[MESSAGE_HEADER]
    registry = app.metrics.registry
    assert registry.get_sample_value("streaminfer_dead_letters_total", {"reason": "ragged"}) == 1
    assert registry.get_sample_value("streaminfer_records_total", {"outcome": "result"}) == len(good)


async def test_dead_letter_keeps_original_key_value_and_headers(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory
) -> None:
    await start_app()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    value = b"\xff not json \x00"
    try:
        await producer.send_and_wait(
            topics["requests"],
            value=value,
            key=b"k-1",
            headers=[("trace", b"abc"), (CORRELATION_HEADER, b"cid-poison"), ("trace", b"dup")],
        )
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topics["dlq"], bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        rec = await consumer.getone()
    finally:
        await consumer.stop()
    assert rec.key == b"k-1"
    assert rec.value == value
    assert list(rec.headers[:3]) == [("trace", b"abc"), (CORRELATION_HEADER, b"cid-poison"), ("trace", b"dup")]
    assert dict(rec.headers)[REASON_HEADER] == b"invalid_json"


async def test_restart_resumes_from_committed_offsets(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    heldout = digits_model / "heldout.npz"
    first = await start_app()
    batch1 = list(digits_requests("first", heldout, limit=60))
    await send_all(kafka_bootstrap, topics["requests"], batch1, progress=False)
    assert (await answers(kafka_bootstrap, topics, batch1)).missing == []
    await first.stop()

    # Everything answered was committed: the group's positions equal the log end offsets.
    committed, ends = await group_offsets(kafka_bootstrap, first.settings.group_id, topics["requests"])
    assert committed == ends

    batch2 = [Outgoing(f"second-{i}", r.value, r.label) for i, r in enumerate(digits_requests("x", heldout, 40))]
    await send_all(kafka_bootstrap, topics["requests"], batch2, progress=False)
    await start_app()
    report = await answers(kafka_bootstrap, topics, batch1 + batch2)
    assert report.missing == []
    assert report.duplicates == 0  # nothing from before the restart was processed again


async def test_lone_record_answered_without_more_traffic(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    app = await start_app(max_batch_size=64, max_batch_delay_ms=5)
    lone = list(digits_requests("lone", digits_model / "heldout.npz", limit=1))
    await send_all(kafka_bootstrap, topics["requests"], lone, progress=False)
    report = await answers(kafka_bootstrap, topics, lone, timeout_s=30)
    assert report.missing == []
    # It went out in a batch of one row: the deadline flushed it, not a full batch.
    assert app.metrics.registry.get_sample_value("streaminfer_batch_rows_sum") == 1
    print(f"lone record latency_ms={report.latencies_ms[0]:.1f}")
