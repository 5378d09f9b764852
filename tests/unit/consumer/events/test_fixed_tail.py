"""avro.FixedTail: a chunk of data of a schema of strings, doubles and floats (nested records of them too) read at
once gives what fastavro gives datum by datum (avro.decode), or None wherever one datum does not decode exactly."""

from __future__ import annotations

import io
import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import fastavro
import pytest

from consumer.errors import RecordError
from consumer.events.avro import FixedTail, decode, parse

BENCH_SCHEMA = json.loads((Path(__file__).parents[4] / "models" / "breast_cancer" / "events.avsc").read_text())
MIXED = {
    "type": "record",
    "name": "Mixed",
    "fields": [
        {"name": "a", "type": "float"},
        {"name": "s", "type": "string"},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "x", "type": "double"}, {"name": "t", "type": "string"}, {"name": "y", "type": "float"}]}},
        {"name": "b", "type": "double"},
    ],
}  # fmt: skip


def encode(parsed: Any, datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, datum)
    return out.getvalue()


def bench_datum(rng: random.Random, i: int) -> dict[str, Any]:
    datum: dict[str, Any] = {"patient_id": "p" * rng.choice([1, 63, 64, 200]) + f"-{i}"}
    for f in BENCH_SCHEMA["fields"][1:31]:
        datum[f["name"]] = rng.random() * 10 ** rng.randrange(-3, 4)
    datum["clinic"] = {"region": rng.choice(["north", "süd", ""])}
    datum["recorded_at"] = "2026-12-04T00:00:00Z"
    return datum


def mixed_datum(rng: random.Random, i: int) -> dict[str, Any]:
    return {"a": rng.random(), "s": f"é{i}", "inner": {"x": -rng.random(), "t": "t" * i, "y": 1e30}, "b": float(i)}


def expected(parsed: Any, payloads: list[bytes]) -> list[Any] | None:
    try:
        return [decode(parsed, memoryview(p)) for p in payloads]
    except RecordError:
        return None


@pytest.mark.parametrize(("schema", "make"), [(BENCH_SCHEMA, bench_datum), (MIXED, mixed_datum)])
def test_a_chunk_reads_as_fastavro_reads_each_datum(schema: dict[str, Any], make: Any) -> None:
    parsed = parse(schema)
    layout = FixedTail.of(parsed)
    assert layout is not None
    rng = random.Random(4)
    payloads = [encode(parsed, make(rng, i)) for i in range(80)]
    got = layout.read(payloads)
    assert got == expected(parsed, payloads)
    assert got is not None
    assert [list(d) for d in got] == [list(d) for d in expected(parsed, payloads) or []]  # field order too


def broken(payload: bytes) -> list[bytes]:
    return [
        payload[:-1],  # short
        payload + b"\x00",  # a byte left over
        b"\x03" + payload[1:],  # a negative string length
        b"\x04\xff\xfe" + payload[3:],  # not UTF-8
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01" + payload[1:],  # a huge length
        b"",
    ]


@pytest.mark.parametrize("which", range(6))
def test_a_datum_that_does_not_decode_exactly_makes_the_chunk_read_datum_by_datum(which: int) -> None:
    parsed = parse(BENCH_SCHEMA)
    layout = FixedTail.of(parsed)
    assert layout is not None
    rng = random.Random(which)
    payloads = [encode(parsed, bench_datum(rng, i)) for i in range(5)]
    payloads[2] = broken(payloads[2])[which]
    assert expected(parsed, payloads) is None  # fastavro refuses it on its own
    assert layout.read(payloads) is None


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "record", "name": "U", "fields": [{"name": "a", "type": ["null", "double"]}]},
        {"type": "record", "name": "L", "fields": [{"name": "a", "type": "long"}]},
        {"type": "record", "name": "E", "fields": []},
        {"type": "record", "name": "A", "fields": [{"name": "a", "type": {"type": "array", "items": "double"}}]},
    ],
)
def test_other_schemas_have_no_layout(schema: dict[str, Any]) -> None:
    assert FixedTail.of(parse(schema)) is None


def _long(n: int) -> bytes:
    """An Avro ``long``: zigzag, then a varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _random_text(rng: random.Random) -> str:
    length = rng.choice([0, 1, 63, 64, 65, 200, 9000])  # one-byte, two-byte and three-byte lengths
    alphabet = ["a", "é", "€", "\U0001f600", "\x00", '"']
    return "".join(rng.choice(alphabet) for _ in range(length))


def _random_payload(rng: random.Random, schema: Any) -> bytes:
    """A datum of ``schema`` as raw Avro bytes: any bit pattern for a double or a float (NaNs, infinities,
    subnormals, -0.0 among them), strings of any length and of 1- to 4-byte UTF-8 characters."""
    out = b""
    for field in schema["fields"]:
        kind = field["type"]
        if kind == "string":
            text = _random_text(rng).encode()
            out += _long(len(text)) + text
        elif kind == "double":
            out += rng.choice([rng.randbytes(8), struct.pack("<d", rng.choice(SPECIAL))])
        elif kind == "float":
            out += rng.choice([rng.randbytes(4), struct.pack("<f", rng.choice(SPECIAL[:-1]))])
        else:
            out += _random_payload(rng, kind)
    return out


SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1e-45, 3.4028234663852886e38, 1.7976931348623157e308]


def _bits(datum: Any) -> Any:
    """A datum with every float as its 8 bytes (a NaN equals itself by its bits), types kept."""
    if isinstance(datum, dict):
        return [(k, _bits(v)) for k, v in datum.items()]
    if isinstance(datum, float):
        return struct.pack("<d", datum)
    return (type(datum).__name__, datum)


ALL_TYPES = {
    "type": "record",
    "name": "AllTypes",
    "fields": [
        {"name": "d", "type": "double"},
        {"name": "f", "type": "float"},
        {"name": "s", "type": "string"},
        {"name": "f2", "type": "float"},
        {"name": "inner", "type": {"type": "record", "name": "In", "fields": [
            {"name": "s", "type": "string"}, {"name": "d", "type": "double"}, {"name": "f", "type": "float"}]}},
        {"name": "d2", "type": "double"},
        {"name": "d3", "type": "double"},
        {"name": "t", "type": "string"},
    ],
}  # fmt: skip


@pytest.mark.parametrize("seed", range(5))
def test_random_data_of_every_type_reads_as_fastavros_schemaless_reader_reads_it(seed: int) -> None:
    parsed = parse(ALL_TYPES)
    layout = FixedTail.of(parsed)
    assert layout is not None
    rng = random.Random(seed)
    payloads = [_random_payload(rng, ALL_TYPES) for _ in range(60)]
    want = [fastavro.schemaless_reader(io.BytesIO(p), parsed, None) for p in payloads]
    got = layout.read(payloads)
    assert got is not None
    assert [_bits(d) for d in got] == [_bits(d) for d in want]  # values, bit for bit, types, field order
    read = layout.read_columns(payloads)
    assert read is not None
    _, columns = read
    assert sorted(columns) == ["d", "d2", "d3", "f", "f2"]  # the top-level numbers, not the nested ones
    for name, column in columns.items():
        assert [struct.pack("<d", v) for v in column.tolist()] == [struct.pack("<d", d[name]) for d in want]
