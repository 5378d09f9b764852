"""TCP ports on this host for local brokers and child processes.

Two kinds: :func:`free_port` is the kernel's choice (free when it returns; for a child that binds at once), and
:func:`stable_ports` picks ports outside the kernel's ephemeral range, so that while a local broker is paused no
client's outgoing connection (or another program's bind to port 0) can take its ports before it resumes.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterable
from pathlib import Path

#: Linux's default ``net.ipv4.ip_local_port_range``, used where /proc does not say.
DEFAULT_EPHEMERAL = (32768, 60999)
#: Lowest port :func:`stable_ports` picks (below: well-known and registered services people run locally).
LOWEST_STABLE_PORT = 10000
#: A window outside the ephemeral range narrower than this many ports is not used.
MIN_WINDOW = 1000


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (the kernel's choice; free when this returns)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range (low, high), inclusive; :data:`DEFAULT_EPHEMERAL` when unknown."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (low, high) if 0 < low <= high <= 65535 else DEFAULT_EPHEMERAL


def stable_windows(ephemeral: tuple[int, int]) -> list[tuple[int, int]]:
    """The port windows (low, high, inclusive) outside ``ephemeral`` and above :data:`LOWEST_STABLE_PORT`, each at
    least :data:`MIN_WINDOW` wide."""
    low, high = ephemeral
    windows = [(LOWEST_STABLE_PORT, low - 1), (high + 1, 65535)]
    return [(a, b) for a, b in windows if b - a + 1 >= MIN_WINDOW]


def stable_ports(
    count: int, host: str = "127.0.0.1", exclude: Iterable[int] = (), ephemeral: tuple[int, int] | None = None
) -> list[int]:
    """``count`` distinct free TCP ports on ``host``, picked at random outside the ephemeral range (the kernel's
    choice when no window is left there). All are bound together while picking, so they are distinct and free when
    this returns.

    Raises:
        OSError: no free port could be found in 1,000 tries plus the kernel's.
    """
    windows = stable_windows(ephemeral or ephemeral_range())
    total = sum(b - a + 1 for a, b in windows)
    taken = set(exclude)
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        tries = 0
        while len(ports) < count:
            tries += 1
            candidate = 0
            if total and tries <= 1000:
                n = secrets.randbelow(total)
                for a, b in windows:
                    if n <= b - a:
                        candidate = a + n
                        break
                    n -= b - a + 1
            s = socket.socket()
            try:
                s.bind((host, candidate))
            except OSError:
                s.close()
                if tries > 2000:
                    raise
                continue
            held.append(s)
            port = int(s.getsockname()[1])
            if port not in taken:
                taken.add(port)
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def ports_taken(ports: Iterable[int], host: str = "127.0.0.1") -> list[int]:
    """The ports among ``ports`` that a server could not listen on now (a bind with ``SO_REUSEADDR``, as the JVM
    does, so leftover TIME_WAIT connections do not count)."""
    taken = []
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                taken.append(port)
    return taken


def listening(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (one connect, ``timeout_s`` seconds)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
