"""Delay, jitter and random loss on a link, in user space: what ``tc qdisc ... netem`` does, for kernels without it.

Our machines' kernel has no ``netem`` qdisc (``tc qdisc add ... netem``: "Specified qdisc kind is unknown") and no
netfilter queue, but it has TUN devices. So :meth:`harness.netns.Link.impair` opens two of them, one on each
side of the link, moves one into the consumers' namespace and routes the link's two addresses through them (a
``/32`` route each way, more specific than the veth's ``/30``). Every IP packet between the two ends is then read by
the forwarder process of this module, which

- drops it with probability ``loss`` (independent per packet, like netem's ``loss random``), or
- writes it out of the other device after ``delay_ms`` +- ``jitter_ms`` (uniform), in order: a packet never
  overtakes the one before it in its direction (like netem with a ``rate``; TCP sees late packets, not reordered
  ones).

Stopping the forwarder closes both devices, the kernel deletes them and their routes, and traffic is back on the
veth link: the TCP connections that crossed the impaired path carry on, as after a real link repair.

Run as ``python -m harness.impair --fds A,B --delay-ms D --jitter-ms J --loss P`` with the two open TUN file
descriptors inherited (``pass_fds``); on SIGTERM it prints one JSON line of packet counts (:class:`Counts`) and exits
0. :func:`open_tun` makes a device.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

#: ``TUNSETIFF`` (``linux/if_tun.h``): attach the open ``/dev/net/tun`` to a named device, creating it.
TUNSETIFF = 0x400454CA
#: Layer-3 device, no packet-information prefix: each read and write is one bare IP packet.
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
#: Largest packet read at once, bytes (the devices' MTU is 1500; the kernel segments before a TUN device).
READ_BYTES = 65_536
#: Most packets read from one device before the queues are served again.
READ_BURST = 256
#: Longest the forwarder waits for a packet before it looks whether it was told to stop, s.
IDLE_WAIT_S = 0.2


def open_tun(name: str) -> int:
    """Create TUN device ``name`` (at most 15 characters) in this process's network namespace and return its open
    file descriptor (non-blocking). The device lives while the descriptor is open.

    Raises:
        OSError: no ``/dev/net/tun``, not root, or the name is taken.
    """
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class Counts:
    """Packets the forwarder saw, per direction (``a_to_b``: read from the first descriptor, written to the second)."""

    passed: dict[str, int] = field(default_factory=lambda: {"a_to_b": 0, "b_to_a": 0})
    dropped: dict[str, int] = field(default_factory=lambda: {"a_to_b": 0, "b_to_a": 0})

    @property
    def total(self) -> int:
        """Packets read, both directions."""
        return sum(self.passed.values()) + sum(self.dropped.values())

    @property
    def lost(self) -> int:
        """Packets dropped, both directions."""
        return sum(self.dropped.values())


class Impairment:
    """The forwarder between two TUN descriptors: loss, then a delay queue per direction.

    Args:
        fds: the two open TUN descriptors (non-blocking).
        delay_ms: added one-way delay, ms.
        jitter_ms: the delay varies uniformly by up to this much either way, ms (clamped at 0 ms).
        loss: probability that a packet is dropped, 0 to 1, per packet and direction.
        rng: the random source (seeded by the caller, so a run can be repeated).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        fds: tuple[int, int],
        delay_ms: float,
        jitter_ms: float,
        loss: float,
        rng: random.Random,
        clock: collections.abc.Callable[[], float] = time.monotonic,
    ) -> None:
        self.fds = fds
        self.delay_s, self.jitter_s, self.loss = delay_ms / 1000, jitter_ms / 1000, loss
        self.rng = rng
        self.clock = clock
        self.counts = Counts()
        # Per source descriptor: (due time, packet) in the order read, and the latest due time so far.
        self.queues: dict[int, collections.deque[tuple[float, bytes]]] = {fd: collections.deque() for fd in fds}
        self.last_due = dict.fromkeys(fds, 0.0)

    def direction(self, source: int) -> str:
        """``a_to_b`` for packets read from the first descriptor, ``b_to_a`` for the second."""
        return "a_to_b" if source == self.fds[0] else "b_to_a"

    def other(self, fd: int) -> int:
        """The descriptor at the other end from ``fd``."""
        return self.fds[1] if fd == self.fds[0] else self.fds[0]

    def take(self, source: int, packet: bytes, now: float) -> None:
        """One packet read from ``source`` at ``now``: dropped, or queued for the other side."""
        way = self.direction(source)
        if self.rng.random() < self.loss:
            self.counts.dropped[way] += 1
            return
        delay = max(0.0, self.delay_s + self.rng.uniform(-self.jitter_s, self.jitter_s))
        due = max(now + delay, self.last_due[source])  # never ahead of the packet before it
        self.last_due[source] = due
        self.queues[source].append((due, packet))

    def due(self, now: float) -> list[tuple[int, bytes]]:
        """(destination descriptor, packet) for every queued packet due by ``now``, removed from the queues."""
        out = []
        for source, queue in self.queues.items():
            while queue and queue[0][0] <= now:
                out.append((self.other(source), queue.popleft()[1]))
                self.counts.passed[self.direction(source)] += 1
        return out

    def wait_s(self, now: float) -> float:
        """How long until the next queued packet is due, s (at most :data:`IDLE_WAIT_S`, so a stop is seen)."""
        heads = [queue[0][0] for queue in self.queues.values() if queue]
        return max(0.0, min(min(heads) - now, IDLE_WAIT_S)) if heads else IDLE_WAIT_S

    def serve(self, running: collections.abc.Callable[[], bool]) -> None:
        """Forward until ``running()`` is False: read what is ready, write what is due."""
        while running():
            try:
                ready, _, _ = select.select(list(self.fds), [], [], self.wait_s(self.clock()))
            except InterruptedError:  # pragma: no cover (PEP 475 retries; kept for signals on old kernels)
                continue
            for fd in ready:
                for _ in range(READ_BURST):
                    try:
                        packet = os.read(fd, READ_BYTES)
                    except BlockingIOError:
                        break
                    self.take(fd, packet, self.clock())
            for target, packet in self.due(self.clock()):
                try:
                    os.write(target, packet)
                except OSError:  # the device is going away, or its queue is full: the packet is lost
                    self.counts.dropped[self.direction(self.other(target))] += 1


def main(argv: Sequence[str] | None = None) -> int:
    """Forward between the inherited descriptors until SIGTERM, then print the counts as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m harness.impair", description=__doc__.split("\n")[0])
    parser.add_argument("--fds", required=True, help="the two inherited TUN descriptors, A,B")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added, ms")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="uniform variation of the delay, +- ms")
    parser.add_argument("--loss", type=float, default=0.0, help="probability a packet is dropped, 0 to 1")
    parser.add_argument("--seed", type=int, default=0, help="random seed (loss and jitter)")
    args = parser.parse_args(argv)
    a, b = (int(x) for x in args.fds.split(","))
    if not 0.0 <= args.loss <= 1.0 or args.delay_ms < 0 or args.jitter_ms < 0:
        parser.error("--loss must be in [0, 1] and --delay-ms, --jitter-ms >= 0")
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    rng = random.Random(args.seed)  # noqa: S311 (fault injection, not cryptography)
    impairment = Impairment((a, b), args.delay_ms, args.jitter_ms, args.loss, rng)
    impairment.serve(lambda: not stop)
    print(json.dumps(asdict(impairment.counts)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
