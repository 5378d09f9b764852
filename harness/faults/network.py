"""The network scenarios of ``make faults``: the consumers run in their own network namespace, joined to the
broker by a veth link (:mod:`harness.netns`), and the link fails under load.

As in :mod:`harness.faults.cluster`, an at_least_once and an exactly_once group read one requests topic side
by side, here with ``--stall-timeout-s`` :data:`NET_STALL_TIMEOUT_S` so that liveness has its say within a cut. A row
passes when nothing is lost, the exactly-once results hold no duplicate, no consumer exited or needed a restart,
and answers resumed within the cut plus :data:`harness.faults.cluster.RESUME_BOUND_S` after it was healed.
``/readyz`` and ``/healthz`` are probed every 0.5 s from inside the namespace, as a kubelet does:

- ``net_partition``: both directions dropped for ``Plan.net_cut_s`` (30 s; longer than the 6 s session timeout, so
  the group coordinator drops both members), then healed. During the cut ``/readyz`` must turn 503 within
  :data:`harness.faults.harness.READY_BOUND_S` and ``/healthz`` within :data:`HEALTH_BOUND_S` (the cluster
  silent for the stall timeout: ``consumer.app.StreamInferApp.liveness``); after healing both must be 200 again
  without a restart.
- ``net_one_way``: only broker -> consumer dropped for ``Plan.net_cut_s``: the consumers' requests reach the broker
  and no answer comes back (half-open connections), then healed; judged as ``net_partition``.
- ``net_slow``: the link limited to :data:`SLOW_KBIT_S` for ``Plan.net_cut_s``; the row prints the answers' p99
  latency and rate before (the same link unthrottled) and after; answers may queue for the throttle's length.
- ``net_lossy``: :data:`LOSSY_DELAY_MS` +- :data:`LOSSY_JITTER_MS` added each way and :data:`LOSSY_LOSS` of the
  packets dropped at random each way, for ``Plan.net_cut_s`` (user space, :mod:`harness.impair`, since the
  kernel has no netem). The row prints p99 latency and answer rate on the plain link and on the lossy one, and the
  packets dropped; ``/readyz`` and ``/healthz`` must stay 200 throughout (a lossy link is slow, not down).

TCP resets and added latency on the byte stream are toxiproxy's (:mod:`harness.faults.toxic`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

import numpy as np

from harness.faults.cluster import RESUME_BOUND_S, Pair, run_pair
from harness.faults.harness import READY_BOUND_S, Harness, Outcome, Plan, first_unready_s
from harness.netns import Link
from harness.process import ConsumerProcess
from producer_tools.results import Report

#: The slow link's rate, kbit/s. Both groups' traffic at the quick run's 150 records/s fits (p99 rises a little); at
#: the full run's 400 records/s it does not (measured: about 200 answers/s pass), so the link saturates, answers
#: queue behind it and none may be lost.
SLOW_KBIT_S = 2000


def link(h: Harness) -> Link:
    """The link between the harness's consumers and its broker."""
    assert h.link is not None, "network scenarios run on the harness's own link"
    return h.link


#: The consumers' ``stall_timeout_s`` in these scenarios, s: short enough for ``/healthz`` to fail within a cut.
NET_STALL_TIMEOUT_S = 5.0
#: Longest a consumer cut off from the cluster may still answer /healthz 200, s. The link check (every 5 s, 5 s
#: timeout) notices the cut within READY_BOUND_S, when the cluster has been silent for 10 s, more than the stall
#: timeout; the last fetch with records was at the cut, at least about 5 s earlier; one more probe (0.5 s) of slack.
HEALTH_BOUND_S = READY_BOUND_S + 1.0
#: The lossy link: one-way delay, its uniform jitter (ms) and the share of packets dropped each way.
LOSSY_DELAY_MS, LOSSY_JITTER_MS, LOSSY_LOSS = 50.0, 10.0, 0.01
#: Flags of both consumers in these scenarios.
NET_CONSUMER_ARGS = ("--stall-timeout-s", str(NET_STALL_TIMEOUT_S))


async def back_to_200(proc: ConsumerProcess, limit_s: float = 60.0) -> float:
    """Seconds until ``proc`` answers 200 on both /readyz and /healthz (probed every 0.5 s), or NaN after
    ``limit_s``."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if await asyncio.to_thread(proc.is_ready) and await asyncio.to_thread(proc.is_healthy):
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    return math.nan


async def first_failures(proc: ConsumerProcess, seconds: float) -> tuple[float, float]:
    """Probe ``proc``'s /readyz and /healthz every 0.5 s for ``seconds``: when each first failed, s (NaN: never)."""
    ready, health = await asyncio.gather(first_unready_s(proc, seconds), first_unready_s(proc, seconds, "/healthz"))
    return ready, health


async def cut_and_heal(h: Harness, plan: Plan, pair: Pair, one_way: bool) -> tuple[str, bool]:
    """Cut the link for ``plan.net_cut_s`` while probing the at_least_once consumer's /readyz and /healthz every
    0.5 s, heal it, and wait until both are 200 again. Returns the note and whether both probes told the truth:
    /readyz 503 within READY_BOUND_S and /healthz 503 within HEALTH_BOUND_S of the cut, both 200 after healing."""
    (link(h).cut_one_way if one_way else link(h).cut)()
    unready_after, unhealthy_after = await first_failures(pair.alo_proc, plan.net_cut_s)
    link(h).heal()
    ok_again = await back_to_200(pair.alo_proc)
    told = unready_after <= READY_BOUND_S and unhealthy_after <= HEALTH_BOUND_S and not math.isnan(ok_again)
    kind = "broker -> consumer dropped" if one_way else "both directions dropped"
    note = (f"{kind} for {plan.net_cut_s:.0f} s; /readyz 503 after {unready_after:.1f} s (at most "
            f"{READY_BOUND_S:.0f}), /healthz 503 after {unhealthy_after:.1f} s (at most {HEALTH_BOUND_S:.0f}; "
            f"stall timeout {NET_STALL_TIMEOUT_S:.0f} s); both 200 again {ok_again:.1f} s after healing, "
            "no restart")  # fmt: skip
    return note, told


async def scenario_net_partition(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        return await cut_and_heal(h, plan, pair, one_way=False)

    return await run_pair(
        h, plan, "net_partition", fault, bound_s=plan.net_cut_s + RESUME_BOUND_S, consumer_args=NET_CONSUMER_ARGS
    )


async def scenario_net_one_way(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        return await cut_and_heal(h, plan, pair, one_way=True)

    return await run_pair(
        h, plan, "net_one_way", fault, bound_s=plan.net_cut_s + RESUME_BOUND_S, consumer_args=NET_CONSUMER_ARGS
    )


def before_after(
    reports: list[Report],
    fault_ms: float,
    labels: tuple[str, str] = ("unthrottled", f"{SLOW_KBIT_S} kbit/s"),
    until_ms: float = math.inf,
) -> str:
    """p99 latency and answer rate of requests sent before ``fault_ms`` and from then until ``until_ms`` (the
    at_least_once report), labelled ``labels``."""
    answers = list(reports[0].answers.values())
    parts = []
    for label, chosen in (
        (labels[0], [a for a in answers if (a.request_timestamp_ms or 0) < fault_ms]),
        (labels[1], [a for a in answers if fault_ms <= (a.request_timestamp_ms or 0) < until_ms]),
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


async def scenario_net_lossy(h: Harness, plan: Plan) -> Outcome:
    healed_ms = [math.inf]

    async def fault(pair: Pair) -> tuple[str, bool]:
        link(h).impair(LOSSY_DELAY_MS, LOSSY_JITTER_MS, LOSSY_LOSS)
        try:
            unready_after, unhealthy_after = await first_failures(pair.alo_proc, plan.net_cut_s)
        finally:
            healed_ms[0] = time.time() * 1000
            counts = link(h).heal()
        held = math.isnan(unready_after) and math.isnan(unhealthy_after)  # both stayed 200 (NaN: never failed)
        dropped = f"{counts.lost} of {counts.total} packets dropped" if counts is not None else "counts missing"
        probes = ("/readyz and /healthz stayed 200" if held else
                  f"/readyz 503 after {unready_after:.1f} s, /healthz 503 after {unhealthy_after:.1f} s")  # fmt: skip
        return (f"{LOSSY_DELAY_MS:.0f} +- {LOSSY_JITTER_MS:.0f} ms each way and {LOSSY_LOSS:.0%} loss for "
                f"{plan.net_cut_s:.0f} s ({dropped}); {probes}"), held and counts is not None  # fmt: skip

    labels = ("plain link", f"{LOSSY_DELAY_MS:.0f} ms, {LOSSY_LOSS:.0%} loss")
    return await run_pair(
        h,
        plan,
        "net_lossy",
        fault,
        bound_s=plan.net_cut_s + RESUME_BOUND_S,
        extra=lambda reports, ms: before_after(reports, ms, labels, until_ms=healed_ms[0]),
        consumer_args=NET_CONSUMER_ARGS,
    )


NETWORK_SCENARIOS: dict[str, Callable[[Harness, Plan], Awaitable[Outcome]]] = {
    "net_partition": scenario_net_partition,
    "net_one_way": scenario_net_one_way,
    "net_slow": scenario_net_slow,
    "net_lossy": scenario_net_lossy,
}
