"""Shared fixtures. The Kafka broker is found in this order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (``.ci/run`` starts one and sets it);
2. ``apache/kafka:<the local broker's version>`` through testcontainers if a Docker engine answers at ``DOCKER_HOST``
   or ``/var/run/docker.sock`` (:class:`harness.docker.kafka.ApacheKafkaContainer`; where the image is neither here
   nor pullable, ``make image-kafka`` builds a local one, else the local broker below is used);
3. :class:`harness.localkafka.LocalBroker` (Apache Kafka's jars via Maven, on the JDK), started for the session.

With ``CI=true`` a broker that cannot be had fails the tests that need one, with the reason; elsewhere they skip.
``DOCKER_TESTS_REQUIRED=1`` makes the Docker path required: without ``KAFKA_BOOTSTRAP_SERVERS`` the session's
broker must be the container (no fall-back), and the container tests (``docker_engine``) fail instead of skipping
when no engine answers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from harness.localkafka import BrokerSetupError, LocalBroker

if TYPE_CHECKING:
    from harness.docker.engine import Engine

ROOT = Path(__file__).resolve().parent.parent


def _no_broker(reason: str) -> None:
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"no Kafka broker for integration tests: {reason}", pytrace=False)
    pytest.skip(f"no Kafka broker: {reason}")


#: Set to 1 (``.ci/run``, ``make test-containers``): the Docker path is required, never skipped or replaced.
REQUIRE_DOCKER = "DOCKER_TESTS_REQUIRED"
#: The session's broker container, when the session's broker is one (None otherwise).
KAFKA_CONTAINER = pytest.StashKey[Any]()


def docker_required() -> bool:
    """Whether ``DOCKER_TESTS_REQUIRED`` asks for the Docker path."""
    return os.environ.get(REQUIRE_DOCKER, "").lower() in {"1", "true", "yes"}


def _no_docker(reason: str) -> NoReturn:
    if docker_required():
        pytest.fail(f"{REQUIRE_DOCKER}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _engine() -> Engine | None:
    """The engine at ``DOCKER_HOST`` or ``/var/run/docker.sock`` (one started by ``make docker-engine`` only when
    ``DOCKER_HOST`` names it: other sessions on the machine never pick it up by chance)."""
    from harness.docker.engine import find

    return find(env=os.environ, started_here=False)


def _say(config: pytest.Config, line: str) -> None:
    """A line on the terminal, past pytest's output capture (which broker the session uses, and why)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.write_line(f"conftest: {line}")


def _container_broker(engine: Engine, config: pytest.Config) -> Any:
    """The started :class:`ApacheKafkaContainer`, or None when its image cannot be had and Docker is not required
    (the local broker is used instead, said so)."""
    from harness.docker.client import DockerError
    from harness.docker.kafka import ApacheKafkaContainer, ensure_image, prepare_testcontainers

    docker = engine.docker()
    try:
        image = ensure_image(docker)
    except DockerError as exc:
        if docker_required():
            pytest.fail(f"{REQUIRE_DOCKER}=1 but {exc}", pytrace=False)
        _say(config, f"{exc}; using the local broker")
        return None
    prepare_testcontainers(docker, say=lambda line: _say(config, line))
    container = ApacheKafkaContainer(image, network=engine.network)
    try:
        container.start()
    except Exception as exc:
        with contextlib.suppress(Exception):
            container.stop()
        if docker_required():
            pytest.fail(f"{REQUIRE_DOCKER}=1 but the {image} container did not start: {exc}", pytrace=False)
        _no_broker(f"the {image} container did not start: {exc}")
    _say(config, f"Kafka broker: {image} through testcontainers at {container.get_bootstrap_server()}")
    return container


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


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs ``consumer.__main__.main`` in-process configures the root logger
    (:func:`consumer.ops.logs.configure`: a ``StreamHandler`` on that test's captured ``sys.stderr``, level set).
    Left in place, every later test's log lines go to a closed stream and print "--- Logging error ---" into the
    stderr a later test reads (test_tools_security's one-line error). Handlers of that kind added during a test
    are removed after it, and the root level restored; pytest's own capture handlers are left to pytest."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and type(handler) is logging.StreamHandler:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[str]:
    """The bootstrap address of a real broker for this test session (the module docstring's order)."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    engine = _engine()
    if engine is None and docker_required():
        _no_docker("no Docker engine answers for the session's broker (DOCKER_HOST unset or silent)")
    container = _container_broker(engine, pytestconfig) if engine is not None else None
    if container is not None:
        pytestconfig.stash[KAFKA_CONTAINER] = container
        try:
            yield container.get_bootstrap_server()
        finally:
            container.stop()
        return
    with _local_broker(tmp_path_factory.mktemp("kafka-local")) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def docker_engine() -> Engine:
    """The Docker engine the container tests use (``DOCKER_HOST``, else ``/var/run/docker.sock``): skipped without
    one, failed instead with ``DOCKER_TESTS_REQUIRED=1``."""
    engine = _engine()
    if engine is None:
        _no_docker(
            "no Docker engine answers (DOCKER_HOST unset or silent, no /var/run/docker.sock): `make docker-engine` "
            "starts one and prints the DOCKER_HOST to export"
        )
    return engine


@pytest.fixture(scope="session")
def kafka_container(kafka_bootstrap: str, pytestconfig: pytest.Config) -> Any:
    """The session broker's container when the session's broker is one (the Docker path), else None."""
    return pytestconfig.stash.get(KAFKA_CONTAINER, None)


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
