"""The Docker engine of the container steps: the one that answers, else one started here (``make docker-engine``).

Where an engine already answers (``DOCKER_HOST``, ``/var/run/docker.sock``, or the one this module started) it is used
as it is and never stopped here. Otherwise, as root on Debian, Debian's ``docker.io`` is installed where ``dockerd`` is
missing, and ``dockerd`` is started the way a machine without iptables allows (:func:`dockerd_argv`)::

    dockerd --host unix:///run/streaminfer-docker/docker.sock --exec-root /run/streaminfer-docker/exec
            --pidfile /run/streaminfer-docker/dockerd.pid --iptables=false --ip6tables=false --ip-forward=false
            --storage-driver overlay2 [--bridge=none]

- **Its own socket**, not ``/var/run/docker.sock``: whatever on the machine looks for Docker at the default place
  (another clone's test session picks testcontainers whenever an engine answers there) does not start using this one
  by chance. The commands that should use it get ``DOCKER_HOST``: ``engine start --env`` prints it, the harness's own
  verbs find it through the record below.
- **Storage**: overlay2, else vfs (every layer a full copy: slow and large, but it works on any file system).
- **Network**: the default bridge (``docker0``) with the userland proxy (``docker-proxy``) for published ports: it
  works without iptables. Containers reach each other and the host's ``docker0`` address, the host reaches published
  ports through the proxy; there is no NAT, so a container on the bridge reaches nothing beyond this machine, and the
  image builds run with ``--network host``. Where the bridge cannot be made: ``--bridge=none``, host networking only
  (:attr:`Engine.network` says which, and the containers are started accordingly).

The record (``<state>/engine.json``, state ``/run/streaminfer-docker`` by default) names the process, so ``stop``
ends only an engine this module started: SIGTERM to ``dockerd`` (which stops its containers), SIGKILL after
:data:`STOP_TIMEOUT_S`, then any of its processes still there (containerd, shims, docker-proxy) by process ID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from harness.docker.client import Docker, DockerError

#: The state folder of an engine started here: its socket, pid file, exec root, log and record.
DEFAULT_STATE = Path("/run/streaminfer-docker")
#: The engine most machines have.
DEFAULT_SOCKET = Path("/var/run/docker.sock")
#: Seconds a started dockerd may take to answer.
START_TIMEOUT_S = 60.0
#: Seconds ``stop`` waits after SIGTERM (dockerd stops its containers first, 15 s each at most) before SIGKILL.
STOP_TIMEOUT_S = 45.0
#: Seconds apt-get waits for another apt-get's lock (several engineers share a machine).
APT_LOCK_TIMEOUT_S = 600

Network = Literal["bridge", "host"]
Say = Callable[[str], None]


class EngineUnavailable(RuntimeError):
    """No engine answers and this machine cannot start one (not root, not Debian, no dockerd and no apt-get): the
    container steps cannot run here. The message says why."""


class EngineError(RuntimeError):
    """Starting or stopping the engine failed (dockerd did not come up: its log's last lines are in the message)."""


@dataclass(frozen=True)
class Engine:
    """An engine that answers.

    Attributes:
        host: its ``DOCKER_HOST`` address.
        version: the server's version.
        network: how containers and this machine reach each other: ``bridge`` (published ports through the userland
            proxy; the host is ``gateway`` from inside) or ``host`` (``--network host`` only).
        gateway: the bridge's address on this machine (containers reach the host there); ``127.0.0.1`` with ``host``.
        storage_driver: overlay2, vfs, ...
        started_here: whether this module started it (only then does ``stop`` end it).
        pid: dockerd's process ID when started here, else 0.
        started_now: whether this call of :func:`start` started it (an engine found running: False).
    """

    host: str
    version: str
    network: Network
    gateway: str
    storage_driver: str
    started_here: bool
    pid: int = 0
    started_now: bool = False

    def docker(self) -> Docker:
        """The docker CLI against this engine."""
        return Docker(self.host)


@dataclass(frozen=True)
class Record:
    """What ``start`` writes to ``<state>/engine.json``."""

    pid: int
    host: str
    storage_driver: str
    network: Network
    log: str
    started_at: float

    @classmethod
    def load(cls, path: Path) -> Record | None:
        """The record at ``path``; None when there is none or it is unreadable (a half-written one)."""
        try:
            raw = json.loads(path.read_text())
            return cls(**raw)
        except (OSError, ValueError, TypeError):
            return None

    def save(self, path: Path) -> None:
        """Write atomically."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)


def socket_host(state: Path) -> str:
    """The ``DOCKER_HOST`` of the engine started with ``state``."""
    return f"unix://{state / 'docker.sock'}"


def dockerd_argv(dockerd: str, state: Path, storage_driver: str, network: Network, data_root: Path | None) -> list[str]:
    """The ``dockerd`` command line of an engine in ``state`` (see the module docstring)."""
    argv = [
        dockerd,
        "--host", socket_host(state),
        "--exec-root", str(state / "exec"),
        "--pidfile", str(state / "dockerd.pid"),
        "--iptables=false", "--ip6tables=false", "--ip-forward=false",
        "--storage-driver", storage_driver,
    ]  # fmt: skip
    if network == "host":
        argv.append("--bridge=none")
    if data_root is not None:
        argv += ["--data-root", str(data_root)]
    return argv


def attempts(storage_driver: str | None, network: Network | None) -> list[tuple[str, Network]]:
    """The (storage driver, network) combinations ``start`` tries, in order: overlay2 before vfs, the bridge before
    host networking; a given ``storage_driver`` or ``network`` is the only one of its kind tried."""
    drivers = [storage_driver] if storage_driver else ["overlay2", "vfs"]
    networks: list[Network] = [network] if network else ["bridge", "host"]
    return [(d, n) for d in drivers for n in networks]


def _alive(pid: int, name: str) -> bool:
    """Whether process ``pid`` runs (a zombie does not) and is ``name`` (not a reused process ID)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name and _running(pid)
    except OSError:
        return False


def describe(host: str, started_here: bool, pid: int = 0) -> Engine | None:
    """The :class:`Engine` at ``host`` when it answers within a few seconds, else None."""
    docker = Docker(host)
    version = docker.answers()
    if version is None:
        return None
    driver = "?"
    with contextlib.suppress(DockerError):
        driver = str(docker.json("info", "--format", "{{json .Driver}}"))
    network: Network = "host"
    gateway = "127.0.0.1"
    done = docker.run("network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}", check=False)
    if done.returncode == 0:
        configs = json.loads(done.stdout or "[]") or []
        gateways = [c.get("Gateway") for c in configs if c.get("Gateway")]
        if gateways:
            network, gateway = "bridge", str(gateways[0])
    return Engine(host, version, network, gateway, driver, started_here, pid)


def find(
    state: Path = DEFAULT_STATE, env: Mapping[str, str] | None = None, *, started_here: bool = True
) -> Engine | None:
    """The engine to use: ``DOCKER_HOST`` when set (and only it), else ``/var/run/docker.sock``, else (with
    ``started_here``) the one started here, found through its record in ``state``; None when none of them answers.
    The test fixtures pass ``started_here=False``: a test session uses the engine started here only when
    ``DOCKER_HOST`` names it."""
    env = os.environ if env is None else env
    if env.get("DOCKER_HOST"):
        rec = Record.load(state / "engine.json")
        ours = rec is not None and rec.host == env["DOCKER_HOST"] and _alive(rec.pid, "dockerd")
        return describe(env["DOCKER_HOST"], ours, rec.pid if ours and rec else 0)
    if DEFAULT_SOCKET.exists():
        found = describe(f"unix://{DEFAULT_SOCKET}", started_here=False)
        if found is not None:
            return found
    rec = Record.load(state / "engine.json")
    if started_here and rec is not None and _alive(rec.pid, "dockerd"):
        return describe(rec.host, started_here=True, pid=rec.pid)
    return None


def apt_install(package: str, command: str, say: Say) -> str:
    """The path of ``command``, installing Debian's ``package`` first where it is missing (root on Debian only).

    Raises:
        EngineUnavailable: it is missing and this is not root on a Debian system with apt-get.
        EngineError: apt-get failed (its last lines in the message).
    """
    path = shutil.which(command) or shutil.which(command, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path:
        return path
    if os.geteuid() != 0:
        raise EngineUnavailable(f"{command} is not installed, and installing it ({package}) needs root")
    if not Path("/etc/debian_version").exists() or shutil.which("apt-get") is None:
        raise EngineUnavailable(f"{command} is not installed and this is not Debian: install {package} (or Docker)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = shutil.which("apt-get") or "apt-get"
    install = [apt, "-o", f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}", "install", "--yes", "--quiet",
               "--no-install-recommends", package]  # fmt: skip
    say(f"installing Debian's {package} (apt-get install {package})")
    done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:  # an old package index: update it once and try again
        update = [install[0], "-o", f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}", "update", "--quiet"]
        subprocess.run(update, env=env, capture_output=True, check=False)  # noqa: S603
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise EngineError(f"apt-get install {package} failed (exit {done.returncode}):\n{tail}")
    path = shutil.which(command) or shutil.which(command, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not path:
        raise EngineError(f"apt-get installed {package} but {command} is still not found")
    return path


def start(
    state: Path = DEFAULT_STATE,
    *,
    storage_driver: str | None = None,
    network: Network | None = None,
    data_root: Path | None = None,
    timeout_s: float = START_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    say: Say | None = None,
) -> Engine:
    """The engine to use: the one that answers (:func:`find`), else ``dockerd`` started here (installed first where
    missing), trying :func:`attempts` in order until one answers within ``timeout_s`` seconds.

    Raises:
        EngineUnavailable: none answers and this machine cannot start one (or ``DOCKER_HOST`` names one that does
            not answer: it is the user's choice, not replaced here).
        EngineError: dockerd did not come up in any of the attempts (each one's log tail in the message).
    """
    env = os.environ if env is None else env
    say = say or _say
    found = find(state, env)
    if found is not None:
        return found
    if env.get("DOCKER_HOST"):
        raise EngineUnavailable(f"DOCKER_HOST={env['DOCKER_HOST']} does not answer (unset it to start an engine here)")
    if os.geteuid() != 0:
        raise EngineUnavailable("no Docker engine answers, and starting dockerd needs root (or rootless Docker)")
    dockerd = apt_install("docker.io", "dockerd", say)
    found = find(state, env)  # a package whose service started on install (systemd machines)
    if found is not None:
        return found
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    failures = []
    for driver, net in attempts(storage_driver, network):
        engine, problem = _try_start(dockerd, state, driver, net, data_root, timeout_s, say)
        if engine is not None:
            return engine
        failures.append(f"--storage-driver {driver} {'--bridge=none' if net == 'host' else '(bridge)'}: {problem}")
    raise EngineError("dockerd did not start:\n" + "\n".join(failures))


def _try_start(
    dockerd: str, state: Path, driver: str, net: Network, data_root: Path | None, timeout_s: float, say: Say
) -> tuple[Engine | None, str]:
    argv = dockerd_argv(dockerd, state, driver, net, data_root)
    log = state / "dockerd.log"
    say(f"starting {' '.join(argv)} (log: {log})")
    (state / "docker.sock").unlink(missing_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(  # noqa: S603 (dockerd with our own arguments)
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    rec = Record(proc.pid, socket_host(state), driver, net, str(log), time.time())
    rec.save(state / "engine.json")
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            _clear(state)
            return None, f"exited with {proc.returncode}; last lines of {log}:\n{_tail(log)}"
        engine = describe(rec.host, started_here=True, pid=proc.pid)
        if engine is not None:
            say(f"engine {engine.version} at {engine.host}: {engine.storage_driver}, network {engine.network} "
                f"(gateway {engine.gateway}), ready after {time.monotonic() - started:.1f} s")  # fmt: skip
            return replace(engine, started_now=True), ""
        time.sleep(0.5)
    _terminate(proc.pid, state, say)
    _clear(state)
    return None, f"did not answer within {timeout_s:.0f} s; last lines of {log}:\n{_tail(log)}"


def stop(state: Path = DEFAULT_STATE, say: Say | None = None) -> bool:
    """Stop the engine started here (its record in ``state``): its containers, dockerd, then whatever of its
    processes is left. Returns whether one was running. An engine not started here is never touched.

    Raises:
        EngineError: a process of it was still there after SIGKILL.
    """
    say = say or _say
    rec = Record.load(state / "engine.json")
    if rec is None:
        return False
    running = _alive(rec.pid, "dockerd")
    if running:
        docker = Docker(rec.host)
        with contextlib.suppress(DockerError):
            ids = docker.run("ps", "--all", "--quiet", check=False, timeout_s=30).stdout.split()
            if ids:
                say(f"removing {len(ids)} container(s) left on the engine")
                docker.run("rm", "--force", "--volumes", *ids, check=False, timeout_s=120)
    left = _terminate(rec.pid if running else 0, state, say)
    _clear(state)
    if left:
        raise EngineError(f"processes of the engine still running after SIGKILL: {left}")
    if running:
        say(f"stopped the engine at {rec.host} (pid {rec.pid})")
    return running


def _terminate(pid: int, state: Path, say: Say) -> list[int]:
    """SIGTERM dockerd ``pid`` (0: none), SIGKILL after :data:`STOP_TIMEOUT_S`; then SIGKILL every process still
    running that belongs to the engine in ``state`` (:func:`engine_processes`). Returns the process IDs still there
    afterwards (none, normally)."""
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone([pid], STOP_TIMEOUT_S):
            say(f"dockerd (pid {pid}) still running after {STOP_TIMEOUT_S:.0f} s: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone([pid], 10)
    rest = engine_processes(state, pid)
    if rest:
        say(f"ending what the engine left running: {', '.join(f'{p} ({n})' for p, n in rest)}")
        for left_pid, _ in rest:
            with contextlib.suppress(ProcessLookupError):
                os.kill(left_pid, signal.SIGKILL)
        _wait_gone([p for p, _ in rest], 10)
    return [p for p, _ in engine_processes(state, pid)]


def engine_processes(state: Path, session: int) -> list[tuple[int, str]]:
    """(pid, name) of every running process (zombies, whose parent has not reaped them yet, are gone already) that
    belongs to the engine in ``state``: its command line names the state folder (the managed containerd, the shims) or
    it is in dockerd's session ``session`` (docker-proxy; 0: none)."""
    found = []
    marker = str(state).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            sid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
            name = (entry / "comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue
        if (marker in cmdline or (session and sid == session)) and _running(int(entry.name)):
            found.append((int(entry.name), name))
    return found


def _wait_gone(pids: Sequence[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_running(p) for p in pids):
            return True
        time.sleep(0.2)
    return not any(_running(p) for p in pids)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (reaping what we started ourselves)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _clear(state: Path) -> None:
    for name in ("engine.json", "docker.sock", "dockerd.pid"):
        (state / name).unlink(missing_ok=True)


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _say(line: str) -> None:
    print(f"docker-engine: {line}", file=sys.stderr, flush=True)
