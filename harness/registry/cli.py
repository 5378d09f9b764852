"""``scripts/registry-local`` / ``python -m harness.registry``: start, stop, pause, resume, freeze and thaw a local
Confluent-compatible Schema Registry (Apicurio Registry), beside the local broker of ``scripts/kafka-local``.

Verbs (exit 0 unless said otherwise; 1 on an error, named in one line; 2 on a bad flag)::

    start [--port N] [--management-port N]   start, or reuse the registry running in the state folder; the
                                             Confluent-compatible URL (http://127.0.0.1:N/apis/ccompat/v7) is the
                                             LAST line of stdout (progress: stderr). Exit 4, nothing started, while
                                             one is paused, frozen or exited without a stop: resume, thaw or stop it
    stop                                     stop it and delete its schemas (the log and the download cache stay)
    status                                   "running" (0), "paused" (4), "frozen" (5), "exited" (3: gone without a
                                             stop; resume brings it back) or "not running" (3), then the URL
    pause [--kill]                           an outage: stop the JVM (SIGTERM, or SIGKILL) but keep its schemas and
                                             ports; connections are refused. Exit 3 if nothing is started
    resume                                   start it again: same port, same schemas and IDs; waits until ready
    freeze                                   a registry that hangs: SIGSTOP (connections accepted, never answered)
    thaw                                     SIGCONT and wait until it answers
    fetch                                    resolve (Maven), check and unpack the application if needed, find the
                                             JDK; prints the java, then the application's folder. Exit 1 when
                                             either is missing: what CI runs before the tests

Environment (read here only; flags win): KAFKA_LOCAL_STATE (the broker's state folder; the registry's is its
``registry`` subfolder, default <repo>/.kafka-local/registry), KAFKA_LOCAL_REGISTRY_PORT,
KAFKA_LOCAL_REGISTRY_JAVA_HOME (a JDK >= 21; else JAVA_HOME, /usr/lib/jvm/* and the other usual places, then PATH),
KAFKA_LOCAL_REGISTRY_CACHE (the unpacked application; default ~/.cache/streaminfer),
KAFKA_LOCAL_REGISTRY_START_TIMEOUT and KAFKA_LOCAL_REGISTRY_STOP_TIMEOUT (s), KAFKA_LOCAL_REGISTRY_HEAP_OPTS,
KAFKA_LOCAL_REGISTRY_JVM_OPTS, KAFKA_LOCAL_MVN_ARGS (e.g. "-o").
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.localkafka.procs import seconds_setting
from harness.registry.java import RegistrySetupError, app_home, default_cache, find_registry_java
from harness.registry.registry import HEAP_OPTS, START_TIMEOUT_S, STOP_TIMEOUT_S, LocalRegistry

ROOT = Path(__file__).resolve().parents[2]
#: Exit codes of ``status`` (and of ``start`` while one is paused, frozen or exited), as kafka-local's.
EXIT_NOT_RUNNING, EXIT_PAUSED, EXIT_FROZEN = 3, 4, 5


def _port(raw: str | int | None, name: str) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        port = int(raw)
    except ValueError:
        raise RegistrySetupError(f"{name} must be a port number, got {raw!r}") from None
    if not 1 <= port <= 65535:
        raise RegistrySetupError(f"{name} must be a port number (1-65535), got {port}")
    return port


def state_folder(args: argparse.Namespace, env: Mapping[str, str]) -> Path:
    """``--state``, else ``$KAFKA_LOCAL_STATE/registry``, else ``<repo>/.kafka-local/registry``."""
    if args.state:
        return Path(args.state)
    return Path(env.get("KAFKA_LOCAL_STATE") or ROOT / ".kafka-local") / "registry"


def registry_from(args: argparse.Namespace, env: Mapping[str, str]) -> LocalRegistry:
    """The :class:`LocalRegistry` the flags and ``KAFKA_LOCAL_REGISTRY_*`` settings describe (its JDK is looked
    for only when a verb starts it).

    Raises:
        RegistrySetupError: a setting that is not usable (named).
    """
    for name in ("KAFKA_LOCAL_REGISTRY_HEAP_OPTS", "KAFKA_LOCAL_REGISTRY_JVM_OPTS", "KAFKA_LOCAL_MVN_ARGS"):
        try:
            shlex.split(env.get(name, ""))
        except ValueError as exc:
            raise RegistrySetupError(f"{name} is not a list of shell words ({exc}): {env[name]!r}") from None
    port = _port(getattr(args, "port", None), "--port") or _port(
        env.get("KAFKA_LOCAL_REGISTRY_PORT"), "KAFKA_LOCAL_REGISTRY_PORT"
    )
    management_port = _port(getattr(args, "management_port", None), "--management-port")
    if port is not None and port == management_port:
        raise RegistrySetupError(f"--port and --management-port must differ, both are {port}")
    return LocalRegistry(
        state_folder(args, env),
        port=port,
        management_port=management_port,
        cache=default_cache(env),
        heap_opts=env.get("KAFKA_LOCAL_REGISTRY_HEAP_OPTS") or HEAP_OPTS,
        jvm_opts=env.get("KAFKA_LOCAL_REGISTRY_JVM_OPTS", ""),
        start_timeout_s=seconds_setting(env, "KAFKA_LOCAL_REGISTRY_START_TIMEOUT", START_TIMEOUT_S, RegistrySetupError),
        stop_timeout_s=seconds_setting(env, "KAFKA_LOCAL_REGISTRY_STOP_TIMEOUT", STOP_TIMEOUT_S, RegistrySetupError),
        mvn_args=shlex.split(env.get("KAFKA_LOCAL_MVN_ARGS", "")),
    )


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="registry-local",
        description="A local Confluent-compatible Schema Registry (Apicurio Registry) on a JDK >= 21, without Docker.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--state", help="state folder (default: $KAFKA_LOCAL_STATE/registry or <repo>/.kafka-local/registry)"
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    start = verbs.add_parser("start", help="start (or reuse) the registry; prints its Confluent-compatible URL last")
    start.add_argument("--port", type=int, help="the HTTP port (default: $KAFKA_LOCAL_REGISTRY_PORT or a free one)")
    start.add_argument("--management-port", type=int, help="the health/metrics port (default: a free one)")
    verbs.add_parser("stop", help="stop the registry and delete its schemas")
    verbs.add_parser("status", help="running / frozen / paused / exited / not running, then the URL")
    pause = verbs.add_parser("pause", help="stop the JVM but keep schemas and ports")
    pause.add_argument("--kill", action="store_true", help="SIGKILL at once (a crash) instead of SIGTERM")
    verbs.add_parser("resume", help="start the paused registry again (same port and schemas)")
    verbs.add_parser("freeze", help="SIGSTOP: the registry hangs instead of refusing")
    verbs.add_parser("thaw", help="SIGCONT a frozen registry")
    verbs.add_parser("fetch", help="download (Maven), check and unpack the application; find the JDK")
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point; returns the exit status (see the module docstring)."""
    env = os.environ if env is None else env
    args = parser().parse_args(argv)
    try:
        return _dispatch(args, env)
    except (RegistrySetupError, OSError, ValueError) as exc:  # a state folder that is a file, ...
        print(f"registry-local: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("registry-local: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    registry = registry_from(args, env)
    verb = args.verb
    if verb == "fetch":
        jdk = find_registry_java(env)
        app = app_home(registry.cache, registry.mvn_args)
        print(f"registry-local: Java {jdk.major} at {jdk.java}; Apicurio Registry in {app}", file=sys.stderr)
        print(jdk.java)
        print(app)
        return 0
    status = registry.status()
    if verb == "start":
        if status in ("paused", "frozen", "exited"):
            fix = {"paused": "'resume' restarts it", "frozen": "'thaw' wakes it", "exited": "'resume' restarts it"}
            print(f"registry-local: the registry in {registry.state} is {status}: {fix[status]}, 'stop' discards it "
                  "(and its schemas) before a new start", file=sys.stderr)  # fmt: skip
            return EXIT_PAUSED
        registry.java = None if status == "running" else find_registry_java(env).java
        print(registry.start())
        return 0
    if verb == "stop":
        if status == "not running":
            print("registry-local: not running", file=sys.stderr)
        registry.stop()
        return 0
    if verb == "status":
        rec = registry.recorded()
        if rec is not None:
            print(f"registry-local: pid {rec.pid or '-'}, HTTP {rec.host}:{rec.port}, management "
                  f"{rec.host}:{rec.management_port}, log {registry.log_file}", file=sys.stderr)  # fmt: skip
        print(status)
        if rec is not None:
            print(registry.url)
        return {"running": 0, "paused": EXIT_PAUSED, "frozen": EXIT_FROZEN}.get(status, EXIT_NOT_RUNNING)
    if status == "not running":
        print(f"registry-local: no registry is started in {registry.state} ('start' first)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    if verb == "pause":
        registry.pause(kill=args.kill)
    elif verb == "resume":
        registry.resume()
    elif verb == "freeze":
        registry.freeze()
    else:
        registry.thaw()
    print(registry.url)
    return 0
