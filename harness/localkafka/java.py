"""The JDK and Apache Kafka's jars for the local broker.

Kafka runs straight from its own jars, which Maven resolves from Maven Central into the local Maven cache (~/.m2)
through ``pom.xml`` next to this module (Kafka 4.1.1, pinned there); only the classpath file is written, under the
broker's state folder, and it is resolved again only when the pom changed or a jar went missing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"
#: The maven-dependency-plugin that writes the classpath (pinned: a plugin resolved by prefix may change under us).
MVN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
#: Kafka 4.x needs Java 17 or newer.
MIN_JAVA = 17
#: Short-lived tool JVMs (StorageTool): small and quick to start.
TOOL_JVM_OPTS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")


class BrokerSetupError(RuntimeError):
    """Something the local broker needs is missing or broken (JDK, Maven, jars, ports, state); the message says
    what and how to fix it."""


def java_major(version_line: str) -> int:
    """The major version in the first line of ``java -version`` (``openjdk version "17.0.15"`` -> 17,
    ``java version "1.8.0_402"`` -> 8).

    Raises:
        BrokerSetupError: the line names no version.
    """
    found = re.search(r'version "([^"]+)"', version_line)
    if not found:
        raise BrokerSetupError(f"cannot read the Java version from: {version_line!r}")
    parts = found.group(1).split(".")
    major = parts[1] if parts[0] == "1" and len(parts) > 1 else re.split(r"[^0-9]", parts[0])[0]
    if not major.isdigit():
        raise BrokerSetupError(f"cannot read the Java version from: {version_line!r}")
    return int(major)


def find_java(env: Mapping[str, str] | None = None) -> Path:
    """The ``java`` of ``JAVA_HOME`` if set, else the one on PATH; checked to be Java >= :data:`MIN_JAVA`.

    Raises:
        BrokerSetupError: none found, it does not run, or it is too old.
    """
    env = os.environ if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            raise BrokerSetupError(f"JAVA_HOME is set to {home!r} but {java} is not executable")
    else:
        found = shutil.which("java", path=env.get("PATH"))
        if not found:
            raise BrokerSetupError(
                "java not found: install a JDK >= 17 (e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME"
            )
        java = Path(found)
    try:
        done = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerSetupError(f"'{java} -version' failed: {exc}") from exc
    line = (done.stderr or done.stdout).splitlines()[0] if (done.stderr or done.stdout) else ""
    major = java_major(line)
    if major < MIN_JAVA:
        raise BrokerSetupError(f"Kafka 4.x needs Java >= {MIN_JAVA}, but {java} is Java {major} (set JAVA_HOME)")
    return java


def classpath(state: Path, mvn_args: Sequence[str] = (), pom: Path = POM) -> str:
    """The Kafka broker's classpath (``:``-joined jar paths), cached in ``state/classpath.txt``.

    Resolved with Maven (``mvn ... build-classpath``; the first time this downloads about 60 MB into ~/.m2) when the
    cache is missing, was made from another pom, or names a jar that is gone.

    Raises:
        BrokerSetupError: mvn is missing or could not resolve the jars (its last lines are in the message).
    """
    state.mkdir(parents=True, exist_ok=True)
    cached, stamp = state / "classpath.txt", state / "classpath.pom.sha256"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if cached.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        jars = cached.read_text().strip()
        if jars and all(Path(jar).is_file() for jar in jars.split(":")):
            return jars
    mvn = shutil.which("mvn")
    if not mvn:
        raise BrokerSetupError(
            "mvn (Apache Maven) not found: it resolves Kafka's jars from Maven Central (e.g. apt-get install maven)"
        )
    tmp = state / f"classpath.txt.tmp.{os.getpid()}"
    goal = f"{MVN_DEPENDENCY_PLUGIN}:build-classpath"
    argv = [mvn, "-q", "-B", "-Dstyle.color=never", *mvn_args, "-f", str(pom), goal, "-Dmdep.includeScope=runtime",
            f"-Dmdep.outputFile={tmp}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)  # noqa: S603
    if done.returncode != 0 or not tmp.exists() or not tmp.read_text().strip():
        tmp.unlink(missing_ok=True)
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise BrokerSetupError(f"mvn could not resolve the Kafka jars (exit {done.returncode}):\n{tail}")
    tmp.replace(cached)
    stamp.write_text(digest + "\n")
    return cached.read_text().strip()


#: Broker logging: INFO to stdout (the node's kafka.log). No log4j shutdown hook: it would stop logging before
#: Kafka's own shutdown hook has finished.
LOG4J_BROKER = """\
status = warn
shutdownHook = disable
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.netclient.name = org.apache.kafka.clients.NetworkClient
logger.netclient.level = WARN
"""

#: Command-line tools (StorageTool): warnings only, to stderr.
LOG4J_TOOLS = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
"""
