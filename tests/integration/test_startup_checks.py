"""Settings whose mistake would otherwise turn every record into a dead letter stop start-up instead (issue 34):
the real Apicurio Registry given by its root URL, not its Confluent-compatible ``/apis/ccompat/v7``, exits 2 naming
``schema_registry_url`` and the suffix, and no record is read (the group never commits, nothing is answered)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from harness.process import ConsumerProcess
from harness.registry.registry import CCOMPAT_PATH
from producer_tools.events import read_events, registry_config
from tests.integration.conftest import read_all

pytestmark = pytest.mark.integration

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "models" / "breast_cancer" / "events.avsc"


def writer_schema() -> str:
    return SCHEMA_FILE.read_text()


async def test_a_registry_url_without_its_compatible_path_exits_2_before_reading_a_record(
    kafka_bootstrap: str, topics: dict[str, str], breast_cancer_model: Path, schema_registry_url: str, tmp_path: Path
) -> None:
    if not schema_registry_url.endswith(CCOMPAT_PATH):
        pytest.skip("SCHEMA_REGISTRY_URL is not an Apicurio Registry's Confluent-compatible path")
    root = schema_registry_url.removesuffix(CCOMPAT_PATH)
    schema = writer_schema()
    event = read_events(breast_cancer_model / "events.jsonl")[0]
    serialize = AvroSerializer(SchemaRegistryClient(registry_config(schema_registry_url)), schema)
    value = serialize(dict(event), SerializationContext(topics["requests"], MessageField.VALUE))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topics["requests"], value, key=b"waiting")  # a record the consumer must not read
    finally:
        await producer.stop()
    group = f"it-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "consumer.log"
    consumer = ConsumerProcess(
        {
            "bootstrap_servers": kafka_bootstrap,
            "group_id": group,
            "requests_topic": topics["requests"],
            "results_topic": topics["results"],
            "dead_letter_topic": topics["dlq"],
            "model_path": breast_cancer_model / "breast_cancer.onnx",
            "request_format": "avro",
            "schema_registry_url": root,
            "warmup_runs": 1,
        },
        log,
    )
    try:
        with pytest.raises(RuntimeError, match="exited with code 2"):
            consumer.start(timeout_s=120)
    finally:
        if consumer.proc is not None:
            consumer.terminate(grace_s=10)
    text = log.read_text()
    assert f"schema_registry_url={root} answers, but not as a Confluent-compatible Schema Registry API" in text
    assert f"{root}/apis/ccompat/v7" in text  # the fix, spelled out
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        groups = {listed[0] for listed in await admin.list_consumer_groups()}
    finally:
        await admin.close()
    assert group not in groups  # the consumer never joined its group, so never read (nor committed) a record
    assert await read_all(kafka_bootstrap, topics["dlq"]) == []
    assert await read_all(kafka_bootstrap, topics["results"]) == []
