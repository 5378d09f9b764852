"""``scripts/kafka-local`` / ``python -m harness.localkafka``: start, stop, pause and resume a local Kafka broker or
3-node cluster, and create topics on it.

Verbs (exit 0 unless said otherwise; 1 on an error, named in one line; 2 on a bad flag)::

    start [--port N] [--nodes 1|3] [--security]   start, or reuse the broker running in the state folder; the
                                                  bootstrap address is the LAST line of stdout (progress: stderr).
                                                  Exit 4, nothing started, while one is paused or crashed (never
                                                  stopped): resume or stop it
    stop                                          stop every node and delete the data (the jar cache stays)
    status                                        "running" (0), "paused" (4), "degraded" (5: some nodes down) or
                                                  "not running" (3), then the address; security.env's lines follow
    pause [--node N] [--kill]                     an outage: stop node N (default: all) but keep its data and ports;
                                                  SIGTERM, or SIGKILL with --kill. Exit 3 if nothing is started
    resume [--node N]                             start the paused node(s) again: same data, ports and security;
                                                  waits until ready. Exit 3 if nothing is started
    restart --node N [--kill]                     pause then resume one node
    topics create NAME PARTITIONS                 create a topic (idempotent; the cluster's replication factor)
    topics list                                   list the topics (both: exit 3 unless the broker runs)
    classpath                                     resolve Kafka's jars (if needed) and print the classpath file
    run [--nodes 1|3] [--security] -- CMD ...     start a broker, run CMD with KAFKA_BOOTSTRAP_SERVERS set (and, in
                                                  security mode, security.env's settings), stop the broker, exit
                                                  with CMD's status (128 + N if a signal N ended it; 127 if it
                                                  cannot run). With KAFKA_BOOTSTRAP_SERVERS already set, CMD runs
                                                  against that broker and none is started; exit 4 when a broker
                                                  already runs (or is paused) in the state folder

Environment (read here only; flags win): KAFKA_LOCAL_STATE (state folder, default <repo>/.kafka-local),
KAFKA_LOCAL_PORT, KAFKA_LOCAL_NODES, KAFKA_LOCAL_SECURITY (1: security mode), KAFKA_LOCAL_START_TIMEOUT and
KAFKA_LOCAL_STOP_TIMEOUT (s), KAFKA_LOCAL_HEAP_OPTS, KAFKA_LOCAL_JVM_OPTS, KAFKA_LOCAL_SERVER_PROPS (extra
server.properties lines), KAFKA_LOCAL_MVN_ARGS (e.g. "-o"), JAVA_HOME.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from aiokafka.errors import KafkaError

from harness.localkafka.broker import START_TIMEOUT_S, STOP_TIMEOUT_S, LocalBroker
from harness.localkafka.java import BrokerSetupError, classpath, find_java
from harness.localkafka.procs import seconds_setting
from producer_tools.cli import kafka_error_text, quiet_client_logs

ROOT = Path(__file__).resolve().parents[2]
#: Exit codes of ``status`` (and of ``start`` while paused), as the shell script before this module had them.
EXIT_NOT_RUNNING, EXIT_PAUSED, EXIT_DEGRADED = 3, 4, 5


def broker_from(args: argparse.Namespace, env: Mapping[str, str]) -> LocalBroker:
    """The :class:`LocalBroker` the flags and ``KAFKA_LOCAL_*`` settings describe.

    Raises:
        BrokerSetupError: a setting that is not usable (named).
    """
    security_raw = env.get("KAFKA_LOCAL_SECURITY", "0") or "0"
    if security_raw not in ("0", "1"):
        raise BrokerSetupError(f"KAFKA_LOCAL_SECURITY must be 1 (security mode) or 0, got {security_raw!r}")
    nodes = getattr(args, "nodes", None) or env.get("KAFKA_LOCAL_NODES") or "1"
    port = getattr(args, "port", None) or env.get("KAFKA_LOCAL_PORT") or None
    try:
        nodes_n = int(nodes)
    except ValueError:
        raise BrokerSetupError(f"KAFKA_LOCAL_NODES must be 1 or 3, got {nodes!r}") from None
    try:
        port_n = int(port) if port else None
    except ValueError:
        raise BrokerSetupError(f"KAFKA_LOCAL_PORT must be a port number, got {port!r}") from None
    for name in ("KAFKA_LOCAL_HEAP_OPTS", "KAFKA_LOCAL_JVM_OPTS", "KAFKA_LOCAL_MVN_ARGS"):
        try:
            shlex.split(env.get(name, ""))
        except ValueError as exc:
            raise BrokerSetupError(f"{name} is not a list of shell words ({exc}): {env[name]!r}") from None
    if port_n is not None and not 1 <= port_n <= 65535:
        raise BrokerSetupError(f"invalid port {port_n}")
    if nodes_n not in (1, 3):
        raise BrokerSetupError(f"--nodes must be 1 (one broker) or 3 (a replicated cluster), got {nodes_n}")
    return LocalBroker(
        Path(args.state or env.get("KAFKA_LOCAL_STATE") or ROOT / ".kafka-local"),
        nodes=nodes_n,
        security=bool(getattr(args, "security", False)) or security_raw == "1",
        port=port_n,
        server_props=env.get("KAFKA_LOCAL_SERVER_PROPS", ""),
        heap_opts=env.get("KAFKA_LOCAL_HEAP_OPTS") or None,
        jvm_opts=env.get("KAFKA_LOCAL_JVM_OPTS", ""),
        start_timeout_s=seconds_setting(env, "KAFKA_LOCAL_START_TIMEOUT", START_TIMEOUT_S, BrokerSetupError),
        stop_timeout_s=seconds_setting(env, "KAFKA_LOCAL_STOP_TIMEOUT", STOP_TIMEOUT_S, BrokerSetupError),
        mvn_args=shlex.split(env.get("KAFKA_LOCAL_MVN_ARGS", "")),
    )


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="kafka-local",
        description="A local Apache Kafka (KRaft) broker or 3-node cluster from Kafka's own jars, without Docker.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--state", help="state folder (default: $KAFKA_LOCAL_STATE or <repo>/.kafka-local)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    start = verbs.add_parser("start", help="start (or reuse) the broker; prints the bootstrap address last")
    start.add_argument("--port", type=int, help="the first node's PLAINTEXT port (default: a free one)")
    start.add_argument("--nodes", type=int, choices=(1, 3), help="1 broker (default) or a 3-node cluster")
    start.add_argument("--security", action="store_true", help="add SSL and SASL_SSL listeners")
    verbs.add_parser("stop", help="stop the broker and delete its data")
    verbs.add_parser("status", help="running / paused / degraded / not running")
    pause = verbs.add_parser("pause", help="stop node(s) but keep data and ports")
    pause.add_argument("--node", type=int, help="one node's ID (default: every node)")
    pause.add_argument("--kill", action="store_true", help="SIGKILL at once (a crash) instead of SIGTERM")
    resume = verbs.add_parser("resume", help="start the paused node(s) again")
    resume.add_argument("--node", type=int, help="one node's ID (default: every paused node)")
    restart = verbs.add_parser("restart", help="pause then resume one node")
    restart.add_argument("--node", type=int, required=True, help="the node's ID")
    restart.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM")
    topics = verbs.add_parser("topics", help="create or list topics")
    tverbs = topics.add_subparsers(dest="topics_verb", required=True, metavar="create|list")
    create = tverbs.add_parser("create", help="create a topic (idempotent)")
    create.add_argument("name")
    create.add_argument("partitions", type=int)
    tverbs.add_parser("list", help="list the topics")
    verbs.add_parser("classpath", help="resolve Kafka's jars and print the classpath file")
    run = verbs.add_parser("run", help="start a broker, run a command against it, stop the broker")
    run.add_argument("--nodes", type=int, choices=(1, 3), help="1 broker (default) or a 3-node cluster")
    run.add_argument("--security", action="store_true", help="add SSL and SASL_SSL listeners")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS ...")
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point; returns the exit status (see the module docstring)."""
    env = os.environ if env is None else env
    args = parser().parse_args(argv)
    quiet_client_logs()
    try:
        return _dispatch(args, env)
    except BrokerSetupError as exc:
        print(f"kafka-local: error: {exc}", file=sys.stderr)
        return 1
    except KafkaError as exc:
        print(f"kafka-local: error: {kafka_error_text(exc)}", file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as exc:  # a state folder that is a file, a topic the broker refuses, ...
        print(f"kafka-local: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kafka-local: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    broker = broker_from(args, env)
    verb = args.verb
    if verb == "classpath":
        find_java(env)
        classpath(broker.state, broker.mvn_args)
        print(broker.state / "classpath.txt")
        return 0
    if verb == "run":
        return _run(broker, args.command, env)
    status, nodes = broker.status()
    if verb == "start":
        if status != "running" and nodes:
            what = status if status != "not running" else "not running but was never stopped (a crash?)"
            print(f"kafka-local: a broker in {broker.state} is {what}: 'resume' restarts it, 'stop' discards it "
                  "(and its data) before a new start", file=sys.stderr)  # fmt: skip
            return EXIT_PAUSED
        print(broker.start())
        return 0
    if verb == "stop":
        if status == "not running" and not nodes:
            print("kafka-local: not running", file=sys.stderr)
        broker.stop()
        return 0
    if verb == "status":
        for node, state in nodes:
            print(f"kafka-local: node {node.node_id} {node.address} {state} (pid {node.pid or '-'}, log "
                  f"{broker.log_file(node.node_id)})", file=sys.stderr)  # fmt: skip
        print(status)
        if nodes:
            print(broker.bootstrap)
            for key, value in broker.security_env().items():
                print(f"{key}={shlex.quote(value)}")
        return {"running": 0, "paused": EXIT_PAUSED, "degraded": EXIT_DEGRADED}.get(status, EXIT_NOT_RUNNING)
    if not nodes:
        print(f"kafka-local: no broker is started in {broker.state} ('start' first)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    if verb == "pause":
        broker.pause(args.node, kill=args.kill)
        print(broker.bootstrap)
        return 0
    if verb == "resume":
        print(broker.resume(args.node))
        return 0
    if verb == "restart":
        broker.restart(args.node, kill=args.kill)
        print(broker.bootstrap)
        return 0
    if status not in ("running", "degraded"):
        print(f"kafka-local: the broker in {broker.state} is {status} ('resume' restarts it)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    if args.topics_verb == "create":
        if args.partitions < 1:
            raise BrokerSetupError(f"PARTITIONS must be a positive integer, got {args.partitions}")
        broker.create_topics({args.name: args.partitions})
        return 0
    names = broker.topics()
    if names:
        print("\n".join(names))
    return 0


def _run(broker: LocalBroker, command: Sequence[str], env: Mapping[str, str]) -> int:
    """``run``: CMD with a broker (see the module docstring); SIGTERM and SIGINT reach CMD, and the broker is
    stopped once CMD has exited."""
    command = list(command[1:] if command and command[0] == "--" else command)
    if not command:
        raise BrokerSetupError("run needs a command: run -- CMD ARGS ...")
    child_env = dict(env)
    if env.get("KAFKA_BOOTSTRAP_SERVERS"):
        print(f"kafka-local: using the broker at {env['KAFKA_BOOTSTRAP_SERVERS']} (KAFKA_BOOTSTRAP_SERVERS)",
              file=sys.stderr)  # fmt: skip
        return subprocess.call(command, env=child_env)  # noqa: S603 (the user's own command)
    status, _ = broker.status()
    if status != "not running":  # (a record whose nodes all exited is stale: start discards it)
        print(f"kafka-local: a broker is {status} in {broker.state}: run starts (and stops) its own, so give it "
              "another --state, or set KAFKA_BOOTSTRAP_SERVERS to use that one", file=sys.stderr)  # fmt: skip
        return EXIT_PAUSED
    proc: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc is None:  # still starting the broker: stop that (start cleans up what it launched)
            raise SystemExit(128 + signum)
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with broker:
            child_env["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap
            child_env.update(broker.security_env())
            print(f"kafka-local: broker at {broker.bootstrap}", file=sys.stderr)
            try:
                proc = subprocess.Popen(command, env=child_env)  # noqa: S603 (the user's own command)
            except OSError as exc:
                print(f"kafka-local: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
                return 127
            code = proc.wait()
            return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
