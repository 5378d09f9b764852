"""``make soak`` / ``python -m harness.soak``: the consumer under steady load for minutes, watched for slow leaks.

One consumer (digits, default settings) on fresh topics. The maximum is measured first (a backlog of
``--max-records`` drained: results / (last append - first append)); then an open loop sends at ``--rate``
records/s (default: half that maximum) for ``--minutes``, from pre-encoded one-row requests, one producer batch per
partition and tick, so the load generator stays cheap beside the consumer on a small machine. Every
``--sample-s`` seconds it records the consumer's RSS and open file descriptors (psutil), its asyncio task count
(``streaminfer_asyncio_tasks``) and metric series (sample lines of ``/metrics``), and the p99 latency of the results
appended in that window (result append time - request timestamp, both set by the broker's clock). It prints a table,
writes ``soak.json`` and ``soak.png`` under ``--out``, and ends with::

    soak: minutes=M rss_growth_pct=G fds_growth=F tasks_growth=T p99_ms_first=A p99_ms_last=B lost=L

Growth is the last sample against the baseline: the first sample at or after one minute (or half the run when it is
shorter), since the first minute is warm-up (allocator arenas, the client's buffers, the first fetches).
``p99_ms_first`` is the p99 of the baseline's window, ``p99_ms_last`` that of the last window. ``lost``: requests
sent without a result or dead letter once the consumer has had ``--drain-s`` to catch up. Targets (issue "network
and soak"): RSS growth <= 5 %, fds and tasks flat, p99 last within 1.5x of first, lost 0; they are printed, not
asserted here.

Exit codes: 0 the soak ran and lost nothing; 1 records were lost or the consumer died; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import REQUEST_TIMESTAMP_HEADER
from consumer.oip.client import encode_request
from harness.bench.data import digits_backlog, digits_rows
from harness.bench.measure import PARTITIONS, new_topics, throughput
from harness.process import ConsumerProcess
from harness.scrape import metric_families
from producer_tools.produce import send_all

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "digits" / "artifacts" / "digits.onnx"
#: Ticks of the open-loop producer per second: each sends the records due since the last one.
TICKS_PER_S = 20


@dataclass
class Sample:
    """One ``--sample-s`` window: where it ends (s since the load began), the consumer's state then, and the
    latency of the results appended during it."""

    t_s: float
    rss_mib: float
    fds: int
    tasks: int
    series: int
    results: int
    p99_ms: float


@dataclass
class Soak:
    """What a soak measured."""

    minutes: float
    rate: float
    max_rps: float
    sent: int = 0
    answered: int = 0
    samples: list[Sample] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return max(0, self.sent - self.answered)

    def baseline(self) -> Sample:
        """The first sample at or after one minute (half the run when it is shorter)."""
        start = min(60.0, self.minutes * 30.0)
        return next((s for s in self.samples if s.t_s >= start), self.samples[-1])

    def summary(self) -> dict[str, float]:
        """The summary line's figures (NaN without samples)."""
        if not self.samples:
            return dict.fromkeys(
                ("rss_growth_pct", "fds_growth", "tasks_growth", "p99_ms_first", "p99_ms_last"), math.nan
            )
        base, last = self.baseline(), self.samples[-1]
        windows = [s for s in self.samples if s.results > 0 and s.t_s >= base.t_s]
        return {
            "rss_growth_pct": 100.0 * (last.rss_mib - base.rss_mib) / base.rss_mib,
            "fds_growth": last.fds - base.fds,
            "tasks_growth": last.tasks - base.tasks,
            "p99_ms_first": windows[0].p99_ms if windows else math.nan,
            "p99_ms_last": windows[-1].p99_ms if windows else math.nan,
        }

    def line(self) -> str:
        """``soak: minutes=M rss_growth_pct=G fds_growth=F tasks_growth=T p99_ms_first=A p99_ms_last=B lost=L``"""
        s = self.summary()
        return (
            f"soak: minutes={self.minutes:g} rss_growth_pct={s['rss_growth_pct']:.1f} fds_growth={s['fds_growth']:g} "
            f"tasks_growth={s['tasks_growth']:g} p99_ms_first={s['p99_ms_first']:.1f} "
            f"p99_ms_last={s['p99_ms_last']:.1f} lost={self.lost}"
        )


def scrape(port: int) -> tuple[int, int]:
    """(metric series, asyncio tasks) from the consumer's ``/metrics``: the number of samples, and
    ``streaminfer_asyncio_tasks`` (-1 when it is not exported)."""
    samples = [s for family in metric_families(port) for s in family.samples]
    tasks = next((s.value for s in samples if s.name == "streaminfer_asyncio_tasks"), None)
    return len(samples), int(tasks) if tasks is not None else -1


class OpenLoop:
    """Sends one-row digits requests at ``rate`` records/s, a producer batch per partition per tick."""

    def __init__(self, bootstrap: str, topic: str, rate: float, tag: str) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._rate = rate
        self._tag = tag
        x = digits_rows()
        self._values = [encode_request(None, {"input": x[i : i + 1]}) for i in range(len(x))]
        self.sent = 0

    async def run(self, seconds: float) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, acks="all", client_id="streaminfer-soak")
        await producer.start()
        try:
            started = time.monotonic()
            pending: list[asyncio.Future[object]] = []
            while (elapsed := time.monotonic() - started) < seconds:
                due = int(elapsed * self._rate) - self.sent
                for partition in range(PARTITIONS):
                    share = due // PARTITIONS + (1 if partition < due % PARTITIONS else 0)
                    if share:
                        pending += await self._send(producer, partition, share)
                for done in [f for f in pending if f.done()]:
                    done.result()  # raises on a failed batch
                pending = [f for f in pending if not f.done()]
                await asyncio.sleep(1.0 / TICKS_PER_S)
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    async def _send(self, producer: AIOKafkaProducer, partition: int, n: int) -> list[asyncio.Future[object]]:
        """``n`` records to ``partition``, in as few producer batches as their size allows (``max_batch_size``)."""
        futures = []
        now_ms = int(time.time() * 1000)
        batch = producer.create_batch()
        for _ in range(n):
            cid = f"{self._tag}-{self.sent}".encode()
            value = self._values[self.sent % len(self._values)]
            while batch.append(key=cid, value=value, timestamp=now_ms, headers=[(CORRELATION_HEADER, cid)]) is None:
                if batch.record_count() == 0:
                    raise RuntimeError(f"a request of {len(value)} bytes does not fit an empty producer batch")
                futures.append(await producer.send_batch(batch, self._topic, partition=partition))
                batch = producer.create_batch()
            self.sent += 1
        if batch.record_count():
            futures.append(await producer.send_batch(batch, self._topic, partition=partition))
        return futures


class Reader:
    """Reads the results and dead-letter topics from the start: distinct correlation IDs, and per window the
    latencies of results appended in it."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self._bootstrap = bootstrap
        self._topics = topics
        self.ids: set[bytes] = set()
        self.window: list[float] = []
        #: Set after every fetch that returned records.
        self.updated = asyncio.Event()
        self._stop = asyncio.Event()

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(self._topics["results"], p) for p in range(PARTITIONS)]
            tps.append(TopicPartition(self._topics["dlq"], 0))
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while not self._stop.is_set():
                for recs in (await consumer.getmany(timeout_ms=200, max_records=10_000)).values():
                    for r in recs:
                        headers = dict(r.headers)
                        self.ids.add(headers.get(CORRELATION_HEADER, b""))
                        request_ms = headers.get(REQUEST_TIMESTAMP_HEADER)
                        if r.topic == self._topics["results"] and request_ms:
                            self.window.append(r.timestamp - int(request_ms))
                    self.updated.set()
        finally:
            await consumer.stop()

    def take_window(self) -> list[float]:
        window, self.window = self.window, []
        return window

    def stop(self) -> None:
        self._stop.set()


async def measure_max(bootstrap: str, consumer: ConsumerProcess, topics: dict[str, str], n: int) -> float:
    """Records/s the consumer answers when ``n`` requests wait for it (results topic append times)."""
    from harness.bench.measure import read_results

    await send_all(bootstrap, topics["requests"], digits_backlog(f"max-{uuid.uuid4().hex[:6]}", n), progress=False)
    stamps = await read_results(bootstrap, topics["results"], n, timeout_s=120)
    if len(stamps) < n:
        raise RuntimeError(f"only {len(stamps)} of {n} backlog records answered; log: {consumer.log}")
    return throughput(stamps)


def consumer_on(bootstrap: str, topics: dict[str, str], group: str, log: Path) -> ConsumerProcess:
    """A digits consumer (CPU, default settings) on ``topics`` in a fresh group named after ``group`` (not started)."""
    return ConsumerProcess(
        {
            "bootstrap_servers": bootstrap,
            "model_path": MODEL,
            "execution_provider": "cpu",
            "requests_topic": topics["requests"],
            "results_topic": topics["results"],
            "dead_letter_topic": topics["dlq"],
            "group_id": f"{group}-{uuid.uuid4().hex[:6]}",
        },
        log,
    )


async def soak(args: argparse.Namespace) -> Soak:
    import psutil

    out: Path = args.out
    max_rps = math.nan
    if args.rate is None:
        warmup = await new_topics(args.bootstrap_servers, f"soak-max-{uuid.uuid4().hex[:6]}")
        probe = consumer_on(args.bootstrap_servers, warmup, "soak-max", out / "consumer-max.log")
        probe.start()
        try:
            max_rps = await measure_max(args.bootstrap_servers, probe, warmup, args.max_records)
        finally:
            probe.terminate()
    rate = args.rate if args.rate is not None else max_rps / 2
    measured = f"maximum {max_rps:.0f} records/s" if args.rate is None else "maximum not measured (--rate)"
    print(f"soak: {measured}; open loop at {rate:.0f} records/s for {args.minutes:g} min", file=sys.stderr)
    topics = await new_topics(args.bootstrap_servers, f"soak-{uuid.uuid4().hex[:6]}")
    consumer = consumer_on(args.bootstrap_servers, topics, "soak", out / "consumer.log")
    consumer.start()
    result = Soak(args.minutes, rate, max_rps)
    proc = psutil.Process(consumer.pid)
    loop = OpenLoop(args.bootstrap_servers, topics["requests"], rate, uuid.uuid4().hex[:6])
    reader = Reader(args.bootstrap_servers, topics)
    reading = asyncio.create_task(reader.run())
    sending = asyncio.create_task(loop.run(args.minutes * 60))
    started = time.monotonic()
    print(
        f"{'t_s':>6} {'rss_mib':>8} {'fds':>5} {'tasks':>6} {'series':>7} {'results':>8} {'p99_ms':>8}", file=sys.stderr
    )
    try:
        while not sending.done():
            await asyncio.wait({sending}, timeout=max(0.0, started + (len(result.samples) + 1) * args.sample_s
                                                      - time.monotonic()))  # fmt: skip
            if sending.done() and time.monotonic() - started < (len(result.samples) + 1) * args.sample_s - 1:
                break  # the last, partial window is not a sample
            if consumer.returncode is not None:
                raise RuntimeError(f"the consumer exited with {consumer.returncode}; log: {consumer.log}")
            latencies = reader.take_window()
            series, tasks = await asyncio.to_thread(scrape, consumer.port)
            sample = Sample(
                round(time.monotonic() - started, 1),
                proc.memory_info().rss / 2**20,
                proc.num_fds(),
                tasks,
                series,
                len(latencies),
                float(np.percentile(latencies, 99)) if latencies else math.nan,
            )
            result.samples.append(sample)
            print(f"{sample.t_s:>6.0f} {sample.rss_mib:>8.1f} {sample.fds:>5} {sample.tasks:>6} {sample.series:>7} "
                  f"{sample.results:>8} {sample.p99_ms:>8.1f}", file=sys.stderr)  # fmt: skip
        await sending
        deadline = time.monotonic() + args.drain_s
        while len(reader.ids) < loop.sent and (left := deadline - time.monotonic()) > 0:
            reader.updated.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.updated.wait(), left)
    finally:
        reader.stop()
        await asyncio.gather(reading, return_exceptions=True)
        if not sending.done():
            sending.cancel()
        consumer.terminate()
    result.sent = loop.sent
    result.answered = len(reader.ids - {b""})
    return result


def plot(result: Soak, path: Path) -> None:
    """RSS, fds, tasks and p99 over the run (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s / 60 for s in result.samples]
    fig, axes = plt.subplots(4, 1, figsize=(7, 8), sharex=True)
    for ax, (label, values) in zip(
        axes,
        (
            ("RSS, MiB", [s.rss_mib for s in result.samples]),
            ("open fds", [s.fds for s in result.samples]),
            ("asyncio tasks", [s.tasks for s in result.samples]),
            ("p99 latency, ms", [s.p99_ms for s in result.samples]),
        ),
        strict=True,
    ):
        ax.plot(t, values, marker=".")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes")
    fig.suptitle(f"streaminfer soak: digits at {result.rate:.0f} records/s")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streaminfer-soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--minutes", type=float, default=10.0, help="length of the open loop, minutes")
    p.add_argument("--rate", type=float, default=None, help="records/s (default: half the measured maximum)")
    p.add_argument("--max-records", type=int, default=30_000, help="backlog that measures the maximum, records")
    p.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--drain-s", type=float, default=30.0, help="longest wait for the last answers, s")
    p.add_argument("--out", type=Path, default=Path("soak-results"), help="soak.json, soak.png, consumer logs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m harness.soak`` (exit codes in the module docstring)."""
    args = parser().parse_args(argv)
    for name in ("minutes", "sample_s"):
        if getattr(args, name) <= 0:
            parser().error(f"--{name.replace('_', '-')} must be > 0")
    if args.rate is not None and args.rate <= 0:
        parser().error("--rate must be > 0")
    if not MODEL.is_file():
        print(f"streaminfer-soak: {MODEL} is missing: make model", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = asyncio.run(soak(args))
    except RuntimeError as exc:
        print(f"streaminfer-soak: {exc}", file=sys.stderr)
        return 1
    (args.out / "soak.json").write_text(json.dumps({**asdict(result), "summary": result.summary()}, indent=1))
    plot(result, args.out / "soak.png")
    print(f"soak: table above; plot, JSON and consumer logs in {args.out}", file=sys.stderr)
    print(result.line())
    return 0 if result.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
