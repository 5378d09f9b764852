"""``python -m harness.faults``: the scenario registry, the table, the run and the command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from harness.faults.cluster import CLUSTER_SCENARIOS
from harness.faults.harness import MODEL, QUICK, Harness, Outcome, Plan
from harness.faults.network import NETWORK_SCENARIOS
from harness.faults.rollout import ROLLOUT_SCENARIOS
from harness.faults.scenarios import (
    scenario_backlog,
    scenario_compression_bomb,
    scenario_dlq_missing,
    scenario_graceful,
    scenario_idle_takeover,
    scenario_kill9,
    scenario_outage,
    scenario_poison,
    scenario_rebalance,
    scenario_slow_model,
)
from harness.faults.steps import STEP_SCENARIOS
from harness.faults.toxic import TOXIC_SCENARIOS
from harness.localkafka import LocalBroker
from harness.netns import Link, unavailable
from harness.toxiproxy import Toxiproxy, ToxiproxyUnavailable

SCENARIOS: dict[str, Callable[[Harness, Plan], Awaitable[Outcome]]] = {
    "kill9": scenario_kill9,
    "exactly_once": lambda h, p: scenario_kill9(h, p, exactly_once=True),
    "rebalance": scenario_rebalance,
    "idle_takeover": scenario_idle_takeover,
    "outage": scenario_outage,
    "dlq_missing": scenario_dlq_missing,
    "poison": scenario_poison,
    "graceful": scenario_graceful,
    "slow_model": scenario_slow_model,
    "backlog": scenario_backlog,
    "compression_bomb": scenario_compression_bomb,
    **STEP_SCENARIOS,
    **ROLLOUT_SCENARIOS,
    **CLUSTER_SCENARIOS,
    **NETWORK_SCENARIOS,
    **TOXIC_SCENARIOS,
}


def table(outcomes: Sequence[Outcome]) -> str:
    """The result table and the summary line."""
    lines = [f"{'scenario':<14}{'records':>9}{'lost':>6}{'duplicates':>12}{'dead_lettered':>15}  outcome"]
    for o in outcomes:
        lines.append(
            f"{o.scenario:<14}{o.records:>9}{o.lost:>6}{o.duplicates:>12}{o.dead_lettered:>15}  "
            f"{'ok' if o.ok else 'FAILED'}  {o.note}"
        )
    lost = sum(o.lost for o in outcomes)
    dup_eos = sum(o.duplicates for o in outcomes if o.exactly_once)
    missed = sum(o.poison_missed for o in outcomes)
    lines.append(
        f"faults: scenarios={len(outcomes)} lost={lost} duplicates_exactly_once={dup_eos} poison_missed={missed}"
    )
    lines += [o.details for o in outcomes if o.details]
    return "\n".join(lines)


async def run(plan: Plan, bootstrap: str | None, work: Path) -> list[Outcome]:
    """Run the chosen scenarios on a private broker (or ``bootstrap``), the cluster scenarios on a private 3-node
    cluster and the network scenarios on a private broker behind a veth link, each started when the first scenario
    that needs it runs (the cluster and network ones are skipped with ``bootstrap``; the network ones also where
    :func:`harness.netns.unavailable` says why); returns the rows."""
    broker = None
    if bootstrap is None:
        broker = LocalBroker(work / "kafka")
        bootstrap = await asyncio.to_thread(broker.start, discard_stale=True)
    harnesses = {"single": Harness(bootstrap, work, broker)}
    links: list[Link] = []
    proxies: list[Toxiproxy] = []
    no_netns: str | None = None  # why the network scenarios cannot run here ("": they can), once asked
    no_toxiproxy = ""  # why the toxic scenarios cannot run here, once a start failed
    outcomes: list[Outcome] = []
    try:
        for name in plan.scenarios or list(SCENARIOS):
            print(f"faults: running {name} ...", file=sys.stderr)
            kind = _kind(name)
            if kind == "network" and no_netns is None:  # asked once: it builds and deletes a namespace
                no_netns = await asyncio.to_thread(unavailable)
            why = no_netns if kind == "network" and no_netns else no_toxiproxy if kind == "toxic" else ""
            if kind != "single" and (broker is None or why):
                reason = why or "the brokers are not ours to break"
                outcomes.append(Outcome(name, 0, 0, 0, 0, True, f"skipped: {reason}"))
                continue
            try:
                if kind not in harnesses:
                    harnesses[kind] = await asyncio.to_thread(_private_harness, kind, work, links, proxies)
                outcome = await SCENARIOS[name](harnesses[kind], plan)
            except ToxiproxyUnavailable as exc:
                no_toxiproxy = str(exc)
                outcome = Outcome(name, 0, 0, 0, 0, True, f"skipped: {exc}")
            except Exception as exc:  # noqa: BLE001 (a broken scenario is a failed row, not a crash)
                outcome = Outcome(name, 0, 0, 0, 0, False, f"error: {exc!r}"[:200])
            finally:
                for harness in harnesses.values():
                    harness.stop_all()
            outcomes.append(outcome)
            print(table([outcome]).splitlines()[1], file=sys.stderr)
            if outcome.details:
                print(outcome.details, file=sys.stderr)
    finally:
        for harness in harnesses.values():
            harness.stop_all()
            if harness.broker is not None:
                await asyncio.to_thread(harness.broker.stop)
        for link in links:
            link.close()
        for proxy in proxies:
            proxy.close()
    return outcomes


def _kind(name: str) -> str:
    """Which harness a scenario runs on: "single", "cluster", "network" or "toxic"."""
    if name in CLUSTER_SCENARIOS:
        return "cluster"
    if name in NETWORK_SCENARIOS:
        return "network"
    return "toxic" if name in TOXIC_SCENARIOS else "single"


def _private_harness(kind: str, work: Path, links: list[Link], proxies: list[Toxiproxy]) -> Harness:
    """A harness on its own 3-node cluster ("cluster"), on its own broker behind a new veth link ("network"; the
    link is appended to ``links`` for the caller to close), or on its own broker whose consumers pass toxiproxy
    ("toxic"; the server is appended to ``proxies``).

    Raises:
        ToxiproxyUnavailable: "toxic", and toxiproxy cannot be built or started.
    """
    if kind == "cluster":
        nodes = LocalBroker(work / "cluster", nodes=3)
        return Harness(nodes.start(discard_stale=True), work, nodes)
    if kind == "toxic":
        server = Toxiproxy(work / "toxiproxy.log")  # first: a build that fails starts no broker
        proxies.append(server)
        proxied = LocalBroker(work / "toxicbroker", proxied=True)
        return Harness(proxied.start(discard_stale=True), work, proxied, toxiproxy=server)
    link = Link().__enter__()
    links.append(link)
    broker = LocalBroker(work / "netbroker", hosts=[link.host_ip])
    return Harness(broker.start(discard_stale=True), work, broker, link)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m harness.faults``; exit 1 when any scenario failed."""
    p = argparse.ArgumentParser(
        prog="streaminfer-faults", description="Fault injection against a real broker, with the figures (make faults)."
    )
    p.add_argument("--quick", action="store_true", help="small sizes (the test suite's run)")
    p.add_argument("--records", type=int, help="records per scenario")
    p.add_argument("--kills", type=int, help="SIGKILLs in kill9 and exactly_once")
    p.add_argument("--backlog", type=int, help="records waiting in the backlog scenario")
    p.add_argument("--outage-s", type=float, help="seconds the broker is down")
    p.add_argument("--node-down-s", type=float, help="seconds a killed cluster node stays down")
    p.add_argument("--net-cut-s", type=float, help="seconds the network scenarios cut the link")
    p.add_argument("--idle-s", type=float, help="seconds the spare member idles in idle_takeover")
    p.add_argument("--step-rate", type=float, help="records/s of the scale-step rows (steps_*)")
    p.add_argument("--step-settle-s", type=float, help="seconds of load after each scale step has recovered")
    p.add_argument("--static-session-ms", type=int, help="session timeout of the static steps_* rows, ms")
    p.add_argument("--scenarios", default="", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--bootstrap-servers", default=None, help="use this broker (no outage and no cluster scenarios)")
    p.add_argument("--work-dir", type=Path, default=None, help="logs and broker state (default: a temp folder)")
    args = p.parse_args(argv)
    plan = Plan(**vars(QUICK)) if args.quick else Plan()
    for name in (
        "records", "kills", "backlog", "outage_s", "idle_s", "node_down_s", "net_cut_s", "step_rate", "step_settle_s",
        "static_session_ms",
    ):  # fmt: skip
        if getattr(args, name) is not None:
            setattr(plan, name, getattr(args, name))
    plan.scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(plan.scenarios) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios: {sorted(unknown)}")
    if not MODEL.exists():
        p.error(f"{MODEL} is missing: run `make model`")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="streaminfer-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    outcomes = asyncio.run(run(plan, args.bootstrap_servers, work))
    print(table(outcomes))
    print(f"faults: logs in {work}", file=sys.stderr)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
