"""The consumer against TLS and SASL listeners of a real broker (the local broker in security mode)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from consumer.app import StreamInferApp
from consumer.config import Settings
from consumer.model.runner import OnnxRunner
from consumer.model.session import SessionOptions
from consumer.ops.logs import setup_logging
from consumer.ops.metrics import Metrics
from producer_tools.produce import digits_requests, send_all
from producer_tools.topics import ensure_topics
from tests.integration.conftest import answers, settings_for

pytestmark = pytest.mark.integration


async def serve_and_check(secure_kafka: dict[str, str], digits_model: Path, **security: Any) -> None:
    plain = secure_kafka["PLAINTEXT_BOOTSTRAP"]
    tag = uuid.uuid4().hex[:8]
    topics = {"requests": f"sec-{tag}.requests", "results": f"sec-{tag}.results", "dlq": f"sec-{tag}.dlq"}
    await ensure_topics(plain, {topics["requests"]: 2, topics["results"]: 2, topics["dlq"]: 1})
    settings = settings_for(plain, topics, digits_model / "digits.onnx", **security)  # security: its bootstrap
    runner = OnnxRunner.load(settings.model_path, SessionOptions(execution_provider="cpu"))
    app = StreamInferApp(settings, runner, Metrics(CollectorRegistry()))
    await app.start()
    try:
        records = list(digits_requests(tag, digits_model / "heldout.npz", limit=20))
        await send_all(plain, topics["requests"], records, progress=False)
        report = await answers(plain, topics, records)
        assert report.missing == []
        assert report.results == 20
    finally:
        await app.stop()


async def test_tls(secure_kafka: dict[str, str], digits_model: Path) -> None:
    await serve_and_check(
        secure_kafka,
        digits_model,
        bootstrap_servers=secure_kafka["KAFKA_LOCAL_SSL_BOOTSTRAP"],
        security_protocol="SSL",
        ssl_cafile=Path(secure_kafka["KAFKA_LOCAL_CA_FILE"]),
    )


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_sasl_over_tls_with_password_file(
    secure_kafka: dict[str, str],
    digits_model: Path,
    mechanism: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    password = secure_kafka["KAFKA_LOCAL_SASL_PASSWORD"]
    password_file = tmp_path / "password"
    password_file.write_text(password)
    # The service's own logging, with aiokafka at DEBUG: it logs SASL PLAIN's wire bytes, password included.
    setup_logging("DEBUG", as_json=False, secrets=[password])
    logging.getLogger("aiokafka").setLevel(logging.DEBUG)
    try:
        await serve_and_check(
            secure_kafka,
            digits_model,
            bootstrap_servers=secure_kafka["KAFKA_LOCAL_SASL_SSL_BOOTSTRAP"],
            security_protocol="SASL_SSL",
            sasl_mechanism=mechanism,
            sasl_username=secure_kafka["KAFKA_LOCAL_SASL_USERNAME"],
            sasl_password_file=password_file,
            ssl_cafile=Path(secure_kafka["KAFKA_LOCAL_CA_FILE"]),
        )
    finally:
        logging.getLogger("aiokafka").setLevel(logging.NOTSET)
        logging.getLogger().handlers.clear()
    logged = capsys.readouterr().err
    assert "Authenticated as streaminfer" in logged
    assert password not in logged


async def test_wrong_password_fails_start(secure_kafka: dict[str, str], digits_model: Path) -> None:
    settings = Settings(
        bootstrap_servers=secure_kafka["KAFKA_LOCAL_SASL_SSL_BOOTSTRAP"],
        group_id="sec-wrong",
        model_path=digits_model / "digits.onnx",
        execution_provider="cpu",
        http_port=0,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username=secure_kafka["KAFKA_LOCAL_SASL_USERNAME"],
        sasl_password="not-the-password",
        ssl_cafile=Path(secure_kafka["KAFKA_LOCAL_CA_FILE"]),
    )
    runner = OnnxRunner.load(settings.model_path, SessionOptions(execution_provider="cpu"))
    app = StreamInferApp(settings, runner, Metrics(CollectorRegistry()))
    with pytest.raises(KafkaError):
        await app.start()
