"""The network scenarios of ``make faults``: the consumers run in their own network namespace, joined to the
broker by a veth link (:mod:`producer_tools.netns`), and the link fails under load.

As in :mod:`producer_tools.faults.cluster`, an at_least_once and an exactly_once group read one requests topic side
by side. A row passes when nothing is lost, the exactly-once results hold no duplicate, no consumer exited or needed
a restart, answers resumed within the cut plus :data:`producer_tools.faults.cluster.RESUME_BOUND_S` after it was
healed, and, during a cut, ``/readyz`` (probed from inside the namespace, as a kubelet does) turned 503 within
:data:`producer_tools.faults.harness.READY_BOUND_S`.

- ``net_partition``: both directions dropped for ``Plan.net_cut_s`` (30 s; longer than the 6 s session timeout, so
  the group coordinator drops both members), then healed.
- ``net_one_way``: only broker -> consumer dropped for ``Plan.net_cut_s``: the consumers' requests reach the broker
  and no answer comes back (half-open connections), then healed.
- ``net_slow``: the link limited to :data:`SLOW_KBIT_S` for ``Plan.net_cut_s``; the row prints the answers' p99
  latency and rate before (the same link unthrottled) and after; answers may queue for the throttle's length.

What our machines' kernel cannot do is not here: ``netem`` (added delay, random loss) and TCP resets (no iptables,
nft or ``ss -K``); see :mod:`producer_tools.netns`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

import numpy as np

from producer_tools.faults.cluster import RESUME_BOUND_S, Pair, run_pair
from producer_tools.faults.harness import READY_BOUND_S, Harness, Outcome, Plan, first_unready_s
from producer_tools.netns import Link
from producer_tools.results import Report

#: The slow link's rate, kbit/s. Both groups' traffic at the quick run's 150 records/s fits (p99 rises a little); at
#: the full run's 400 records/s it does not (measured: about 200 answers/s pass), so the link saturates, answers
#: queue behind it and none may be lost.
SLOW_KBIT_S = 2000


def link(h: Harness) -> Link:
    """The link between the harness's consumers and its broker."""
    assert h.link is not None, "network scenarios run on the harness's own link"
    return h.link


async def cut_and_heal(h: Harness, plan: Plan, pair: Pair, one_way: bool) -> tuple[str, bool]:
    """Cut the link for ``plan.net_cut_s`` while probing the at_least_once consumer's /readyz and /healthz every
    0.5 s, heal it, and wait until /readyz is 200 again. Returns the note and whether readiness told the truth.
    /healthz is reported, not judged: the group drops a member it cannot reach and its partitions are revoked, so
    the consumer holds no lag and stays live (a restart cannot mend the network)."""
    (link(h).cut_one_way if one_way else link(h).cut)()
    unready_after, unhealthy_after = await asyncio.gather(
        first_unready_s(pair.alo_proc, plan.net_cut_s), first_unready_s(pair.alo_proc, plan.net_cut_s, "/healthz")
    )
    link(h).heal()
    healed = time.monotonic()
    ready_again = math.nan
    while time.monotonic() - healed < 60:
        if await asyncio.to_thread(pair.alo_proc.is_ready):
            ready_again = time.monotonic() - healed
            break
        await asyncio.sleep(0.5)
    told = unready_after <= READY_BOUND_S and not math.isnan(ready_again)  # NaN compares False
    kind = "broker -> consumer dropped" if one_way else "both directions dropped"
    health = "stayed 200" if math.isnan(unhealthy_after) else f"503 after {unhealthy_after:.1f} s"
    note = (f"{kind} for {plan.net_cut_s:.0f} s; /readyz 503 after {unready_after:.1f} s (at most "
            f"{READY_BOUND_S:.0f}), 200 again {ready_again:.1f} s after healing; /healthz {health}")  # fmt: skip
    return note, told


async def scenario_net_partition(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        return await cut_and_heal(h, plan, pair, one_way=False)

    return await run_pair(h, plan, "net_partition", fault, bound_s=plan.net_cut_s + RESUME_BOUND_S)


async def scenario_net_one_way(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        return await cut_and_heal(h, plan, pair, one_way=True)

    return await run_pair(h, plan, "net_one_way", fault, bound_s=plan.net_cut_s + RESUME_BOUND_S)


def before_after(
    reports: list[Report], fault_ms: float, labels: tuple[str, str] = ("unthrottled", f"{SLOW_KBIT_S} kbit/s")
) -> str:
    """p99 latency and answer rate of requests sent before and after ``fault_ms`` (the at_least_once report),
    labelled ``labels``."""
    answers = list(reports[0].answers.values())
    parts = []
    for label, chosen in (
        (labels[0], [a for a in answers if (a.request_timestamp_ms or 0) < fault_ms]),
        (labels[1], [a for a in answers if (a.request_timestamp_ms or 0) >= fault_ms]),
    ):
        lat = [a.latency_ms for a in chosen if a.latency_ms is not None]
        stamps = sorted(a.timestamp_ms for a in chosen)
        span_s = (stamps[-1] - stamps[0]) / 1000 if len(stamps) > 1 else math.nan
        p99 = float(np.percentile(lat, 99)) if lat else math.nan
        parts.append(f"{label}: p99 {p99:.0f} ms, {(len(chosen) - 1) / span_s:.0f} answers/s")
    return "; ".join(parts)


async def scenario_net_slow(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        link(h).throttle(SLOW_KBIT_S)
        await asyncio.sleep(plan.net_cut_s)
        return f"link limited to {SLOW_KBIT_S} kbit/s each way", True

    try:
        return await run_pair(h, plan, "net_slow", fault, bound_s=plan.net_cut_s + RESUME_BOUND_S, extra=before_after)
    finally:
        link(h).heal()


NETWORK_SCENARIOS: dict[str, Callable[[Harness, Plan], Awaitable[Outcome]]] = {
    "net_partition": scenario_net_partition,
    "net_one_way": scenario_net_one_way,
    "net_slow": scenario_net_slow,
}
