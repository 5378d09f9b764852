"""The Docker path: testcontainers' apache/kafka broker, and the CPU image against what the manifests assume of it.

These need a Docker engine (``docker_engine``): without one they skip with the reason, with
``DOCKER_TESTS_REQUIRED=1`` (``.ci/run``, ``make test-containers``) they fail. Where CI's path differs from a
laptop's: the ``apache/kafka`` image is the local stand-in (``make image-kafka``) because no registry is reachable,
testcontainers' reaper is off for the same reason, and this machine carries ``/.dockerenv``, so testcontainers takes
itself to be inside a container and reaches published ports at the bridge's gateway rather than ``localhost``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from harness.docker import pod
from harness.docker.engine import Engine
from harness.docker.images import project_version
from harness.docker.kafka import PORT, ApacheKafkaContainer, ensure_image, kafka_version, prepare_testcontainers
from producer_tools.topics import ensure_topics
from tests.conftest import docker_required

pytestmark = [pytest.mark.integration, pytest.mark.docker]


@pytest.fixture(scope="module")
def broker_container(docker_engine: Engine, kafka_container: Any) -> Iterator[Any]:
    """The session's broker container when the session runs on one, else one started for this module."""
    if kafka_container is not None:
        yield kafka_container
        return
    docker = docker_engine.docker()
    image = ensure_image(docker)
    prepare_testcontainers(docker)
    with ApacheKafkaContainer(image, network=docker_engine.network) as container:
        yield container


async def _advertised(bootstrap: str) -> list[tuple[str, int]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
    finally:
        await admin.close()
    return [(str(b["host"]), int(b["port"])) for b in cluster["brokers"]]


async def _round_trip(bootstrap: str) -> bytes:
    topic = f"tc-{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, {topic: 1})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"through the published port")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    return bytes(record.value)


def test_the_broker_advertises_the_port_testcontainers_mapped(broker_container: Any, docker_engine: Engine) -> None:
    bootstrap = broker_container.get_bootstrap_server()
    host, port = bootstrap.rsplit(":", 1)
    if docker_engine.network == "bridge":
        assert int(port) == int(broker_container.get_exposed_port(PORT))
        assert int(port) != PORT, "a published port is mapped to a free port of the host, not 9092"
    assert asyncio.run(_advertised(bootstrap)) == [(host, int(port))]
    assert asyncio.run(_round_trip(bootstrap)) == b"through the published port"


def test_the_broker_runs_the_local_brokers_kafka_version_as_a_non_root_user(broker_container: Any) -> None:
    assert broker_container.image == f"apache/kafka:{kafka_version()}"
    code, out = broker_container.get_wrapped_container().exec_run(["id", "-u"])
    assert code == 0
    assert out.strip() != b"0"


def test_the_session_broker_is_the_container_when_docker_is_required(
    kafka_bootstrap: str, kafka_container: Any
) -> None:
    import os

    if not docker_required() or os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("the session's broker is chosen by KAFKA_BOOTSTRAP_SERVERS, or Docker is not required")
    assert kafka_container is not None, "DOCKER_TESTS_REQUIRED=1 but the session fell back to another broker"
    assert kafka_bootstrap == kafka_container.get_bootstrap_server()


def test_the_cpu_image_fits_the_manifests_and_carries_the_cpu_runtime_only(docker_engine: Engine) -> None:
    docker = docker_engine.docker()
    plan = pod.plan(pod.render("cpu"))
    image = f"streaminfer:{project_version()}-cpu"
    assert plan.image == image, "the cpu overlay names another image than `make image-cpu` builds"
    inspected = docker.image(image)
    if inspected is None:
        message = f"no image {image}: `make image-cpu` builds it"
        if docker_required():
            pytest.fail(message)
        pytest.skip(message)
    assert pod.image_problems(plan, inspected) == []
    found = pod.parse_probe(docker.run(*pod.probe_argv(plan, image), timeout_s=120).stdout)
    assert pod.probe_problems(plan, found, "cpu") == []
    assert found["runtimes"] == ["onnxruntime"]
    assert "CPUExecutionProvider" in found["providers"]
    assert found["writable"] == ["/tmp"]
    assert (found["uid"], found["gid"]) == (plan.run_as_user, plan.run_as_group)
