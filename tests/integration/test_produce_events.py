"""``streaminfer-produce --format avro|json`` against the real broker and the real schema registry: the breast-cancer
events land on the topic keyed by patient, with the correlation ID header, and read back with confluent-kafka's own
``AvroDeserializer`` (or as JSON) equal to the events without their expectations, which the manifest holds."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from consumer.answers.headers import CORRELATION_HEADER
from harness.ports import free_port
from producer_tools.events import registry_config
from producer_tools.produce import main
from producer_tools.topics import ensure_topics
from tests.integration.conftest import read_all

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "models" / "breast_cancer" / "events.avsc"
LIMIT = 25


def run_produce(argv: list[str], manifest: Path, events: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """streaminfer-produce as a user runs it (exit 0 expected): (the manifest's entries, the events sent)."""
    assert main(argv) == 0
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    return entries, [json.loads(line) for line in events.read_text().splitlines()[:LIMIT]]


async def produced(
    bootstrap: str, events: Path, tmp_path: Path, *flags: str
) -> tuple[str, list[Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Run streaminfer-produce on a fresh 3-partition topic: (topic, the records on it, correlation ID -> manifest
    entry, the events sent in file order)."""
    topic = f"it-{uuid.uuid4().hex[:8]}.events"
    await ensure_topics(bootstrap, {topic: 3})
    manifest = tmp_path / "manifest.jsonl"
    argv = ["--bootstrap-servers", bootstrap, "--topic", topic, "--source", str(events), "--limit", str(LIMIT),
            "--key-field", "patient_id", "--manifest", str(manifest), "--no-progress", *flags]  # fmt: skip
    entries, sent = await asyncio.to_thread(run_produce, argv, manifest, events)  # it runs its own event loop
    return topic, await read_all(bootstrap, topic), {e["correlation_id"]: e for e in entries}, sent


def check(records: list[Any], manifest: dict[str, dict[str, Any]], sent: list[dict[str, Any]], decode: Any) -> None:
    """Every event arrived once, keyed by its patient, with its correlation ID, its value the event without the
    expectations, which the manifest holds."""
    assert len(records) == len(manifest) == LIMIT
    by_patient = {e["patient_id"]: e for e in sent}
    seen = set()
    for record in records:
        cid = dict(record.headers)[CORRELATION_HEADER].decode()
        entry = manifest[cid]
        expected = dict(by_patient[record.key.decode()])
        assert entry["label"] == expected.pop("true_label")
        assert entry["expected_label"] == expected.pop("expected_label")
        assert entry["expected_probability"] == expected.pop("expected_probability")
        assert decode(record) == expected
        seen.add(cid)
    assert seen == set(manifest)


async def test_avro_events_read_back_with_confluents_deserializer(
    kafka_bootstrap: str, schema_registry_url: str, breast_cancer_model: Path, tmp_path: Path
) -> None:
    topic, records, manifest, sent = await produced(
        kafka_bootstrap, breast_cancer_model / "events.jsonl", tmp_path,
        "--format", "avro", "--schema", str(SCHEMA), "--schema-registry-url", schema_registry_url,
    )  # fmt: skip
    deserializer = AvroDeserializer(SchemaRegistryClient(registry_config(schema_registry_url)))

    def decode(record: Any) -> Any:
        assert record.value[0] == 0  # Confluent's framing
        return deserializer(record.value, SerializationContext(topic, MessageField.VALUE))

    check(records, manifest, sent, decode)
    registered = SchemaRegistryClient(registry_config(schema_registry_url)).get_latest_version(f"{topic}-value")
    assert {int.from_bytes(r.value[1:5], "big") for r in records} == {registered.schema_id}
    assert json.loads(registered.schema.schema_str)["name"] == "BreastCancerEvent"


async def test_json_events_read_back_as_the_same_objects(
    kafka_bootstrap: str, breast_cancer_model: Path, tmp_path: Path
) -> None:
    _, records, manifest, sent = await produced(
        kafka_bootstrap, breast_cancer_model / "events.jsonl", tmp_path, "--format", "json"
    )
    check(records, manifest, sent, lambda record: orjson.loads(record.value))


def test_an_unreachable_registry_is_one_line_exit_1_and_nothing_is_sent(
    kafka_bootstrap: str, breast_cancer_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "manifest.jsonl"
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    code = main(["--bootstrap-servers", kafka_bootstrap, "--topic", "never-created", "--format", "avro",
                 "--source", str(breast_cancer_model / "events.jsonl"), "--schema", str(SCHEMA),
                 "--schema-registry-url", url, "--manifest", str(manifest), "--no-progress"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"streaminfer-produce: schema registry at {url}: ")
    assert err[0].endswith("nothing sent")
    assert not manifest.exists()


def test_a_registry_that_never_answers_is_exit_1_not_a_hang(
    kafka_bootstrap: str,
    breast_cancer_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registry that accepts connections and never answers (a hung JVM): each request times out after
    ``REGISTRY_TIMEOUT_S`` (here 0.2 s), confluent-kafka's client sends it again ``max.retries`` times, then the
    tool gives up with one line; without a time-out it would wait for ever."""
    monkeypatch.setattr("producer_tools.events.REGISTRY_TIMEOUT_S", 0.2)
    manifest = tmp_path / "manifest.jsonl"
    with socket.socket() as silent:  # the kernel completes the handshake; nobody ever reads or writes
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/apis/ccompat/v7"
        code = main(["--bootstrap-servers", kafka_bootstrap, "--topic", "never-created", "--format", "avro",
                     "--source", str(breast_cancer_model / "events.jsonl"), "--schema", str(SCHEMA),
                     "--schema-registry-url", url, "--manifest", str(manifest), "--no-progress"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"streaminfer-produce: schema registry at {url}: ")
    assert "Timeout" in err[0]
    assert not manifest.exists()
