"""The consumer as a child process, for the demo, the benchmark, the fault harness and the tests: one argument list
built from setting names (:func:`consumer_argv`), one readiness wait (``/readyz``), one bounded stop (SIGTERM, then
SIGKILL after a grace); ports from :func:`harness.ports.free_port`.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from consumer.config import Settings
from harness.netns import IP
from harness.ports import free_port

#: How long :meth:`ConsumerProcess.terminate` waits after SIGTERM before SIGKILL, seconds: above the consumer's
#: default ``shutdown_grace_s`` (25 s), so a clean stop is never cut short.
STOP_GRACE_S = 40.0


def consumer_argv(settings: Mapping[str, Any]) -> list[str]:
    """``python -m consumer`` with ``settings`` (setting name -> value) as flags: ``--name value``, booleans as
    ``--name`` / ``--no-name``, None left out.

    Raises:
        ValueError: a name that is not a setting of :class:`consumer.config.Settings`.
    """
    argv = [sys.executable, "-m", "consumer"]
    for name, value in settings.items():
        if name not in Settings.model_fields:
            raise ValueError(f"{name!r} is not a consumer setting")
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> tuple[int, float]:
    """SIGTERM, wait up to ``grace_s`` seconds, then SIGKILL. Returns (exit code, seconds it took)."""
    started = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode, time.monotonic() - started


class ConsumerProcess:
    """``python -m consumer`` as a child process, its output appended to ``log``.

    Args:
        settings: setting name -> value (:func:`consumer_argv`); ``http_host`` and ``http_port`` are chosen here
            (127.0.0.1, a free port on every start) unless given.
        log: file the child's stdout and stderr go to (appended; made if missing).
        data_limit_bytes: the child's ``RLIMIT_DATA`` (heap and private mappings), bytes; None: inherited.
        extra_args: raw flags after the settings (e.g. a test's bad flag).
        netns: run it in this network namespace (``ip netns exec``; needs root), probing ``/readyz`` from inside.

    Attributes:
        proc: the running (or finished) child, None before :meth:`start`.
        port: its HTTP port (``/readyz``, ``/metrics``).
        starts: how many times it was started.
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        log: Path,
        *,
        data_limit_bytes: int | None = None,
        extra_args: Sequence[str] = (),
        netns: str = "",
    ) -> None:
        self.settings = dict(settings)
        self.log = log
        self.data_limit_bytes = data_limit_bytes
        self.extra_args = list(extra_args)
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0

    def start(self, *, wait: bool = True, timeout_s: float = 90) -> None:
        """Start the child (a new HTTP port each time); with ``wait``, return once it is ready.

        Raises:
            RuntimeError: it exited, or was not ready within ``timeout_s`` seconds.
        """
        fixed_port = self.settings.get("http_port")
        self.port = int(fixed_port) if fixed_port else free_port()
        argv = consumer_argv({"http_host": "127.0.0.1", **self.settings, "http_port": self.port}) + self.extra_args
        if self.netns:
            argv = [IP, "netns", "exec", self.netns, *argv]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(  # noqa: S603 (our own module)
                argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_data_limit(self.data_limit_bytes)
            )
        self.starts += 1
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 90) -> None:
        """Poll ``/readyz`` until it answers 200.

        Raises:
            RuntimeError: the child exited, or was not ready within ``timeout_s`` seconds (the log named).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"consumer exited with code {self.returncode} before it was ready; log: {self.log}")
            if self.is_ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"consumer not ready after {timeout_s:.0f} s; log: {self.log}")

    def is_ready(self) -> bool:
        """One ``/readyz`` request (1 s timeout): whether it answered 200 (503, a refused or timed-out connection:
        False). In a network namespace the request is made from inside it, as a kubelet probes its own pod."""
        return self.probe("/readyz")

    def is_healthy(self) -> bool:
        """One ``/healthz`` request, as :meth:`is_ready` makes it: whether it answered 200."""
        return self.probe("/healthz")

    def probe(self, path: str) -> bool:
        """One GET of ``path`` on the consumer's HTTP port (1 s timeout): whether it answered 200."""
        url = f"http://127.0.0.1:{self.port}{path}"
        if self.netns:
            probe = f"import urllib.request as u; u.urlopen({url!r}, timeout=1)"
            done = subprocess.run(  # noqa: S603 (ip netns exec with our own interpreter)
                [IP, "netns", "exec", self.netns, sys.executable, "-S", "-c", probe],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip
            return done.returncode == 0
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:  # urllib's HTTPError (503) and URLError are OSErrors
            return False

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs (or before it started)."""
        return None if self.proc is None else self.proc.poll()

    @property
    def pid(self) -> int:
        """The child's process ID (0 before it started)."""
        return 0 if self.proc is None else self.proc.pid

    def kill(self) -> None:
        """SIGKILL (no shutdown, no LeaveGroup) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def terminate(self, grace_s: float = STOP_GRACE_S) -> tuple[int, float]:
        """SIGTERM, then SIGKILL after ``grace_s`` seconds. Returns (exit code, seconds it took)."""
        assert self.proc is not None, "terminate() before start()"
        return stop_process(self.proc, grace_s)

    def rss_bytes(self) -> int:
        """Resident set size of the child (``VmRSS`` in /proc), bytes; 0 when it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return 0
        with contextlib.suppress(OSError), open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def _data_limit(limit: int | None) -> Callable[[], None] | None:
    if limit is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    return apply
