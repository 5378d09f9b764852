"""The scale-step scenarios of ``make faults`` (issue 28): how long a group stops answering while it changes.

A group of digits consumers serves an open-loop load (``Plan.step_rate`` records/s spread evenly over
:data:`PARTITIONS` request partitions) while it goes through four steps, one after the other::

    scale_out   a second member starts and joins                          (1 -> 2 members)
    kill9       that member is SIGKILLed and started again at once        (its container restarted in place)
    rolling     every member replaced in turn
    scale_in    the second member gets SIGTERM                            (2 -> 1 members)

One row per delivery mode and membership, ``steps_<alo|eos>_<membership>``:

- ``dynamic``: no ``group.instance.id``; rolling as a Deployment rolls (maxSurge 1: a new pod starts and is ready,
  then the old one gets SIGTERM).
- ``static``: what the manifests do (``k8s/base/deployment.yaml``): ``group.instance.id`` = the pod's name, which a
  container restarted in place keeps, and ``leave_group_on_shutdown`` (a SIGTERMed member leaves at once); rolling
  as a Deployment rolls (new pods, new names).
- ``statefulset`` (exactly_once only): the alternative the manifests did not take: ``group.instance.id`` = a stable
  slot name, no leave on shutdown (KIP-345's behaviour); rolling as a StatefulSet rolls (SIGTERM, then the member
  started again with its name). Its scale-in waits for the session timeout: the trade-off, measured.

Heartbeats every :data:`HEARTBEAT_MS` (the manifests' ``STREAMINFER_HEARTBEAT_INTERVAL_MS``: a member learns of a
rebalance at its next heartbeat); session timeout :data:`~harness.faults.harness.SESSION_TIMEOUT_MS` for dynamic
members (the broker's least: a SIGKILLed member is noticed soon), ``Plan.static_session_ms`` (the manifests') for
static ones.

A reader with ``isolation.level=read_committed`` (an exactly-once answer exists only once its transaction commits)
notes when it *receives* each answer; every request carries its partition and number in its correlation ID. For
every step, from the moment it begins until the group has answered on every partition again and
``Plan.step_settle_s`` more:

- **gap**: the longest time in which no answer at all arrived, s;
- **partition gap**: the longest time one request partition went without an answer (a surviving member's own
  partitions hide the others' stall), s, and which partition;
- **p99**: the 99th percentile latency (receipt - request timestamp) of the requests sent during the step (but its
  last :data:`P99_TAIL_S`, which the next step delays), ms;
- **rebalances**: assignments the members that stayed through the step received (``streaminfer_rebalances_total``):
  0 means no partition moved.

A ``steady`` line before the first step gives the figures of the undisturbed group. Lost and duplicates are counted
as in the other rows once the load stops. The quick run asserts only lost = 0 and no exactly-once duplicate and
prints the figures; the full run also judges the targets of :func:`target_s` (a missed one fails the row, its note
says which).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import REQUEST_TIMESTAMP_HEADER
from consumer.oip.client import encode_request
from harness.faults.harness import SESSION_TIMEOUT_MS, Harness, Outcome, Plan, log_excerpt
from harness.process import ConsumerProcess

#: Request (and results) partitions of the scale-step topics.
PARTITIONS = 8
#: Ticks of the open-loop producer per second: each sends the records due since the last one.
TICKS_PER_S = 50
#: Undisturbed load before the first step, s.
STEADY_S = 4.0
#: Longest a step waits for every partition to answer again before the next step begins anyway, s (beyond the
#: session timeout the step may have to wait out).
SETTLE_LIMIT_S = 30.0
#: How long the reader may take to receive every answer once the load stopped, s.
DRAIN_S = 60.0
#: The steps, in the order they run.
STEPS = ("scale_out", "kill9", "rolling", "scale_in")
#: Slack over a restart's own duration that a static member's restart may stop its partitions for, s: one
#: transaction window and one fetch of the reader.
RESTART_SLACK_S = 2.0
#: Slack over the session timeout for a member that leaves without a word (kill -9; static scale-in), s.
SESSION_SLACK_S = 5.0
#: The last part of a step whose requests the p99 leaves out: the next step's stall delays them, s.
P99_TAIL_S = 1.0
#: The members' heartbeat interval: the manifests' STREAMINFER_HEARTBEAT_INTERVAL_MS (a manifest test checks), ms.
HEARTBEAT_MS = 500
#: The memberships of the rows (see the module docstring).
MEMBERSHIPS = ("dynamic", "static", "statefulset")


@dataclass
class Figures:
    """What one step cost (see the module docstring)."""

    step: str
    gap_s: float
    partition_gap_s: float
    partition: int
    p99_ms: float
    #: None: no member stayed through the step (a rolling restart replaces them all).
    rebalances: int | None
    #: How long the step's action took (a restart: from the signal until the member was ready again), s.
    action_s: float = 0.0
    #: The target the full run judges the partition gap against, s (None: no target).
    target_s: float | None = None
    met: bool = True

    def line(self) -> str:
        target = "" if self.target_s is None else f"  <= {self.target_s:.1f} s {'met' if self.met else 'MISSED'}"
        return (
            f"{self.step:<10}{self.gap_s:>8.2f}{self.partition_gap_s:>11.2f} (p{self.partition}){self.p99_ms:>9.0f}"
            f"{'-' if self.rebalances is None else self.rebalances:>6}{self.action_s:>8.1f}{target}"
        )


HEADER = f"{'step':<10}{'gap_s':>8}{'part_gap_s':>11}     {'p99_ms':>9}{'rebal':>6}{'act_s':>8}"


def target_s(delivery: str, membership: str, step: str, session_s: float, action_s: float) -> float | None:
    """The longest partition gap issue 28 allows ``step`` (None: no target), s.

    Members that leave with a word (dynamic, static): scaling out, in and a rolling restart within 1 s
    (at_least_once) or 2 s (exactly_once). A dynamic member's kill -9 within the session timeout +
    :data:`SESSION_SLACK_S`; a static member's (it restarts with its id) within the restart itself (``action_s``) +
    :data:`RESTART_SLACK_S`, moving no partition. A StatefulSet's restarts (kill -9, rolling) likewise; its
    scale-in within the session timeout + :data:`SESSION_SLACK_S`.
    """
    quick = 1.0 if delivery == "at_least_once" else 2.0
    if membership == "statefulset":
        if step in ("kill9", "rolling"):
            return action_s + RESTART_SLACK_S
        return session_s + SESSION_SLACK_S if step == "scale_in" else None
    if step == "kill9":
        return action_s + RESTART_SLACK_S if membership == "static" else session_s + SESSION_SLACK_S
    return quick


class Load:
    """Open-loop digits requests at ``rate`` records/s, spread evenly over :data:`PARTITIONS` partitions, one
    producer batch per partition and tick; correlation ID ``<tag>-<partition>-<n>`` (n counts per partition)."""

    def __init__(self, bootstrap: str, topic: str, rate: float, tag: str, values: list[bytes]) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._rate = rate
        self._tag = tag
        self._values = values
        self.sent = [0] * PARTITIONS
        self._turn = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Send until :meth:`stop`; return once the broker acknowledged everything sent.

        Raises:
            aiokafka.errors.KafkaError: a batch was not written.
        """
        producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap, acks="all", enable_idempotence=True, client_id="streaminfer-steps"
        )
        await producer.start()
        try:
            started = time.monotonic()
            pending: list[asyncio.Future[object]] = []
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self._rate) - sum(self.sent)
                if due > 0:
                    base, extra = divmod(due, PARTITIONS)
                    for k in range(PARTITIONS):  # the remainder's partitions take turns
                        partition = (self._turn + k) % PARTITIONS
                        if n := base + (1 if k < extra else 0):
                            pending += await self._send(producer, partition, n)
                    self._turn = (self._turn + extra) % PARTITIONS
                for done in [f for f in pending if f.done()]:
                    done.result()
                pending = [f for f in pending if not f.done()]
                await asyncio.sleep(1.0 / TICKS_PER_S)
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    async def _send(self, producer: AIOKafkaProducer, partition: int, n: int) -> list[asyncio.Future[object]]:
        futures = []
        now_ms = int(time.time() * 1000)
        batch = producer.create_batch()
        for _ in range(n):
            number = self.sent[partition]
            cid = f"{self._tag}-{partition}-{number}".encode()
            value = self._values[(number * PARTITIONS + partition) % len(self._values)]
            while batch.append(key=cid, value=value, timestamp=now_ms, headers=[(CORRELATION_HEADER, cid)]) is None:
                futures.append(await producer.send_batch(batch, self._topic, partition=partition))
                batch = producer.create_batch()
            self.sent[partition] += 1
        if batch.record_count():
            futures.append(await producer.send_batch(batch, self._topic, partition=partition))
        return futures


@dataclass
class Receipts:
    """When each answer arrived (``time.time()`` s), per request partition, and each first answer's latency."""

    times: list[list[float]] = field(default_factory=lambda: [[] for _ in range(PARTITIONS)])
    #: (request timestamp ms, latency ms) of every first answer.
    latencies: list[tuple[int, float]] = field(default_factory=list)
    seen: list[set[int]] = field(default_factory=lambda: [set() for _ in range(PARTITIONS)])
    duplicates: int = 0
    dead_letters: int = 0


#: Called with (request partition, request number, receipt time s, the result's value) for each first result.
OnResult = Callable[[int, int, float, bytes], None]


class Reader:
    """Reads the results and dead-letter topics (``read_committed``) from the start and notes every receipt
    (``on_result``: also hands each first result to it)."""

    def __init__(self, bootstrap: str, topics: dict[str, str], tag: str, on_result: OnResult | None = None) -> None:
        self._bootstrap = bootstrap
        self._topics = topics
        self._prefix = f"{tag}-".encode()
        self._on_result = on_result
        self.receipts = Receipts()
        self._stop = asyncio.Event()
        self.updated = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=50,
            client_id="streaminfer-steps-reader",
        )
        await consumer.start()
        r = self.receipts
        try:
            tps = [TopicPartition(self._topics["results"], p) for p in range(PARTITIONS)]
            tps.append(TopicPartition(self._topics["dlq"], 0))
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while not self._stop.is_set():
                fetched = await consumer.getmany(timeout_ms=50, max_records=20_000)
                now = time.time()
                for tp, records in fetched.items():
                    for rec in records:
                        headers = dict(rec.headers)
                        cid = headers.get(CORRELATION_HEADER, b"")
                        if not cid.startswith(self._prefix):
                            continue
                        _, partition_text, number_text = cid.rsplit(b"-", 2)
                        partition, number = int(partition_text), int(number_text)
                        r.times[partition].append(now)
                        if number in r.seen[partition]:
                            r.duplicates += 1
                            continue
                        r.seen[partition].add(number)
                        if tp.topic == self._topics["dlq"]:
                            r.dead_letters += 1
                        elif self._on_result is not None:
                            self._on_result(partition, number, now, rec.value)
                        request_ms = headers.get(REQUEST_TIMESTAMP_HEADER)
                        if request_ms:
                            r.latencies.append((int(request_ms), now * 1000 - int(request_ms)))
                if fetched:
                    self.updated.set()
        finally:
            await consumer.stop()


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest wait between receipts in ``[start, end)``, counting from ``start`` to the first one and from the
    last one to ``end``, s. ``times`` is sorted. (A step ends once every partition answered again and some more, so
    a stall that crosses ``end`` belongs to the next step.)"""
    left = int(np.searchsorted(times, start, side="left"))
    right = int(np.searchsorted(times, end, side="left"))
    points = [start, *times[left:right], end]
    return max(b - a for a, b in itertools.pairwise(points))


def figures(
    receipts: Receipts, step: str, start: float, end: float, rebalances: int | None, action_s: float
) -> Figures:
    """The figures of the step that ran from ``start`` to ``end`` (``time.time()`` s)."""
    per_partition = [sorted(t) for t in receipts.times]
    merged = sorted(t for times in per_partition for t in times)
    gaps = [longest_gap(t, start, end) for t in per_partition]
    worst = int(np.argmax(gaps))
    latencies = [lat for sent_ms, lat in receipts.latencies if start * 1000 <= sent_ms < (end - P99_TAIL_S) * 1000]
    p99 = float(np.percentile(latencies, 99)) if latencies else math.nan
    return Figures(step, longest_gap(merged, start, end), gaps[worst], worst, p99, rebalances, action_s)


def rebalances_of(proc: ConsumerProcess) -> int:
    """``streaminfer_rebalances_total`` of a running consumer (-1 when it cannot be read)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return -1
    for line in text.splitlines():
        if line.startswith("streaminfer_rebalances_total "):
            return int(float(line.split()[-1]))
    return -1


class Group:
    """The members of one row, started and stopped as Kubernetes would (see the module docstring)."""

    def __init__(
        self, h: Harness, topics: dict[str, str], group: str, delivery: str, membership: str, session_ms: int
    ) -> None:
        self._h = h
        self._topics = topics
        self._group = group
        self._delivery = delivery
        self.membership = membership
        self._session_ms = session_ms
        self.members: list[ConsumerProcess] = []
        self.retired: list[ConsumerProcess] = []
        #: Exit codes of the members stopped with SIGTERM so far.
        self.exits: list[int] = []
        self._made = 0

    def new(self, slot: int) -> ConsumerProcess:
        """A new member (a new pod) for ``slot``, not started: static, ``group.instance.id`` = its pod name;
        statefulset, ``member-<slot>``."""
        name = f"m{self._made}"
        self._made += 1
        extra = ["--delivery", self._delivery]
        if self.membership == "static":
            extra += ["--group-instance-id", f"{self._group}-{name}"]
        elif self.membership == "statefulset":
            extra += ["--group-instance-id", f"{self._group}-{slot}", "--no-leave-group-on-shutdown"]
        proc = self._h.consumer(self._topics, self._group, name, *extra)
        proc.settings["session_timeout_ms"] = self._session_ms
        proc.settings["heartbeat_interval_ms"] = HEARTBEAT_MS
        return proc

    async def start(self, proc: ConsumerProcess) -> None:
        await asyncio.to_thread(proc.start)

    async def stop(self, proc: ConsumerProcess) -> None:
        """SIGTERM and wait for the exit (its code is judged at the end)."""
        code, _ = await asyncio.to_thread(proc.terminate)
        self.exits.append(code)


async def _until(reader: Reader, done: Callable[[], bool], limit_s: float) -> bool:
    """Wait until ``done()`` (checked whenever the reader received answers), at most ``limit_s``; returns it."""
    deadline = time.monotonic() + limit_s
    while not done() and (remaining := deadline - time.monotonic()) > 0:
        reader.updated.clear()
        try:
            await asyncio.wait_for(reader.updated.wait(), remaining)
        except TimeoutError:
            break
    return done()


async def _settle(reader: Reader, since: float, settle_s: float, limit_s: float) -> None:
    """Wait until every partition answered after ``since`` (``time.time()``), at most ``limit_s``; then
    ``settle_s`` more."""
    times = reader.receipts.times
    await _until(reader, lambda: all(t and t[-1] > since for t in times), limit_s)
    await asyncio.sleep(settle_s)


async def wind_down(load: Load, sending: asyncio.Task[None], reader: Reader, reading: asyncio.Task[None]) -> float:
    """Stop the load, wait for its last acknowledgements, let the reader receive every answer (at most
    :data:`DRAIN_S`) and any late duplicate (2 s), stop it; returns when the load stopped (``time.time()`` s).

    Raises:
        aiokafka.errors.KafkaError: the load's last batch was not written (the reader is stopped all the same).
    """
    load.stop()
    ended = time.time()
    try:
        await sending
    finally:
        expected = sum(load.sent)
        await _until(reader, lambda: sum(len(s) for s in reader.receipts.seen) >= expected, DRAIN_S)
        await asyncio.sleep(2.0)  # late duplicates
        reader.stop()
        await reading
    return ended


def tally(group: Group, load: Load, reader: Reader) -> tuple[list[bool], list[int], int]:
    """After :func:`wind_down`: whether each current member was still running, every member's exit code (the
    current ones SIGTERMed now) and how many requests got no answer at all."""
    alive = [p.returncode is None for p in group.members]
    codes = group.exits + [p.terminate()[0] for p in group.members]
    lost = sum(load.sent) - sum(len(s) for s in reader.receipts.seen)
    return alive, codes, lost


#: What a step's action hands back: the members whose rebalances count (their count before it, or after their own
#: restart), the rebalances counted already (None: none watched), how long the action took (s).
Watched = tuple[dict[ConsumerProcess, int], int | None, float]


#: One step's mark: (step, start ``time.time()`` s, rebalances of the stayers or None, action s).
Mark = tuple[str, float, int | None, float]


def rows_of(receipts: Receipts, marks: list[Mark], ended: float, judge: Callable[[Figures], None]) -> list[Figures]:
    """One :class:`Figures` row per mark, in order: a step's window runs from its start to the next mark's start
    (the last one's to ``ended``, ``time.time()`` s). ``judge`` sets ``target_s`` and ``met`` on every row but
    ``steady``'s (the baseline, judged by nothing)."""
    rows: list[Figures] = []
    bounds = [m[1] for m in marks[1:]] + [ended]
    for (label, start, moved, action_s), end in zip(marks, bounds, strict=True):
        f = figures(receipts, label, start, end, moved, action_s)
        if label != "steady":
            judge(f)
        rows.append(f)
    return rows


async def scenario_steps(h: Harness, plan: Plan, delivery: str, membership: str) -> Outcome:
    """One row: ``delivery`` ("at_least_once" or "exactly_once") with one of :data:`MEMBERSHIPS`."""
    mode = "alo" if delivery == "at_least_once" else "eos"
    name = f"steps_{mode}_{membership}"
    session_ms = SESSION_TIMEOUT_MS if membership == "dynamic" else plan.static_session_ms
    topics = await h.new_topics(name, partitions=PARTITIONS)
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    group = Group(h, topics, tag, delivery, membership, session_ms)
    x = h.x.astype(np.float32)
    values = [encode_request(None, {"input": x[i : i + 1]}) for i in range(len(x))]
    load = Load(h.bootstrap, topics["requests"], plan.step_rate, tag, values)
    reader = Reader(h.bootstrap, topics, tag)
    first = group.new(0)
    await group.start(first)
    group.members = [first]
    reading = asyncio.create_task(reader.run())
    sending = asyncio.create_task(load.run())
    marks: list[Mark] = []  # (step, start, rebalances of the stayers, action s)
    session_s = session_ms / 1000

    def baseline(procs: list[ConsumerProcess]) -> dict[ConsumerProcess, int]:
        return {p: rebalances_of(p) for p in procs}

    async def step(label: str, action: Callable[[], Awaitable[Watched]]) -> None:
        """Run ``action``, wait for every partition to answer again, count the rebalances the watched members
        received since their baseline."""
        started = time.time()
        watched, moved, action_s = await action()
        await _settle(reader, time.time(), plan.step_settle_s, SETTLE_LIMIT_S + session_s)
        if watched:
            moved = (moved or 0) + sum(max(0, rebalances_of(p) - n) for p, n in watched.items())
        marks.append((label, started, moved, action_s))

    async def scale_out() -> Watched:
        watched = baseline(group.members)
        joiner = group.new(1)
        t = time.monotonic()
        await group.start(joiner)
        group.members.append(joiner)
        return watched, None, time.monotonic() - t

    async def kill9() -> Watched:
        watched = baseline(group.members[:1])
        victim = group.members[1]
        t = time.monotonic()
        victim.kill()
        await group.start(victim)  # the container restarted in place: the same pod (and instance id)
        return watched, None, time.monotonic() - t

    async def rolling() -> Watched:
        longest = 0.0
        watched = baseline(group.members)
        moved: int | None = 0 if membership == "statefulset" else None
        for slot, old in enumerate(list(group.members)):
            t = time.monotonic()
            if membership == "statefulset":  # the pod goes, then comes back with its name
                moved = (moved or 0) + max(0, rebalances_of(old) - watched[old])  # while the others restarted
                await group.stop(old)
                await group.start(old)
                watched[old] = rebalances_of(old)  # its own first assignment
            else:  # a Deployment (maxSurge 1, maxUnavailable 0): the new pod is ready before the old one goes
                new = group.new(slot)
                await group.start(new)
                await group.stop(old)
                group.retired.append(old)
                group.members[slot] = new
            longest = max(longest, time.monotonic() - t)
        return (watched if membership == "statefulset" else {}), moved, longest

    async def scale_in() -> Watched:
        leaver = group.members.pop()
        watched = baseline(group.members)
        t = time.monotonic()
        await group.stop(leaver)
        group.retired.append(leaver)
        return watched, None, time.monotonic() - t

    failure = ""
    try:
        await asyncio.sleep(STEADY_S)
        marks.append(("steady", time.time() - STEADY_S + 1.0, 0, 0.0))
        for label, action in zip(STEPS, (scale_out, kill9, rolling, scale_in), strict=True):
            await step(label, action)
    except RuntimeError as exc:  # a member that did not start
        failure = f"error: {exc}"
    finally:
        ended = await wind_down(load, sending, reader, reading)
    alive, codes, lost = tally(group, load, reader)
    r = reader.receipts

    def judge(f: Figures) -> None:
        f.target_s = target_s(delivery, membership, f.step, session_s, f.action_s)
        restart = f.step == "kill9" or (f.step == "rolling" and membership == "statefulset")
        moved_ok = membership == "dynamic" or not restart or not f.rebalances
        f.met = moved_ok and (f.target_s is None or f.partition_gap_s <= f.target_s)

    rows = rows_of(r, marks, ended, judge)
    missed = [f.step for f in rows if not f.met]
    judged = plan.judge_steps and not failure
    ok = (lost == 0 and (r.duplicates == 0 or delivery == "at_least_once") and all(alive)
          and all(c == 0 for c in codes) and not failure and not (judged and missed))  # fmt: skip
    summary = "; ".join(f"{f.step} {f.gap_s:.1f}/{f.partition_gap_s:.1f} s p99 {f.p99_ms:.0f} ms" for f in rows)
    members = f"{membership} (session {session_s:.0f} s, heartbeat {HEARTBEAT_MS / 1000:g} s)"
    note = (
        f"{delivery}, {members}, {plan.step_rate:.0f} rec/s on {PARTITIONS} partitions; gap/partition gap: "
        f"{summary}; exits {codes}"
    )
    if missed:
        note += f"; targets missed: {', '.join(missed)}" + ("" if judged else " (not judged)")
    if failure:
        note = f"{failure}; {note}"
    details = "\n".join([f"{name}: {members}, {delivery}", "  " + HEADER, *("  " + f.line() for f in rows)])
    if not ok:
        for proc in group.members + group.retired:
            print(f"{name}: {proc.log}:\n{log_excerpt(proc.log)}", file=sys.stderr)
    dups = r.duplicates
    return Outcome(name, sum(load.sent), lost, dups, r.dead_letters, ok, note,
                   exactly_once=delivery == "exactly_once", details=details)  # fmt: skip


STEP_SCENARIOS: dict[str, Callable[[Harness, Plan], Awaitable[Outcome]]] = {
    "steps_alo_dynamic": lambda h, p: scenario_steps(h, p, "at_least_once", "dynamic"),
    "steps_eos_dynamic": lambda h, p: scenario_steps(h, p, "exactly_once", "dynamic"),
    "steps_alo_static": lambda h, p: scenario_steps(h, p, "at_least_once", "static"),
    "steps_eos_static": lambda h, p: scenario_steps(h, p, "exactly_once", "static"),
    "steps_eos_statefulset": lambda h, p: scenario_steps(h, p, "exactly_once", "statefulset"),
}
