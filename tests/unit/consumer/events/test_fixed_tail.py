"""avro.FixedTail: a chunk of data of a schema of strings, doubles and floats (nested records of them too) read at
once gives what fastavro gives datum by datum (avro.decode), or None wherever one datum does not decode exactly."""

from __future__ import annotations

import io
import json
import random
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
