"""The stream-level network scenarios of ``make faults``: the consumers reach the broker through toxiproxy
(:mod:`harness.toxiproxy`; the broker's PROXIED listener advertises the proxy, so every connection they make
passes it), while the harness's producer and readers use the PLAINTEXT listener directly.

As in :mod:`harness.faults.cluster`, an at_least_once and an exactly_once group read one requests topic side
by side; a row passes on the same terms (nothing lost, no exactly-once duplicate, no exit or restart, answers
resumed within the bound).

- ``tcp_reset``: :data:`RESET_BURSTS` bursts of connection resets (toxiproxy's ``reset_peer``: every connection
  through the proxy closed with a TCP RST, new ones too, both directions) of :data:`RESET_S` each, every
  :data:`RESET_EVERY_S`, under load: produce requests, fetches, commits and transactions cut mid-flight.
- ``slow_link``: :data:`LATENCY_MS` +- :data:`JITTER_MS` added each way for ``Plan.net_cut_s``; the row prints the
  answers' p99 latency and rate before (no latency added) and during.

Packet loss is not among them: a stream proxy cannot drop packets (TCP would hide it), and this kernel has no
``netem`` (:mod:`harness.netns`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from harness.faults.cluster import RESUME_BOUND_S, Pair, run_pair
from harness.faults.harness import Harness, Outcome, Plan
from harness.faults.network import before_after
from harness.toxiproxy import Toxiproxy
from producer_tools.results import Report

RESET_BURSTS = 3
RESET_S = 2.0
RESET_EVERY_S = 6.0
#: Added each way on ``slow_link``, ms (a round trip then takes about 100 ms more).
LATENCY_MS = 50
JITTER_MS = 10


def toxiproxy(h: Harness) -> tuple[Toxiproxy, list[str]]:
    """The harness's toxiproxy and its proxies' names (one per broker)."""
    assert h.toxiproxy is not None, "toxic scenarios run on the harness's own proxied broker"
    return h.toxiproxy, h.proxies


def _add_everywhere(h: Harness, toxic: str, kind: str, attributes: dict[str, int]) -> None:
    server, names = toxiproxy(h)
    for name in names:
        for stream in ("upstream", "downstream"):
            server.add(name, f"{toxic}-{stream}", kind, stream, **attributes)


def _remove_everywhere(h: Harness, toxic: str) -> None:
    server, names = toxiproxy(h)
    for name in names:
        for stream in ("upstream", "downstream"):
            server.remove(name, f"{toxic}-{stream}")


async def add_everywhere(h: Harness, toxic: str, kind: str, **attributes: int) -> None:
    """Toxic ``kind`` on both directions of every proxy (the REST calls in a thread: they block)."""
    await asyncio.to_thread(_add_everywhere, h, toxic, kind, attributes)


async def remove_everywhere(h: Harness, toxic: str) -> None:
    """Remove what :func:`add_everywhere` added as ``toxic``."""
    await asyncio.to_thread(_remove_everywhere, h, toxic)


async def scenario_tcp_reset(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        for burst in range(RESET_BURSTS):
            if burst:
                await asyncio.sleep(RESET_EVERY_S - RESET_S)
            await add_everywhere(h, "reset", "reset_peer", timeout=0)
            await asyncio.sleep(RESET_S)
            await remove_everywhere(h, "reset")
        return (f"{RESET_BURSTS} bursts of TCP resets ({RESET_S:.0f} s each, every {RESET_EVERY_S:.0f} s) on every "
                f"consumer connection"), True  # fmt: skip

    return await run_pair(h, plan, "tcp_reset", fault)


async def scenario_slow_link(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        await add_everywhere(h, "latency", "latency", latency=LATENCY_MS, jitter=JITTER_MS)
        try:
            await asyncio.sleep(plan.net_cut_s)
        finally:
            await remove_everywhere(h, "latency")
        return f"{LATENCY_MS} +- {JITTER_MS} ms added each way for {plan.net_cut_s:.0f} s", True

    def figures(reports: list[Report], fault_ms: float) -> str:
        return before_after(reports, fault_ms, labels=("no latency added", f"+{LATENCY_MS} ms each way"))

    return await run_pair(h, plan, "slow_link", fault, bound_s=plan.net_cut_s + RESUME_BOUND_S, extra=figures)


TOXIC_SCENARIOS: dict[str, Callable[[Harness, Plan], Awaitable[Outcome]]] = {
    "tcp_reset": scenario_tcp_reset,
    "slow_link": scenario_slow_link,
}
