"""A throwaway Apache Kafka on this machine, without Docker: one KRaft broker, or a cluster of three.

Every node is one JVM that is both broker and controller (``process.roles=broker,controller``), run straight from
Kafka's jars (:mod:`harness.localkafka.java`). A cluster's nodes listen on 127.0.0.1, 127.0.0.2 and 127.0.0.3
(where the loopback takes them; else all on 127.0.0.1), form a controller quorum of three voters and keep every
topic with replication factor 3 and ``min.insync.replicas=2``, as production clusters do, so one node can be
stopped, killed (SIGKILL) and restarted while clients carry on.

Everything :class:`LocalBroker` starts is recorded in its state folder, so another process (the CLI, a test run) can
pause, resume, stop or query the same broker::

    <state>/state.json              what start recorded: cluster id, nodes (host, ports, pid, paused), JVM options
    <state>/lock                    held (flock) while a verb changes the broker
    <state>/classpath.txt           Kafka's jars (resolved by Maven; cached)
    <state>/node-<id>/server.properties, kafka.log, data/
    <state>/security/ca.pem, server.p12; <state>/security.env   security mode only (mode 600 where secret)

Security mode adds two listeners to every node, next to PLAINTEXT (which stays the bootstrap address and carries
the broker and controller traffic): ``SSL`` (TLS, server authentication only) and ``SASL_SSL`` (TLS + SASL PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512, one user ``streaminfer`` with a random password; no authorizer). Fresh TLS material
is made at every start (:mod:`harness.localkafka.tls`).

Ports are picked outside the kernel's ephemeral range (:func:`harness.ports.stable_ports`), so that while a
node is paused no client's outgoing connection can take them; resume still refuses (the node stays paused) when
another program took one meanwhile.

The methods block (they start JVMs and wait for them); from async code call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

from aiokafka.errors import KafkaError

from harness.localkafka import admin
from harness.localkafka.java import (
    LOG4J_BROKER,
    LOG4J_TOOLS,
    TOOL_JVM_OPTS,
    BrokerSetupError,
    classpath,
    find_java,
)
from harness.localkafka.nodes import (
    SASL_USER,
    Node,
    Recorded,
    cluster_id,
    lay_out,
    node_hosts,
    random_word,
    security_settings,
    server_properties,
    write_private,
)
from harness.localkafka.procs import is_broker, state_lock, wait_gone
from harness.ports import listening, ports_taken
from producer_tools.topics import ensure_topics

#: Heap of one node: a single broker has room; three share a 2-core, 24 GiB machine with the tests.
HEAP_OPTS = {1: "-Xms64m -Xmx512m", 3: "-Xms64m -Xmx384m"}
#: JVM options of every node besides the heap.
BROKER_JVM_OPTS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true")
#: A cluster's nodes also skip the optimising JIT compiler: three JVMs restarting under load on two cores start
#: in a fraction of the CPU time, and a fault-injection cluster needs no peak broker throughput.
CLUSTER_JVM_OPTS = ("-XX:TieredStopAtLevel=1",)
#: Seconds a node's start (or a resume) may take until it answers metadata requests.
START_TIMEOUT_S = 90.0
#: Seconds ``stop`` and ``pause`` wait after SIGTERM (a controlled shutdown) before SIGKILL.
STOP_TIMEOUT_S = 20.0
#: The whole broker's state (:meth:`LocalBroker.status`).
Status = Literal["running", "paused", "degraded", "not running"]


class LocalBroker:
    """A local Kafka broker (``nodes=1``) or cluster (``nodes=3``) recorded in ``state``; a context manager that
    starts it on entry and stops it (deleting its data) on exit.

    Args:
        state: its state folder (made if missing); one broker per folder.
        nodes: how many broker+controller nodes (1, or 3 for a replicated cluster; any count from 1 to 9 works).
        security: add the SSL and SASL_SSL listeners (see the module docstring).
        port: the first node's PLAINTEXT port (default: a free one).
        server_props: extra ``server.properties`` lines, appended to every node's.
        heap_opts: the nodes' heap flags (default :data:`HEAP_OPTS`).
        jvm_opts: extra JVM flags of the nodes.
        start_timeout_s: how long a start or resume may take, s.
        stop_timeout_s: how long a stop or pause waits after SIGTERM before SIGKILL, s.
        mvn_args: extra Maven arguments (``-o`` for offline).
        hosts: the nodes' listener addresses, one per node (default: :func:`node_hosts`), e.g. an address that a
            consumer in another network namespace reaches.
        log: whether progress lines go to stderr.
        proxied: also a PROXIED listener per node, advertised at a port where a TCP proxy is to listen
            (:meth:`proxy_routes`; the fault harness's toxiproxy scenarios).

    Raises (from the verbs):
        BrokerSetupError: a JDK, Maven, the jars or a port is missing, or a node did not come up (its log's last
            lines in the message).
    """

    def __init__(
        self,
        state: Path,
        *,
        nodes: int = 1,
        security: bool = False,
        port: int | None = None,
        server_props: str = "",
        heap_opts: str | None = None,
        jvm_opts: str = "",
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        mvn_args: Sequence[str] = (),
        hosts: Sequence[str] | None = None,
        log: bool = True,
        proxied: bool = False,
    ) -> None:
        if not 1 <= nodes <= 9:
            raise ValueError(f"nodes must be between 1 and 9, got {nodes}")
        self.state = state.resolve()
        self.nodes = nodes
        self.security = security
        self.port = port
        self.server_props = server_props
        self.heap_opts = heap_opts or HEAP_OPTS.get(nodes, HEAP_OPTS[3])
        self.jvm_opts = jvm_opts
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.mvn_args = list(mvn_args)
        self._log = log
        if hosts is not None and len(hosts) != nodes:
            raise ValueError(f"hosts names {len(hosts)} addresses for {nodes} nodes")
        self.hosts = list(hosts) if hosts is not None else None
        self.proxied = proxied
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------------------------------- context manager
    def __enter__(self) -> LocalBroker:
        self.start(discard_stale=True)  # a context-managed broker is a throwaway: a crashed predecessor's data too
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------------- queries
    @property
    def record_path(self) -> Path:
        """``state.json``."""
        return self.state / "state.json"

    def recorded(self) -> Recorded | None:
        """What ``start`` recorded, None when nothing was started (or it was stopped)."""
        return Recorded.load(self.record_path)

    @property
    def bootstrap(self) -> str:
        """Every node's PLAINTEXT ``host:port``, comma-separated ("" when nothing was started)."""
        rec = self.recorded()
        return ",".join(n.address for n in rec.nodes) if rec else ""

    def proxy_routes(self) -> list[tuple[str, str]]:
        """A proxied broker: per node, (where its proxy must listen, the PROXIED listener it forwards to), both
        ``host:port``; [] otherwise. A client that bootstraps at a proxy's address is given the proxies' addresses
        for every broker, so all its traffic passes them; PLAINTEXT clients bypass them."""
        rec = self.recorded()
        return (
            [(f"{n.host}:{n.proxy_port}", f"{n.host}:{n.proxied_port}") for n in rec.nodes if n.proxied_port]
            if rec
            else []
        )

    def security_env(self) -> dict[str, str]:
        """Security mode's client settings (also in ``<state>/security.env``, one ``KEY=value`` a line):
        KAFKA_LOCAL_SSL_BOOTSTRAP, KAFKA_LOCAL_SASL_SSL_BOOTSTRAP, KAFKA_LOCAL_CA_FILE, KAFKA_LOCAL_SASL_USERNAME,
        KAFKA_LOCAL_SASL_PASSWORD; empty outside security mode."""
        rec = self.recorded()
        return dict(rec.security) if rec else {}

    def log_file(self, node_id: int) -> Path:
        """Node ``node_id``'s broker log."""
        return self.state / f"node-{node_id}" / "kafka.log"

    def alive(self, node: Node) -> bool:
        """Whether ``node``'s JVM runs (its recorded pid, checked to be that node's JVM, not a reused pid)."""
        return bool(node.pid) and is_broker(node.pid, self._props(node.node_id), self._children.get(node.node_id))

    def status(self) -> tuple[Status, list[tuple[Node, str]]]:
        """The whole broker's state and each node's ("running", "paused" or "exited": not running, not paused).

        "degraded": some nodes run and others are paused or exited (a cluster during a fault).
        """
        rec = self.recorded()
        if rec is None:
            return "not running", []
        each = [(n, "running" if self.alive(n) else "paused" if n.paused else "exited") for n in rec.nodes]
        states = {s for _, s in each}
        if states == {"running"}:
            return "running", each
        if "running" not in states:
            return ("paused" if states == {"paused"} else "not running"), each
        return "degraded", each

    # --------------------------------------------------------------------------------------------------- verbs
    def start(self, *, discard_stale: bool = False) -> str:
        """Start the broker (or reuse the running one recorded in ``state``) and wait until every node answers
        metadata requests. Returns :attr:`bootstrap`.

        Args:
            discard_stale: delete the record (and data) of a broker whose nodes all exited without a stop (a crash)
                and start afresh; by default that is refused, since ``resume`` could bring it back.

        Raises:
            BrokerSetupError: see the class; also when a broker is paused in ``state`` (resume or stop it first), or
                crashed there and ``discard_stale`` is False.
        """
        with self._locked():
            status, _ = self.status()
            rec = self.recorded()
            if status == "running" and rec is not None:
                if len(rec.nodes) != self.nodes or bool(rec.security) != self.security:
                    self._say(f"warning: reusing the running broker ({len(rec.nodes)} nodes, security "
                              f"{'on' if rec.security else 'off'}); stop it first to change that")  # fmt: skip
                self._say(f"already running at {self.bootstrap}")
                return self.bootstrap
            if status in ("paused", "degraded"):
                raise BrokerSetupError(
                    f"a broker in {self.state} is {status}: resume it, or stop it (deleting its data) before a "
                    "new start"
                )
            if rec is not None:
                if not discard_stale:
                    raise BrokerSetupError(
                        f"the broker in {self.state} is not running but was never stopped (it crashed, or the machine "
                        "restarted): resume restarts it with its data and address, stop discards it"
                    )
                self._say("discarding the state of a broker that crashed (it was never stopped)")
            self._clear()
            return self._start_new()

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after ``stop_timeout_s``) and delete the data and the record (the
        classpath cache stays). Nothing started: nothing to do."""
        with self._locked():
            rec = self.recorded()
            if rec is None:
                return
            # All at once and a short grace: the data is deleted anyway, and the last node of a cluster cannot
            # finish a controlled shutdown once the quorum is gone.
            running = [n for n in rec.nodes if self.alive(n)]
            self._terminate(running, kill=False, grace_s=min(5.0, self.stop_timeout_s), say=False)
            self._say(f"stopped the broker at {','.join(n.address for n in rec.nodes)}")
            self._clear()

    def pause(self, node_id: int | None = None, *, kill: bool = False) -> None:
        """An outage: stop node ``node_id`` (default: every node) but keep its data, ports, configuration and TLS
        material. SIGTERM (a controlled shutdown: leadership moves first), or with ``kill`` SIGKILL at once (a
        crash). A node already paused stays so.

        Raises:
            BrokerSetupError: nothing is started, or no such node.
        """
        with self._locked():
            rec = self._require()
            chosen = [n for n in rec.nodes if node_id is None or n.node_id == node_id]
            if not chosen:
                raise BrokerSetupError(f"no node {node_id}: the nodes are {[n.node_id for n in rec.nodes]}")
            running = [n for n in chosen if self.alive(n)]
            for node in chosen:
                node.paused = ("kill" if kill else "term") if node in running else (node.paused or "term")
            rec.save(self.record_path)  # marked first: from now on a node that is not running is paused
            started = time.monotonic()
            self._terminate(running, kill=kill)
            for node in running:
                node.pid = 0
            rec.save(self.record_path)
            if running:
                self._say(f"paused node(s) {[n.node_id for n in running]} ({'SIGKILL' if kill else 'SIGTERM'}) after "
                          f"{time.monotonic() - started:.1f} s")  # fmt: skip

    def resume(self, node_id: int | None = None) -> str:
        """Start paused node ``node_id`` (default: every paused node) again: same data, ports and security; returns
        once it answers metadata requests. Returns :attr:`bootstrap`.

        Raises:
            BrokerSetupError: nothing is started, or a port was taken meanwhile (the node stays paused), or it did
                not come back within ``start_timeout_s``.
        """
        with self._locked():
            rec = self._require()
            chosen = [n for n in rec.nodes if (node_id is None or n.node_id == node_id) and not self.alive(n)]
            if node_id is not None and not any(n.node_id == node_id for n in rec.nodes):
                raise BrokerSetupError(f"no node {node_id}: the nodes are {[n.node_id for n in rec.nodes]}")
            for node in chosen:
                taken = ports_taken(node.ports, node.host)
                if taken:
                    raise BrokerSetupError(
                        f"cannot resume node {node.node_id} at {node.address}: port(s) {taken} on {node.host} are in "
                        "use by another program; it stays paused (free them and resume again, or stop to discard it)"
                    )
            if not chosen:
                return self.bootstrap
            jars = classpath(self.state, self.mvn_args)
            started = time.monotonic()
            for node in chosen:
                with self.log_file(node.node_id).open("a") as out:
                    out.write(f"[localkafka] resuming (paused: {node.paused or 'exited'})\n")
                self._launch(rec, node, jars)
                rec.save(self.record_path)
            self._await(rec, chosen, time.monotonic() + self.start_timeout_s)
            for node in chosen:
                node.paused = ""
            rec.save(self.record_path)
            self._say(f"resumed node(s) {[n.node_id for n in chosen]} after {time.monotonic() - started:.1f} s")
            return self.bootstrap

    def restart(self, node_id: int, *, kill: bool = False) -> None:
        """:meth:`pause` node ``node_id`` (SIGTERM, or SIGKILL with ``kill``), then :meth:`resume` it."""
        self.pause(node_id, kill=kill)
        self.resume(node_id)

    def create_topics(
        self, partitions: Mapping[str, int], configs: Mapping[str, Mapping[str, str]] | None = None
    ) -> None:
        """Create each topic (name -> partition count) unless it exists, with the cluster's replication factor.

        Raises:
            BrokerSetupError: nothing is started.
            aiokafka.errors.KafkaError: the broker refused.
        """
        rec = self._require()
        cfg = {k: dict(v) for k, v in (configs or {}).items()}
        asyncio.run(ensure_topics(self.bootstrap, dict(partitions), replication_factor=len(rec.nodes), configs=cfg))

    def topics(self) -> list[str]:
        """The topic names on the broker, sorted (internal ones included).

        Raises:
            BrokerSetupError: nothing is started.
            aiokafka.errors.KafkaError: the request failed.
        """
        self._require()
        return asyncio.run(admin.topic_names(self.bootstrap))

    def partitions(self) -> admin.Partitions:
        """Every partition's (leader, replicas, in-sync replicas) as the cluster reports them: broker IDs, which are
        the node IDs (leader -1: none).

        Raises:
            BrokerSetupError: nothing is started.
            aiokafka.errors.KafkaError: the request failed.
        """
        self._require()
        return asyncio.run(admin.partitions(self.bootstrap))

    def wait_in_sync(self, timeout_s: float = 120.0) -> float:
        """Wait until every partition's in-sync replicas are all its replicas (no under-replicated partition: what
        a rolling restart waits for between nodes). Returns the seconds it took.

        Raises:
            BrokerSetupError: still under-replicated after ``timeout_s`` (the partitions named).
        """
        self._require()
        started = time.monotonic()
        lagging: list[str] = []
        while time.monotonic() - started < timeout_s:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                parts = asyncio.run(admin.partitions(self.bootstrap))
                lagging = [f"{t}-{p}" for (t, p), (_, replicas, isr) in parts.items() if set(isr) != set(replicas)]
                if not lagging:
                    return time.monotonic() - started
            time.sleep(0.5)
        raise BrokerSetupError(f"partitions still under-replicated after {timeout_s:.0f} s: {lagging[:10]}")

    # --------------------------------------------------------------------------------------------------- inside
    def _say(self, line: str) -> None:
        if self._log:
            print(f"kafka-local: {line}", file=sys.stderr, flush=True)

    def _require(self) -> Recorded:
        rec = self.recorded()
        if rec is None:
            raise BrokerSetupError(f"no broker is started in {self.state} (start one first)")
        return rec

    def _props(self, node_id: int) -> Path:
        return self.state / f"node-{node_id}" / "server.properties"

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold ``<state>/lock`` (:func:`~harness.localkafka.procs.state_lock`) for a start or a stop."""
        return state_lock(self.state, BrokerSetupError)

    def _clear(self) -> None:
        """Delete what a start made (the record, the nodes' folders, the TLS material), never the classpath cache."""
        self.record_path.unlink(missing_ok=True)
        (self.state / "security.env").unlink(missing_ok=True)
        for path in [*self.state.glob("node-*"), self.state / "security"]:
            shutil.rmtree(path, ignore_errors=True)
        self._children.clear()

    def _start_new(self) -> str:
        java = find_java()
        jars = classpath(self.state, self.mvn_args)
        (self.state / "log4j2-broker.properties").write_text(LOG4J_BROKER)
        (self.state / "log4j2-tools.properties").write_text(LOG4J_TOOLS)
        hosts = self.hosts or node_hosts(self.nodes)
        keystore: Path | None = None
        ks_pass = sasl_pass = ""
        if self.security:
            from harness.localkafka.tls import make_tls_material  # cryptography: only security mode needs it

            ks_pass, sasl_pass = random_word(), random_word()
            material = make_tls_material(
                self.state / "security", sorted(set(hosts)), ks_pass, f"kafka-local CA {random_word(8)}"
            )
            keystore = material.keystore
        nodes = lay_out(hosts, self.port, security=self.security, proxied=self.proxied)
        rec = Recorded(cluster_id(), nodes, str(java), self._jvm_args())
        for node in nodes:
            folder = self.state / f"node-{node.node_id}"
            (folder / "data").mkdir(parents=True)
            props = server_properties(node, nodes, folder / "data", keystore=keystore, keystore_password=ks_pass,
                                      sasl_password=sasl_pass, extra=self.server_props)  # fmt: skip
            write_private(self._props(node.node_id), props)
        self._format(rec, jars, sasl_pass)
        if self.security:
            rec.security = security_settings(nodes, self.state / "security" / "ca.pem", sasl_pass)
        rec.save(self.record_path)
        self._say(f"starting {self.nodes} node(s) at {','.join(n.address for n in nodes)}; logs in "
                  f"{self.state}/node-*/kafka.log")  # fmt: skip
        started = time.monotonic()
        try:
            for node in nodes:
                self._launch(rec, node, jars)
            rec.save(self.record_path)
            self._await(rec, nodes, time.monotonic() + self.start_timeout_s)
        except BaseException:
            self._terminate([n for n in nodes if self.alive(n)], kill=True)
            self._clear()
            raise
        security = rec.security
        if security:
            env = self.state / "security.env"
            write_private(env, "".join(f"{k}={shlex.quote(v)}\n" for k, v in security.items()))
            self._say(f"security mode: SSL at {security['KAFKA_LOCAL_SSL_BOOTSTRAP']}, SASL_SSL (PLAIN, "
                      f"SCRAM-SHA-256/512, user {SASL_USER}) at {security['KAFKA_LOCAL_SASL_SSL_BOOTSTRAP']}; client "
                      f"settings in {env}")  # fmt: skip
        self._say(f"ready after {time.monotonic() - started:.1f} s")
        return self.bootstrap

    def _jvm_args(self) -> list[str]:
        return [
            *shlex.split(self.heap_opts),
            *BROKER_JVM_OPTS,
            *(CLUSTER_JVM_OPTS if self.nodes > 1 else ()),
            *shlex.split(self.jvm_opts),
            f"-Dlog4j2.configurationFile={self.state / 'log4j2-broker.properties'}",
        ]

    def _format(self, rec: Recorded, jars: str, sasl_pass: str) -> None:
        """Format every node's storage with the cluster ID (side by side: JVM start-up is most of the cost)."""
        scram: list[str] = []
        if sasl_pass:
            for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                scram += ["--add-scram", f"{mech}=[name={SASL_USER},password={sasl_pass}]"]
        tools = f"-Dlog4j2.configurationFile={self.state / 'log4j2-tools.properties'}"
        running = [
            (node, subprocess.Popen(  # noqa: S603 (the JDK's java with Kafka's own StorageTool)
                [rec.java, *TOOL_JVM_OPTS, tools, "-cp", jars, "kafka.tools.StorageTool", "format",
                 "--ignore-formatted", "-t", rec.cluster_id, "-c", str(self._props(node.node_id)), *scram],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            ))
            for node in rec.nodes
        ]  # fmt: skip
        for node, proc in running:
            out, _ = proc.communicate(timeout=300)
            if proc.returncode != 0:
                self._clear()
                raise BrokerSetupError(
                    f"formatting node {node.node_id}'s storage failed:\n{out.decode(errors='replace')[-2000:]}"
                )

    def _launch(self, rec: Recorded, node: Node, jars: str) -> None:
        """Start ``node``'s JVM in a session of its own (it outlives this process), output appended to its log."""
        folder = self.state / f"node-{node.node_id}"
        # SIGTERM and SIGINT wait until the JVM is recorded: a handler that raises (kafka-local run's) must not leave
        # a JVM behind that no clean-up knows of.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            with (folder / "kafka.log").open("ab") as out:
                proc = subprocess.Popen(  # noqa: S603 (the JDK's java running Kafka)
                    [rec.java, *rec.jvm_args, f"-Dkafka.logs.dir={folder}", "-cp", jars, "kafka.Kafka",
                     str(self._props(node.node_id))],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            self._children[node.node_id] = proc
            node.pid = proc.pid
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _await(self, rec: Recorded, nodes: Sequence[Node], deadline: float) -> None:
        """Wait until each of ``nodes`` listens on all its ports and the cluster's metadata lists it (registered and
        unfenced).

        Raises:
            BrokerSetupError: a node exited, or the deadline passed (its log's last lines in the message).
        """
        pending = list(nodes)
        while pending:
            node = pending[0]
            if not self.alive(node):
                raise BrokerSetupError(f"node {node.node_id} exited during start-up; {self._tail(node)}")
            if time.monotonic() > deadline:
                raise BrokerSetupError(f"node {node.node_id} did not come up within {self.start_timeout_s:.0f} s; "
                                       f"{self._tail(node)}")  # fmt: skip
            if all(listening(node.host, p) for p in node.ports):
                with contextlib.suppress(KafkaError, OSError, TimeoutError):
                    if node.node_id in asyncio.run(admin.broker_ids(node.address, 2.0)):
                        pending.pop(0)
                        continue
            time.sleep(0.25)

    def _tail(self, node: Node, lines: int = 40) -> str:
        log = self.log_file(node.node_id)
        text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
        return f"last lines of {log}:\n" + "\n".join(text)

    def _terminate(self, nodes: Sequence[Node], *, kill: bool, grace_s: float | None = None, say: bool = True) -> None:
        """SIGTERM every one of ``nodes`` at once and wait up to ``grace_s`` (default ``stop_timeout_s``), then
        SIGKILL what is left; or SIGKILL at once with ``kill``. Returns once every thread of each JVM is gone (a
        killed JVM's main thread turns zombie while the threads holding its sockets still exit).

        Raises:
            BrokerSetupError: a node was still there 30 s after SIGKILL.
        """
        grace = self.stop_timeout_s if grace_s is None else grace_s
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + (0 if kill else grace)
        for node in nodes:
            child = self._children.get(node.node_id)
            if not kill and not wait_gone(node.pid, child, max(0.0, deadline - time.monotonic())):
                if say:
                    self._say(f"node {node.node_id} (pid {node.pid}) still running after {grace:.0f} s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGKILL)
            if not wait_gone(node.pid, child, 30.0):
                raise BrokerSetupError(f"could not stop node {node.node_id} (pid {node.pid})")
            self._children.pop(node.node_id, None)
