"""``streaminfer-bench`` / ``make bench``: streaminfer against its ceilings and its naive baseline, one broker, one run.

Modes, each run as its own process against the same real broker, on the same backlog of requests:

- **naive**: one record -> decode -> ``session.run`` at batch 1 -> produce -> wait for the ack -> commit: the
  straightforward port of notebook code (time-boxed: it is slow);
- **passthrough**: consume -> decode -> produce a response of the model's output shapes (zeros: the same bytes
  streaminfer writes) with the same client and producer settings, acks awaited and commits made behind the
  fetching, no inference: the Kafka I/O ceiling;
- **streaminfer**: ``streaminfer-consumer`` at default settings and over a sweep of max_batch_size /
  max_batch_delay_ms (and with binary-extension requests instead of JSON);
- **bare ORT**: ONNX Runtime alone over the same tensors at the same batch size, in this process: the compute
  ceiling (MiniLM: sorted by length and padded per batch, its best case).

Closed loop: a mode drains a backlog; throughput = results / (last result's append time - first result's), from
the broker's LogAppendTime on the results topic, records/s. Open loop: requests are offered at a fixed rate for a
few seconds; latency = result append time - request timestamp (producer CreateTime), p50/p95/p99 in ms. Each
sweep setting is timed at 20 % of the passthrough throughput (one rate for all settings); the default settings
at 25/50/75 % of their own closed-loop throughput; a lone record (one request at a time) too.
CPU % (of one core; 200 % = both of 2 cores) and peak RSS are read from the mode's process with psutil
(sampled every 0.1 s), between readiness and the last result. streaminfer's batch-size histogram comes from its
``/metrics``.

Output: a table on stdout, ``bench.json`` and PNG plots in ``--out`` (default ``bench-results/``), and last::

    bench: digits_vs_passthrough=R1 digits_vs_naive=R2 minilm_vs_bare_ort=R3

Models: digits (``models/digits/build.py``) and MiniLM (``models/minilm/build.py`` output folder, ``--minilm-dir``;
texts are docstrings of Python's standard library, real English of every length). ``--skip-minilm`` leaves MiniLM
out (R3 is then ``nan``). ``--quick`` runs small sizes (used by the test suite).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from tqdm import tqdm

from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER, CORRELATION_HEADER
from consumer.sink import REQUEST_TIMESTAMP_HEADER
from producer_tools.demo import free_port, wait_ready
from producer_tools.produce import DEFAULT_HELDOUT, Outgoing, send_all
from producer_tools.topics import ensure_topics

if TYPE_CHECKING:
    from consumer.runner import OnnxRunner

ROOT = Path(__file__).resolve().parent.parent
DIGITS_MODEL = ROOT / "models" / "digits" / "artifacts" / "digits.onnx"
DEFAULT_MINILM = Path(os.environ.get("STREAMINFER_CACHE", Path.home() / ".cache" / "streaminfer")) / "minilm"
APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
PARTITIONS = 4
#: (max_batch_size, max_batch_delay_ms) swept for digits; the consumer's defaults are (64, 5).
SWEEP = ((1, 5.0), (8, 5.0), (32, 5.0), (64, 5.0), (256, 5.0), (64, 1.0), (64, 20.0))
DEFAULT_SETTING = (64, 5.0)
LOADS = (0.25, 0.50, 0.75)
#: Each sweep setting's latency is measured at this share of the passthrough throughput (the same rate for all).
SWEEP_LOAD = 0.2
#: Bare ONNX Runtime repeats its batches for at least this long, s (a digits pass takes milliseconds).
BARE_MIN_S = 1.0
#: Python standard library modules whose docstrings are the MiniLM corpus.
CORPUS_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "concurrent.futures",
    "csv",
    "dataclasses",
    "decimal",
    "email",
    "enum",
    "fractions",
    "functools",
    "http",
    "inspect",
    "json",
    "logging",
    "os",
    "pathlib",
    "pickle",
    "random",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.request",
    "zipfile",
)


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
        """Stop sampling."""
        self._stop.set()
        self._thread.join()

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


# ------------------------------------------------------------------------------------------------ data
def digits_rows(heldout: Path = DEFAULT_HELDOUT) -> np.ndarray:
    """The held-out digits, FP32 ``[n, 64]``."""
    with np.load(heldout) as data:
        return np.asarray(data["x"], dtype=np.float32)


def digits_backlog(tag: str, n: int, binary: bool = False) -> list[Outgoing]:
    """``n`` one-row digits requests (held-out rows, cycled), JSON or binary extension."""
    x = digits_rows()
    out = []
    for i in range(n):
        cid = f"{tag}-{i}"
        row = x[i % len(x) : i % len(x) + 1]
        if binary:
            value, length = encode_request_binary(cid, {"input": row}, binary_output=False)
            out.append(Outgoing(cid, value, headers=((BINARY_HEADER, str(length).encode()),)))
        else:
            out.append(Outgoing(cid, encode_request(cid, {"input": row})))
    return out


def corpus(n: int) -> list[str]:
    """``n`` texts: paragraphs of the standard library's docstrings (fixed module order), cycled."""
    seen: set[str] = set()
    texts: list[str] = []
    with warnings.catch_warnings():  # touching deprecated members (typing.io) warns
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in CORPUS_MODULES:
            module = importlib.import_module(name)
            members = sorted(inspect.getmembers(module), key=lambda kv: kv[0])
            for obj in [module, *(obj for _, obj in members)]:
                doc = inspect.getdoc(obj) if callable(obj) or inspect.ismodule(obj) else None
                for para in re.split(r"\n\s*\n", doc or ""):
                    text = " ".join(para.split())
                    if 10 <= len(text) <= 1200 and text not in seen:
                        seen.add(text)
                        texts.append(text)
    return [texts[i % len(texts)] for i in range(n)]


def sorted_batches(
    runner: OnnxRunner, tokenizer: Path, texts: Sequence[str], size: int
) -> tuple[list[dict[str, np.ndarray]], float]:
    """Bare ONNX Runtime's best case for a sequence model: ``texts`` tokenized one by one, sorted by length and
    padded per batch of ``size`` rows.

    Returns:
        (batches, mean tokens per text): each batch input name -> INT64 ``[rows, longest]``.
    """
    from consumer.sequence import BatchBuffers, TextEncoder

    spec = runner.signature.sequence
    assert spec is not None
    encoder = TextEncoder(tokenizer, spec)
    parts = sorted((encoder.encode([t]) for t in texts), key=lambda p: p["input_ids"].shape[1])
    buffers = BatchBuffers({s.name: s.dtype for s in runner.signature.inputs}, spec.pad_values)
    batches = []
    for start in range(0, len(parts), size):
        feeds, _, _ = buffers.pad(parts[start : start + size])
        batches.append({k: v.copy() for k, v in feeds.items()})
    return batches, float(np.mean([p["input_ids"].shape[1] for p in parts]))


def text_backlog(tag: str, texts: Sequence[str]) -> list[Outgoing]:
    """One text request (BYTES ``[1]``) per text."""
    return [Outgoing(f"{tag}-{i}", encode_request(f"{tag}-{i}", {"text": [t]})) for i, t in enumerate(texts)]


# ------------------------------------------------------------------------------------------------ broker helpers
async def new_topics(bootstrap: str, tag: str) -> dict[str, str]:
    """Fresh requests (4 partitions), results (4, broker append time) and dead-letter topics."""
    names = {"requests": f"bench-{tag}.requests", "results": f"bench-{tag}.results", "dlq": f"bench-{tag}.dlq"}
    await ensure_topics(
        bootstrap,
        {names["requests"]: PARTITIONS, names["results"]: PARTITIONS, names["dlq"]: 1},
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
) -> list[tuple[int, int]]:
    """Read all ``partitions`` of ``topic`` from the start until ``want`` records (or ``done()`` and no more come,
    or the timeout).

    Returns:
        (append time, request timestamp) per result, ms since the epoch (request timestamp -1 when absent).
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, client_id="streaminfer-bench")
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


def scrape(port: int) -> tuple[dict[str, float], float]:
    """From the consumer's ``/metrics``: the streaminfer_batch_rows buckets (``{le: cumulative count}``) and the
    mean of streaminfer_batch_padding_ratio (padded / real tokens; NaN for fixed-shape models)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    hist: dict[str, float] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "streaminfer_batch_rows":
            hist = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
        if family.name == "streaminfer_batch_padding_ratio":
            sums = {s.name.rsplit("_", 1)[-1]: s.value for s in family.samples if not s.name.endswith("_bucket")}
    padding = sums["sum"] / sums["count"] if sums.get("count") else math.nan
    return hist, padding


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


def start_streaminfer(bootstrap: str, topics: dict[str, str], model: Path, log: Path, **settings: Any) -> Child:
    """``python -m consumer`` on ``topics`` with a fresh group and ``settings`` (flag name -> value); ready."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "consumer",
        "--bootstrap-servers", bootstrap,
        "--model-path", str(model),
        "--group-id", f"bench-{uuid.uuid4().hex[:8]}",
        "--requests-topic", topics["requests"],
        "--results-topic", topics["results"],
        "--dead-letter-topic", topics["dlq"],
        "--http-port", str(port), "--http-host", "127.0.0.1",
        "--execution-provider", "cpu",
        "--log-level", "WARNING",
    ]  # fmt: skip
    for name, value in settings.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603 (our own module)
    wait_ready(port, proc, timeout_s=180)
    return Child(proc, port, log)


def start_worker(mode: str, bootstrap: str, topics: dict[str, str], model: Path, log: Path, seconds: float) -> Child:
    """``python -m producer_tools.bench worker MODE``; returns once it printed ``ready``."""
    cmd = [
        sys.executable, "-m", "producer_tools.bench", "worker", mode,
        "--bootstrap-servers", bootstrap,
        "--requests", topics["requests"], "--results", topics["results"],
        "--model-path", str(model), "--seconds", str(seconds),
    ]  # fmt: skip
    with log.open("ab") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)  # noqa: S603 (our own module)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        raise RuntimeError(f"worker {mode} did not start: {line!r}; log: {log}")
    return Child(proc, None, log)


def stop(child: Child) -> None:
    """SIGTERM, then SIGKILL after 40 s; close its pipe."""
    if child.proc.poll() is None:
        child.proc.send_signal(signal.SIGTERM)
        try:
            child.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
    if child.proc.stdout is not None:
        child.proc.stdout.close()


# ------------------------------------------------------------------------------------------------ workers
async def worker(mode: str, args: argparse.Namespace) -> None:
    """The naive and passthrough consumers. Prints ``ready`` once joined-to-be, runs ``--seconds`` at most."""
    from consumer.oip.decode import Limits, decode_request
    from consumer.oip.encode import encode_response
    from consumer.runner import OnnxRunner

    runner = OnnxRunner.load(args.model_path, execution_provider="cpu")
    session, signature = runner.session, runner.signature
    limits = Limits()
    consumer = AIOKafkaConsumer(
        args.requests,
        bootstrap_servers=args.bootstrap_servers,
        group_id=f"bench-{mode}-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=args.bootstrap_servers, acks="all", enable_idempotence=True, linger_ms=1
    )
    await producer.start()
    await consumer.start()
    chunks: asyncio.Queue[asyncio.Task[dict[TopicPartition, int]]] = asyncio.Queue(maxsize=8)

    async def publish(requests: list[tuple[Any, Any]], offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        futures = []
        for rec, request in requests:
            # a response of the model's output shapes, all zeros: the same bytes as streaminfer writes
            answer = encode_response(
                request.id or "", signature, [(o.name, zeros[o.name][: request.rows]) for o in outputs]
            )
            headers = [(CORRELATION_HEADER, rec.key), (REQUEST_TIMESTAMP_HEADER, str(rec.timestamp).encode())]
            futures.append(await producer.send(args.results, answer, key=rec.key, headers=headers))
        await asyncio.gather(*futures)
        return offsets

    async def commit_behind() -> None:
        while True:
            task = await chunks.get()
            await consumer.commit(await task)

    outputs = signature.outputs
    zeros = {o.name: np.zeros((limits.max_record_rows, *(d or 1 for d in o.shape[1:])), o.dtype) for o in outputs}
    committer = asyncio.create_task(commit_behind())
    print("ready", flush=True)
    names = list(signature.output_names)
    first = await consumer.getmany(timeout_ms=60_000, max_records=1)  # the time box starts with the first record
    for tp, records in first.items():
        consumer.seek(tp, records[0].offset)
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline:
            if mode == "naive":
                rec = await consumer.getone()
                body = json.loads(rec.value)  # the notebook port: json, numpy, one record at a time
                feeds = {i["name"]: np.asarray(i["data"], dtype=np.float32).reshape(i["shape"]) for i in body["inputs"]}
                values = session.run(None, feeds)
                answer = encode_response(body.get("id", ""), signature, list(zip(names, values, strict=True)))
                headers = [(CORRELATION_HEADER, rec.key), (REQUEST_TIMESTAMP_HEADER, str(rec.timestamp).encode())]
                await producer.send_and_wait(args.results, answer, key=rec.key, headers=headers)
                await consumer.commit()
                continue
            # passthrough: fetch and decode here; encode, send and await the acks in a task per chunk; commit
            # behind them in order (as streaminfer's fetch, publish and commit tasks do).
            batch = await consumer.getmany(timeout_ms=100, max_records=500)
            requests = [(rec, decode_request(rec.value, signature, limits)) for recs in batch.values() for rec in recs]
            if requests:
                offsets = {tp: recs[-1].offset + 1 for tp, recs in batch.items() if recs}
                await chunks.put(asyncio.create_task(publish(requests, offsets)))
    finally:
        committer.cancel()
        await consumer.stop()
        await producer.stop()


# ------------------------------------------------------------------------------------------------ the benchmark
class Bench:
    """Runs every mode and keeps the :class:`Run` rows."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.bootstrap: str = args.bootstrap_servers
        self.out: Path = args.out
        self.runs: list[Run] = []
        self.tag = uuid.uuid4().hex[:6]
        self.bar: tqdm[Any] | None = None

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description(what)
            self.bar.update(1)

    def log(self, name: str) -> Path:
        return self.out / "logs" / (re.sub(r"[^A-Za-z0-9._-]", "-", name) + ".log")

    # -- closed loop
    async def closed_streaminfer(
        self, model_name: str, model: Path, topics_backlog: str, n: int, setting: str, **settings: Any
    ) -> Run:
        topics = {
            "requests": topics_backlog,
            "results": await results_topic(self.bootstrap, f"{self.tag}-{model_name}-{setting}-{uuid.uuid4().hex[:4]}"),
            "dlq": f"bench-{self.tag}.dlq",
        }
        child = start_streaminfer(self.bootstrap, topics, model, self.log(f"{model_name}-{setting}"), **settings)
        sampler = Sampler(child.proc.pid).start()
        try:
            stamps = await read_results(self.bootstrap, topics["results"], n, timeout_s=self.args.timeout_s)
            assert child.port is not None
            hist, padding = scrape(child.port)
        finally:
            sampler.stop()
            stop(child)
        run = Run(
            model_name,
            "streaminfer",
            setting,
            len(stamps),
            throughput(stamps),
            cpu_pct=sampler.cpu_pct(last_result_s(stamps)),
            peak_rss_mib=sampler.peak_rss_mib,
            batch_rows=hist,
        )
        run.extra["mean_batch_rows"] = mean_batch(hist)
        run.extra["mean_padding_ratio"] = padding
        return run

    async def closed_worker(self, mode: str, model: Path, backlog: str, n: int, seconds: float) -> Run:
        topics = {"requests": backlog, "results": await results_topic(self.bootstrap, f"{self.tag}-{mode}")}
        child = start_worker(mode, self.bootstrap, topics, model, self.log(mode), seconds)
        sampler = Sampler(child.proc.pid).start()
        try:
            stamps = await read_results(
                self.bootstrap, topics["results"], n, seconds + 30, done=lambda: child.proc.poll() is not None
            )
        finally:
            sampler.stop()
            stop(child)
        return Run(
            "digits",
            mode,
            "batch 1" if mode == "naive" else "no model",
            len(stamps),
            throughput(stamps),
            cpu_pct=sampler.cpu_pct(last_result_s(stamps)),
            peak_rss_mib=sampler.peak_rss_mib,
        )

    # -- open loop
    async def open_loop(
        self, model: Path, rate: float, seconds: float, setting: str, lone: bool = False, **settings: Any
    ) -> Run:
        topics = await new_topics(self.bootstrap, f"{self.tag}-open-{uuid.uuid4().hex[:4]}")
        child = start_streaminfer(self.bootstrap, topics, model, self.log(f"open-{setting}"), **settings)
        n = int(rate * seconds)
        records = digits_backlog(f"open-{uuid.uuid4().hex[:4]}", n)
        sampler = Sampler(child.proc.pid).start()
        try:
            if lone:
                for rec in records:  # one at a time, the producer without linger: each waits for nothing else
                    await send_all(self.bootstrap, topics["requests"], [rec], progress=False, linger_ms=0)
                    await asyncio.sleep(1.0 / rate)
            else:
                await send_all(self.bootstrap, topics["requests"], records, rate=rate, progress=False)
            stamps = await read_results(self.bootstrap, topics["results"], n, timeout_s=self.args.timeout_s)
        finally:
            sampler.stop()
            stop(child)
        p50, p95, p99 = latency_pcts(stamps)
        return Run(
            "digits",
            "lone" if lone else "open-loop",
            setting,
            len(stamps),
            rate,
            p50,
            p95,
            p99,
            sampler.cpu_pct(last_result_s(stamps)),
            sampler.peak_rss_mib,
        )

    # -- bare ONNX Runtime
    def bare_ort(
        self,
        model_name: str,
        model: Path,
        batches: Sequence[dict[str, np.ndarray]],
        setting: str,
        level: Literal["disable", "basic", "extended", "all"] = "all",
        threads: int = 0,
    ) -> Run:
        import psutil

        from consumer.runner import OnnxRunner

        runner = OnnxRunner.load(
            model, execution_provider="cpu", graph_optimization_level=level, intra_op_threads=threads
        )
        session = runner.session  # bare: session.run alone, none of the runner's checks
        for feeds in batches[:3]:
            session.run(None, feeds)
        proc = psutil.Process()
        cpu0 = sum(proc.cpu_times()[:2])
        started = time.perf_counter()
        rows = runs = 0
        while runs < len(batches) or time.perf_counter() - started < BARE_MIN_S:  # whole passes, >= 1 s
            for feeds in batches:
                session.run(None, feeds)
                rows += next(iter(feeds.values())).shape[0]
            runs += len(batches)
        wall = time.perf_counter() - started
        cpu = 100.0 * (sum(proc.cpu_times()[:2]) - cpu0) / wall
        return Run(
            model_name,
            "bare-ort",
            setting,
            rows,
            rows / wall,
            cpu_pct=cpu,
            peak_rss_mib=proc.memory_info().rss / 2**20,
            extra={"batch_ms": 1000 * wall / runs},
        )

    # -- decode cost, JSON against the binary data extension
    def decode_costs(self) -> None:
        """Records/s of ``decode_request`` alone for digits requests of 1 and 64 rows, JSON and binary."""
        from consumer.oip.decode import Limits, decode_request
        from consumer.oip.wire import binary_header_length
        from consumer.runner import OnnxRunner

        signature = OnnxRunner.load(DIGITS_MODEL, execution_provider="cpu").signature
        x = digits_rows()
        for rows in (1, 64):
            for binary in (False, True):
                outgoing = []
                for i in range(200):
                    start = (i * rows) % (len(x) - rows)
                    if binary:
                        value, n = encode_request_binary(None, {"input": x[start : start + rows]}, binary_output=False)
                        outgoing.append((value, [(BINARY_HEADER, str(n).encode())]))
                    else:
                        outgoing.append((encode_request(None, {"input": x[start : start + rows]}), []))
                count = 0
                started = time.perf_counter()
                while time.perf_counter() - started < 0.5:
                    for value, headers in outgoing:
                        decode_request(value, signature, Limits(), json_length=binary_header_length(headers))
                    count += len(outgoing)
                rps = count / (time.perf_counter() - started)
                run = Run("digits", "decode", f"{rows} rows {'binary' if binary else 'JSON'}", count, rps)
                run.extra["bytes"] = len(outgoing[0][0])
                self.runs.append(run)

    # -- the plan
    async def digits(self) -> None:
        a = self.args
        n = a.records
        backlog = (await new_topics(self.bootstrap, f"{self.tag}-digits"))["requests"]
        await send_all(self.bootstrap, backlog, digits_backlog("d", n), progress=False)
        binary_backlog = (await new_topics(self.bootstrap, f"{self.tag}-digits-bin"))["requests"]
        await send_all(self.bootstrap, binary_backlog, digits_backlog("b", n, binary=True), progress=False)
        self.step("digits: backlog")

        x = digits_rows()
        rows = np.resize(x, (n, 64))
        size = DEFAULT_SETTING[0]
        self.runs.append(
            self.bare_ort("digits", DIGITS_MODEL, [{"input": rows[i : i + size]} for i in range(0, n, size)], "b64")
        )
        lone_compute_ms = self.bare_ort("digits", DIGITS_MODEL, [{"input": rows[i : i + 1]} for i in range(500)], "b1")
        self.runs.append(lone_compute_ms)
        self.decode_costs()
        self.step("digits: bare ORT")
        self.runs.append(await self.closed_worker("passthrough", DIGITS_MODEL, backlog, n, a.passthrough_s))
        self.step("digits: passthrough")
        self.runs.append(await self.closed_worker("naive", DIGITS_MODEL, backlog, n, a.naive_s))
        self.step("digits: naive")
        passthrough = self.find("digits", "passthrough")
        assert passthrough is not None
        fixed_rate = SWEEP_LOAD * passthrough.throughput_rps
        for b, d in self.sweep:
            setting = f"b{b}/d{d:g}ms"
            run = await self.closed_streaminfer(
                "digits", DIGITS_MODEL, backlog, n, setting, max_batch_size=b, max_batch_delay_ms=d
            )
            run.extra["default"] = (b, d) == DEFAULT_SETTING
            # Latency of this setting at one offered load for all settings (a share of the I/O ceiling).
            timed = await self.open_loop(
                DIGITS_MODEL, fixed_rate, a.open_s, setting, max_batch_size=b, max_batch_delay_ms=d
            )
            run.p50_ms, run.p95_ms, run.p99_ms = timed.p50_ms, timed.p95_ms, timed.p99_ms
            run.extra["latency_at_rps"] = fixed_rate
            self.runs.append(run)
            self.step(f"digits: streaminfer {setting}")
        binary = await self.closed_streaminfer("digits", DIGITS_MODEL, binary_backlog, n, "b64/d5ms")
        binary.mode = "streaminfer-binary"
        self.runs.append(binary)
        self.step("digits: streaminfer binary")
        best = self.streaminfer_default("digits").throughput_rps
        for load in LOADS:
            run = await self.open_loop(DIGITS_MODEL, best * load, a.open_s, f"{int(load * 100)}% of max")
            self.runs.append(run)
            self.step(f"digits: open loop {int(load * 100)}%")
        lone = await self.open_loop(DIGITS_MODEL, 10.0, a.lone_s, "1 at a time", lone=True)
        lone.extra["target_ms"] = DEFAULT_SETTING[1] + lone_compute_ms.extra["batch_ms"] + 5.0
        self.runs.append(lone)
        self.step("digits: lone record")

    async def minilm(self) -> None:
        a = self.args
        model = a.minilm_dir / "minilm.onnx"
        tokenizer = a.minilm_dir / "tokenizer.json"
        if not model.is_file() or not tokenizer.is_file():
            raise SystemExit(f"streaminfer-bench: no MiniLM in {a.minilm_dir}; run python models/minilm/build.py")
        from consumer.runner import OnnxRunner

        texts = corpus(a.texts)
        size = a.minilm_batch
        batches, mean_tokens = sorted_batches(OnnxRunner.load(model, execution_provider="cpu"), tokenizer, texts, size)
        bare = self.bare_ort("minilm", model, batches, f"b{size} sorted")
        bare.extra["mean_tokens"] = mean_tokens
        self.runs.append(bare)
        # The session options streaminfer exposes, on a share of the same batches: the defaults are the best here.
        share = batches[: max(2, len(batches) // 4)]
        options: tuple[tuple[Literal["basic", "extended", "all"], int], ...] = (
            ("all", 0),
            ("basic", 0),
            ("extended", 0),
            ("all", 1),
        )
        for level, threads in options:
            run = self.bare_ort("minilm", model, share, f"{level}/threads {threads or 'auto'}", level, threads)
            run.mode = "bare-ort-options"
            self.runs.append(run)
        self.step("minilm: bare ORT")
        topics = await new_topics(self.bootstrap, f"{self.tag}-minilm")
        await send_all(self.bootstrap, topics["requests"], text_backlog("m", texts), progress=False)
        run = await self.closed_streaminfer(
            "minilm",
            model,
            topics["requests"],
            len(texts),
            f"b{size}/d5ms text",
            tokenizer_path=tokenizer,
            max_batch_size=size,
        )
        run.extra["default"] = True
        self.runs.append(run)
        self.step("minilm: streaminfer")

    @property
    def sweep(self) -> tuple[tuple[int, float], ...]:
        return SWEEP if not self.args.quick else ((8, 5.0), DEFAULT_SETTING)

    def streaminfer_default(self, model: str) -> Run:
        return next(r for r in self.runs if r.model == model and r.mode == "streaminfer" and r.extra.get("default"))

    def find(self, model: str, mode: str) -> Run | None:
        return next((r for r in self.runs if r.model == model and r.mode == mode), None)

    def ratios(self) -> dict[str, float]:
        out = {"digits_vs_passthrough": math.nan, "digits_vs_naive": math.nan, "minilm_vs_bare_ort": math.nan}
        passthrough = self.find("digits", "passthrough")
        naive = self.find("digits", "naive")
        if passthrough is not None and naive is not None:
            digits = self.streaminfer_default("digits").throughput_rps
            out["digits_vs_passthrough"] = digits / passthrough.throughput_rps
            out["digits_vs_naive"] = digits / naive.throughput_rps
        bare = self.find("minilm", "bare-ort")
        if bare is not None:
            out["minilm_vs_bare_ort"] = self.streaminfer_default("minilm").throughput_rps / bare.throughput_rps
        return out

    async def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        steps = (0 if self.args.skip_digits else 6 + len(self.sweep) + len(LOADS)) + (0 if self.args.skip_minilm else 2)
        with tqdm(total=steps, desc="bench", unit="step", disable=self.args.no_progress) as bar:
            self.bar = bar
            if not self.args.skip_digits:
                await self.digits()
            if not self.args.skip_minilm:
                await self.minilm()
        return {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "records": self.args.records,
            "runs": [asdict(r) for r in self.runs],
            "ratios": self.ratios(),
        }


# ------------------------------------------------------------------------------------------------ output
def table(runs: Sequence[dict[str, Any]]) -> str:
    """The runs as a fixed-width text table."""
    head = (
        f"{'model':<7} {'mode':<19} {'setting':<17} {'records':>8} {'rec/s':>9} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'CPU %':>6} {'RSS MiB':>8} {'rows/batch':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        mean = r["extra"].get("mean_batch_rows", math.nan)
        lines.append(
            f"{r['model']:<7} {r['mode']:<19} {r['setting']:<17} {r['records']:>8} {r['throughput_rps']:>9.0f} "
            f"{r['p50_ms']:>7.1f} {r['p95_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['cpu_pct']:>6.0f} "
            f"{r['peak_rss_mib']:>8.0f} {mean:>10.1f}"
        )
    return "\n".join(lines)


def plots(result: dict[str, Any], out: Path) -> list[Path]:
    """throughput.png (digits: rec/s per mode and setting, with the ceilings) and latency.png (p50/p95/p99
    against offered load). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if r["model"] == "digits"]
    closed = [r for r in runs if r["mode"] in ("naive", "passthrough", "streaminfer", "streaminfer-binary", "bare-ort")]
    labels = [f"{r['mode']}\n{r['setting']}" for r in closed]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(closed)), 4.5))
    colors = {"naive": "tab:red", "passthrough": "tab:gray", "bare-ort": "tab:green"}
    ax.bar(labels, [r["throughput_rps"] for r in closed], color=[colors.get(r["mode"], "tab:blue") for r in closed])
    ax.set_yscale("log")
    ax.set_ylabel("throughput, records/s (log; bars)")
    ax.set_title("digits: closed-loop throughput (bars) and open-loop p99 (dots) per mode and setting", fontsize=10)
    ax.tick_params(axis="x", labelsize=7)
    timed = [(i, r["p99_ms"]) for i, r in enumerate(closed) if math.isfinite(r["p99_ms"])]
    if timed:
        rate = next((r["extra"].get("latency_at_rps") for r in closed if "latency_at_rps" in r["extra"]), None)
        twin = ax.twinx()
        twin.plot([i for i, _ in timed], [p for _, p in timed], "o", color="black")
        twin.set_yscale("log")
        twin.set_ylabel(f"p99 latency at {rate:.0f} rec/s, ms (log; dots)" if rate else "p99, ms")
    fig.tight_layout()
    paths = [out / "throughput.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    open_runs = [r for r in runs if r["mode"] == "open-loop"]
    if open_runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        rates = [r["throughput_rps"] for r in open_runs]
        for key in ("p50_ms", "p95_ms", "p99_ms"):
            ax.plot(rates, [r[key] for r in open_runs], marker="o", label=key.replace("_ms", ""))
        ax.set_xlabel("offered load, records/s")
        ax.set_ylabel("latency, ms (result append - request timestamp)")
        ax.set_title("digits: latency against offered load (streaminfer defaults)")
        ax.legend()
        fig.tight_layout()
        paths.append(out / "latency.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def summary_line(ratios: dict[str, float]) -> str:
    """The last line of the benchmark, in the issue's exact form."""
    return (
        f"bench: digits_vs_passthrough={ratios['digits_vs_passthrough']:.2f} "
        f"digits_vs_naive={ratios['digits_vs_naive']:.2f} minilm_vs_bare_ort={ratios['minilm_vs_bare_ort']:.2f}"
    )


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(prog="streaminfer-bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    w = sub.add_parser("worker", help="internal: the naive or passthrough consumer process")
    w.add_argument("mode", choices=["naive", "passthrough"])
    w.add_argument("--bootstrap-servers", required=True)
    w.add_argument("--requests", required=True)
    w.add_argument("--results", required=True)
    w.add_argument("--model-path", type=Path, required=True)
    w.add_argument("--seconds", type=float, required=True)
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--out", type=Path, default=ROOT / "bench-results", help="results folder (JSON, PNG, logs)")
    p.add_argument("--records", type=int, default=20_000, help="digits backlog, records")
    p.add_argument("--texts", type=int, default=2_000, help="MiniLM backlog, texts")
    p.add_argument("--minilm-dir", type=Path, default=DEFAULT_MINILM, help="models/minilm/build.py output")
    p.add_argument("--minilm-batch", type=int, default=64, help="MiniLM max_batch_size and bare ORT batch, rows")
    p.add_argument("--naive-s", type=float, default=10.0, help="time box of the naive consumer, s")
    p.add_argument("--passthrough-s", type=float, default=60.0, help="time box of the passthrough consumer, s")
    p.add_argument("--open-s", type=float, default=8.0, help="duration of each open-loop run, s")
    p.add_argument("--lone-s", type=float, default=3.0, help="duration of the lone-record run (10 rec/s), s")
    p.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for one run's results, s")
    p.add_argument("--skip-minilm", action="store_true", help="digits only")
    p.add_argument("--skip-digits", action="store_true", help="MiniLM only (the digits ratios are then nan)")
    p.add_argument("--quick", action="store_true", help="small sizes and a short sweep (tests)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``streaminfer-bench``."""
    args = parser().parse_args(argv)
    if args.command == "worker":
        asyncio.run(worker(args.mode, args))
        return 0
    if args.quick:
        args.records = min(args.records, 2000)
        args.texts = min(args.texts, 200)
        args.naive_s, args.open_s, args.lone_s = min(args.naive_s, 3.0), min(args.open_s, 2.0), min(args.lone_s, 1.0)
    if not DIGITS_MODEL.is_file() and not args.skip_digits:
        raise SystemExit("streaminfer-bench: digits model missing; run make model")
    result = asyncio.run(Bench(args).run())
    (args.out / "bench.json").write_text(json.dumps(strict_json(result), indent=2) + "\n")
    print(table(result["runs"]))
    for path in plots(result, args.out):
        print(f"wrote {path}")
    print(f"wrote {args.out / 'bench.json'}")
    print(summary_line(result["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
