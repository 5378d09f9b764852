"""The local servers' JVMs as processes (the broker's nodes, the schema registry): is a pid still that JVM, has it
ended (every thread of it), and the lock that keeps two commands from starting or stopping one at once."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path


def seconds_setting(env: Mapping[str, str], name: str, default: float, error: type[Exception]) -> float:
    """The number of seconds in variable ``name`` of ``env`` (a time-out of a local server's command line), or
    ``default`` when it is unset or empty.

    Raises:
        error: it is not a finite number above 0 (the variable and its value named).
    """
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise error(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise error(f"{name} must be a number of seconds above 0, got {raw!r}")
    return value


#: Longest wait for another command's hold on a state folder, s.
LOCK_WAIT_S = 120.0


@contextlib.contextmanager
def state_lock(state: Path, error: type[Exception]) -> Iterator[None]:
    """Hold ``<state>/lock`` (flock), so two commands never start or stop the same server at once.

    Raises:
        error: another command held it for :data:`LOCK_WAIT_S` (its message names the lock file).
    """
    state.mkdir(parents=True, exist_ok=True)
    with (state / "lock").open("w") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise error(f"another command holds {state / 'lock'}") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_broker(pid: int, props: Path, child: subprocess.Popen[bytes] | None) -> bool:
    """``pid`` runs (not a zombie) and is the JVM started with ``props`` (a pid reused by another program is not).

    ``child``: this process's own handle on it, if it started the JVM; then that handle decides, since the pid of an
    unreaped child cannot be reused, and between fork and exec its command line is still this process's.
    """
    if child is not None:
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        if not Path("/proc/self").exists():  # no procfs: trust the pid
            try:
                os.kill(pid, 0)
            except OSError:
                return False
            return True
        return False
    if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
        return False
    return str(props).encode() in cmdline


def wait_gone(pid: int, child: subprocess.Popen[bytes] | None, timeout_s: float) -> bool:
    """Wait until ``pid`` and all its threads have ended (reaping it when it is our child); False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None:
            try:
                child.wait(timeout=0.1)
                return True
            except subprocess.TimeoutExpired:
                continue
        if not threads_left(pid):
            return True
        time.sleep(0.1)
    return False


def threads_left(pid: int) -> bool:
    """Whether any thread of ``pid`` still runs (zombie threads count as ended)."""
    if not Path("/proc/self").exists():  # no procfs: the process as a whole
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            state = stat.read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            return True
    return False
