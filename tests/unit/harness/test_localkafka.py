"""The local broker's parts that need no JVM: Java version parsing, the jar cache, ports, server.properties, the TLS
material, the record of a started broker, its status, and the command line's refusals and ``run``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from harness import toxiproxy
from harness.faults.cluster import longest_stall_s
from harness.faults.network import before_after
from harness.localkafka import BrokerSetupError, LocalBroker, Node
from harness.localkafka.cli import main as cli
from harness.localkafka.java import classpath, find_java, java_major
from harness.localkafka.nodes import Recorded, cluster_id, lay_out, server_properties
from harness.localkafka.procs import is_broker, wait_gone
from harness.localkafka.tls import make_tls_material
from harness.ports import listening, ports_taken, stable_ports, stable_windows
from producer_tools.readers import Answer
from producer_tools.results import Report, build_report

# ------------------------------------------------------------------------------------------------ java and jars


@pytest.mark.parametrize(
    ("line", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_402"', 8),
        ('openjdk version "21-ea" 2023-09-19', 21),
        ('openjdk version "25" 2025-09-16', 25),
    ],
)
def test_java_major(line: str, major: int) -> None:
    assert java_major(line) == major


def test_java_major_refuses_a_line_without_a_version() -> None:
    with pytest.raises(BrokerSetupError, match="cannot read the Java version"):
        java_major("bash: java: command not found")


def test_find_java_names_a_bad_java_home(tmp_path: Path) -> None:
    with pytest.raises(BrokerSetupError, match="JAVA_HOME is set to"):
        find_java({"JAVA_HOME": str(tmp_path)})


def test_find_java_without_java_says_how_to_install_one(tmp_path: Path) -> None:
    with pytest.raises(BrokerSetupError, match="java not found: install a JDK >= 17"):
        find_java({"PATH": str(tmp_path)})


def test_find_java_refuses_an_old_java(tmp_path: Path) -> None:
    home = tmp_path / "jdk8"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'java version \"1.8.0_402\"' >&2\n")
    java.chmod(0o755)
    with pytest.raises(BrokerSetupError, match=r"needs Java >= 17, but .* is Java 8"):
        find_java({"JAVA_HOME": str(home)})


def test_classpath_cache_is_used_while_the_pom_and_the_jars_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pom, jar = tmp_path / "pom.xml", tmp_path / "kafka.jar"
    pom.write_text("<project/>")
    jar.write_text("")
    state = tmp_path / "state"
    state.mkdir()
    import hashlib

    (state / "classpath.txt").write_text(str(jar))
    (state / "classpath.pom.sha256").write_text(hashlib.sha256(pom.read_bytes()).hexdigest())
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no mvn: the cache must do
    assert classpath(state, pom=pom) == str(jar)
    jar.unlink()  # a jar gone from ~/.m2: resolve again, which needs mvn
    with pytest.raises(BrokerSetupError, match=r"mvn \(Apache Maven\) not found"):
        classpath(state, pom=pom)
    jar.write_text("")
    pom.write_text("<project><!-- changed --></project>")  # another pom: resolve again
    with pytest.raises(BrokerSetupError, match="mvn"):
        classpath(state, pom=pom)


# ------------------------------------------------------------------------------------------------ ports


def test_stable_windows_leave_out_the_ephemeral_range() -> None:
    assert stable_windows((32768, 60999)) == [(10000, 32767), (61000, 65535)]
    assert stable_windows((1024, 65535)) == []  # nothing left: stable_ports falls back to the kernel


def test_stable_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    ports = stable_ports(6, exclude=[])
    assert len(set(ports)) == 6
    assert all(10000 <= p < 32768 or p > 60999 for p in ports) or stable_windows((32768, 60999)) == []
    assert ports_taken(ports) == []


def test_stable_ports_fall_back_to_the_kernel_without_a_window() -> None:
    assert len(set(stable_ports(3, ephemeral=(1024, 65535)))) == 3


def test_ports_taken_and_listening_see_a_listening_socket() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert ports_taken([port]) == [port]
        assert listening("127.0.0.1", port)
    assert not listening("127.0.0.1", port)


# ------------------------------------------------------------------------------------------------ configuration


def _nodes(n: int, security: bool = False) -> list[Node]:
    return [
        Node(i, f"127.0.0.{i}", 20000 + i, 21000 + i, 22000 + i if security else 0, 23000 + i if security else 0)
        for i in range(1, n + 1)
    ]


def _props(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return dict(pairs)


def test_a_single_broker_replicates_nothing() -> None:
    (node,) = _nodes(1)
    props = _props(server_properties(node, [node], Path("/d")))
    assert props["controller.quorum.voters"] == "1@127.0.0.1:21001"
    assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == "1"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "1"
    assert props["auto.create.topics.enable"] == "false"
    assert "broker.session.timeout.ms" not in props  # Kafka's default


def test_a_cluster_replicates_three_ways_with_two_in_sync() -> None:
    nodes = _nodes(3)
    props = _props(server_properties(nodes[1], nodes, Path("/d")))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:21001,2@127.0.0.2:21002,3@127.0.0.3:21003"
    assert props["listeners"] == "PLAINTEXT://127.0.0.2:20002,CONTROLLER://127.0.0.2:21002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.2:20002"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):  # fmt: skip
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    assert int(props["broker.session.timeout.ms"]) < 9000


def test_security_mode_adds_tls_and_sasl_listeners_and_extra_lines_win() -> None:
    (node,) = _nodes(1, security=True)
    text = server_properties(node, [node], Path("/d"), keystore=Path("/s/server.p12"), keystore_password="kp",
                             sasl_password="sp", extra="num.partitions=7")  # fmt: skip
    props = _props(text)
    assert props["listeners"].endswith(",SSL://127.0.0.1:22001,SASL_SSL://127.0.0.1:23001")
    assert props["ssl.keystore.location"] == "/s/server.p12"
    assert 'user_streaminfer="sp"' in props["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert text.rstrip().endswith("num.partitions=7")  # appended last, so it overrides num.partitions=1


def test_a_proxied_broker_advertises_its_proxy_on_a_listener_of_its_own() -> None:
    nodes = lay_out(["127.0.0.1"], None, security=False, proxied=True)
    (node,) = nodes
    assert len({node.port, node.controller_port, node.proxied_port, node.proxy_port}) == 4
    props = _props(server_properties(node, nodes, Path("/d")))
    assert props["listeners"].endswith(f",PROXIED://127.0.0.1:{node.proxied_port}")
    assert props["advertised.listeners"] == (
        f"PLAINTEXT://127.0.0.1:{node.port},PROXIED://127.0.0.1:{node.proxy_port}"
    )  # a client bootstrapping at the proxy is sent back to the proxy, a PLAINTEXT one goes direct
    assert "PROXIED:PLAINTEXT" in props["listener.security.protocol.map"]
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    (plain,) = lay_out(["127.0.0.1"], None, security=False)
    assert "PROXIED" not in _props(server_properties(plain, [plain], Path("/d")))["listeners"]


def test_toxiproxy_without_go_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STREAMINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(toxiproxy.shutil, "which", lambda _: None)
    with pytest.raises(toxiproxy.ToxiproxyUnavailable, match="no Go toolchain"):
        toxiproxy.binary()


def test_cluster_ids_look_like_kafkas() -> None:
    ids = {cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") and "=" not in i for i in ids)


def test_tls_material_names_every_host_and_is_signed_by_the_ca(tmp_path: Path) -> None:
    material = make_tls_material(tmp_path / "sec", ["127.0.0.1", "127.0.0.2"], "pw", "test CA")
    assert material.keystore.stat().st_mode & 0o777 == 0o600
    key, cert, chain = pkcs12.load_key_and_certificates(material.keystore.read_bytes(), b"pw")
    assert key is not None
    assert cert is not None
    ca = x509.load_pem_x509_certificate(material.ca_file.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert [c.subject for c in chain] == [ca.subject]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "127.0.0.2"}
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    with pytest.raises(ValueError, match="Invalid password"):
        pkcs12.load_key_and_certificates(material.keystore.read_bytes(), b"wrong")


# ------------------------------------------------------------------------------------------------ record, status


def _record(state: Path, nodes: list[Node]) -> LocalBroker:
    state.mkdir(parents=True, exist_ok=True)
    Recorded("cid", nodes, "/usr/bin/java", ["-Xmx1m"]).save(state / "state.json")
    return LocalBroker(state, log=False)


def test_nothing_started_is_not_running(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, log=False)
    assert broker.status() == ("not running", [])
    assert broker.bootstrap == ""
    with pytest.raises(BrokerSetupError, match="no broker is started"):
        broker.pause()


def test_status_tells_paused_from_exited_and_never_trusts_a_reused_pid(tmp_path: Path) -> None:
    a, b, c = _nodes(3)
    a.paused, b.pid = "kill", os.getpid()  # b's pid is this test's process: not its JVM
    broker = _record(tmp_path, [a, b, c])
    status, nodes = broker.status()
    assert status == "not running"
    assert [s for _, s in nodes] == ["paused", "exited", "exited"]
    assert broker.bootstrap == "127.0.0.1:20001,127.0.0.2:20002,127.0.0.3:20003"
    b.paused = c.paused = "term"
    assert _record(tmp_path, [a, b, c]).status()[0] == "paused"


def test_a_record_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"nodes": 3}')
    with pytest.raises(BrokerSetupError, match="not a local broker's record"):
        LocalBroker(tmp_path, log=False).status()


def test_start_refuses_while_a_node_is_paused(tmp_path: Path) -> None:
    (a,) = _nodes(1)
    a.paused = "term"
    with pytest.raises(BrokerSetupError, match="is paused: resume it, or stop it"):
        _record(tmp_path, [a]).start()


def test_start_refuses_a_crashed_broker_unless_told_to_discard_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (a,) = _nodes(1)  # recorded, never paused, not running: it crashed
    with pytest.raises(BrokerSetupError, match=r"never stopped .* resume restarts it"):
        _record(tmp_path, [a]).start()
    assert cli(["--state", str(tmp_path), "start"], env={}) == 4
    assert "was never stopped" in capsys.readouterr().err
    assert (tmp_path / "state.json").exists()  # nothing discarded


# ------------------------------------------------------------------------------------------------ command line


def test_cli_status_and_pause_without_a_broker_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--state", str(tmp_path), "status"], env={}) == 3
    assert capsys.readouterr().out.strip() == "not running"
    assert cli(["--state", str(tmp_path), "pause"], env={}) == 3


def test_cli_names_a_bad_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--state", str(tmp_path), "status"], env={"KAFKA_LOCAL_SECURITY": "yes"}) == 1
    assert "KAFKA_LOCAL_SECURITY must be 1" in capsys.readouterr().err
    assert cli(["--state", str(tmp_path), "status"], env={"KAFKA_LOCAL_STOP_TIMEOUT": "soon"}) == 1
    assert "KAFKA_LOCAL_STOP_TIMEOUT must be a number" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        cli(["--state", str(tmp_path), "start", "--nodes", "2"], env={})
    assert bad.value.code == 2


def test_cli_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert cli(["--state", str(afile), "status"], env={}) == 1
    assert cli(["status"], env={"KAFKA_LOCAL_STATE": str(afile), "KAFKA_LOCAL_JVM_OPTS": '"x'}) == 1
    assert cli(["--state", str(tmp_path), "status"], env={"KAFKA_LOCAL_START_TIMEOUT": "nan"}) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3, err
    assert err[0].startswith("kafka-local: error: ")
    assert "KAFKA_LOCAL_JVM_OPTS is not a list of shell words" in err[1]
    assert "KAFKA_LOCAL_START_TIMEOUT must be a number" in err[2]


def test_cli_run_never_takes_over_a_broker_it_did_not_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node,) = _nodes(1)
    node.paused = "term"
    _record(tmp_path, [node])
    assert cli(["--state", str(tmp_path), "run", "--", "true"], env={}) == 4
    assert "run starts (and stops) its own" in capsys.readouterr().err
    assert (tmp_path / "state.json").exists()  # left as it was


def test_cli_run_uses_a_given_broker_and_returns_the_commands_status(tmp_path: Path) -> None:
    script = "import os, sys; sys.exit(7 if os.environ['KAFKA_BOOTSTRAP_SERVERS'] == 'h:1' else 1)"
    code = cli(["--state", str(tmp_path), "run", "--", sys.executable, "-c", script],
               env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": "h:1"})  # fmt: skip
    assert code == 7
    assert not (tmp_path / "state.json").exists()  # no broker was started
    assert cli(["--state", str(tmp_path), "run"], env={"KAFKA_BOOTSTRAP_SERVERS": "h:1"}) == 1


# ------------------------------------------------------------------------------------------------ cluster scenarios


def test_longest_stall_counts_the_wait_for_the_first_answer_after_the_fault() -> None:
    def report(stamps: list[int]) -> Report:
        first = {f"c{i}": Answer(f"c{i}", "result", 1.0, ts, ts - 1) for i, ts in enumerate(stamps)}
        return build_report({cid: {} for cid in first}, first, 0)

    steady = report([1000, 1100, 1200, 1300])
    stalled = report([900, 1000, 9000, 9100])
    assert longest_stall_s([steady], 1000) == pytest.approx(0.1)
    assert longest_stall_s([steady, stalled], 950) == pytest.approx(8.0)
    assert longest_stall_s([report([900])], 1000) == float("inf")  # nothing answered after the fault


def test_a_child_of_ours_is_judged_by_its_handle_and_a_stranger_by_its_command_line(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    child = subprocess.Popen(["sleep", "30"])  # its command line never names props
    try:
        assert is_broker(child.pid, props, child)  # ours: alive (also between fork and exec)
        assert not is_broker(child.pid, props, None)  # a stranger with this pid: not that node's JVM
    finally:
        child.kill()
        child.wait()
    assert not is_broker(child.pid, props, child)
    assert wait_gone(child.pid, child, 1.0)


def test_the_slow_link_row_splits_answers_at_the_fault() -> None:
    def answer(i: int, sent: int, latency: int) -> Answer:
        return Answer(f"c{i}", "result", float(latency), sent + latency, sent)

    first = {a.correlation_id: a for a in [answer(i, 1000 + 10 * i, 5) for i in range(10)]}
    first |= {a.correlation_id: a for a in [answer(i, 2000 + 10 * i, 50) for i in range(10, 20)]}
    report = build_report({cid: {} for cid in first}, first, 0)
    line = before_after([report], fault_ms=2000)
    assert line.startswith("unthrottled: p99 5 ms, 100 answers/s;")
    assert "kbit/s: p99 50 ms, 100 answers/s" in line
