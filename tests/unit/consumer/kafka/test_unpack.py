"""Bounded unpacking (consumer/kafka/unpack.py) without Kafka: real record batches built by aiokafka's own builders,
read back through its fetcher's MemoryRecords for both record implementations (compiled and pure Python) and every
codec."""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import aiokafka.consumer.fetcher as fetcher
import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from consumer.answers.records import (
    COMPRESSED_BYTES_HEADER,
    FIRST_OFFSET_HEADER,
    LAST_OFFSET_HEADER,
    OFFSET_HEADER,
    UNPACKED_OVER_HEADER,
    VALUE_DROPPED_HEADER,
    AnswerRecords,
)
from consumer.errors import ConfigError, DeadLetterReason
from consumer.intake import Intake
from consumer.kafka.unpack import BatchCorrupt, BatchTooLarge, Dropped, GuardedRecords, capped_codecs, install
from consumer.offsets import OffsetTracker
from consumer.ops.metrics import Metrics
from consumer.signature import ModelSignature
from consumer.work import Limits
from tests.unit.fakes import record

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CAP = 1 << 20
MAX_RECORD = 10_000


def implementations() -> list[Any]:
    mods = [importlib.import_module("aiokafka.record.default_records")]
    with contextlib.suppress(ImportError):  # no compiled extension on this platform
        mods.insert(0, importlib.import_module("aiokafka.record._crecords.default_records"))
    return mods


def batch(module: Any, codec: int, values: list[bytes], base_offset: int = 0) -> bytes:
    builder = module.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=b"k%d" % i, value=value, headers=[("h", b"v")])
    raw = bytearray(builder.build())
    raw[0:8] = base_offset.to_bytes(8, "big")  # the broker assigns offsets; the CRC does not cover them
    return bytes(raw)


def read_all(data: bytes) -> list[Any]:
    records = fetcher.MemoryRecords(data)
    out = []
    while records.has_next():
        out.extend(records.next_batch())
    return out


@pytest.fixture(autouse=True)
def bounded() -> None:
    install(CAP, MAX_RECORD)


@pytest.mark.parametrize("module", implementations(), ids=lambda m: m.__name__.split(".")[-2])
@pytest.mark.parametrize("codec", list(CODECS.values()), ids=list(CODECS))
def test_batches_pass_until_too_large(module: Any, codec: int) -> None:
    small = batch(module, codec, [b"x" * 500] * 3, base_offset=0)
    large_value = batch(module, codec, [b"a" * 100, b"y" * (MAX_RECORD + 1), b"b" * 100], base_offset=3)
    bomb = batch(module, codec, [b"\0" * (CAP // 2)] * 3, base_offset=6)  # 1.5x the cap of zeros
    after = batch(module, codec, [b"z" * 10], base_offset=9)
    got = read_all(small + large_value + bomb + after)

    assert [r.offset for r in got] == [0, 1, 2, 3, 4, 5, 8, 9]
    assert [r.value for r in got[:4]] == [b"x" * 500] * 3 + [b"a" * 100]
    dropped = got[4].value
    assert type(dropped) is Dropped
    assert dropped == b""
    assert (dropped.first_offset, dropped.last_offset, dropped.unpacked_bytes) == (
        4,
        4,
        MAX_RECORD + 1 + 4,
    )  # + key, header
    assert dropped.compressed_bytes is None
    assert (got[4].key, list(got[4].headers)) == (b"k1", [("h", b"v")])  # the correlation ID stays
    assert got[5].value == b"b" * 100
    whole = got[6].value
    assert type(whole) is Dropped
    assert (whole.first_offset, whole.last_offset, whole.unpacked_bytes) == (6, 8, CAP)
    assert whole.compressed_bytes is not None
    assert 0 < whole.compressed_bytes < len(bomb)
    assert got[6].key is None
    assert got[7].value == b"z" * 10


@pytest.mark.parametrize("name", list(CODECS))
def test_capped_decoders_match_the_clients_below_the_cap(name: str) -> None:
    import aiokafka.codec as codec

    payload = bytes(range(256)) * 2000 + b"\0" * 100_000
    encode = getattr(codec, f"{name}_encode")
    compressed = encode(payload)
    decode = capped_codecs(len(payload))[f"{name}_decode"]
    assert decode(compressed) == getattr(codec, f"{name}_decode")(compressed) == payload
    with pytest.raises(BatchTooLarge) as info:
        capped_codecs(len(payload) - 1)[f"{name}_decode"](compressed)
    assert info.value.cap == len(payload) - 1


def test_gzip_of_several_members_is_capped_over_all() -> None:
    import gzip

    member = gzip.compress(b"\0" * 600)
    assert capped_codecs(1200)["gzip_decode"](member + member) == b"\0" * 1200
    with pytest.raises(BatchTooLarge):
        capped_codecs(1199)["gzip_decode"](member + member)


BOMB_UNDER_LIMIT = """
import resource, sys
sys.path.insert(0, {root!r})
import cramjam
from consumer.kafka.unpack import BatchTooLarge, capped_codecs
chunk = b"\\0" * (64 << 20)
data = {{}}
c = cramjam.zstd.Compressor()
for _ in range(32): c.compress(chunk)  # 2 GiB of zeros
data["zstd"] = bytes(c.finish())
c = cramjam.lz4.Compressor()
for _ in range(32): c.compress(chunk)
data["lz4"] = bytes(c.finish())
import zlib
z = zlib.compressobj(1, zlib.DEFLATED, 31)
data["gzip"] = b"".join([z.compress(chunk) for _ in range(16)] + [z.flush()])  # 1 GiB
del chunk
resource.setrlimit(resource.RLIMIT_DATA, (512 << 20, 512 << 20))
for name, payload in data.items():
    try:
        capped_codecs(128 << 20)[name + "_decode"](payload)
    except BatchTooLarge:
        print(name, "refused")
"""


def test_bombs_are_refused_under_a_data_limit(tmp_path: Path) -> None:
    """2 GiB (zstd, lz4) and 1 GiB (gzip) of zeros under a 512 MiB data limit: refused, not unpacked. An unbounded
    decoder fails this test with a MemoryError instead of taking the machine down."""
    script = tmp_path / "bomb.py"
    script.write_text(textwrap.dedent(BOMB_UNDER_LIMIT.format(root=str(Path(__file__).parents[4]))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["zstd refused", "lz4 refused", "gzip refused"]


@pytest.mark.parametrize("module", implementations(), ids=lambda m: m.__name__.split(".")[-2])
@pytest.mark.parametrize("codec", [0, *CODECS.values()], ids=["none", *CODECS])
def test_next_and_iteration_share_one_pass_and_match_the_clients_own_records(module: Any, codec: int) -> None:
    values = [b"r%d" % i * 50 for i in range(5)]
    data = batch(module, codec, values, base_offset=7)
    records = fetcher.MemoryRecords(data)
    guarded = records.next_batch()
    assert guarded.next_offset == 12
    assert not guarded.is_control_batch
    assert guarded.validate_crc()
    first = next(guarded)  # as the fetcher reads a control batch's marker
    rest = list(guarded)
    assert next(iter(guarded), None) is None  # one pass, like the client's own batch
    assert not records.has_next()
    plain = list(GuardedRecords.memory_records(data).next_batch())
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in [first, *rest]] == [
        (r.offset, r.key, r.value, list(r.headers)) for r in plain
    ]
    assert [r.value for r in [first, *rest]] == values


def raw_batch(codec: int, payload: bytes, records: int, base_offset: int) -> bytes:
    """A v2 batch around an arbitrary (e.g. corrupt) compressed payload, CRC valid."""
    import struct

    from aiokafka.record.util import calc_crc32c

    header = struct.Struct(">qiibIhiqqqhii")
    total = header.size + len(payload)
    raw = bytearray(header.pack(base_offset, total - 12, -1, 2, 0, codec, records - 1, 0, 0, -1, -1, -1, records))
    raw += payload
    struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    return bytes(raw)


@pytest.mark.parametrize("module", implementations(), ids=lambda m: m.__name__.split(".")[-2])
def test_a_corrupt_batch_becomes_one_stand_in_and_the_next_batch_is_read(module: Any) -> None:
    import aiokafka.codec as codec

    good = batch(module, 1, [b"ok"], base_offset=0)
    garbage = raw_batch(1, codec.gzip_encode(b"x" * 50) + b"garbage!", records=3, base_offset=1)
    after = batch(module, 1, [b"after"], base_offset=4)
    got = read_all(good + garbage + after)
    assert [r.offset for r in got] == [0, 3, 4]
    stand_in = got[1].value
    assert type(stand_in) is Dropped
    assert (stand_in.first_offset, stand_in.last_offset) == (1, 3)
    assert stand_in.error is not None
    assert "cannot be unpacked" in stand_in.describe()
    assert got[2].value == b"after"


def test_gzip_zero_padding_reads_as_the_client_reads_it() -> None:
    import aiokafka.codec as codec

    padded = codec.gzip_encode(b"y" * 700) + b"\0" * 8
    assert capped_codecs(1 << 20)["gzip_decode"](padded) == codec.gzip_decode(padded) == b"y" * 700


def test_snappy_with_a_negative_block_length_is_corrupt_not_a_loop() -> None:
    import struct

    payload = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", -20) + b"\0" * 8
    with pytest.raises(BatchCorrupt, match="block length -20"):
        capped_codecs(1 << 20)["snappy_decode"](payload)


@pytest.mark.parametrize("module", implementations(), ids=lambda m: m.__name__.split(".")[-2])
def test_large_keys_and_headers_count_and_are_dropped_when_they_alone_are_too_large(module: Any) -> None:
    builder = module.DefaultRecordBatchBuilder(
        magic=2, compression_type=4, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 30,
    )  # fmt: skip
    builder.append(0, timestamp=0, key=b"k" * (MAX_RECORD + 1), value=b"v", headers=[])
    builder.append(1, timestamp=0, key=b"k", value=b"v", headers=[("h", b"x" * MAX_RECORD)])
    builder.append(2, timestamp=0, key=b"k", value=b"v" * (MAX_RECORD - 10), headers=[("h", b"x" * 100)])
    got = read_all(bytes(builder.build()))
    sizes = [r.value.unpacked_bytes if type(r.value) is Dropped else None for r in got]
    assert sizes == [MAX_RECORD + 2, 1 + 1 + 1 + MAX_RECORD, 1 + MAX_RECORD - 10 + 1 + 100]
    assert [(r.key, list(r.headers)) for r in got[:2]] == [(None, []), (None, [])]  # alone too large: dropped
    assert (got[2].key, list(got[2].headers)) == (b"k", [("h", b"x" * 100)])  # the value alone was the excess


def test_install_refuses_a_client_it_cannot_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(fetcher, "MemoryRecords")
    with pytest.raises(ConfigError, match="cannot be bounded"):
        install(CAP, MAX_RECORD)


def test_install_twice_wraps_once() -> None:
    install(CAP, MAX_RECORD)
    install(CAP * 2, 5)
    assert fetcher.MemoryRecords.memory_records is not fetcher.MemoryRecords  # type: ignore[attr-defined]
    assert fetcher.MemoryRecords.max_record_bytes == 5  # type: ignore[attr-defined]
    install(CAP, MAX_RECORD)


# -- stand-ins downstream
def test_stand_ins_are_dead_lettered_too_large_without_the_bomb(digits_signature: ModelSignature) -> None:
    tp = TopicPartition("requests", 0)
    whole = Dropped.make(10, 14, 4096, CAP, "max_batch_unpacked_bytes", CAP)
    one = Dropped.make(15, 15, None, 20 << 20, "max_record_bytes", 1 << 20)
    records = [record("requests", 0, 14, whole), record("requests", 0, 15, one, key=b"cid")]
    intake = Intake(digits_signature, Limits(), None, Metrics(CollectorRegistry()), lambda: 0.0)
    import asyncio

    works = asyncio.run(intake.decode({tp: records}, OffsetTracker()))
    assert [w.error.reason for w in works if w.error is not None] == [DeadLetterReason.TOO_LARGE] * 2
    assert "offsets 10-14 (4096 bytes compressed)" in str(works[0].error)
    assert "record of 20971520 bytes (key, value and headers) exceeds max_record_bytes=1048576" in str(works[1].error)
    sink = AnswerRecords(results_topic="results", dead_letter_topic="dlq", group_id="g")
    _, key, value, headers = sink.of(works[0])
    got = dict(headers)
    assert (key, value) == (None, b"")
    assert got[FIRST_OFFSET_HEADER] == b"10"
    assert got[LAST_OFFSET_HEADER] == got[OFFSET_HEADER] == b"14"
    assert (got[COMPRESSED_BYTES_HEADER], got[UNPACKED_OVER_HEADER]) == (b"4096", str(CAP).encode())
    _, key, value, headers = sink.of(works[1])
    assert (key, value, dict(headers)[VALUE_DROPPED_HEADER]) == (b"cid", None, str(20 << 20).encode())
    corrupt = Dropped.make(20, 22, 300, 0, "", 0, error="error: incorrect header check")
    works = asyncio.run(intake.decode({tp: [record("requests", 0, 22, corrupt)]}, OffsetTracker()))
    assert works[0].error is not None
    assert works[0].error.reason is DeadLetterReason.UNDECODABLE_RECORD
    got = dict(sink.of(works[0])[3])
    assert (got[FIRST_OFFSET_HEADER], got[COMPRESSED_BYTES_HEADER]) == (b"20", b"300")
    assert UNPACKED_OVER_HEADER not in got


def test_a_reduced_dead_letter_cuts_the_key_too() -> None:
    from consumer.errors import RecordError

    sink = AnswerRecords(results_topic="results", dead_letter_topic="dlq", group_id="g")
    rec = record("requests", 0, 5, b"v", key=b"k" * (2 << 20))
    _, key, value, _ = sink.dead_letter(rec, b"c", RecordError(DeadLetterReason.TOO_LARGE, "x"), reduced=True)
    assert value is None
    assert key == b"k" * 1024
