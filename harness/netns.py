"""A network namespace joined to this host by a veth pair, for the network fault scenarios of ``make faults``.

The consumer runs inside the namespace (``ip netns exec``); the broker listens on the host side's address, so every
byte between them crosses the veth link, where faults are made with ``tc``. What this kernel offers decides what
faults exist: the ``tbf`` qdisc (token bucket) is the one used, since ``netem`` (delay, loss), classifiers and
iptables/nft are missing on our machines (``tc qdisc add ... netem``: "Specified qdisc kind is unknown"):

- :meth:`Link.cut`: both directions dropped (a tbf whose bucket holds no packet), the partition;
- :meth:`Link.cut_one_way`: only host -> namespace dropped (broker -> consumer), so the consumer's connections go
  half-open: its requests reach the broker, no answer comes back;
- :meth:`Link.throttle`: both directions limited to a rate (a slow link; no added delay or loss);
- :meth:`Link.impair`: added delay, jitter and random loss, both directions, made in user space by
  :mod:`harness.impair` (two TUN devices and a forwarder process, since netem is missing).

Needs root (``ip netns add``). :func:`unavailable` says why not, where it cannot work.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from types import TracebackType

from harness.impair import Counts, open_tun

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
    """Why :class:`Link` cannot work here ("" when it can): not root, no iproute2, no tbf qdisc or no TUN devices."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    try:
        with Link() as link:
            link.throttle(1000)
            link.impair(1.0, 0.0, 0.0)
            link.heal()
    except NetnsError as exc:
        return f"network namespaces or tc tbf do not work here: {exc}"
    except OSError as exc:
        return f"TUN devices (/dev/net/tun) do not work here: {exc}"
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
        self.host_tun, self.ns_tun = f"si{tag}a", f"si{tag}b"  # the impaired path's TUN devices (impair)
        self._forwarder: subprocess.Popen[str] | None = None

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
        """Stop any impairment, delete the veth pair and the namespace (whatever of them exists)."""
        self._stop_forwarder()
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

    def impair(self, delay_ms: float, jitter_ms: float, loss: float, seed: int = 0) -> None:
        """Add ``delay_ms`` +- ``jitter_ms`` (uniform, ms) and drop packets with probability ``loss`` (0 to 1), each
        way: the link's traffic is routed through two TUN devices and :mod:`harness.impair`'s forwarder.
        Open connections move onto the impaired path and back (:meth:`heal`); none is reset."""
        self._stop_forwarder()
        fds = [open_tun(self.host_tun), open_tun(self.ns_tun)]
        try:
            _run(IP, "link", "set", self.ns_tun, "netns", self.netns)
            _run(IP, "link", "set", self.host_tun, "up")
            self._ns(IP, "link", "set", self.ns_tun, "up")
            argv = [sys.executable, "-m", "harness.impair", "--fds", f"{fds[0]},{fds[1]}",
                    "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms), "--loss", str(loss),
                    "--seed", str(seed)]  # fmt: skip
            self._forwarder = subprocess.Popen(argv, pass_fds=fds, stdout=subprocess.PIPE, text=True)  # noqa: S603
            # A /32 each way, more specific than the veth's /30: both ends now reach each other through the TUNs.
            _run(IP, "route", "add", f"{self.ns_ip}/32", "dev", self.host_tun, "src", self.host_ip)
            self._ns(IP, "route", "add", f"{self.host_ip}/32", "dev", self.ns_tun, "src", self.ns_ip)
        except BaseException:
            self._stop_forwarder()
            raise
        finally:
            for fd in fds:
                os.close(fd)  # the forwarder holds its own copies; the devices go when it exits

    def _stop_forwarder(self) -> Counts | None:
        """Stop the impairment's forwarder (its devices and routes go with it); its packet counts, or None."""
        proc, self._forwarder = self._forwarder, None
        if proc is None:
            return None
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
        lines = out.strip().splitlines()
        return Counts(**json.loads(lines[-1])) if proc.returncode == 0 and lines else None

    def heal(self) -> Counts | None:
        """Remove every fault: the link passes everything again. Returns the impairment's packet counts (None when
        :meth:`impair` was not in effect)."""
        counts = self._stop_forwarder()
        self._qdisc(False)
        self._qdisc(True)
        return counts
