"""Measuring a mode: results read back from the broker, throughput and latency from their timestamps, the
consumer's own metrics, and its process (CPU, memory), each mode in a child process of its own."""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumer.answers.records import REQUEST_TIMESTAMP_HEADER
from consumer.ops.metrics import STAGES
from harness.process import ConsumerProcess, stop_process
from harness.scrape import metric_families
from producer_tools.topics import ensure_topics

#: How often the bench asks a starting consumer's ``/readyz``, s (the time to its first answer is read against it).
READY_POLL_S = 0.01
APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
PARTITIONS = 4


@dataclass
class Run:
    """One measured run.

    Attributes:
        model: ``digits`` or ``minilm``.
        mode: naive, passthrough, streaminfer, streaminfer-binary, bare-ort, open-loop, lone.
        setting: e.g. ``b64/d5ms``.
        records: results counted.
        throughput_rps: records/s (closed loop), or the offered rate (open loop).
        p50_ms, p95_ms, p99_ms: latency percentiles, ms (open loop and lone record; closed loop: NaN).
        cpu_pct: CPU of the mode's process, % of one core.
        cpu_us_per_record: the mode's process's own CPU time (user + system) over the window of its results (first
            to last result's append time) / the results appended in it, microseconds per record (closed loop).
        peak_rss_mib: the mode's peak resident set, MiB (sampled).
        batch_rows: streaminfer's batch-size histogram, ``{le: count}`` (cumulative, Prometheus buckets).
    """

    model: str
    mode: str
    setting: str
    records: int
    throughput_rps: float
    p50_ms: float = math.nan
    p95_ms: float = math.nan
    p99_ms: float = math.nan
    cpu_pct: float = math.nan
    peak_rss_mib: float = math.nan
    cpu_us_per_record: float = math.nan
    batch_rows: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ process sampling
class Sampler:
    """CPU time and RSS of one process, sampled by a thread every ``interval_s`` seconds (psutil) while it lives.

    CPU % over a window is read off the samples nearest its ends, so a window that ends at the last result is
    measured even when the process has exited (or idled) since.
    """

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        import psutil

        self._proc = psutil.Process(pid)
        self._interval = interval_s
        self.samples: list[tuple[float, float, int]] = []  # (epoch s, CPU s, RSS bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> bool:
        try:
            t = self._proc.cpu_times()
            rss = self._proc.memory_info().rss
        except Exception:  # noqa: BLE001 (psutil.NoSuchProcess, ZombieProcess: the process has exited)
            return False
        self.samples.append((time.time(), float(t.user + t.system), int(rss)))
        return True

    def _loop(self) -> None:
        while self._sample() and not self._stop.wait(self._interval):
            pass

    def start(self) -> Sampler:
        """Begin sampling (call once the process is ready)."""
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, with one last reading (while the process lives): a window that ended just now (its last
        result read a moment ago) then lies inside the readings."""
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def peak_rss_mib(self) -> float:
        """Largest sampled RSS, MiB."""
        return max((s[2] for s in self.samples), default=0) / 2**20

    def cpu_pct(self, until_epoch_s: float | None = None) -> float:
        """CPU % of one core from the first sample to the sample nearest ``until_epoch_s`` (default: the last)."""
        if len(self.samples) < 2:
            return math.nan
        first = self.samples[0]
        last = self.samples[-1]
        if until_epoch_s is not None:
            last = min(self.samples[1:], key=lambda s: abs(s[0] - until_epoch_s))
        return 100.0 * (last[1] - first[1]) / max(1e-9, last[0] - first[0])

    def cpu_s_at(self, epoch_s: float) -> float:
        """The process's cumulative CPU time (user + system, s) at ``epoch_s``: linear between the two readings of
        its CPU time around it (NaN outside the readings)."""
        times = [s[0] for s in self.samples]
        if len(times) < 2 or not times[0] <= epoch_s <= times[-1]:
            return math.nan
        return float(np.interp(epoch_s, times, [s[1] for s in self.samples]))

    def cpu_us_per_record(self, stamps: Sequence[tuple[int, int]]) -> float:
        """CPU time per record over the window of the results ``stamps`` (append time, request time; ms): the
        process's own CPU time read at the window's start and end (the first and last result's append time, the
        start clipped to the first reading), over the results appended within the window; microseconds (NaN
        below 2 results in the window, or without readings around it).

        Both ends are reads of ``/proc/<pid>/stat``'s utime + stime (psutil's ``cpu_times``), interpolated between
        the readings 0.1 s apart: an error of a few milliseconds of CPU at each end, against seconds in the
        window; no CPU percentage is sampled."""
        if len(stamps) < 2 or len(self.samples) < 2:
            return math.nan
        appended = sorted(a / 1000.0 for a, _ in stamps)
        start = max(appended[0], self.samples[0][0])
        end = min(appended[-1], self.samples[-1][0])
        inside = sum(1 for a in appended if start < a <= end)
        used = self.cpu_s_at(end) - self.cpu_s_at(start)
        if inside < 1 or not math.isfinite(used):
            return math.nan
        return 1e6 * used / inside


class OtherWork:
    """How much CPU the rest of the machine used while a mode ran: every process's CPU time (``/proc/stat``, steal
    included: time a hypervisor gave to other machines) but for the ones measured (the mode, the broker, this
    bench), % of one core, averaged over the window between :meth:`start` and :meth:`stop`. On a shared machine it
    says how comparable two runs are.

    Args:
        pids: the processes measured; one that has exited counts what it used until it exited.
    """

    def __init__(self, pids: Sequence[int]) -> None:
        import psutil

        self._procs = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):  # gone already
                self._procs.append(psutil.Process(pid))
        self._start: tuple[float, float, dict[int, float]] | None = None

    @staticmethod
    def _busy() -> float:
        import psutil

        t = psutil.cpu_times()
        return float(t.user + t.nice + t.system + t.irq + t.softirq + t.steal)

    def _ours(self) -> dict[int, float]:
        import psutil

        out = {}
        for proc in self._procs:
            with contextlib.suppress(psutil.Error):  # NoSuchProcess, ZombieProcess: it has exited
                t = proc.cpu_times()
                out[proc.pid] = float(t.user + t.system)
        return out

    def start(self) -> OtherWork:
        """Begin the window."""
        self._start = (time.monotonic(), self._busy(), self._ours())
        return self

    def stop(self) -> float:
        """End the window: the other processes' CPU over it, % of one core (NaN when it was not started)."""
        if self._start is None:
            return math.nan
        began, busy, ours = self._start
        wall = max(1e-9, time.monotonic() - began)
        now = self._ours()
        used = sum(now.get(pid, cpu) - cpu for pid, cpu in ours.items())
        return max(0.0, 100.0 * (self._busy() - busy - used) / wall)


def listening_pids(bootstrap: str) -> list[int]:
    """The local processes listening on the ports of ``bootstrap`` (``host:port,...``): the broker when it runs on
    this machine; none for a remote one."""
    import psutil

    ports = {int(part.rsplit(":", 1)[1]) for part in bootstrap.split(",") if ":" in part}
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error:  # AccessDenied without the privileges to see other users' sockets
        return []
    return sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports
                   and c.pid})  # fmt: skip


# ------------------------------------------------------------------------------------------------ broker helpers
async def new_topics(bootstrap: str, tag: str, partitions: int = PARTITIONS) -> dict[str, str]:
    """Fresh requests (``partitions``, default 4), results (4, broker append time) and dead-letter topics."""
    names = {"requests": f"bench-{tag}.requests", "results": f"bench-{tag}.results", "dlq": f"bench-{tag}.dlq"}
    await ensure_topics(
        bootstrap,
        {names["requests"]: partitions, names["results"]: PARTITIONS, names["dlq"]: 1},
        configs={names["results"]: APPEND_TIME, names["dlq"]: APPEND_TIME},
    )
    return names


async def results_topic(bootstrap: str, tag: str) -> str:
    """A fresh results topic (broker append time)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", f"bench-{tag}.results")
    await ensure_topics(bootstrap, {name: PARTITIONS}, configs={name: APPEND_TIME})
    return name


async def read_results(
    bootstrap: str,
    topic: str,
    want: int,
    timeout_s: float,
    done: Callable[[], bool] | None = None,
    partitions: int = PARTITIONS,
    isolation_level: str = "read_uncommitted",
) -> list[tuple[int, int]]:
    """Read all ``partitions`` of ``topic`` from the start until ``want`` records (or ``done()`` and no more come,
    or the timeout); ``read_committed`` for an exactly_once consumer's results.

    Returns:
        (append time, request timestamp) per result, ms since the epoch (request timestamp -1 when absent).
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        client_id="streaminfer-bench",
        isolation_level=isolation_level,
    )
    await consumer.start()
    out: list[tuple[int, int]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]  # we created the topic: its size is known
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while len(out) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            got = [r for recs in batch.values() for r in recs]
            for r in got:
                req = next((v for k, v in r.headers if k == REQUEST_TIMESTAMP_HEADER), None)
                out.append((r.timestamp, int(req) if req else -1))
            quiet = 0 if got else quiet + 1
            if done is not None and done() and quiet >= 5:
                break
    finally:
        await consumer.stop()
    return out


def throughput(stamps: Sequence[tuple[int, int]]) -> float:
    """Results / (last append time - first append time), records/s (NaN below 2 results)."""
    if len(stamps) < 2:
        return math.nan
    times = [a for a, _ in stamps]
    span_s = max(1, max(times) - min(times)) / 1000.0
    return (len(stamps) - 1) / span_s


def first_result_s(stamps: Sequence[tuple[int, int]]) -> float | None:
    """The first result's append time, epoch seconds (None without results)."""
    return min(a for a, _ in stamps) / 1000.0 if stamps else None


def last_result_s(stamps: Sequence[tuple[int, int]]) -> float | None:
    """The last result's append time, epoch seconds (None without results)."""
    return max(a for a, _ in stamps) / 1000.0 if stamps else None


def latency_pcts(stamps: Sequence[tuple[int, int]]) -> tuple[float, float, float]:
    """p50, p95, p99 of append time - request timestamp, ms."""
    lat = [a - r for a, r in stamps if r >= 0]
    if not lat:
        return math.nan, math.nan, math.nan
    p = np.percentile(lat, [50, 95, 99])
    return float(p[0]), float(p[1]), float(p[2])


@dataclass
class Scraped:
    """What a streaminfer run's ``/metrics`` says.

    Attributes:
        batch_rows: the streaminfer_batch_rows buckets, ``{le: cumulative count}``.
        padding_ratio: mean of streaminfer_batch_padding_ratio (padded / real tokens; NaN for fixed-shape models).
        stage_seconds: streaminfer_stage_seconds_total per stage, seconds.
        answered: streaminfer_records_total over both outcomes, records.
        assign_s: streaminfer_rebalance_seconds_sum{phase="assign"}: the assignment handlers' time (exactly_once:
            opening the partitions' transactional producers), seconds.
        shadow_rows: streaminfer_shadow_rows_total: rows the shadow candidate scored (0 without one).
        shadow_shed_rows: streaminfer_shadow_shed_rows_total: rows it shed, rows.
    """

    batch_rows: dict[str, float]
    padding_ratio: float
    stage_seconds: dict[str, float]
    answered: float
    assign_s: float = math.nan
    shadow_rows: float = 0.0
    shadow_shed_rows: float = 0.0

    def stage_us_per_record(self) -> dict[str, float]:
        """Each stage's time per answered record, microseconds (stages overlap where they await each other)."""
        if not self.answered:
            return dict.fromkeys(STAGES, math.nan)
        return {stage: 1e6 * self.stage_seconds.get(stage, 0.0) / self.answered for stage in STAGES}


def scrape(port: int) -> Scraped:
    """Read the consumer's ``/metrics``."""
    hist: dict[str, float] = {}
    sums: dict[str, float] = {}
    stages: dict[str, float] = {}
    answered = 0.0
    assign_s = math.nan
    shadow = {"streaminfer_shadow_rows": 0.0, "streaminfer_shadow_shed_rows": 0.0}
    for family in metric_families(port):
        if family.name in shadow:
            shadow[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
        if family.name == "streaminfer_batch_rows":
            hist = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
        if family.name == "streaminfer_batch_padding_ratio":
            sums = {s.name.rsplit("_", 1)[-1]: s.value for s in family.samples if not s.name.endswith("_bucket")}
        if family.name == "streaminfer_stage_seconds":
            stages = {s.labels["stage"]: s.value for s in family.samples if s.name.endswith("_total")}
        if family.name == "streaminfer_records":
            answered = sum(s.value for s in family.samples if s.name.endswith("_total"))
        if family.name == "streaminfer_rebalance_seconds":
            assign_s = sum(
                s.value for s in family.samples if s.name.endswith("_sum") and s.labels.get("phase") == "assign"
            )
    padding = sums["sum"] / sums["count"] if sums.get("count") else math.nan
    return Scraped(
        hist,
        padding,
        stages,
        answered,
        assign_s,
        shadow["streaminfer_shadow_rows"],
        shadow["streaminfer_shadow_shed_rows"],
    )


def mean_batch(hist: dict[str, float]) -> float:
    """Mean rows per batch from cumulative buckets (each bucket counted at its upper bound's midpoint)."""
    prev_le, prev_count, total, rows = 0.0, 0.0, 0.0, 0.0
    for le, count in sorted(((float(k), v) for k, v in hist.items()), key=lambda kv: kv[0]):
        n = count - prev_count
        if math.isfinite(le):
            rows += n * (prev_le + le) / 2 if prev_le else n * le
        total += n
        prev_le, prev_count = le, count
    return rows / total if total else math.nan


# ------------------------------------------------------------------------------------------------ child processes
@dataclass
class Child:
    """A mode's process and how to talk to it."""

    proc: subprocess.Popen[bytes]
    port: int | None
    log: Path
    ready_s: float = math.nan
    #: The process's CPU time read from the moment it was started (so that readings lie before its first result,
    #: however soon that comes): what :meth:`Sampler.cpu_us_per_record` reads; stopped by :func:`stop`.
    cpu: Sampler | None = None


def start_streaminfer(
    bootstrap: str,
    topics: dict[str, str],
    model: Path,
    log: Path,
    data_limit_bytes: int | None = None,
    **settings: Any,
) -> Child:
    """``python -m consumer`` on ``topics`` with a fresh group and ``settings`` (setting name -> value); ready.
    ``Child.ready_s`` is when ``/readyz`` first answered 200 (the end of the first assignment handler), epoch s,
    polled every :data:`READY_POLL_S`.

    Args:
        data_limit_bytes: the child's ``RLIMIT_DATA`` (heap and private mappings), bytes; None: inherited.

    Raises:
        RuntimeError: it exited or was not ready within 180 s.
    """
    consumer = ConsumerProcess(
        {
            "bootstrap_servers": bootstrap,
            "model_path": model,
            "group_id": f"bench-{uuid.uuid4().hex[:8]}",
            "requests_topic": topics["requests"],
            "results_topic": topics["results"],
            "dead_letter_topic": topics["dlq"],
            "execution_provider": "cpu",
            "log_level": "WARNING",
            **settings,
        },
        log,
        data_limit_bytes=data_limit_bytes,
    )
    consumer.start(wait=False)
    assert consumer.proc is not None
    cpu = Sampler(consumer.proc.pid).start()
    deadline = time.monotonic() + 180
    while not consumer.is_ready():
        if consumer.returncode is not None or time.monotonic() > deadline:
            consumer.kill()
            cpu.stop()
            raise RuntimeError(f"consumer exited ({consumer.returncode}) or not ready in 180 s; log: {log}")
        time.sleep(READY_POLL_S)
    return Child(consumer.proc, consumer.port, log, time.time(), cpu)


def start_worker(
    mode: str,
    bootstrap: str,
    topics: dict[str, str],
    model: Path,
    log: Path,
    seconds: float,
    extra: Sequence[str] = (),
) -> Child:
    """``python -m harness.bench worker MODE`` (``extra``: more of its flags); returns once it printed ``ready``."""
    cmd = [
        sys.executable, "-m", "harness.bench", "worker", mode,
        "--bootstrap-servers", bootstrap,
        "--requests", topics["requests"], "--results", topics["results"],
        "--model-path", str(model), "--seconds", str(seconds), *extra,
    ]  # fmt: skip
    with log.open("ab") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)  # noqa: S603 (our own module)
    assert proc.stdout is not None
    cpu = Sampler(proc.pid).start()
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        cpu.stop()
        raise RuntimeError(f"worker {mode} did not start: {line!r}; log: {log}")
    return Child(proc, None, log, time.time(), cpu)


def stop(child: Child) -> None:
    """SIGTERM, then SIGKILL after 40 s; close its pipe; stop reading its CPU time."""
    if child.cpu is not None:
        child.cpu.stop()
    stop_process(child.proc)
    if child.proc.stdout is not None:
        child.proc.stdout.close()
