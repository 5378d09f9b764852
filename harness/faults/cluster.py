"""The cluster scenarios of ``make faults``: a node of a local 3-node KRaft cluster (replication factor 3,
``min.insync.replicas=2``, :class:`harness.localkafka.LocalBroker` with ``nodes=3``) dies or restarts under
load, as production clusters' nodes do all the time.

Each runs two consumers side by side on one requests topic, so one fault hits both delivery modes: an
``at_least_once`` group writing to one results topic and an ``exactly_once`` group writing to another (read back
``read_committed``). Records are produced at ``Plan.rate`` records/s (``acks=all``) from before the fault until
after it. A row passes when nothing is lost in either mode, the exactly-once results hold no duplicate, no consumer
exited, and answers stopped for at most :data:`RESUME_BOUND_S` (the longest gap between consecutive answers' append
times on the results topics, from the fault on).

- ``leader_kill``: SIGKILL the leader of the busiest requests partition (most records so far), bring it back after
  ``Plan.node_down_s``.
- ``rolling_restart``: restart every node in turn (SIGTERM, a controlled shutdown), waiting after each until no
  partition is under-replicated, as an operator's rolling restart does.
- ``txn_broker_kill``: SIGKILL the transaction coordinator of the exactly-once group's busiest partition while its
  transactions are open (one per micro-batch, so one is open almost all the time under load), bring it back after
  ``Plan.node_down_s``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient

from consumer.config import Settings
from harness.faults.harness import Harness, Outcome, Plan, count_records, log_excerpt
from harness.localkafka import LocalBroker
from harness.process import ConsumerProcess
from producer_tools.produce import Outgoing
from producer_tools.results import Report

#: Longest answers may stop for when one node dies or restarts, s. The controllers fence a dead node after the
#: cluster's broker session timeout (4 s, harness.localkafka.broker.CLUSTER_SESSION_TIMEOUT_MS) and move its
#: partitions' leadership; the consumers' fetches, produces and commits then fail over once their clients have
#: refreshed metadata, and the group coordinator may move too (the group's members rejoin).
RESUME_BOUND_S = 20.0
#: Seconds of load before the fault and after the cluster is whole again.
LOAD_MARGIN_S = 5.0


@dataclass
class Pair:
    """The two consumers of a cluster scenario and their topics (``topics``: at_least_once, ``eos``)."""

    topics: dict[str, str]
    eos: dict[str, str]
    alo_proc: ConsumerProcess
    eos_proc: ConsumerProcess
    eos_group: str


async def start_pair(h: Harness, name: str, *extra: str) -> Pair:
    """Topics and both consumers of scenario ``name``, started (ready); ``extra``: flags for both consumers."""
    topics = await h.new_topics(name)
    eos = await h.new_topics(f"{name}-eos")
    eos["requests"] = topics["requests"]  # one requests topic, read by both groups
    tag = uuid.uuid4().hex[:6]
    alo_proc = h.consumer(topics, f"{name}-alo-{tag}", "m0", *extra)
    eos_group = f"{name}-eos-{tag}"
    eos_proc = h.consumer(eos, eos_group, "m0", "--delivery", "exactly_once", *extra)
    await asyncio.gather(asyncio.to_thread(alo_proc.start), asyncio.to_thread(eos_proc.start))
    return Pair(topics, eos, alo_proc, eos_proc, eos_group)


def cluster(h: Harness) -> LocalBroker:
    """The harness's broker, which these scenarios stop and kill nodes of."""
    assert h.broker is not None, "cluster scenarios run on the harness's own cluster"
    return h.broker


async def busiest_partition(h: Harness, topic: str) -> tuple[int, int]:
    """(partition, its leader's node ID) of the ``topic`` partition with the most records so far."""
    parts = await asyncio.to_thread(cluster(h).partitions)
    leaders = {p: leader for (t, p), (leader, _, _) in parts.items() if t == topic}
    ends = await h.end_offsets(topic, sorted(leaders))
    partition = max(ends, key=lambda p: (ends[p], -p))
    return partition, leaders[partition]


async def transaction_coordinator(bootstrap: str, transactional_id: str) -> int:
    """The node ID of ``transactional_id``'s transaction coordinator (FindCoordinator, key type 1)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="streaminfer-faults")
    await admin.start()
    try:
        return int(await admin.find_coordinator(transactional_id, coordinator_type=1))
    finally:
        await admin.close()


def longest_stall_s(reports: list[Report], since_ms: float) -> float:
    """The longest gap between consecutive answers (append times on the results topics, ms) from ``since_ms`` on,
    counting the wait from ``since_ms`` to the first answer after it, s; infinite when a report has no answer after
    it."""
    worst = 0.0
    for report in reports:
        stamps = sorted(a.timestamp_ms for a in report.answers.values() if a.timestamp_ms >= since_ms)
        if not stamps:
            return math.inf
        gaps = [stamps[0] - since_ms] + [b - a for a, b in itertools.pairwise(stamps)]
        worst = max(worst, max(gaps) / 1000)
    return worst


async def run_pair(
    h: Harness,
    plan: Plan,
    name: str,
    fault: Callable[[Pair], Awaitable[tuple[str, bool]]],
    bound_s: float = RESUME_BOUND_S,
    extra: Callable[[list[Report], float], str] | None = None,
    consumer_args: Sequence[str] = (),
) -> Outcome:
    """Start both consumers (with ``consumer_args``), produce under load, run ``fault`` (it returns the row's note on
    what it did and whether its own checks held), keep the load on for :data:`LOAD_MARGIN_S`, then read both results
    topics back and judge the row: answers may stall at most ``bound_s``; ``extra`` adds figures from both reports
    (and the fault's time, ms) to the note."""
    pair = await start_pair(h, name, *consumer_args)
    done = asyncio.Event()
    sending = asyncio.create_task(h.produce_during(pair.topics["requests"], name, plan.rate, done))
    await asyncio.sleep(LOAD_MARGIN_S)
    fault_ms = time.time() * 1000
    what, held = await fault(pair)
    await asyncio.sleep(LOAD_MARGIN_S)
    done.set()
    records: list[Outgoing] = await sending
    written = await count_records(h.bootstrap, pair.topics["requests"])  # the idempotent producer wrote each once
    alo = await h.answers(pair.topics, records, timeout_s=120)
    eos = await h.answers(pair.eos, records, timeout_s=120, read_committed=True)
    alive = [p.returncode is None for p in (pair.alo_proc, pair.eos_proc)]
    codes = [pair.alo_proc.terminate()[0], pair.eos_proc.terminate()[0]]
    stall = longest_stall_s([alo, eos], fault_ms)
    lost = len(alo.missing) + len(eos.missing)
    ok = (held and lost == 0 and eos.duplicates == 0 and all(alive) and codes == [0, 0] and stall <= bound_s
          and written == len(records))  # fmt: skip
    if not ok:
        for label, proc, report, code in (
            ("at_least_once", pair.alo_proc, alo, codes[0]),
            ("exactly_once", pair.eos_proc, eos, codes[1]),
        ):
            if report.missing or code != 0 or (label == "exactly_once" and report.duplicates):
                print(
                    f"{name}: {label} consumer's last warnings ({proc.log}):\n{log_excerpt(proc.log)}", file=sys.stderr
                )
    if extra is not None:
        what += "; " + extra([alo, eos], fault_ms)
    note = (
        f"{what}; {written} requests written for {len(records)} sent; answers stalled at most {stall:.1f} s "
        f"(bound {bound_s:.0f}); lost at_least_once "
        f"{len(alo.missing)} exactly_once {len(eos.missing)}; duplicates at_least_once {alo.duplicates}; exits {codes}"
    )
    return Outcome(name, len(records), lost, eos.duplicates, alo.dead_letters + eos.dead_letters, ok, note,
                   exactly_once=True)  # fmt: skip


async def scenario_leader_kill(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        partition, node = await busiest_partition(h, pair.topics["requests"])
        await asyncio.to_thread(cluster(h).pause, node, kill=True)
        await asyncio.sleep(plan.node_down_s)
        started = time.monotonic()
        await asyncio.to_thread(cluster(h).resume, node)
        return (f"SIGKILL of node {node} (leader of requests partition {partition}), down {plan.node_down_s:.0f} s, "
                f"back in {time.monotonic() - started:.1f} s"), True  # fmt: skip

    return await run_pair(h, plan, "leader_kill", fault)


async def scenario_rolling_restart(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        broker = cluster(h)
        recorded = broker.recorded()
        took = []
        for node in recorded.nodes if recorded else []:
            started = time.monotonic()
            await asyncio.to_thread(broker.restart, node.node_id)
            await asyncio.to_thread(broker.wait_in_sync, 120.0)
            took.append(f"{time.monotonic() - started:.0f}")
        return f"nodes restarted one by one (SIGTERM), each back in sync after {'/'.join(took)} s", True

    return await run_pair(h, plan, "rolling_restart", fault)


async def scenario_txn_broker_kill(h: Harness, plan: Plan) -> Outcome:
    async def fault(pair: Pair) -> tuple[str, bool]:
        partition, _ = await busiest_partition(h, pair.topics["requests"])
        prefix = Settings.model_fields["transactional_id_prefix"].default
        tid = f"{prefix}-{pair.eos_group}-{pair.topics['requests']}-{partition}"
        node = await transaction_coordinator(h.bootstrap, tid)
        await asyncio.to_thread(cluster(h).pause, node, kill=True)
        await asyncio.sleep(plan.node_down_s)
        await asyncio.to_thread(cluster(h).resume, node)
        return f"SIGKILL of node {node} (transaction coordinator of {tid}), down {plan.node_down_s:.0f} s", True

    return await run_pair(h, plan, "txn_broker_kill", fault)


CLUSTER_SCENARIOS: dict[str, Callable[[Harness, Plan], Awaitable[Outcome]]] = {
    "leader_kill": scenario_leader_kill,
    "rolling_restart": scenario_rolling_restart,
    "txn_broker_kill": scenario_txn_broker_kill,
}
