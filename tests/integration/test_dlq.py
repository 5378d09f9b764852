"""streaminfer-dlq against the real broker: records dead-lettered ``too_large`` under a low ``max_record_rows`` are
replayed once the consumer runs with the default, and each gets exactly one result; a second replay sends nothing.
Each result carries its request's ``traceparent``."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from consumer.answers.headers import CORRELATION_HEADER
from consumer.oip.client import encode_request
from producer_tools.dlq import main
from producer_tools.produce import Outgoing
from tests.integration.conftest import AppFactory, answers, group_offsets, read_all

pytestmark = pytest.mark.integration


def traceparent(cid: str) -> bytes:
    """A W3C traceparent whose trace ID is derived from ``cid``."""
    return f"00-{uuid.uuid5(uuid.NAMESPACE_URL, cid).hex}-00f067aa0ba902b7-01".encode()


async def send(bootstrap: str, topic: str, records: list[Outgoing]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for rec in records:
            cid = rec.correlation_id.encode()
            headers = [(CORRELATION_HEADER, cid), ("traceparent", traceparent(rec.correlation_id))]
            await producer.send_and_wait(topic, rec.value, key=cid, headers=headers)
    finally:
        await producer.stop()


async def results_by_id(bootstrap: str, topic: str) -> tuple[Counter[str], dict[str, dict[str, bytes]]]:
    """Every result on ``topic`` (to its end now), counted by correlation ID, and the headers of each."""
    counts: Counter[str] = Counter()
    headers: dict[str, dict[str, bytes]] = {}
    for rec in await read_all(bootstrap, topic):
        cid = dict(rec.headers)[CORRELATION_HEADER].decode()
        counts[cid] += 1
        headers[cid] = dict(rec.headers)
    return counts, headers


async def dlq(
    bootstrap: str, topics: dict[str, str], *argv: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    capsys.readouterr()
    common = ["--bootstrap-servers", bootstrap, "--dead-letter-topic", topics["dlq"], "--no-progress"]
    code = await asyncio.to_thread(main, [*common, *argv])  # the tool runs its own event loop
    out, err = capsys.readouterr()
    return code, out + err


async def test_too_large_dead_letters_replayed_after_the_limit_is_raised_are_answered_exactly_once(
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
    digits_model: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    x = np.load(digits_model / "heldout.npz")["x"]
    run = uuid.uuid4().hex[:6]
    big = [Outgoing(f"{run}-big-{i}", encode_request(None, {"input": x[i : i + 4]})) for i in range(3)]
    small = [Outgoing(f"{run}-small-{i}", encode_request(None, {"input": x[i : i + 1]})) for i in range(3)]
    app = await start_app(max_record_rows=2)
    await send(kafka_bootstrap, topics["requests"], [*big, *small])
    report = await answers(kafka_bootstrap, topics, [*big, *small])
    assert report.missing == []
    assert report.results == 3
    assert {report.answers[r.correlation_id].reason for r in big} == {"too_large"}
    await app.stop()

    code, out = await dlq(kafka_bootstrap, topics, "summary", "--json", capsys=capsys)
    assert code == 0, out
    summary = orjson.loads(out)
    assert summary["dead_letters"] == 3
    assert summary["reasons"]["too_large"]["count"] == 3

    again = await start_app()  # the same group, max_record_rows back to its default
    code, out = await dlq(kafka_bootstrap, topics, "replay", "--reason", "too_large", "--dry-run",
                          "--to", topics["requests"], capsys=capsys)  # fmt: skip
    assert (code, "would send=3" in out) == (0, True), out
    code, out = await dlq(kafka_bootstrap, topics, "replay", "--reason", "too_large", "--to", topics["requests"],
                          capsys=capsys)  # fmt: skip
    assert (code, "sent=3 refused=0 failed=0" in out) == (0, True), out

    for _ in range(120):
        counts, _ = await results_by_id(kafka_bootstrap, topics["results"])
        if all(counts[r.correlation_id] for r in big):
            break
        await asyncio.sleep(0.5)
    await again.stop()  # drains and commits: what it has not written by now it never writes
    committed, ends = await group_offsets(kafka_bootstrap, again.settings.group_id, topics["requests"])
    assert {tp: c or 0 for tp, c in committed.items()} == ends  # every request answered (the replayed ones too)
    counts, headers = await results_by_id(kafka_bootstrap, topics["results"])
    assert {r.correlation_id: counts[r.correlation_id] for r in [*big, *small]} == {
        r.correlation_id: 1 for r in [*big, *small]
    }  # each big one answered once by the replay; the small ones were never replayed
    for rec in [*big, *small]:  # the trace continues: through the consumer, and through the replay
        assert headers[rec.correlation_id]["traceparent"] == traceparent(rec.correlation_id)

    code, out = await dlq(kafka_bootstrap, topics, "replay", "--reason", "too_large", "--to", topics["requests"],
                          capsys=capsys)  # fmt: skip
    assert (code, "read=0 selected=0 sent=0" in out) == (0, True), out  # the finished replay is not repeated
