"""Requests produced from outside the cluster while ``kubectl`` changes the Deployment, and the figures of each
change as the answers show them: the longest gap with no answer (append times on the results topic, which the
tests create with ``LogAppendTime``), counted from the change's start to its end.

The steps run in a thread (``kubectl`` blocks) while the producer sends at a steady rate; once they are done the
producer is stopped and only what the broker acknowledged is expected back (:func:`producer_tools.produce.send_all`'s
``on_acked``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.partitioner import DefaultPartitioner

from producer_tools.produce import Outgoing, digits_requests, send_all
from producer_tools.results import Report, collect

#: Partitions of the tests' requests topic (test_pod.py's ``deploy``).
PARTITIONS = 4


@dataclass(slots=True)
class Step:
    """One change: ``start``/``end`` (``time.time()``, s) bound the window its gap is measured in; ``action_s``
    is how long its kubectl commands took until the pods settled (s); ``note`` what was seen."""

    name: str
    start: float
    end: float = 0.0
    action_s: float = 0.0
    note: str = ""
    gap_s: float = field(default=float("nan"))
    partition_gap_s: float = field(default=float("nan"))
    latency_ms: float = field(default=float("nan"))


def longest_gap(times_s: list[float], start: float, end: float) -> float:
    """The longest wait between answers in ``[start, end]``, from ``start`` to the first one and from the last one
    to ``end`` included, s (``times_s`` sorted)."""
    inside = [t for t in times_s if start <= t <= end]
    return max(b - a for a, b in itertools.pairwise([start, *inside, end]))


def requests(heldout: Path) -> Iterator[Outgoing]:
    """The held-out digits over and over, each round under a run ID of its own (so every correlation ID is new)."""
    tag = uuid.uuid4().hex[:6]
    for round_ in itertools.count():
        yield from digits_requests(f"{tag}r{round_}", heldout)


async def under_load(
    bootstrap: str,
    topic: str,
    heldout: Path,
    steps: Callable[[], list[Step]],
    *,
    rate: float = 100.0,
    warmup_s: float = 4.0,
    tail_s: float = 4.0,
    most_s: float = 300.0,
) -> tuple[list[Outgoing], list[Step]]:
    """Send at ``rate`` records/s; after ``warmup_s`` run ``steps`` in a thread, keep sending ``tail_s`` more, then
    stop the producer. Returns what the broker acknowledged and the steps. Raises what a step raised (the producer
    stopped first); ``most_s`` bounds the records prepared (rate x most_s)."""
    acked: list[Outgoing] = []
    records = list(itertools.islice(requests(heldout), int(rate * most_s)))
    sending = asyncio.create_task(send_all(bootstrap, topic, records, rate=rate, progress=False, on_acked=acked.append))
    try:
        await asyncio.sleep(warmup_s)
        done = await asyncio.to_thread(steps)
        await asyncio.sleep(tail_s)
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
    if len(acked) >= len(records):
        raise AssertionError(f"the steps outlasted the {most_s:.0f} s of records prepared")
    return acked, done


def report_of(bootstrap: str, topics: dict[str, str], sent: list[Outgoing], exactly_once: bool) -> Report:
    """Read the answers to ``sent`` back (read_committed under exactly_once); 180 s at most, 5 s more for late
    duplicates."""
    expected = {r.correlation_id: r.manifest() for r in sent}
    return asyncio.run(
        collect(
            bootstrap,
            topics["results"],
            topics["dlq"],
            expected,
            180,
            progress=False,
            isolation_level="read_committed" if exactly_once else "read_uncommitted",
            settle_s=5,
        )
    )


def request_partition(correlation_id: str, partitions: int = PARTITIONS) -> int:
    """The requests topic's partition of a request: the producer's default partitioner (murmur2) on its key, the
    correlation ID (:func:`producer_tools.produce.send_all`)."""
    return int(DefaultPartitioner()(correlation_id.encode(), list(range(partitions)), list(range(partitions))))


def measure(report: Report, steps: list[Step]) -> str:
    """Fill in each step's figures from the answers' append times; one line per step: the longest gap with no
    answer at all, the longest on one request partition (a partition moved between members waits for its new
    owner), and the longest latency of a request sent during the step (request to answer, ms)."""
    answers = list(report.answers.values())
    times = sorted(a.timestamp_ms / 1000 for a in answers)
    per_partition: list[list[float]] = [[] for _ in range(PARTITIONS)]
    for a in answers:
        per_partition[request_partition(a.correlation_id)].append(a.timestamp_ms / 1000)
    for part in per_partition:
        part.sort()
    lines = []
    for step in steps:
        step.gap_s = longest_gap(times, step.start, step.end)
        step.partition_gap_s = max(longest_gap(t, step.start, step.end) for t in per_partition)
        step.latency_ms = max(
            (
                a.latency_ms
                for a in answers
                if a.latency_ms is not None
                and a.request_timestamp_ms is not None
                and step.start <= a.request_timestamp_ms / 1000 <= step.end
            ),
            default=float("nan"),
        )
        lines.append(
            f"  {step.name:<30} gap {step.gap_s:5.2f} s, one partition {step.partition_gap_s:5.2f} s, "
            f"max latency {step.latency_ms:6.0f} ms; kubectl..settled {step.action_s:5.1f} s; {step.note}"
        )
    return "\n".join(lines)


def clock() -> float:
    """Wall time, s: the results topic's append times are wall times too."""
    return time.time()
