"""Hostile batches against the real broker: compression bombs (gzip, snappy, lz4, zstd; one record per batch and
whole batches) must not crash the consumer. It runs as its own process under a data limit (``RLIMIT_DATA``), so a
regression that unpacks a bomb fails with an out-of-memory exit instead of taking the machine down."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from consumer.answers.records import (
    FIRST_OFFSET_HEADER,
    LAST_OFFSET_HEADER,
    OFFSET_HEADER,
    REASON_HEADER,
    VALUE_DROPPED_HEADER,
)
from harness.bench.measure import Sampler, start_streaminfer, stop
from harness.bombs import RawBatch, bomb_producer, corrupt_gzip_batch, send_whole_batch_bomb
from producer_tools.produce import digits_requests
from producer_tools.topics import ensure_topics
from tests.integration.conftest import read_all

pytestmark = pytest.mark.integration

MIB = 1 << 20
#: The consumer's data limit: far below what one whole-batch bomb or the per-record bombs unpack to.
DATA_LIMIT = 1536 * MIB
#: (codec, per-record bombs of 20 MiB, records x MiB of the whole-batch bomb). zstd: the issue's 300 records.
BOMBS = (("zstd", 300, (100, 20)), ("lz4", 80, (100, 20)), ("gzip", 8, (64, 16)), ("snappy", 4, (8, 16)))


async def test_compression_bombs_are_dead_lettered_under_a_data_limit(
    kafka_bootstrap: str, digits_model: Path, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = {"requests": f"it-{tag}.requests", "results": f"it-{tag}.results", "dlq": f"it-{tag}.dlq"}
    # The broker checks the compressed batch only; 16 MiB lets the whole-batch snappy and gzip bombs in.
    await ensure_topics(
        kafka_bootstrap,
        {topics["requests"]: 1, topics["results"]: 1, topics["dlq"]: 1},
        configs={topics["requests"]: {"max.message.bytes": str(16 * MIB)}},
    )
    whole: dict[int, tuple[str, int]] = {}  # first offset -> (codec, records)
    per_record: set[int] = set()
    value = b"\0" * (20 * MIB)
    for codec, count, (records, mib) in BOMBS:
        producer = bomb_producer(kafka_bootstrap, codec)
        await producer.start()
        try:
            first = await send_whole_batch_bomb(producer, topics["requests"], 0, codec, records, mib * MIB)
            whole[first] = (codec, records)
            for _ in range(count):
                metadata = await producer.send_and_wait(topics["requests"], value, partition=0)
                per_record.add(metadata.offset)
        finally:
            await producer.stop()
    # Not bombs, but as hostile: 100 records with a 20 MiB header each (key and value small), and a gzip batch
    # with garbage after its stream, which the broker accepts and no codec can unpack.
    header_bombs: set[int] = set()
    producer = bomb_producer(kafka_bootstrap, "zstd")
    await producer.start()
    try:
        for _ in range(100):
            sent = await producer.send_and_wait(topics["requests"], b"{}", partition=0, headers=[("pad", value)])
            header_bombs.add(sent.offset)
    finally:
        await producer.stop()
    producer = bomb_producer(kafka_bootstrap, None)
    await producer.start()
    try:
        garbage = RawBatch(corrupt_gzip_batch(records=3), 3)
        corrupt_first = (await (await producer.send_batch(garbage, topics["requests"], partition=0))).offset  # type: ignore[arg-type]
    finally:
        await producer.stop()
    valid = next(iter(digits_requests(tag, digits_model / "heldout.npz", limit=1)))
    producer = bomb_producer(kafka_bootstrap, None)
    await producer.start()
    try:
        await producer.send_and_wait(
            topics["requests"], valid.value, partition=0, headers=[("correlation_id", valid.correlation_id.encode())]
        )
    finally:
        await producer.stop()

    child = start_streaminfer(
        kafka_bootstrap, topics, digits_model / "digits.onnx", tmp_path / "consumer.log", data_limit_bytes=DATA_LIMIT
    )
    sampler = Sampler(child.proc.pid).start()
    try:
        results = await read_all(kafka_bootstrap, topics["results"], want=1, timeout_s=120)
        want = len(whole) + len(per_record) + len(header_bombs) + 1
        dead = await read_all(kafka_bootstrap, topics["dlq"], want=want, timeout_s=60)
        assert child.proc.poll() is None, (tmp_path / "consumer.log").read_text()[-3000:]
    finally:
        sampler.stop()
        stop(child)

    assert [dict(r.headers)["correlation_id"] for r in results] == [valid.correlation_id.encode()]
    assert len(dead) == want
    seen_whole: dict[int, int] = {}
    seen_per_record: set[int] = set()
    seen_headers: set[int] = set()
    for letter in dead:
        headers = dict(letter.headers)
        assert len(letter.value or b"") == 0  # never the bomb
        if headers[REASON_HEADER] == b"undecodable_record":  # the corrupt gzip batch, once for its 3 offsets
            assert (int(headers[FIRST_OFFSET_HEADER]), int(headers[LAST_OFFSET_HEADER])) == (
                corrupt_first,
                corrupt_first + 2,
            )
            continue
        assert headers[REASON_HEADER] == b"too_large"
        if "pad" not in headers and int(headers[OFFSET_HEADER]) in header_bombs:
            seen_headers.add(int(headers[OFFSET_HEADER]))  # dropped with its key and headers
        elif FIRST_OFFSET_HEADER in headers:
            first, last = int(headers[FIRST_OFFSET_HEADER]), int(headers[LAST_OFFSET_HEADER])
            assert int(headers[OFFSET_HEADER]) == last
            seen_whole[first] = last - first + 1
        else:
            assert headers[VALUE_DROPPED_HEADER] == str(20 * MIB).encode()
            seen_per_record.add(int(headers[OFFSET_HEADER]))
    assert seen_whole == {first: records for first, (_, records) in whole.items()}
    assert seen_per_record == per_record
    assert seen_headers == header_bombs
    # What it held: the budget (max_in_flight_bytes 512 MiB + 2 x max_batch_unpacked_bytes 64 MiB) and the model.
    print(f"hostile: peak_rss_mib={sampler.peak_rss_mib:.0f}")
    assert sampler.peak_rss_mib < 640 + 256
