"""The local schema registry is a real Confluent-compatible one: confluent-kafka's own Avro serializer and
deserializer round-trip a record through it (TopicNameStrategy), its async client fetches schemas by ID, registering
is idempotent, a registry paused and resumed keeps its schemas and IDs, a frozen one hangs instead of refusing, and
it listens on loopback only."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_reader
from fastavro.schema import to_parsing_canonical_form

from harness.ports import listening
from harness.registry import LocalRegistry
from harness.registry.registry import http_status
from producer_tools.events import registry_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "models" / "breast_cancer" / "events.avsc"


def event(i: int = 0) -> dict[str, Any]:
    """A BreastCancerEvent (every field of events.avsc; values made up)."""
    schema = json.loads(SCHEMA_FILE.read_text())
    features = [f["name"] for f in schema["fields"] if f["type"] == "double"]
    body: dict[str, Any] = {
        "patient_id": f"p-{i}",
        "clinic": {"region": "north"},
        "recorded_at": "2026-01-01T00:00:00Z",
    }
    body.update({name: 0.5 * k + i for k, name in enumerate(features)})
    return body


def canonical(schema_str: str) -> str:
    return str(to_parsing_canonical_form(parse_schema(json.loads(schema_str))))


def client(url: str) -> SchemaRegistryClient:
    """A fresh client (no cache): every call asks the registry; a request unanswered for 30 s fails (not the test's
    whole time limit)."""
    return SchemaRegistryClient(registry_config(url))


def test_confluents_avro_serde_round_trips_a_record_through_the_registry(schema_registry_url: str) -> None:
    topic = f"it-{uuid.uuid4().hex[:8]}.events"
    schema_str = SCHEMA_FILE.read_text()
    ctx = SerializationContext(topic, MessageField.VALUE)
    record = event(7)
    framed = AvroSerializer(client(schema_registry_url), schema_str)(record, ctx)
    assert framed is not None
    assert framed[0] == 0  # Confluent's wire format: magic byte 0, a 4-byte big-endian schema ID, Avro binary
    schema_id = int.from_bytes(framed[1:5], "big")
    latest = client(schema_registry_url).get_latest_version(f"{topic}-value")  # TopicNameStrategy, auto-registered
    assert latest.schema_id == schema_id
    assert canonical(latest.schema.schema_str) == canonical(schema_str)
    import io

    assert schemaless_reader(io.BytesIO(framed[5:]), parse_schema(json.loads(schema_str)), None) == record
    assert AvroDeserializer(client(schema_registry_url))(framed, ctx) == record


async def test_the_async_client_fetches_a_schema_by_id(schema_registry_url: str) -> None:
    schema_str = SCHEMA_FILE.read_text()
    schema_id = client(schema_registry_url).register_schema(
        f"it-{uuid.uuid4().hex[:8]}-value", Schema(schema_str, "AVRO")
    )
    async with AsyncSchemaRegistryClient(registry_config(schema_registry_url)) as async_client:
        fetched = await async_client.get_schema(schema_id)
    assert fetched.schema_type == "AVRO"
    assert canonical(fetched.schema_str) == canonical(schema_str)


def test_registering_is_idempotent_and_ids_are_per_schema(schema_registry_url: str) -> None:
    schema = Schema(SCHEMA_FILE.read_text(), "AVRO")
    other = Schema(json.dumps({"type": "record", "name": f"R{uuid.uuid4().hex}", "fields": []}), "AVRO")
    subject = f"it-{uuid.uuid4().hex[:8]}-value"
    first = client(schema_registry_url).register_schema(subject, schema)
    assert client(schema_registry_url).register_schema(subject, schema) == first  # a dozen replicas may register
    assert client(schema_registry_url).lookup_schema(subject, schema).schema_id == first
    assert client(schema_registry_url).get_versions(subject) == [1]  # no second version either
    assert client(schema_registry_url).register_schema(f"{subject}-2", schema) == first  # one ID per schema
    assert client(schema_registry_url).register_schema(subject, other) != first


def test_a_paused_registry_refuses_then_resumes_with_its_schemas_and_ids(own_registry: LocalRegistry) -> None:
    url = own_registry.url
    subject = f"it-{uuid.uuid4().hex[:8]}-value"
    schema_str = SCHEMA_FILE.read_text()
    schema_id = client(url).register_schema(subject, Schema(schema_str, "AVRO"))
    own_registry.pause()
    try:
        assert own_registry.status() == "paused"
        assert http_status(f"{url}/subjects") is None  # refused
    finally:
        assert own_registry.resume() == url  # same port
    assert own_registry.status() == "running"
    assert canonical(client(url).get_schema(schema_id).schema_str) == canonical(schema_str)
    assert client(url).register_schema(subject, Schema(schema_str, "AVRO")) == schema_id
    assert subject in client(url).get_subjects()
    newer = Schema(json.dumps({"type": "record", "name": f"R{uuid.uuid4().hex}", "fields": []}), "AVRO")
    assert client(url).register_schema(subject + "-new", newer) > schema_id  # IDs go on, never reused


def test_a_frozen_registry_hangs_instead_of_refusing(own_registry: LocalRegistry) -> None:
    url = own_registry.url
    own_registry.freeze()
    try:
        assert own_registry.status() == "frozen"
        assert listening("127.0.0.1", int(url.split(":")[2].split("/")[0]))  # the kernel still accepts
        assert http_status(f"{url}/subjects", timeout_s=1.0) is None  # but nothing answers
    finally:
        own_registry.thaw()
    assert http_status(f"{url}/subjects") == 200


def test_both_interfaces_listen_on_loopback_only(own_registry: LocalRegistry) -> None:
    rec = own_registry.recorded()
    assert rec is not None
    assert rec.management_port != 9000  # Quarkus's default, which would also be on 0.0.0.0
    with socket.socket() as control:  # an address on all interfaces is reachable at 127.0.0.2 on this loopback
        control.bind(("0.0.0.0", 0))
        control.listen()
        if not listening("127.0.0.2", control.getsockname()[1]):
            pytest.skip("127.0.0.2 does not reach this host's loopback: cannot tell loopback-only from all")
    for port in (rec.port, rec.management_port):
        assert listening("127.0.0.1", port)
        assert not listening("127.0.0.2", port), f"port {port} is bound beyond 127.0.0.1"
    assert http_status(own_registry.health_url) == 200
    assert "apicurio" in own_registry.log_file.read_text().lower()
