"""Enriched results (consumer/answers/enrich.py, consumer/answers/records.py): the event plus the model's outputs,
JSON in JSON out and Avro in Avro out (framed with the result schema's ID); the request's key and headers kept;
tombstones forwarded."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import numpy as np
import orjson
import pytest
from aiokafka import TopicPartition

from consumer.answers.enrich import EnrichedAnswers, check_enriched
from consumer.answers.records import AnswerRecords
from consumer.events.avro import output_type, split_frame
from consumer.events.mapping import load_mapping
from consumer.events.registry import Schemas
from consumer.offsets import PartitionOffsets
from consumer.signature import ModelSignature, TensorSpec
from consumer.timeouts import Backoff
from consumer.work import DecodedRequest, Event, Work
from tests.unit.consumer.events.fakes import PAYMENT, FlakyRegistry, InstantClock
from tests.unit.fakes import record

F32, I64, F64, OBJ = np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float64), np.dtype(object)
SIGNATURE = ModelSignature(
    "m",
    "1",
    (TensorSpec("amount", F32, (None, 1)),),
    (
        TensorSpec("label", I64, (None,)),
        TensorSpec("probabilities", F32, (None, 2)),
        TensorSpec("tag", OBJ, (None, 1)),
        TensorSpec("bias", F64, (1,), batched=False),
    ),
)
OUTPUTS = {
    "label": np.array([1, 0], dtype=np.longlong),  # ONNX Runtime's int64 scalar type (not numpy.int64 on Linux)
    "probabilities": np.array([[0.1, 0.9], [0.7, 0.3]], dtype=np.float32),
    "tag": np.array([["a"], ["b"]], dtype=object),
    "bias": np.array([0.25]),
}


def work_of(fields: dict[str, Any], raw: bytes | None = None, schema_id: int | None = None, offset: int = 0) -> Work:
    """A work item holding an event (its raw bytes: the JSON text of ``fields`` unless given)."""
    request = DecodedRequest(None, None, 1, None)
    request.event = Event(fields, orjson.dumps(fields) if raw is None else raw, schema_id)
    rec = record("events", 0, offset, b"value", b"key-1", [("trace", b"t")])  # headers: correlation_id, trace
    return Work(rec, TopicPartition("events", 0), PartitionOffsets(), b"c-1", request, None, 1, 0.0)


def test_json_results_are_the_event_with_its_outputs_appended() -> None:
    answers = EnrichedAnswers(SIGNATURE, load_mapping(SIGNATURE, None, enrich=True), "json")
    works = [
        work_of({"id": "p-1", "amount": 3.5}),
        work_of({"id": "p-2", "amount": 1}, b'{ "id": "p-2",\n "amount": 1.0e0 }\n'),
    ]
    results = answers.encode(works, OUTPUTS)
    assert results[0] == (
        b'{"id":"p-1","amount":3.5,"label":1,"probabilities":[0.1,0.9],"tag":"a","bias":0.25}'
    )  # float32 written as float32: 0.9, not 0.8999999761581421
    # the event's own bytes reach the result untouched (spacing and number format included)
    assert results[1] == b'{ "id": "p-2",\n "amount": 1.0e0,"label":0,"probabilities":[0.7,0.3],"tag":"b","bias":0.25}'
    assert orjson.loads(work_of({}).request.event.raw) == {}  # type: ignore[union-attr]
    (empty,) = answers.encode([work_of({})], {k: v[:1] for k, v in OUTPUTS.items()})
    assert orjson.loads(empty) == {"label": 1, "probabilities": [0.1, 0.9], "tag": "a", "bias": 0.25}


async def test_avro_results_decode_with_their_result_schema() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    signature = ModelSignature("m", "1", SIGNATURE.inputs, SIGNATURE.outputs[:2])
    mapping = load_mapping(signature, None, enrich=True)
    writer_id = await registry.add("payments-value", PAYMENT)
    schemas = Schemas(registry, mapping, signature, "scored-value", register=True, unknown_retries=0,
                      backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep)  # fmt: skip
    await schemas.resolve([writer_id])
    answers = EnrichedAnswers(signature, mapping, "avro", schemas)
    event = {"id": "p-1", "amount": 3.5, "device": None, "at": 1_764_000_000_000}
    datum = io.BytesIO()
    fastavro.schemaless_writer(datum, fastavro.parse_schema(PAYMENT, named_schemas={}), event)
    (result,) = answers.encode(
        [work_of(dict(event), datum.getvalue(), writer_id)], {k: v[:1] for k, v in OUTPUTS.items()}
    )
    assert isinstance(result, bytes)
    framed = split_frame(result)
    assert framed is not None
    result_id, payload = framed
    known = schemas.get(writer_id)
    assert known is not None
    assert result_id == known.result_id
    schema = json.loads((await registry.mock.get_schema(result_id)).schema_str)
    datum = fastavro.schemaless_reader(io.BytesIO(payload), fastavro.parse_schema(schema), None)
    assert datum["id"] == "p-1"
    assert datum["label"] == 1
    assert datum["probabilities"] == pytest.approx([0.1, 0.9])
    assert datum["at"].year == 2025  # the logical type kept in the result schema: a reader gets its datetime


def test_avro_types_of_outputs() -> None:
    assert output_type(TensorSpec("p", F32, (None, 2))) == {"type": "array", "items": "float"}
    assert output_type(TensorSpec("y", F32, (None, 1))) == "float"
    assert output_type(TensorSpec("y", I64, (None,))) == "long"
    nested = {"type": "array", "items": {"type": "array", "items": "double"}}
    assert output_type(TensorSpec("e", F64, (None, None, 3))) == nested
    assert output_type(TensorSpec("s", OBJ, (None,))) == "string"


def test_the_probe_checks_each_output_fits_an_enriched_result() -> None:
    for spec in SIGNATURE.outputs:
        check_enriched(SIGNATURE, spec.name, OUTPUTS[spec.name][:1] if spec.batched else OUTPUTS[spec.name])
    with pytest.raises((TypeError, ValueError)):
        check_enriched(SIGNATURE, "tag", np.array([[{1}]], dtype=object))  # a set is no string


def test_enriched_results_and_tombstones_keep_the_requests_key_and_headers() -> None:
    records = AnswerRecords(results_topic="scored", dead_letter_topic="dlq", group_id="g", enrich=True)
    work = work_of({"amount": 1.0})
    work.record.headers.append(("__value_schema_id", b"\x01"))  # a header-based serializer's: not copied
    work.result = b'{"amount":1.0,"label":1}'
    topic, key, value, headers = records.of(work)
    assert (topic, key, value) == ("scored", b"key-1", b'{"amount":1.0,"label":1}')
    assert headers[:2] == [("correlation_id", b"c-1"), ("streaminfer.request.timestamp_ms", b"0")]
    assert headers[2:] == [("trace", b"t")]  # the request's correlation_id header is not written twice
    tombstone = work_of({})
    tombstone.tombstone = True
    assert records.of(tombstone)[:3] == ("scored", b"key-1", None)
