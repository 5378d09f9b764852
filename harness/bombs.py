"""Compression bombs for a requests topic: record batches of zeros, small on the wire and huge once unpacked.

Used by tests/integration/test_hostile.py and the ``compression-bomb`` scenario of ``make faults``. A whole-batch
bomb is built here as Kafka's record batch format v2 (``DefaultRecordBatch``: a 61-byte header, CRC-32C over
everything after the CRC field, zig-zag varints in the records) with its records streamed through the compressor,
so the sender never holds the unpacked bytes either; it is sent with the producer's own batch API. Per-record
bombs are ordinary records sent through a compressing producer, one batch each.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import cramjam
from aiokafka import AIOKafkaProducer
from aiokafka.record.util import calc_crc32c

#: Kafka's codec ids (the batch attributes' low 3 bits).
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
#: ``>qiibIhiqqqhii``: baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
#: baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount.
HEADER = struct.Struct(">qiibIhiqqqhii")
CRC_FROM = 21  # the attributes field: the CRC covers the batch from here on
CHUNK_BYTES = 16 << 20
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_BYTES = 32 << 10


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _records(count: int, value_bytes: int) -> Iterator[bytes]:
    """The unpacked records of a batch (no key, a value of zeros, no headers), in pieces of <= CHUNK_BYTES."""
    zeros = b"\0" * min(value_bytes, CHUNK_BYTES)
    for delta in range(count):
        body = b"\0" + _varint(0) + _varint(delta) + _varint(-1) + _varint(value_bytes)
        yield _varint(len(body) + value_bytes + 1) + body
        left = value_bytes
        while left:
            piece = min(left, len(zeros))
            yield zeros if piece == len(zeros) else zeros[:piece]
            left -= piece
        yield _varint(0)


def _compress(codec: str, pieces: Iterator[bytes]) -> bytes:
    if codec == "gzip":
        deflate = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return b"".join([deflate.compress(p) for p in pieces] + [deflate.flush()])
    if codec == "snappy":  # xerial blocks of 32 KiB, as Kafka's Java client writes them
        data = b"".join(pieces)
        blocks = [
            bytes(cramjam.snappy.compress_raw(data[i : i + XERIAL_BLOCK_BYTES]))
            for i in range(0, len(data), XERIAL_BLOCK_BYTES)
        ]
        return XERIAL_HEADER + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    # Kafka's LZ4 reader takes only frames of independent blocks
    compressor = cramjam.lz4.Compressor(block_linked=False) if codec == "lz4" else cramjam.zstd.Compressor()
    for piece in pieces:
        compressor.compress(piece)
    return bytes(compressor.finish())


def zeros_batch(codec: str, records: int, value_bytes: int, timestamp_ms: int | None = None) -> bytes:
    """One record batch (v2, offsets 0..records-1: the broker assigns the real ones) of ``records`` values of
    ``value_bytes`` zeros each, compressed with ``codec`` (gzip, snappy, lz4, zstd).

    Raises:
        KeyError: an unknown codec.
    """
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    payload = _compress(codec, _records(records, value_bytes))
    total = HEADER.size + len(payload)
    header = HEADER.pack(0, total - 12, -1, 2, 0, CODEC_IDS[codec], records - 1, ts, ts, -1, -1, -1, records)
    raw = bytearray(header + payload)
    struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[CRC_FROM:])))
    return bytes(raw)


def corrupt_gzip_batch(records: int) -> bytes:
    """A v2 batch claiming ``records`` records whose gzip payload has garbage after its stream: the broker accepts
    it (it validates the CRC and reads the stream), no codec can unpack it whole."""
    payload = _compress("gzip", _records(records, 10)) + b"garbage!"
    total = HEADER.size + len(payload)
    ts = int(time.time() * 1000)
    header = HEADER.pack(0, total - 12, -1, 2, 0, CODEC_IDS["gzip"], records - 1, ts, ts, -1, -1, -1, records)
    raw = bytearray(header + payload)
    struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[CRC_FROM:])))
    return bytes(raw)


class RawBatch:
    """A finished batch in the shape ``AIOKafkaProducer.send_batch`` takes (what its ``BatchBuilder`` offers the
    accumulator); for a producer without idempotence."""

    def __init__(self, data: bytes, records: int) -> None:
        self._data = data
        self._records = records

    def closed(self) -> bool:
        return True

    def close(self) -> None:
        return None

    def size(self) -> int:
        return len(self._data)

    def record_count(self) -> int:
        return self._records

    def _build(self) -> bytes:
        return self._data

    def _set_producer_state(self, *_args: Any) -> None:
        raise RuntimeError("RawBatch is for producers without idempotence")


async def send_whole_batch_bomb(
    producer: AIOKafkaProducer, topic: str, partition: int, codec: str, records: int, value_bytes: int
) -> int:
    """Send one bomb batch; returns its first offset.

    Raises:
        aiokafka.errors.KafkaError: the broker refused it (e.g. above the topic's ``max.message.bytes``).
    """
    raw = RawBatch(zeros_batch(codec, records, value_bytes), records)
    future = await producer.send_batch(raw, topic, partition=partition)
    metadata = await future
    return int(metadata.offset)


def bomb_producer(bootstrap_servers: str, codec: str | None) -> AIOKafkaProducer:
    """A producer for bombs: no idempotence (raw batches carry no producer id), requests up to 256 MiB before
    compression (the broker checks the compressed batch against ``max.message.bytes``)."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers,
        compression_type=codec,
        enable_idempotence=False,
        acks="all",
        linger_ms=0,
        max_request_size=256 << 20,
    )
