"""The tests' Docker broker: ``apache/kafka:<the local broker's Kafka version>`` through testcontainers.

testcontainers' ``KafkaContainer`` runs Confluent's ``cp-kafka`` start scripts and cannot start another image, so
:class:`ApacheKafkaContainer` starts the official ``apache/kafka`` image the way Java testcontainers'
``org.testcontainers.kafka.KafkaContainer`` does, through testcontainers' generic ``DockerContainer`` (its port
mapping, its log wait): the container waits for a start script, which is copied in once the mapped port is known
and sets ``KAFKA_ADVERTISED_LISTENERS`` to it before running the image's ``/etc/kafka/docker/run``. KRaft, one
broker+controller, the official image's environment variables.

Where no registry is reachable, :func:`build_image` makes a local image under that name (``make image-kafka``): the
same Kafka version, from the same jars the local broker runs (Maven Central, ``harness/localkafka/pom.xml``), on a
Debian JRE base made here (:mod:`harness.docker.base`), with the official image's environment contract
(``harness/docker/apache_kafka/run``). A laptop pulls the real image under the same name and runs the same code.

Where CI's path differs from a laptop's: the image is the local stand-in, testcontainers' reaper (Ryuk) is off
when its image cannot be pulled (:func:`prepare_testcontainers`; the fixtures stop what they start), and an engine
without a bridge runs the broker with host networking on a free port instead of a published one.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from harness.docker.client import Docker, DockerError
from harness.docker.engine import Network
from harness.localkafka.java import POM, classpath
from harness.ports import free_port

CONTEXT = Path(__file__).resolve().parent / "apache_kafka"
#: The image a laptop pulls, and the name of the local stand-in.
IMAGE_REPOSITORY = "apache/kafka"
#: What the broker logs once it serves (testcontainers waits for it).
STARTED = re.compile(r"Kafka Server started")
#: Inside the container: the listener published to the host, the inter-broker one, the controller's.
PORT, BROKER_PORT, CONTROLLER_PORT = 9092, 9093, 9094
#: Where the start script is copied once the mapped port is known.
START_SCRIPT = "/tmp/testcontainers_start.sh"  # noqa: S108 (a path inside the container)
#: Seconds the broker may take to log :data:`STARTED`.
START_TIMEOUT_S = 120


def kafka_version(pom: Path = POM) -> str:
    """The Kafka version the local broker runs (``<kafka.version>`` of ``harness/localkafka/pom.xml``).

    Raises:
        ValueError: the pom names none.
    """
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if not found:
        raise ValueError(f"{pom} has no <kafka.version>")
    return found.group(1).strip()


def image_name() -> str:
    """``apache/kafka:<version>``."""
    return f"{IMAGE_REPOSITORY}:{kafka_version()}"


def build_image(
    docker: Docker, base: str, cache: Path, *, tag: str | None = None, say: Callable[[str], None] = print
) -> str:
    """Build the local stand-in for ``apache/kafka:<version>`` on ``base`` (an image with ``java`` >= 17 and
    ``useradd``) from the jars Maven resolves into ``cache`` (the local broker's classpath cache). Returns the tag.

    Raises:
        harness.localkafka.BrokerSetupError: Maven could not resolve the jars.
        DockerError: the build failed.
    """
    tag = tag or image_name()
    jars = [Path(p) for p in classpath(cache).split(":") if p]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="streaminfer-kafka-image-") as tmp:
        context = Path(tmp)
        shutil.copy(CONTEXT / "Dockerfile", context / "Dockerfile")
        (context / "libs").mkdir()
        for jar in jars:  # hard links where the cache is on the same file system: the jars are 45 MB
            if jar.stat().st_dev == context.stat().st_dev:
                os.link(jar, context / "libs" / jar.name)
            else:
                shutil.copy(jar, context / "libs" / jar.name)
        (context / "docker").mkdir()
        for name in ("run", "log4j2.yaml", "tools-log4j2.yaml"):
            shutil.copy(CONTEXT / name, context / "docker" / name)
        (context / "docker" / "run").chmod(0o755)
        args = ["-t", tag, "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"KAFKA_VERSION={kafka_version()}"]
        docker.build(args, context)
    say(f"image {tag} built in {time.monotonic() - started:.0f} s ({len(jars)} jars, base {base})")
    return tag


def prepare_testcontainers(docker: Docker, say: Callable[[str], None] = print) -> None:
    """Point testcontainers at ``docker``'s engine and turn its reaper (Ryuk) off when the reaper's image is neither
    here nor pullable (no registry): the fixtures stop their containers themselves. ``TESTCONTAINERS_RYUK_DISABLED``,
    when set, is left as the user set it."""
    from testcontainers.core.config import testcontainers_config

    os.environ["DOCKER_HOST"] = docker.host
    if "TESTCONTAINERS_RYUK_DISABLED" in os.environ:
        return
    problem = docker.have_or_pull(testcontainers_config.ryuk_image, timeout_s=60)
    if problem is not None:
        say(f"testcontainers' reaper {testcontainers_config.ryuk_image} cannot be pulled ({problem}): reaper off")
        testcontainers_config.ryuk_disabled = True


def broker_env(network: Network, ports: tuple[int, int, int] = (PORT, BROKER_PORT, CONTROLLER_PORT)) -> dict[str, str]:
    """The official image's variables for one KRaft broker+controller whose PLAINTEXT listener is published (or, with
    ``network`` ``host``, listens on 127.0.0.1 at ``ports``' first). Advertised listeners are set at start."""
    plain, broker, controller = ports
    host = "127.0.0.1" if network == "host" else "0.0.0.0"  # noqa: S104 (inside the container: published ports)
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://{host}:{plain},BROKER://{host}:{broker},CONTROLLER://{host}:{controller}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@localhost:{controller}",
        # As the local broker (harness/localkafka/nodes.py): one replica of everything, topics created explicitly.
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_LOG_DIRS": "/var/lib/kafka/data",
        "KAFKA_HEAP_OPTS": "-Xms64m -Xmx512m",
    }


def start_script(advertised_host: str, advertised_port: int, broker_port: int = BROKER_PORT) -> str:
    """The script the container waits for: the advertised listeners (the address a client outside reaches), then the
    image's own start."""
    return (
        "#!/bin/bash\n"
        f"export KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://{advertised_host}:{advertised_port},"
        f"BROKER://localhost:{broker_port}\n"
        "exec /etc/kafka/docker/run\n"
    )


class ApacheKafkaContainer(DockerContainer):
    """One ``apache/kafka`` broker through testcontainers' generic container (see the module docstring).

    Args:
        image: the image (default :func:`image_name`).
        network: ``bridge``: the PLAINTEXT listener published on a port testcontainers maps; ``host``: host networking
            with free ports on 127.0.0.1 (an engine started with ``--bridge=none``).

    Use as a context manager (``with ApacheKafkaContainer() as kafka: kafka.get_bootstrap_server()``); ``start``
    raises testcontainers' errors (the image missing and not pullable, the broker not started within
    :data:`START_TIMEOUT_S`: its log in the message).
    """

    def __init__(self, image: str | None = None, *, network: Network = "bridge") -> None:
        super().__init__(image or image_name())
        self.network = network
        if network == "host":
            self.ports_in_use = (free_port(), free_port(), free_port())
            self.with_kwargs(network_mode="host")
        else:
            self.ports_in_use = (PORT, BROKER_PORT, CONTROLLER_PORT)
            self.with_exposed_ports(PORT)
        for key, value in broker_env(network, self.ports_in_use).items():
            self.with_env(key, value)
        self.with_command(["sh", "-c", f"while [ ! -f {START_SCRIPT} ]; do sleep 0.1; done; exec bash {START_SCRIPT}"])

    def start(self) -> Self:
        """Create and start the container, copy the start script in, and wait for the broker's start line."""
        super().start()
        host, port = self.advertised()
        script = start_script(host, port, self.ports_in_use[1]).encode()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(START_SCRIPT.lstrip("/"))
            info.size, info.mode, info.mtime = len(script), 0o755, int(time.time())
            tar.addfile(info, io.BytesIO(script))
        self.get_wrapped_container().put_archive("/", archive.getvalue())
        LogMessageWaitStrategy(STARTED).with_startup_timeout(START_TIMEOUT_S).wait_until_ready(self)
        return self

    def advertised(self) -> tuple[str, int]:
        """(host, port) where clients outside the container reach the PLAINTEXT listener."""
        if self.network == "host":
            return "127.0.0.1", self.ports_in_use[0]
        return str(self.get_container_host_ip()), int(self.get_exposed_port(PORT))

    def get_bootstrap_server(self) -> str:
        """``host:port`` of the broker for clients on this machine."""
        host, port = self.advertised()
        return f"{host}:{port}"


def ensure_image(docker: Docker, say: Callable[[str], None] = print) -> str:
    """``apache/kafka:<version>`` here: present, pulled, or an error naming how to build it.

    Raises:
        DockerError: not here and not pullable.
    """
    name = image_name()
    problem = docker.have_or_pull(name)
    if problem is not None:
        raise DockerError(
            f"{name} is not here and cannot be pulled ({problem}): `make image-kafka` builds a local one from the "
            "local broker's jars"
        )
    return name
