"""Spliced enriched results (consumer/answers/enrich.py, consumer/events/avro.py's result tails) are byte for byte
what a full re-encode writes: the event with the outputs appended, encoded whole by orjson (JSON) or by fastavro
with the result schema (Avro), on varied events (unicode, floats, nested values) and varied outputs."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import numpy as np
import orjson
import pytest
from aiokafka import TopicPartition

from consumer.answers.enrich import EnrichedAnswers
from consumer.errors import InferenceError
from consumer.events import avro
from consumer.events.mapping import load_mapping
from consumer.events.registry import Schemas
from consumer.offsets import PartitionOffsets
from consumer.signature import ModelSignature, TensorSpec
from consumer.timeouts import Backoff
from consumer.work import DecodedRequest, Event, Work
from tests.unit.consumer.events.fakes import FlakyRegistry, InstantClock
from tests.unit.fakes import record

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I32, I64, U32, U64 = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint32), np.dtype(np.uint64)
ROWS = 64
RNG = np.random.default_rng(33)
#: A writer schema with a bit of everything around the one input (``amount``).
WRITER = {
    "type": "record",
    "name": "Varied",
    "namespace": "example",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "place", "type": {"type": "record", "name": "Place", "fields": [
            {"name": "city", "type": "string"}, {"name": "xy", "type": {"type": "array", "items": "float"}}]}},
        {"name": "tags", "type": {"type": "map", "values": "long"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}  # fmt: skip
TEXTS = ["plain", "Zürich", "東京", "emoji 🦀", 'quote " and \\ backslash', "", "new\nline"]


def events(n: int) -> list[dict[str, Any]]:
    """``n`` varied events of :data:`WRITER` (JSON-compatible as well)."""
    out = []
    for i in range(n):
        out.append(
            {
                "id": f"p-{i}-{TEXTS[i % len(TEXTS)]}",
                "amount": [0.1, -0.0, 1e300, 5e-324, 123456789.125, 3.0][i % 6] * (1 + i),
                "note": None if i % 3 == 0 else TEXTS[(i + 1) % len(TEXTS)],
                "place": {"city": TEXTS[(i + 2) % len(TEXTS)], "xy": [float(np.float32(x)) for x in RNG.random(i % 4)]},
                "tags": {TEXTS[j % len(TEXTS)] + str(j): j * -(10**i % 97) for j in range(i % 3)},
                "at": 1_764_000_000_000 + i,
            }
        )
    return out


def finite(dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """Random finite floats from random bits: subnormals, negative zero, extremes and all."""
    bits = RNG.integers(0, 2 ** (8 * dtype.itemsize), size=shape, dtype=np.uint64 if dtype.itemsize == 8 else np.int64)
    arr = bits.astype(f"u{dtype.itemsize}").view(dtype)
    arr[~np.isfinite(arr)] = -0.0
    return arr


def outputs_of(signature: ModelSignature, rows: int) -> dict[str, np.ndarray]:
    """Random outputs of ``signature``'s shapes (``rows`` rows)."""
    out = {}
    for spec in signature.outputs:
        shape = (rows, *(d or 3 for d in spec.shape[1:]))
        if spec.dtype.kind == "f":
            out[spec.name] = finite(spec.dtype, shape) if spec.dtype.itemsize > 2 else RNG.random(shape).astype(F16)
        else:
            info = np.iinfo(spec.dtype)
            out[spec.name] = RNG.integers(info.min, info.max, size=shape, dtype=spec.dtype, endpoint=True)
            out[spec.name].reshape(-1)[:2] = [info.min, info.max]
    return out


FAST = ModelSignature(
    "m",
    "1",
    (TensorSpec("amount", F64, (None, 1)),),
    (
        TensorSpec("label", I64, (None,)),
        TensorSpec("probabilities", F32, (None, 3)),
        TensorSpec("score", F64, (None, 1)),
        TensorSpec("code", I32, (None, 1)),
        TensorSpec("count", U32, (None,)),
        TensorSpec("vector", F64, (None, None)),
    ),
)
#: Outputs the fast path leaves to fastavro: FP16, UINT64, two axes per row.
SLOW = ModelSignature(
    "m",
    "1",
    FAST.inputs,
    (
        TensorSpec("half", F16, (None, 2)),
        TensorSpec("big", U64, (None,)),
        TensorSpec("grid", F32, (None, 2, 2)),
    ),
)


def work_of(fields: dict[str, Any], raw: bytes, schema_id: int | None, offset: int) -> Work:
    request = DecodedRequest(None, None, 1, None)
    request.event = Event(fields, raw, schema_id)
    rec = record("events", 0, offset, raw, b"k", [])
    return Work(rec, TopicPartition("events", 0), PartitionOffsets(), b"c", request, None, 1, 0.0)


def test_json_results_equal_a_full_reencode() -> None:
    for signature in (FAST, SLOW):
        answers = EnrichedAnswers(signature, load_mapping(signature, None, enrich=True), "json")
        evs = events(ROWS)
        outputs = outputs_of(signature, ROWS)
        works = [work_of(e, orjson.dumps(e), None, i) for i, e in enumerate(evs)]
        results = answers.encode(works, outputs)
        for k, (event, result) in enumerate(zip(evs, results, strict=True)):
            row = {
                name: orjson.loads(orjson.dumps(outputs[name][k], option=orjson.OPT_SERIALIZE_NUMPY))
                for name in outputs
            }
            row = {n: v[0] if isinstance(v, list) and signature.output(n).shape[1:] in ((1,), ()) else v  # type: ignore[union-attr]
                   for n, v in row.items()}  # fmt: skip
            assert result == orjson.dumps({**event, **row})


async def schemas_for(signature: ModelSignature) -> tuple[Schemas, int, FlakyRegistry]:
    registry, clock = FlakyRegistry(), InstantClock()
    mapping = load_mapping(signature, None, enrich=True)
    writer_id = await registry.add("varied-value", WRITER)
    schemas = Schemas(registry, mapping, signature, "scored-value", register=True, unknown_retries=0,
                      backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep)  # fmt: skip
    await schemas.resolve([writer_id])
    return schemas, writer_id, registry


@pytest.mark.parametrize("signature", [FAST, SLOW], ids=["fast", "fastavro"])
async def test_avro_results_equal_a_full_reencode(signature: ModelSignature) -> None:
    schemas, writer_id, registry = await schemas_for(signature)
    answers = EnrichedAnswers(signature, load_mapping(signature, None, enrich=True), "avro", schemas)
    writer = avro.parse(WRITER)
    known = schemas.get(writer_id)
    assert known is not None
    assert known.result_id is not None
    result_schema = avro.parse(json.loads((await registry.mock.get_schema(known.result_id)).schema_str))
    evs = events(ROWS)
    raws = [avro.encode(writer, e) for e in evs]
    works = [work_of(avro.decode(writer, memoryview(r)), r, writer_id, i) for i, r in enumerate(raws)]
    outputs = outputs_of(signature, ROWS)
    results = answers.encode(works, outputs)
    columns = {spec.name: avro.row_values(spec, outputs[spec.name], ROWS) for spec in signature.outputs}
    for k, (work, result) in enumerate(zip(works, results, strict=True)):
        assert work.request is not None
        assert work.request.event is not None
        whole = {**work.request.event.fields, **{name: values[k] for name, values in columns.items()}}
        try:
            expected: bytes | None = avro.frame(known.result_id, avro.encode(result_schema, whole))
        except ValueError:  # a UINT64 above a long's range: the result dead-letters
            expected = None
        if expected is None:
            assert isinstance(result, InferenceError), result
        else:
            assert result == expected
    assert any(isinstance(r, bytes) for r in results)


def test_result_tails_are_fastavros_bytes() -> None:
    for spec in FAST.outputs:
        arr = outputs_of(FAST, ROWS)[spec.name]
        tails = avro.tail_values(spec, arr, ROWS)
        assert tails is not None, spec.name
        one = avro.parse({"type": "record", "name": "One", "fields": avro.output_fields([(spec.name, spec)])})
        for value, tail in zip(avro.row_values(spec, arr, ROWS), tails, strict=True):
            assert tail == avro.encode(one, {spec.name: value})
    for spec in SLOW.outputs:
        assert avro.tail_values(spec, outputs_of(SLOW, ROWS)[spec.name], ROWS) is None
    nan = np.full((ROWS, 3), np.nan, dtype=F32)
    assert avro.tail_values(FAST.outputs[1], nan, ROWS) is None  # a NaN's bits: fastavro's own writing
    for n in (0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)):
        stream = io.BytesIO()
        fastavro.schemaless_writer(stream, fastavro.parse_schema("long"), n)
        assert avro.zigzag(n) == stream.getvalue()
