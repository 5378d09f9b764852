"""The user tools against a secured cluster (issue 34): ``streaminfer-produce`` and ``streaminfer-dlq replay`` reach
the local broker's SASL_SSL listener (SCRAM-SHA-512) with nothing but a Kafka client properties file
(``--command-config``, as Kafka's own tools take it); a wrong password in it fails in one line, the password
not in it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from producer_tools import dlq, produce
from producer_tools.topics import ensure_topics
from tests.integration.conftest import read_all

pytestmark = pytest.mark.integration


def properties(secure_kafka: dict[str, str], path: Path, password: str | None = None) -> Path:
    """A client properties file for the SASL_SSL listener, SCRAM-SHA-512, the CA as PEM."""
    secret = password if password is not None else secure_kafka["KAFKA_LOCAL_SASL_PASSWORD"]
    path.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{secure_kafka["KAFKA_LOCAL_SASL_USERNAME"]}" password="{secret}";\n'
        f"ssl.ca.location={secure_kafka['KAFKA_LOCAL_CA_FILE']}\n"
    )
    return path


async def test_produce_and_dlq_replay_reach_a_sasl_ssl_scram_broker_with_a_properties_file(
    secure_kafka: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, secured = secure_kafka["PLAINTEXT_BOOTSTRAP"], secure_kafka["KAFKA_LOCAL_SASL_SSL_BOOTSTRAP"]
    tag = uuid.uuid4().hex[:8]
    dead, requests = f"sec-{tag}.requests.dlq", f"sec-{tag}.requests"
    await ensure_topics(plain, {dead: 1, requests: 2})
    config = properties(secure_kafka, tmp_path / "client.properties")
    common = ["--bootstrap-servers", secured, "--command-config", str(config)]
    # dead letters to replay: 5 requests written straight to the dead-letter topic, over SASL_SSL
    code = await asyncio.to_thread(
        produce.main, [*common, "--topic", dead, "--limit", "5", "--no-progress", "--run-id", tag]
    )
    assert code == 0, capsys.readouterr().err
    assert len(await read_all(plain, dead)) == 5
    code = await asyncio.to_thread(
        dlq.main, [*common, "--dead-letter-topic", dead, "--no-progress", "replay", "--to", requests]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    replayed = await read_all(plain, requests)
    assert len(replayed) == 5
    assert {dict(r.headers)["correlation_id"].decode() for r in replayed} == {f"{tag}-{i:06d}" for i in range(5)}


async def test_a_wrong_password_in_the_properties_file_fails_in_one_line(
    secure_kafka: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:8]
    await ensure_topics(secure_kafka["PLAINTEXT_BOOTSTRAP"], {f"sec-{tag}.requests": 1})
    config = properties(secure_kafka, tmp_path / "client.properties", password="not-the-password")
    code = await asyncio.to_thread(produce.main, [
        "--bootstrap-servers", secure_kafka["KAFKA_LOCAL_SASL_SSL_BOOTSTRAP"], "--command-config", str(config),
        "--topic", f"sec-{tag}.requests", "--limit", "1", "--no-progress",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1  # aiokafka reports a refused SASL handshake as a failed bootstrap
    assert err.count("\n") == 1
    assert err.startswith("streaminfer-produce: KafkaConnectionError"), err
    assert "0 of 1 records acknowledged" in err
    assert "not-the-password" not in err
