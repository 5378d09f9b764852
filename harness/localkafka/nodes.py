"""What a local broker is made of, as data: its nodes (:class:`Node`), the record ``start`` writes
(:class:`Recorded`), and each node's ``server.properties`` (:func:`server_properties`). Nothing here starts a process.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.localkafka.java import BrokerSetupError
from harness.ports import ports_taken, stable_ports

#: The SASL user of security mode.
SASL_USER = "streaminfer"
#: A cluster's controllers fence a node that sent no heartbeat for this long, ms, and only then move its partitions'
#: leadership: Kafka's default (9 s) shortened so a killed node's partitions move within a few seconds.
CLUSTER_SESSION_TIMEOUT_MS = 4000
CLUSTER_HEARTBEAT_MS = 1000


@dataclass
class Node:
    """One broker+controller JVM. ``paused`` is "" while it should run, else how it was stopped ("term", "kill")."""

    node_id: int
    host: str
    port: int
    controller_port: int
    ssl_port: int = 0
    sasl_ssl_port: int = 0
    pid: int = 0
    paused: str = ""
    #: A proxied broker (``LocalBroker(proxied=True)``): its PROXIED listener's port, and the port it advertises
    #: for it, where a TCP proxy (toxiproxy) listens and forwards to ``proxied_port``.
    proxied_port: int = 0
    proxy_port: int = 0

    @property
    def address(self) -> str:
        """``host:port`` of its PLAINTEXT listener."""
        return f"{self.host}:{self.port}"

    @property
    def ports(self) -> list[int]:
        """Every port it listens on."""
        return [p for p in (self.port, self.controller_port, self.ssl_port, self.sasl_ssl_port, self.proxied_port) if p]


@dataclass
class Recorded:
    """What ``start`` writes to ``state.json`` (and every other verb reads)."""

    cluster_id: str
    nodes: list[Node]
    java: str
    jvm_args: list[str]
    security: dict[str, str] = field(default_factory=dict)  # security.env's lines, empty outside security mode

    @classmethod
    def load(cls, path: Path) -> Recorded | None:
        """The record at ``path``, or None when there is none.

        Raises:
            BrokerSetupError: the file is not a record of this module.
        """
        try:
            raw = json.loads(path.read_text())
            return cls(
                cluster_id=raw["cluster_id"],
                nodes=[Node(**n) for n in raw["nodes"]],
                java=raw["java"],
                jvm_args=list(raw["jvm_args"]),
                security=dict(raw.get("security", {})),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise BrokerSetupError(f"{path} is not a local broker's record ({exc}); delete its folder") from exc

    def save(self, path: Path) -> None:
        """Write atomically (a crash leaves the old record or the new one, never half of one)."""
        tmp = path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)


def cluster_id() -> str:
    """A new KRaft cluster ID: 16 random bytes, base64url without padding, never starting with ``-`` (Kafka's own
    tools never hand such an ID out: it reads as a flag)."""
    while True:
        cid = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def random_word(n: int = 24) -> str:
    """``n`` random letters and digits (passwords)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(n))


def node_hosts(count: int) -> list[str]:
    """Loopback addresses for ``count`` nodes: 127.0.0.1 .. 127.0.0.N where this host binds them (Linux routes all of
    127/8 to the loopback), else 127.0.0.1 for every node."""
    hosts = [f"127.0.0.{i}" for i in range(1, count + 1)]
    for host in hosts[1:]:
        with socket.socket() as s:
            try:
                s.bind((host, 0))
            except OSError:
                return ["127.0.0.1"] * count
    return hosts


def server_properties(
    node: Node,
    nodes: Sequence[Node],
    data: Path,
    *,
    keystore: Path | None = None,
    keystore_password: str = "",
    sasl_password: str = "",
    extra: str = "",
) -> str:
    """The ``server.properties`` of ``node`` in a cluster of ``nodes`` (a single broker: ``nodes == [node]``).

    Replication follows the cluster's size: factor ``len(nodes)`` for every topic (internal ones too) and
    ``min.insync.replicas`` 2 from three nodes up, so an ``acks=all`` write survives one node down. ``extra``
    (``KAFKA_LOCAL_SERVER_PROPS``) is appended, so it overrides what comes before.
    """
    factor = len(nodes)
    min_isr = 2 if factor >= 3 else 1
    voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in nodes)
    listeners = [f"PLAINTEXT://{node.host}:{node.port}", f"CONTROLLER://{node.host}:{node.controller_port}"]
    advertised = [f"PLAINTEXT://{node.host}:{node.port}"]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    if node.proxied_port:  # clients that bootstrap here are told the proxy's address for every broker
        listeners.append(f"PROXIED://{node.host}:{node.proxied_port}")
        advertised.append(f"PROXIED://{node.host}:{node.proxy_port}")
        protocols.append("PROXIED:PLAINTEXT")
    if keystore is not None:
        for name, port in (("SSL", node.ssl_port), ("SASL_SSL", node.sasl_ssl_port)):
            listeners.append(f"{name}://{node.host}:{port}")
            advertised.append(f"{name}://{node.host}:{port}")
            protocols.append(f"{name}:{name}")
    lines = [
        "# Written by harness.localkafka at start.",
        "process.roles=broker,controller",
        f"node.id={node.node_id}",
        f"controller.quorum.voters={voters}",
        f"listeners={','.join(listeners)}",
        f"advertised.listeners={','.join(advertised)}",
        "inter.broker.listener.name=PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        f"listener.security.protocol.map={','.join(protocols)}",
        f"log.dirs={data}",
        "num.partitions=1",
        f"default.replication.factor={factor}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={factor}",
        "offsets.topic.num.partitions=1",
        f"transaction.state.log.replication.factor={factor}",
        f"transaction.state.log.min.isr={min_isr}",
        "transaction.state.log.num.partitions=1",
        f"share.coordinator.state.topic.replication.factor={factor}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        "group.initial.rebalance.delay.ms=0",
        "# Like most production clusters: a topic exists only once it is created, so a typo fails loudly.",
        "auto.create.topics.enable=false",
    ]
    if factor > 1:
        lines += [
            f"broker.session.timeout.ms={CLUSTER_SESSION_TIMEOUT_MS}",
            f"broker.heartbeat.interval.ms={CLUSTER_HEARTBEAT_MS}",
            "unclean.leader.election.enable=false",
        ]
    if keystore is not None:
        lines += [
            "# Security mode: TLS with server auth only on SSL and SASL_SSL; SASL PLAIN (users from the JAAS config)",
            "# and SCRAM (credentials added when the storage is formatted); no authorizer.",
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.location={keystore}",
            f"ssl.keystore.password={keystore_password}",
            f"ssl.key.password={keystore_password}",
            "ssl.client.auth=none",
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
            f'required user_{SASL_USER}="{sasl_password}";',
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        ]
    if extra.strip():
        lines += ["# KAFKA_LOCAL_SERVER_PROPS", extra.strip()]
    return "\n".join(lines) + "\n"


def lay_out(hosts: Sequence[str], first_port: int | None, *, security: bool, proxied: bool = False) -> list[Node]:
    """The nodes of a new broker, one per host (IDs from 1): free ports picked outside the ephemeral range
    (:func:`harness.ports.stable_ports`), the first node's PLAINTEXT port ``first_port`` if given; SSL and
    SASL_SSL ports too with ``security``; the PROXIED listener's port and its proxy's with ``proxied``.

    Raises:
        BrokerSetupError: ``first_port`` is taken.
    """
    nodes: list[Node] = []
    for i, host in enumerate(hosts, start=1):
        wanted = [first_port] if i == 1 and first_port else []
        if wanted and ports_taken(wanted, host):
            raise BrokerSetupError(f"port {first_port} on {host} is already in use")
        exclude = [p for n in nodes for p in (*n.ports, n.proxy_port)] + wanted
        count = (4 if security else 2) + (2 if proxied else 0)
        picked = wanted + stable_ports(count - len(wanted), host, exclude=exclude)
        ssl, sasl = (picked[2], picked[3]) if security else (0, 0)
        node = Node(i, host, picked[0], picked[1], ssl, sasl)
        if proxied:
            node.proxied_port, node.proxy_port = picked[-2], picked[-1]
        nodes.append(node)
    return nodes


def security_settings(nodes: Sequence[Node], ca_file: Path, password: str) -> dict[str, str]:
    """Security mode's client settings (``security.env``): the SSL and SASL_SSL bootstrap addresses of ``nodes``,
    the CA file, the SASL user and ``password``."""
    return {
        "KAFKA_LOCAL_SSL_BOOTSTRAP": ",".join(f"{n.host}:{n.ssl_port}" for n in nodes),
        "KAFKA_LOCAL_SASL_SSL_BOOTSTRAP": ",".join(f"{n.host}:{n.sasl_ssl_port}" for n in nodes),
        "KAFKA_LOCAL_CA_FILE": str(ca_file),
        "KAFKA_LOCAL_SASL_USERNAME": SASL_USER,
        "KAFKA_LOCAL_SASL_PASSWORD": password,
    }


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (mode 600 from the start: it holds secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
