"""Events on a real broker and a real schema registry (issue 26's acceptance): JSON and Avro events answered with
enriched results equal to a direct ONNX Runtime run on the same features; every event dead-letter reason given by a
real record; a registry stopped mid-stream loses nothing and dead-letters nothing; a new schema version keeps serving;
a removed required field dead-letters with its reason; Confluent's own serializer in, Confluent's own deserializer
out."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from consumer.app import StreamInferApp
from consumer.errors import ConfigError
from consumer.events.avro import frame
from harness.registry import LocalRegistry
from producer_tools.events import EXPECTATION_FIELDS, read_events, registry_config
from tests.integration.conftest import AppFactory, read_all

pytestmark = pytest.mark.integration

#: The mapping example docs/events.md runs (committed beside the model's build script).
MAPPING = Path(__file__).resolve().parents[2] / "models" / "breast_cancer" / "mapping.yaml"

#: A result field the tests read, and the reason header of a dead letter.
REASON = "streaminfer.error.reason"


def events_of(folder: Path, n: int) -> list[dict[str, Any]]:
    """``n`` example events without the manifest's expectation fields."""
    out = []
    for event in read_events(folder / "events.jsonl", limit=n):
        for name in EXPECTATION_FIELDS:
            event.pop(name, None)
        out.append(event)
    return out


def direct(folder: Path, events: list[dict[str, Any]]) -> dict[str, tuple[int, list[float]]]:
    """patient_id -> (label, probabilities) of ONNX Runtime run directly on each event's features, one at a time."""
    session = ort.InferenceSession(str(folder / "breast_cancer.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    out = {}
    for event in events:
        feeds = {name: np.array([[event[name]]], dtype=np.float32) for name in names}
        label, probabilities = session.run(None, feeds)
        out[event["patient_id"]] = (int(label[0]), [float(p) for p in probabilities[0]])
    return out


async def send(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value=value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def until_answered(
    bootstrap: str, topics: dict[str, str], count: int, timeout_s: float = 60
) -> tuple[list[Any], list[Any]]:
    """(results, dead letters) once ``count`` answers are on the two topics."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        results = await read_all(bootstrap, topics["results"])
        dead = await read_all(bootstrap, topics["dlq"])
        if len(results) + len(dead) >= count or asyncio.get_running_loop().time() > deadline:
            return results, dead
        await asyncio.sleep(0.5)


def reasons(dead: list[Any]) -> dict[bytes | None, str]:
    return {d.key: dict(d.headers)[REASON].decode() for d in dead}


def check_enriched(result: dict[str, Any], event: dict[str, Any], expected: tuple[int, list[float]]) -> None:
    """The result is the event (every field as sent) plus the outputs, equal to the direct run's: the label exactly,
    the probabilities within float32 accumulation error (ONNX Runtime's tree ensemble sums its trees in another order
    in a batch run on more threads: measured up to 1.2e-7 apart)."""
    for name, value in event.items():
        if isinstance(value, float):
            assert result[name] == pytest.approx(value), name
        else:
            assert result[name] == value, name
    assert result["label"] == expected[0]
    assert result["probabilities"] == pytest.approx(expected[1], rel=1e-5, abs=1e-6)


# ------------------------------------------------------------------------------------------------ JSON
async def test_json_events_are_enriched_and_bad_ones_dead_lettered(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, breast_cancer_model: Path, tmp_path: Path
) -> None:
    folder = breast_cancer_model
    events = events_of(folder, 40)
    features = json.loads((folder / "features.json").read_text())["fields"]
    # a mapping: every feature by name but mean_radius, from a category with a lookup table
    mapping = {"inputs": {name: [name] for name in features}}
    mapping["inputs"]["mean_radius"] = [{"field": "size", "lookup": {"small": 10.0, "large": 20.0}}]
    mapping_file = tmp_path / "mapping.yaml"
    mapping_file.write_text(json.dumps(mapping))  # JSON is YAML
    good = [dict(e, size="small" if i % 2 else "large") for i, e in enumerate(events)]
    for e in good:
        e["mean_radius"] = 10.0 if e["size"] == "small" else 20.0  # what the lookup feeds, for the direct run
    expected = direct(folder, good)
    bad = {
        b"missing": orjson.dumps({k: v for k, v in good[0].items() if k != "mean_texture"}),
        b"wrong-type": orjson.dumps(dict(good[0], mean_texture="24.5")),
        b"unknown-category": orjson.dumps(dict(good[0], size="huge")),
        b"clash": orjson.dumps(dict(good[0], label=3)),
        b"not-json": b"{not json",
        b"not-object": b"[1, 2, 3]",
    }
    records: list[tuple[bytes | None, bytes | None]] = [(e["patient_id"].encode(), orjson.dumps(e)) for e in good]
    records[5:5] = list(bad.items())
    records.append((b"gone", None))  # a tombstone
    await start_app(
        model_path=folder / "breast_cancer.onnx", request_format="json", input_mapping=mapping_file, max_batch_size=16
    )
    await send(kafka_bootstrap, topics["requests"], records)
    results, dead = await until_answered(kafka_bootstrap, topics, len(records))
    assert reasons(dead) == {
        b"missing": "missing_field",
        b"wrong-type": "wrong_type",
        b"unknown-category": "unknown_category",
        b"clash": "field_clash",
        b"not-json": "invalid_json",
        b"not-object": "not_an_object",
    }
    for d in dead:  # the dead letter keeps the original bytes
        assert d.value == bad[d.key]
    tombstones = [r for r in results if r.value is None]
    assert [t.key for t in tombstones] == [b"gone"]
    enriched = {r.key.decode(): orjson.loads(r.value) for r in results if r.value is not None}
    assert set(enriched) == {e["patient_id"] for e in good}
    for event in good:
        check_enriched(enriched[event["patient_id"]], event, expected[event["patient_id"]])


async def test_the_documented_mapping_file_feeds_the_vector_model(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, breast_cancer_model: Path
) -> None:
    """models/breast_cancer/mapping.yaml, as docs/events.md runs it: the 30 fields in the model's order into the one
    ``features`` input of breast_cancer_features.onnx, the label renamed; the answers are the direct run's."""
    folder = breast_cancer_model
    mapping = yaml.safe_load(MAPPING.read_text())
    assert mapping["inputs"]["features"] == json.loads((folder / "features.json").read_text())["fields"]
    events = events_of(folder, 20)
    expected = direct(folder, events)
    await start_app(model_path=folder / "breast_cancer_features.onnx", request_format="json", input_mapping=MAPPING)
    await send(kafka_bootstrap, topics["requests"], [(e["patient_id"].encode(), orjson.dumps(e)) for e in events])
    results, dead = await until_answered(kafka_bootstrap, topics, len(events))
    assert dead == []
    enriched = {r.key.decode(): orjson.loads(r.value) for r in results}
    assert set(enriched) == set(expected)
    for patient, (label, probabilities) in expected.items():
        assert "label" not in enriched[patient]
        assert enriched[patient]["predicted_label"] == label
        assert enriched[patient]["probabilities"] == pytest.approx(probabilities, rel=1e-5, abs=1e-6)


# ------------------------------------------------------------------------------------------------ Avro
def serializer(url: str, schema: dict[str, Any]) -> AvroSerializer:
    """confluent-kafka's own Avro serializer (TopicNameStrategy, the schema registered when absent)."""
    return AvroSerializer(SchemaRegistryClient(registry_config(url)), json.dumps(schema))


def avsc(folder: Path) -> dict[str, Any]:
    return json.loads((Path(__file__).resolve().parents[2] / "models" / "breast_cancer" / "events.avsc").read_text())


async def test_avro_events_from_confluents_serializer_are_answered_in_avro_confluent_reads(
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
    breast_cancer_model: Path,
    schema_registry_url: str,
) -> None:
    folder = breast_cancer_model
    events = events_of(folder, 30)
    expected = direct(folder, events)
    schema = avsc(folder)
    context = SerializationContext(topics["requests"], MessageField.VALUE)
    v1 = serializer(schema_registry_url, schema)
    records: list[tuple[bytes | None, bytes | None]] = [(e["patient_id"].encode(), v1(e, context)) for e in events[:10]]
    # a new version upstream: a field added (with a default) keeps serving
    v2_schema = dict(schema, fields=[*schema["fields"], {"name": "ward", "type": "string", "default": "none"}])
    v2 = serializer(schema_registry_url, v2_schema)
    records += [(e["patient_id"].encode(), v2(dict(e, ward="B"), context)) for e in events[10:20]]
    # a version without a field the model needs: its records are dead-lettered missing_field
    v3_schema = dict(schema, name="Trimmed", fields=[f for f in schema["fields"] if f["name"] != "worst_area"])
    v3 = AvroSerializer(
        SchemaRegistryClient(registry_config(schema_registry_url)),
        json.dumps(v3_schema),
        conf={"auto.register.schemas": True},
    )
    trimmed = {k: v for k, v in events[20].items() if k != "worst_area"}
    records.append((b"trimmed", v3(trimmed, SerializationContext(f"{topics['requests']}-trimmed", MessageField.VALUE))))
    good_value = records[0][1]
    assert good_value is not None
    records += [
        (b"plain-json", orjson.dumps(events[21])),  # not in the wire format
        (b"unknown-id", frame(987_654, good_value[5:])),  # an ID the registry never gave
        (b"truncated", good_value[:-4]),  # does not decode with its schema
    ]
    records += [(e["patient_id"].encode(), v1(e, context)) for e in events[22:]]
    await start_app(
        model_path=folder / "breast_cancer.onnx",
        request_format="avro",
        schema_registry_url=schema_registry_url,
        unknown_schema_retries=1,
        retry_backoff_ms=50,
    )
    await send(kafka_bootstrap, topics["requests"], records)
    results, dead = await until_answered(kafka_bootstrap, topics, len(records))
    assert reasons(dead) == {
        b"trimmed": "missing_field",
        b"plain-json": "not_in_wire_format",
        b"unknown-id": "unknown_schema_id",
        b"truncated": "invalid_avro",
    }
    deserializer = AvroDeserializer(SchemaRegistryClient(registry_config(schema_registry_url)))
    out = SerializationContext(topics["results"], MessageField.VALUE)
    enriched = {r.key.decode(): deserializer(r.value, out) for r in results}
    answered = [e for i, e in enumerate(events) if i != 20 and i != 21]
    assert set(enriched) == {e["patient_id"] for e in answered}
    for i, event in enumerate(events):
        if event["patient_id"] in enriched:
            check_enriched(enriched[event["patient_id"]], dict(event, ward="B") if 10 <= i < 20 else event,
                           expected[event["patient_id"]])  # fmt: skip


async def test_a_registry_stopped_mid_stream_loses_nothing_and_dead_letters_nothing(
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
    breast_cancer_model: Path,
    own_registry: LocalRegistry,
) -> None:
    folder = breast_cancer_model
    events = events_of(folder, 40)
    schema = avsc(folder)
    context = SerializationContext(topics["requests"], MessageField.VALUE)
    v1 = serializer(own_registry.url, schema)
    app: StreamInferApp = await start_app(
        model_path=folder / "breast_cancer.onnx",
        request_format="avro",
        schema_registry_url=own_registry.url,
        schema_registry_timeout_ms=1000,
        retry_backoff_ms=100,
        retry_backoff_max_ms=500,
    )
    await send(kafka_bootstrap, topics["requests"], [(e["patient_id"].encode(), v1(e, context)) for e in events[:10]])
    results, _ = await until_answered(kafka_bootstrap, topics, 10)
    assert len(results) == 10
    # a new schema version, registered while the registry is up, produced while it is down
    v2_schema = dict(schema, fields=[*schema["fields"], {"name": "batch", "type": "string", "default": ""}])
    v2 = serializer(own_registry.url, v2_schema)
    later = [(e["patient_id"].encode(), v2(dict(e, batch=uuid.uuid4().hex), context)) for e in events[10:30]]
    known = [(e["patient_id"].encode(), v1(e, context)) for e in events[30:]]
    # A spy on the wait: the delivery mode hands source.idle to each chunk's decode, the registry client calls it
    # between its tries while the registry is away.
    assert app.stages is not None
    source = app.stages.source
    wait_out = source.idle
    waits = 0

    async def counted(seconds: float) -> None:
        nonlocal waits
        waits += 1
        await wait_out(seconds)

    source.idle = counted  # type: ignore[method-assign]
    own_registry.pause()
    try:
        await send(kafka_bootstrap, topics["requests"], later)
        for _ in range(100):  # the consumer finds the registry away, holds the new ID's records, tries again
            if not app.readiness()[0] and waits >= 3:
                break
            await asyncio.sleep(0.1)
        ready, reason = app.readiness()
        assert not ready
        assert reason.startswith("schema registry unanswered")
        assert waits >= 3  # waited out three times, the records held: none dead-lettered in between
        assert app.liveness()[0]  # held for the registry: alive
        assert app.metrics.registry.get_sample_value("streaminfer_schema_registry_reachable") == 0
        assert len(await read_all(kafka_bootstrap, topics["dlq"])) == 0
    finally:
        own_registry.resume()
    await send(kafka_bootstrap, topics["requests"], known)
    results, dead = await until_answered(kafka_bootstrap, topics, 40)
    assert dead == []
    assert {r.key.decode() for r in results} == {e["patient_id"] for e in events}
    assert app.readiness()[0]
    assert app.metrics.registry.get_sample_value("streaminfer_schema_registry_reachable") == 1


async def test_a_result_schema_that_may_not_be_registered(
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
    breast_cancer_model: Path,
    schema_registry_url: str,
) -> None:
    folder = breast_cancer_model
    events = events_of(folder, 3)
    schema = avsc(folder)
    context = SerializationContext(topics["requests"], MessageField.VALUE)
    # the requests subject is empty when the consumer starts: start-up has nothing to check
    await start_app(
        model_path=folder / "breast_cancer.onnx",
        request_format="avro",
        schema_registry_url=schema_registry_url,
        register_result_schema=False,
    )
    v1 = serializer(schema_registry_url, schema)
    await send(kafka_bootstrap, topics["requests"], [(e["patient_id"].encode(), v1(e, context)) for e in events])
    results, dead = await until_answered(kafka_bootstrap, topics, 3)
    assert results == []
    assert set(reasons(dead).values()) == {"result_schema_refused"}
    # now the subject has a writer schema: a consumer that may not register stops start-up, naming the subject
    with pytest.raises(ConfigError, match=rf"{topics['results']}-value and register_result_schema is false"):
        await start_app(
            model_path=folder / "breast_cancer.onnx",
            request_format="avro",
            schema_registry_url=schema_registry_url,
            register_result_schema=False,
            group_id=f"other-{uuid.uuid4().hex[:6]}",
        )
