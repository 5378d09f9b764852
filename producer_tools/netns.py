"""A network namespace joined to this host by a veth pair, for the network fault scenarios of ``make faults``.

The consumer runs inside the namespace (``ip netns exec``); the broker listens on the host side's address, so every
byte between them crosses the veth link, where faults are made with ``tc``. What this kernel offers decides what
faults exist: the ``tbf`` qdisc (token bucket) is the one used, since ``netem`` (delay, loss), classifiers and
iptables/nft are missing on our machines (``tc qdisc add ... netem``: "Specified qdisc kind is unknown"):

- :meth:`Link.cut`: both directions dropped (a tbf whose bucket holds no packet), the partition;
- :meth:`Link.cut_one_way`: only host -> namespace dropped (broker -> consumer), so the consumer's connections go
  half-open: its requests reach the broker, no answer comes back;
- :meth:`Link.throttle`: both directions limited to a rate (a slow link; no added delay or loss).

Needs root (``ip netns add``). :func:`unavailable` says why not, where it cannot work.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from types import TracebackType

#: The ``ip`` command (iproute2).
IP = shutil.which("ip") or "/usr/sbin/ip"
#: The ``tc`` command (iproute2).
TC = shutil.which("tc") or "/usr/sbin/tc"
#: Private /30 networks used for the links, 10.203.<n>.0/30.
SUBNET_PREFIX = "10.203"


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed; the message has its output."""


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)  # noqa: S603 (iproute2)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")


def unavailable() -> str:
    """Why :class:`Link` cannot work here ("" when it can): not root, no iproute2, or no tbf qdisc."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    try:
        with Link() as link:
            link.throttle(1000)
    except NetnsError as exc:
        return f"network namespaces or tc tbf do not work here: {exc}"
    return ""


class Link:
    """A namespace ``si-<tag>`` and a veth pair: ``host_ip`` on this host's side, ``ns_ip`` inside. A context manager
    that builds it on entry and deletes both on exit.

    Raises (on entry and from the fault methods):
        NetnsError: an ``ip``/``tc`` command failed.
    """

    def __init__(self, index: int | None = None) -> None:
        tag = uuid.uuid4().hex[:6]
        n = index if index is not None else int(tag, 16) % 250 + 1
        self.netns = f"si-{tag}"
        self.host_dev, self.ns_dev = f"si{tag}h", f"si{tag}n"
        self.host_ip, self.ns_ip = f"{SUBNET_PREFIX}.{n}.1", f"{SUBNET_PREFIX}.{n}.2"

    def __enter__(self) -> Link:
        _run(IP, "netns", "add", self.netns)
        try:
            _run(IP, "link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev)
            _run(IP, "link", "set", self.ns_dev, "netns", self.netns)
            _run(IP, "addr", "add", f"{self.host_ip}/30", "dev", self.host_dev)
            _run(IP, "link", "set", self.host_dev, "up")
            self._ns(IP, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_dev)
            self._ns(IP, "link", "set", self.ns_dev, "up")
            self._ns(IP, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Delete the veth pair and the namespace (whatever of them exists)."""
        with contextlib.suppress(NetnsError):
            _run(IP, "link", "del", self.host_dev)
        with contextlib.suppress(NetnsError):
            _run(IP, "netns", "del", self.netns)

    def _ns(self, *argv: str) -> None:
        _run(IP, "netns", "exec", self.netns, *argv)

    def _qdisc(self, inside: bool, *spec: str) -> None:
        dev = self.ns_dev if inside else self.host_dev
        prefix = (IP, "netns", "exec", self.netns) if inside else ()
        with contextlib.suppress(NetnsError):
            _run(*prefix, TC, "qdisc", "del", "dev", dev, "root")
        if spec:
            _run(*prefix, TC, "qdisc", "add", "dev", dev, "root", *spec)

    #: A token bucket that passes no full-size packet: a drop of everything sent that way.
    DROP = ("tbf", "rate", "8bit", "burst", "64", "limit", "1")

    def cut(self) -> None:
        """Drop everything, both ways (a partition)."""
        self._qdisc(False, *self.DROP)
        self._qdisc(True, *self.DROP)

    def cut_one_way(self) -> None:
        """Drop host -> namespace (broker -> consumer) only; namespace -> host passes."""
        self._qdisc(False, *self.DROP)
        self._qdisc(True)

    def throttle(self, kbit_s: int) -> None:
        """Limit both directions to ``kbit_s`` kbit/s (tbf: 32 KiB burst, 100 ms of queue)."""
        spec = ("tbf", "rate", f"{kbit_s}kbit", "burst", "32kb", "latency", "100ms")
        self._qdisc(False, *spec)
        self._qdisc(True, *spec)

    def heal(self) -> None:
        """Remove every fault: the link passes everything again."""
        self._qdisc(False)
        self._qdisc(True)
