"""A real Confluent-compatible Schema Registry on this machine, without Docker: Apicurio Registry (Apache-2.0).

:class:`LocalRegistry` runs the Apicurio Registry application (:mod:`harness.registry.java`: from Maven Central,
checked and cached) on a JDK >= 21 as one JVM, bound to 127.0.0.1 only: its HTTP interface (the APIs) and its
management interface (``/health``, ``/metrics``; Quarkus would put that on 0.0.0.0:9000) each on a free port picked
outside the kernel's ephemeral range (:func:`harness.ports.stable_ports`), so no client's outgoing connection
takes them while the registry is paused.

Storage is Apicurio's SQL storage on an H2 database *file* in the state folder (the application's default is an
in-memory H2 database), so a registry paused and resumed keeps every schema and its ID, as a production registry
does across restarts. Schema IDs are what Confluent clients expect: the Confluent-compatible API under
``/apis/ccompat/v7`` (:attr:`LocalRegistry.url`, what a Confluent client is given) hands out Apicurio's content IDs,
the same for the same schema under any subject.

Everything :class:`LocalRegistry` starts is recorded in its state folder, so another process (the CLI, a test run)
can pause, resume, freeze, thaw, stop or query the same registry::

    <state>/state.json     what start recorded: ports, pid, JVM arguments, paused / frozen
    <state>/lock           held (flock) while a verb changes the registry
    <state>/registry.log   the JVM's output (Quarkus's log and access log), appended across pauses
    <state>/data/          the H2 database (registry.mv.db)
    <state>/tmp/           the JVM's temporary folder (uploads, snapshots, imports)

The methods block (they start a JVM and wait for it); from async code call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from harness.localkafka.procs import state_lock, wait_gone
from harness.ports import listening, ports_taken, stable_ports
from harness.registry.java import RegistrySetupError, app_home, find_registry_java

#: Where the registry listens (both interfaces): loopback only.
HOST = "127.0.0.1"
#: The Confluent-compatible API's path.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: The readiness check's path on the management interface.
READY_PATH = "/health/ready"
#: The JVM's heap: a registry for tests holds a handful of schemas.
HEAP_OPTS = "-Xms64m -Xmx256m"
#: JVM options besides the heap. The C1 compiler alone halves the start-up time and CPU (about 2.7 s instead of
#: 5.9 s on two cores) and a registry for tests needs no peak throughput; the serial collector saves ~50 MB RSS.
REGISTRY_JVM_OPTS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
#: Seconds a start (or a resume, or a thaw) may take until the registry answers.
START_TIMEOUT_S = 90.0
#: Seconds ``stop`` and ``pause`` wait after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 20.0
#: Seconds one readiness request may take.
PROBE_TIMEOUT_S = 2.0
#: The registry's state (:meth:`LocalRegistry.status`): "exited" is a registry that stopped without ``stop`` or
#: ``pause`` (a crash, a reboot): ``resume`` brings it back with its data, ``stop`` discards it.
Status = Literal["running", "frozen", "paused", "exited", "not running"]


@dataclass
class RegistryRecord:
    """What ``start`` writes to ``state.json`` (and every other verb reads)."""

    host: str
    port: int
    management_port: int
    java: str
    argv: list[str]  # the whole command line, java first
    pid: int = 0
    paused: bool = False
    frozen: bool = False
    properties: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> RegistryRecord | None:
        """The record at ``path``, or None when there is none.

        Raises:
            RegistrySetupError: the file is not a record of this module.
        """
        try:
            raw = json.loads(path.read_text())
            return cls(**raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise RegistrySetupError(f"{path} is not a local registry's record ({exc}): delete the folder") from exc

    def save(self, path: Path) -> None:
        """Write the record atomically."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)


def registry_properties(
    state: Path, port: int, management_port: int, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Quarkus and Apicurio configuration of a registry in ``state`` (passed as ``-D`` system properties, which
    win over the application's own ``application.properties``); ``extra`` is applied last.

    - ``quarkus.http.host/port``, ``quarkus.management.host/port``: both interfaces on loopback and our ports;
    - ``apicurio.storage.kind=sql``, ``apicurio.storage.sql.kind=h2`` (the defaults, spelled out) with
      ``apicurio.datasource.url=jdbc:h2:file:<state>/data/registry``: data kept across restarts;
    - ``apicurio.datasource.jdbc.*``: a pool of 2 to 10 connections instead of 20 to 100;
    - snapshots, imports and the JVM's temporary files under ``<state>/tmp`` (the defaults are /tmp).
    """
    tmp = state / "tmp"
    props = {
        "quarkus.http.host": HOST,
        "quarkus.http.port": str(port),
        "quarkus.management.host": HOST,
        "quarkus.management.port": str(management_port),
        "apicurio.storage.kind": "sql",
        "apicurio.storage.sql.kind": "h2",
        "apicurio.datasource.url": f"jdbc:h2:file:{state / 'data' / 'registry'}",
        "apicurio.datasource.jdbc.initial-size": "2",
        "apicurio.datasource.jdbc.min-size": "2",
        "apicurio.datasource.jdbc.max-size": "10",
        "apicurio.storage.snapshot.location": str(tmp),
        "apicurio.import.work-dir": str(tmp),
        "java.io.tmpdir": str(tmp),
    }
    props.update(extra or {})
    return props


def is_registry(pid: int, marker: str, child: subprocess.Popen[bytes] | None) -> bool:
    """``pid`` runs (frozen counts; a zombie does not) and is the JVM whose command line holds the argument
    ``marker`` (a pid reused by another program is not).

    ``child``: this process's own handle on it, if it started the JVM; then that handle decides (the pid of an
    unreaped child cannot be reused).
    """
    if child is not None:
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        if Path("/proc/self").exists():
            return False
        try:  # no procfs: trust the pid
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X") and marker.encode() in cmdline


def http_status(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """The HTTP status of a GET of ``url``, None when nothing answered within ``timeout_s`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (our own http:// URL)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):  # refused, reset, timed out (TimeoutError is an OSError)
        return None


class LocalRegistry:
    """A local Apicurio Registry recorded in ``state``; a context manager that starts it on entry and stops it
    (deleting its data) on exit.

    Args:
        state: its state folder (made if missing); one registry per folder.
        port: the HTTP port (default: a free one).
        management_port: the management interface's port (default: a free one).
        java: the ``java`` to run (default: :func:`harness.registry.java.find_registry_java`, which reads
            KAFKA_LOCAL_REGISTRY_JAVA_HOME and JAVA_HOME).
        cache: where the application is unpacked (default: :func:`harness.registry.java.default_cache`).
        heap_opts: the heap flags (default :data:`HEAP_OPTS`).
        jvm_opts: extra JVM flags (shell words), after the defaults.
        properties: extra configuration (Quarkus and ``apicurio.*`` properties), applied last.
        start_timeout_s: how long a start, resume or thaw may take until the registry answers, s.
        stop_timeout_s: how long stop and pause wait after SIGTERM before SIGKILL, s.
        mvn_args: extra Maven arguments (``-o`` for offline).
        log: whether progress lines go to stderr.

    Raises (from the verbs):
        RegistrySetupError: a JDK >= 21, Maven, the application or a port is missing, or the registry did not come
            up (its log's last lines in the message).
    """

    def __init__(
        self,
        state: Path,
        *,
        port: int | None = None,
        management_port: int | None = None,
        java: Path | None = None,
        cache: Path | None = None,
        heap_opts: str = HEAP_OPTS,
        jvm_opts: str = "",
        properties: Mapping[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        mvn_args: Sequence[str] = (),
        log: bool = True,
    ) -> None:
        for name, value in (("port", port), ("management_port", management_port)):
            if value is not None and not 1 <= value <= 65535:
                raise ValueError(f"{name} must be a port number (1-65535), got {value}")
        if port is not None and port == management_port:
            raise ValueError(f"port and management_port must differ, both are {port}")
        self.state = state.resolve()
        self.port = port
        self.management_port = management_port
        self.java = java
        self.cache = cache
        self.heap_opts = heap_opts
        self.jvm_opts = jvm_opts
        self.properties = dict(properties or {})
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.mvn_args = list(mvn_args)
        self._log = log
        self._child: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------------------------------- context manager
    def __enter__(self) -> LocalRegistry:
        self.start(discard_stale=True)  # a context-managed registry is a throwaway: a crashed predecessor's too
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

    @property
    def log_file(self) -> Path:
        """The JVM's log."""
        return self.state / "registry.log"

    def recorded(self) -> RegistryRecord | None:
        """What ``start`` recorded, None when nothing was started (or it was stopped)."""
        return RegistryRecord.load(self.record_path)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` ("" when nothing was started)."""
        rec = self.recorded()
        return f"http://{rec.host}:{rec.port}" if rec else ""

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL, ``http://127.0.0.1:<port>/apis/ccompat/v7``: what a Confluent
        client (``SchemaRegistryClient({"url": ...})``) is given ("" when nothing was started)."""
        base = self.base_url
        return base + CCOMPAT_PATH if base else ""

    @property
    def health_url(self) -> str:
        """The readiness check, ``http://127.0.0.1:<management port>/health/ready`` ("" when nothing was
        started)."""
        rec = self.recorded()
        return f"http://{rec.host}:{rec.management_port}{READY_PATH}" if rec else ""

    def alive(self, rec: RegistryRecord | None = None) -> bool:
        """Whether the recorded JVM runs (frozen counts; a pid reused by another program does not)."""
        rec = self.recorded() if rec is None else rec
        return rec is not None and bool(rec.pid) and is_registry(rec.pid, self._marker, self._child)

    def status(self) -> Status:
        """The registry's state: "running", "frozen" (SIGSTOPped: it hangs), "paused" (stopped by :meth:`pause`),
        "exited" (gone without stop or pause) or "not running" (nothing started)."""
        rec = self.recorded()
        if rec is None:
            return "not running"
        if self.alive(rec):
            return "frozen" if rec.frozen else "running"
        return "paused" if rec.paused else "exited"

    # --------------------------------------------------------------------------------------------------- verbs
    def start(self, *, discard_stale: bool = False) -> str:
        """Start the registry (or reuse the one running in ``state``) and wait until it answers. Returns
        :attr:`url`.

        Args:
            discard_stale: delete the record and data of a registry that exited without stop or pause and start
                afresh; by default that is refused, since ``resume`` could bring it back.

        Raises:
            RegistrySetupError: see the class; also when the registry in ``state`` is paused or frozen, or exited
                and ``discard_stale`` is False.
        """
        with self._locked():
            status = self.status()
            if status == "running":
                self._say(f"already running at {self.url}")
                return self.url
            if status in ("paused", "frozen"):
                verb = "resume" if status == "paused" else "thaw"
                raise RegistrySetupError(
                    f"the registry in {self.state} is {status}: {verb} it, or stop it (deleting its data) before a "
                    "new start"
                )
            if status == "exited":
                if not discard_stale:
                    raise RegistrySetupError(
                        f"the registry in {self.state} is not running but was never stopped (it crashed, or the "
                        "machine restarted): resume restarts it with its data and ports, stop discards it"
                    )
                self._say("discarding the state of a registry that exited without a stop")
            self._clear()
            return self._start_new()

    def stop(self) -> None:
        """Stop the JVM (SIGTERM, SIGKILL after ``stop_timeout_s``; a frozen one is thawed to hear it) and delete
        the data and the record (the log and the application cache stay). Nothing started: nothing to do.

        Raises:
            RegistrySetupError: the JVM was still there 30 s after SIGKILL.
        """
        with self._locked():
            rec = self.recorded()
            if rec is None:
                return
            if self.alive(rec):
                self._terminate(rec, kill=False)
            self._say(f"stopped the registry at {self.url}")
            self._clear()

    def pause(self, *, kill: bool = False) -> None:
        """An outage: stop the JVM but keep its data, ports and configuration (SIGTERM, or with ``kill`` SIGKILL at
        once: a crash, which may lose the last half second of writes, H2's write delay). A paused registry refuses
        connections; :meth:`resume` brings it back.

        Raises:
            RegistrySetupError: nothing is started.
        """
        with self._locked():
            rec = self._require()
            running = self.alive(rec)
            rec.paused = True
            rec.save(self.record_path)  # marked first: from now on a registry that is not running is paused
            if running:
                started = time.monotonic()
                self._terminate(rec, kill=kill)
                self._say(f"paused ({'SIGKILL' if kill else 'SIGTERM'}) after {time.monotonic() - started:.1f} s")
            rec.pid, rec.frozen = 0, False
            rec.save(self.record_path)

    def resume(self) -> str:
        """Start a paused (or exited) registry again: same ports, data and configuration; returns once it answers.
        Returns :attr:`url`; a running one is left alone.

        Raises:
            RegistrySetupError: nothing is started, a port was taken meanwhile (it stays paused), or it did not come
                back within ``start_timeout_s``.
        """
        with self._locked():
            rec = self._require()
            if self.alive(rec):
                return self.url
            taken = ports_taken([rec.port, rec.management_port], rec.host)
            if taken:
                raise RegistrySetupError(
                    f"cannot resume the registry at {self.url}: port(s) {taken} on {rec.host} are in use by another "
                    "program; it stays paused (free them and resume again, or stop to discard it)"
                )
            started = time.monotonic()
            with self.log_file.open("a") as out:
                out.write(f"[registry-local] resuming (paused: {rec.paused})\n")
            self._launch(rec)
            rec.save(self.record_path)
            self._await(rec, time.monotonic() + self.start_timeout_s)
            rec.paused = False
            rec.save(self.record_path)
            self._say(f"resumed after {time.monotonic() - started:.1f} s")
            return self.url

    def freeze(self) -> None:
        """A registry that hangs instead of refusing: SIGSTOP the JVM. Connections are still accepted (by the
        kernel) but nothing answers until :meth:`thaw`.

        Raises:
            RegistrySetupError: nothing is started, or it is not running.
        """
        with self._locked():
            rec = self._require()
            if not self.alive(rec):
                raise RegistrySetupError(f"the registry in {self.state} is not running: nothing to freeze")
            os.kill(rec.pid, signal.SIGSTOP)
            rec.frozen = True
            rec.save(self.record_path)
            self._say(f"froze pid {rec.pid} (SIGSTOP)")

    def thaw(self) -> str:
        """SIGCONT a frozen registry and wait until it answers again. Returns :attr:`url`.

        Raises:
            RegistrySetupError: nothing is started, it is not running, or it did not answer within
                ``start_timeout_s``.
        """
        with self._locked():
            rec = self._require()
            if not self.alive(rec):
                raise RegistrySetupError(f"the registry in {self.state} is not running: nothing to thaw")
            os.kill(rec.pid, signal.SIGCONT)
            rec.frozen = False
            rec.save(self.record_path)
            self._await(rec, time.monotonic() + self.start_timeout_s)
            self._say(f"thawed pid {rec.pid} (SIGCONT)")
            return self.url

    def command(self, java: Path, app: Path, port: int, management_port: int) -> list[str]:
        """The JVM's command line for a registry of this state folder (nothing is run)."""
        props = registry_properties(self.state, port, management_port, self.properties)
        return [
            str(java),
            *shlex.split(self.heap_opts),
            *REGISTRY_JVM_OPTS,
            *shlex.split(self.jvm_opts),
            self._marker,  # how status tells our JVM from a reused pid
            *(f"-D{key}={value}" for key, value in props.items()),
            "-jar",
            str(app / "quarkus-run.jar"),
        ]

    # --------------------------------------------------------------------------------------------------- inside
    @property
    def _marker(self) -> str:
        return f"-Dstreaminfer.registry.record={self.record_path}"

    def _say(self, line: str) -> None:
        if self._log:
            print(f"registry-local: {line}", file=sys.stderr, flush=True)

    def _require(self) -> RegistryRecord:
        rec = self.recorded()
        if rec is None:
            raise RegistrySetupError(f"no registry is started in {self.state} (start one first)")
        return rec

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold ``<state>/lock`` (:func:`~harness.localkafka.procs.state_lock`) for a change of the registry."""
        return state_lock(self.state, RegistrySetupError)

    def _clear(self) -> None:
        """Delete what a start made (the record, the data, the temporary files), never the log or the cache."""
        self.record_path.unlink(missing_ok=True)
        for path in (self.state / "data", self.state / "tmp"):
            shutil.rmtree(path, ignore_errors=True)
        self._child = None

    def _start_new(self) -> str:
        java = self.java or find_registry_java().java
        app = app_home(self.cache, self.mvn_args)
        wanted = [p for p in (self.port, self.management_port) if p is not None]
        taken = ports_taken(wanted, HOST)
        if taken:
            raise RegistrySetupError(f"port(s) {taken} on {HOST} are in use by another program")
        picked = iter(stable_ports(2 - len(wanted), HOST, exclude=wanted))
        port = self.port if self.port is not None else next(picked)
        management_port = self.management_port if self.management_port is not None else next(picked)
        argv = self.command(java, app, port, management_port)
        rec = RegistryRecord(HOST, port, management_port, str(java), argv, properties=self.properties)
        (self.state / "data").mkdir(parents=True, exist_ok=True)
        (self.state / "tmp").mkdir(parents=True, exist_ok=True)
        self.log_file.write_text("")  # a new registry, a new log
        rec.save(self.record_path)
        self._say(f"starting Apicurio Registry at {self.url} (management {HOST}:{management_port}); log in "
                  f"{self.log_file}")  # fmt: skip
        started = time.monotonic()
        try:
            self._launch(rec)
            rec.save(self.record_path)
            self._await(rec, time.monotonic() + self.start_timeout_s)
        except BaseException:
            if self.alive(rec):
                self._terminate(rec, kill=True)
            self._clear()
            raise
        self._say(f"ready after {time.monotonic() - started:.1f} s")
        return self.url

    def _launch(self, rec: RegistryRecord) -> None:
        """Start the JVM in a session of its own (it outlives this process), output appended to the log."""
        # SIGTERM and SIGINT wait until the JVM is recorded: a handler that raises must not leave a JVM behind that
        # no clean-up knows of.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            with self.log_file.open("ab") as out:
                self._child = subprocess.Popen(  # noqa: S603 (a JDK's java running the Apicurio application)
                    rec.argv, cwd=self.state, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            rec.pid = self._child.pid
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _await(self, rec: RegistryRecord, deadline: float) -> None:
        """Wait until the readiness check says UP (200) and the Confluent-compatible API lists the subjects (200).

        Raises:
            RegistrySetupError: the JVM exited, or the deadline passed (the log's last lines in the message).
        """
        health = f"http://{rec.host}:{rec.management_port}{READY_PATH}"
        subjects = f"http://{rec.host}:{rec.port}{CCOMPAT_PATH}/subjects"
        while True:
            if not self.alive(rec):
                raise RegistrySetupError(f"the registry exited during start-up; {self._tail()}")
            if time.monotonic() > deadline:
                raise RegistrySetupError(
                    f"the registry did not answer within {self.start_timeout_s:.0f} s; {self._tail()}"
                )
            if listening(rec.host, rec.port) and http_status(health) == 200 and http_status(subjects) == 200:
                return
            time.sleep(0.25)

    def _tail(self, lines: int = 40) -> str:
        text = self.log_file.read_text(errors="replace").splitlines()[-lines:] if self.log_file.exists() else []
        return f"last lines of {self.log_file}:\n" + "\n".join(text)

    def _terminate(self, rec: RegistryRecord, *, kill: bool) -> None:
        """SIGTERM the JVM (SIGCONT too, so a frozen one hears it) and wait up to ``stop_timeout_s``, then SIGKILL;
        or SIGKILL at once with ``kill``. Returns once every thread of it is gone.

        Raises:
            RegistrySetupError: it was still there 30 s after SIGKILL.
        """
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGKILL if kill else signal.SIGTERM)
            os.kill(rec.pid, signal.SIGCONT)
        if not kill and not wait_gone(rec.pid, self._child, self.stop_timeout_s):
            self._say(f"pid {rec.pid} still running after {self.stop_timeout_s:.0f} s: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid, signal.SIGKILL)
        if not wait_gone(rec.pid, self._child, 30.0):
            raise RegistrySetupError(f"could not stop the registry (pid {rec.pid})")
        self._child = None
