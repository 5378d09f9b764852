"""The fault harness's plumbing: the plan of a run, one row of the table, and :class:`Harness` (topics, consumers
as child processes, records, producing, reading answers back, committed offsets)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumer.oip.client import encode_request
from harness.localkafka import LocalBroker
from harness.netns import Link
from harness.process import ConsumerProcess
from harness.toxiproxy import Toxiproxy
from producer_tools.produce import DEFAULT_HELDOUT, Headers, Outgoing, send_all
from producer_tools.results import Report, collect
from producer_tools.topics import ensure_topics

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "digits" / "artifacts" / "digits.onnx"

#: Group timing for harness consumers: the broker's minimum session timeout, so a SIGKILLed dynamic member
#: is noticed quickly, ms.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000


@dataclass
class Outcome:
    """One row of the table."""

    scenario: str
    records: int
    lost: int
    duplicates: int
    dead_lettered: int
    ok: bool
    note: str = ""
    exactly_once: bool = False
    poison_missed: int = 0
    #: Lines printed under the table (the scale-step rows' figures per step).
    details: str = ""


@dataclass
class Plan:
    """Sizes of one run (``--quick`` for the test suite, the defaults for ``make faults``)."""

    records: int = 20_000
    kills: int = 10
    rate: float = 400.0  # records/s while faults happen
    outage_s: float = 40.0
    idle_s: float = 120.0  # how long the spare member waits without partitions before it takes over
    backlog: int = 1_000_000
    node_down_s: float = 10.0  # how long a killed cluster node stays down
    net_cut_s: float = 30.0  # how long the network scenarios cut the consumers' link
    step_rate: float = 2000.0  # records/s while the scale-step rows change the group
    step_settle_s: float = 8.0  # load after every partition answers again, before the next step, s
    #: Session timeout of the static-membership scale-step rows, ms: the manifests' (k8s/components/static-membership).
    static_session_ms: int = 45_000
    judge_steps: bool = True  # whether a missed scale-step target fails its row
    scenarios: list[str] = field(default_factory=list)


#: Most consumer log lines an outage and the recovery after it may write (the Kafka client alone wrote about
#: 10,900 a second before its records were rate-limited).
OUTAGE_LOG_LINES = 300


#: Longest a consumer cut off from the cluster may still answer /readyz 200, s (consumer/kafka/link.py: a check every
#: 5 s that fails after 5 s without an answer; plus the probe's own 0.5 s cadence and 1 s timeout).
READY_BOUND_S = 12.0


async def first_unready_s(proc: ConsumerProcess, seconds: float, path: str = "/readyz") -> float:
    """Probe ``proc``'s /readyz (or ``path``) every 0.5 s for ``seconds`` (a fault in progress); returns when it
    first failed, s from the start, or NaN if it never did."""
    started = time.monotonic()
    unready_after = math.nan
    while time.monotonic() - started < seconds:
        if math.isnan(unready_after) and not await asyncio.to_thread(proc.probe, path):
            unready_after = time.monotonic() - started
        await asyncio.sleep(0.5)
    return unready_after


def log_lines(path: Path) -> int:
    """Lines in ``path`` so far (0 when it does not exist yet)."""
    return len(path.read_text(errors="replace").splitlines()) if path.exists() else 0


def log_excerpt(path: Path, last: int = 25) -> str:
    """The last ``last`` WARNING / ERROR lines of a consumer's log (each cut to 240 characters; tracebacks left out),
    printed under a failed row so a CI log says what the consumer saw."""
    if not path.exists():
        return f"  ({path} is missing)"
    picked = [
        line[:240] for line in path.read_text(errors="replace").splitlines() if " WARNING " in line or " ERROR " in line
    ]
    return "\n".join(f"  {line}" for line in picked[-last:]) or "  (no warnings)"


QUICK = Plan(
    records=600, kills=3, rate=150.0, outage_s=8.0, idle_s=10.0, backlog=5_000, node_down_s=6.0, net_cut_s=15.0,
    step_rate=400.0, step_settle_s=2.0, static_session_ms=10_000, judge_steps=False,
)  # fmt: skip


# ------------------------------------------------------------------------------------------------ harness
class Harness:
    """Shared plumbing: topics, records, producing, collecting."""

    def __init__(
        self,
        bootstrap: str,
        work: Path,
        broker: LocalBroker | None,
        link: Link | None = None,
        toxiproxy: Toxiproxy | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.link = link  # the consumers' network namespace and its link to the broker; None: this host's network
        # The consumers' toxiproxy (their bootstrap is its first proxy), its proxies one per broker; None: direct.
        self.toxiproxy = toxiproxy
        routes = broker.proxy_routes() if broker is not None and toxiproxy is not None else []
        self.proxies = [f"kafka-{i}" for i in range(1, len(routes) + 1)]
        if toxiproxy is not None:
            for name, (listen, upstream) in zip(self.proxies, routes, strict=True):
                toxiproxy.proxy(name, listen, upstream)
        self.consumer_bootstrap = ",".join(listen for listen, _ in routes) or bootstrap
        self.work = work
        self.broker = broker
        data = np.load(DEFAULT_HELDOUT)
        self.x, self.y = data["x"], data["y"]
        self.consumers: list[ConsumerProcess] = []
        recorded = broker.recorded() if broker is not None else None
        self.replication = len(recorded.nodes) if recorded else 1

    async def new_topics(self, scenario: str, partitions: int = 4, dlq: bool = True) -> dict[str, str]:
        """Fresh requests and results topics (``partitions`` each) and a 1-partition dead-letter topic (unless
        ``dlq`` is False), replicated over every node of the harness's broker; results and dead letters carry the
        broker's append time (``LogAppendTime``), so gaps in the answers are measured on one clock."""
        tag = f"{scenario}-{uuid.uuid4().hex[:6]}"
        names = {"requests": f"{tag}.requests", "results": f"{tag}.results", "dlq": f"{tag}.requests.dlq"}
        wanted = {names["requests"]: partitions, names["results"]: partitions}
        if dlq:
            wanted[names["dlq"]] = 1
        append = {"message.timestamp.type": "LogAppendTime"}
        configs = {names["results"]: append, names["dlq"]: append}
        await ensure_topics(self.bootstrap, wanted, replication_factor=self.replication, configs=configs)
        return names

    def consumer(self, topics: dict[str, str], group: str, name: str, *extra: str) -> ConsumerProcess:
        """A consumer of ``group`` on ``topics`` (not started), its log ``<work>/<group>-<name>.log``; ``extra``: raw
        flags after the harness's settings."""
        settings = {
            "bootstrap_servers": self.consumer_bootstrap,
            "model_path": MODEL,
            "execution_provider": "cpu",
            "group_id": group,
            "requests_topic": topics["requests"],
            "results_topic": topics["results"],
            "dead_letter_topic": topics["dlq"],
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": HEARTBEAT_MS,
            "client_id": f"{group}-{name}",
            "warmup_runs": 1,
        }
        proc = ConsumerProcess(
            settings, self.work / f"{group}-{name}.log", extra_args=extra, netns=self.link.netns if self.link else ""
        )
        self.consumers.append(proc)
        return proc

    def digits(self, run: str, n: int) -> list[Outgoing]:
        """``n`` one-row requests cycling through the held-out digits, with unique correlation IDs."""
        return [self.digit(f"{run}-{i:07d}", i) for i in range(n)]

    def digit(self, cid: str, i: int) -> Outgoing:
        """One one-row request: held-out digit ``i`` (modulo their count), correlation ID ``cid``."""
        j = i % len(self.y)
        return Outgoing(cid, encode_request(cid, {"input": self.x[j : j + 1]}), label=int(self.y[j]))

    async def produce(
        self,
        topic: str,
        records: Sequence[Outgoing],
        rate: float | None = None,
        headers: Callable[[Outgoing], Headers] | None = None,
    ) -> None:
        """Send with acks=all, paced at ``rate`` records/s (``streaminfer-produce``'s own sender)."""
        await send_all(self.bootstrap, topic, records, rate, progress=False, headers=headers)

    async def produce_during(
        self, topic: str, run: str, rate: float, done: asyncio.Event, chunk_s: float = 2.0
    ) -> list[Outgoing]:
        """Send digits requests at ``rate`` records/s, ``chunk_s`` seconds' worth per producer, until ``done`` is
        set; returns every record sent (all acknowledged)."""
        sent: list[Outgoing] = []
        size = max(1, int(rate * chunk_s))
        while not done.is_set():
            chunk = [self.digit(f"{run}-{i:07d}", i) for i in range(len(sent), len(sent) + size)]
            await self.produce(topic, chunk, rate)
            sent += chunk
        return sent

    async def end_offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The end offset (records written so far) of each of ``topic``'s ``partitions``."""
        probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await probe.start()
        try:
            ends = await probe.end_offsets([TopicPartition(topic, p) for p in partitions])
            return {tp.partition: int(offset) for tp, offset in ends.items()}
        finally:
            await probe.stop()

    async def answers(
        self, topics: dict[str, str], records: Sequence[Outgoing], timeout_s: float, read_committed: bool = False
    ) -> Report:
        expected = {r.correlation_id: r.manifest() for r in records}
        return await collect(
            self.bootstrap,
            topics["results"],
            topics["dlq"],
            expected,
            timeout_s,
            progress=False,
            isolation_level="read_committed" if read_committed else "read_uncommitted",
            settle_s=2.0,
        )

    async def committed(self, group: str, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=group)
        await probe.start()
        try:
            return {tp: await probe.committed(tp) for tp in tps}
        finally:
            await probe.stop()

    def stop_all(self) -> None:
        for proc in self.consumers:
            proc.kill()


async def count_records(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (end minus beginning offsets over its partitions); 0 if it does not exist."""
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await probe.start()
    try:
        if topic not in await probe.topics():
            return 0
        probe.subscribe([topic])  # fetches the topic's metadata
        for _ in range(50):
            parts = probe.partitions_for_topic(topic)
            if parts:
                break
            await asyncio.sleep(0.1)
        tps = [TopicPartition(topic, p) for p in parts or ()]
        ends = await probe.end_offsets(tps)
        starts = await probe.beginning_offsets(tps)
        return sum(ends[tp] - starts[tp] for tp in tps)
    finally:
        await probe.stop()
