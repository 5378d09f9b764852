"""Shared fixtures. The Kafka broker is found in this order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (``.ci/run`` starts one and sets it);
2. testcontainers' Kafka if a Docker engine answers;
3. :class:`harness.localkafka.LocalBroker` (Apache Kafka's jars via Maven, on the JDK), started for the
   session.

With ``CI=true`` a broker that cannot be had fails the tests that need one, with the reason; elsewhere they skip.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.localkafka import BrokerSetupError, LocalBroker

ROOT = Path(__file__).resolve().parent.parent


def _no_broker(reason: str) -> None:
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"no Kafka broker for integration tests: {reason}", pytrace=False)
    pytest.skip(f"no Kafka broker: {reason}")


def _docker_answers() -> bool:
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    import docker

    client = None
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except Exception:
        return False
    finally:
        if client is not None:
            client.close()
    return True


@contextlib.contextmanager
def _local_broker(state: Path, **options: Any) -> Iterator[LocalBroker]:
    """A :class:`LocalBroker` in its own state folder (``options`` go to it), stopped afterwards; a broker that
    cannot start fails or skips the test (:func:`_no_broker`) with the reason."""
    broker = LocalBroker(state, **options)
    try:
        broker.start()
    except BrokerSetupError as exc:
        _no_broker(f"the local broker ({options or 'defaults'}) did not start: {exc}")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of a real broker for this test session."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    with _local_broker(tmp_path_factory.mktemp("kafka-local")) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with digits.onnx, heldout.npz and metrics.json, built for this session by models/digits/build.py."""
    out = tmp_path_factory.mktemp("digits")
    subprocess.run(
        [sys.executable, str(ROOT / "models" / "digits" / "build.py"), "--out", str(out)], check=True, timeout=300
    )
    return out


@pytest.fixture(scope="session")
def breast_cancer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with breast_cancer.onnx (one input per feature), breast_cancer_features.onnx, events.jsonl,
    features.json, heldout.npz and metrics.json, built for this session by models/breast_cancer/build.py."""
    out = tmp_path_factory.mktemp("breast_cancer")
    subprocess.run(
        [sys.executable, str(ROOT / "models" / "breast_cancer" / "build.py"), "--out", str(out)],
        check=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A second local broker with TLS and SASL_SSL listeners (``LocalBroker(security=True)``).

    Yields its :meth:`LocalBroker.security_env` (KAFKA_LOCAL_SSL_BOOTSTRAP, KAFKA_LOCAL_SASL_SSL_BOOTSTRAP,
    KAFKA_LOCAL_CA_FILE, KAFKA_LOCAL_SASL_USERNAME, KAFKA_LOCAL_SASL_PASSWORD) plus PLAINTEXT_BOOTSTRAP.
    """
    with _local_broker(tmp_path_factory.mktemp("kafka-secure"), security=True) as broker:
        yield {**broker.security_env(), "PLAINTEXT_BOOTSTRAP": broker.bootstrap}


@pytest.fixture(scope="session")
def text_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The small variable-length sentence encoder of tests/text_model.py (no torch): (model, tokenizer.json)."""
    from tests.text_model import build

    return build(tmp_path_factory.mktemp("text-model"))


@pytest.fixture(scope="session")
def image_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny colour classifier of tests/image_model.py (no torch), with its preprocessing in its metadata."""
    from tests.image_model import build

    return build(tmp_path_factory.mktemp("image-model") / "colours.onnx")
