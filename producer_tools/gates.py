"""``streaminfer-gates``: read the V1 -> V2 gates off running consumers.

Scrapes each consumer's ``/metrics`` twice, ``--window`` seconds apart, and prints what the window's deltas say:

- records/s (``streaminfer_records_total``, every outcome) and the batch-size distribution
  (``streaminfer_batch_rows``): most batches of 1 row mean ``max_batch_delay_ms`` is too short or the traffic too
  low for batching to help;
- where a record's time goes, per stage (``streaminfer_stage_seconds_total``: fetch, decode, assemble, infer,
  encode, produce, commit), microseconds per record and share of the stages' total (the stages overlap where one
  awaits another, so the shares say where the time is, not a sum of wall time);
- the process's CPU (``process_cpu_seconds_total``: cores busy over the window, and CPU microseconds per record);
- the GPU: utilisation (``streaminfer_gpu_utilization_ratio``, NVML) and memory in use
  (``streaminfer_gpu_memory_used_bytes``); absent on CPU;
- p99 of a record's age when its answer is acknowledged (``streaminfer_record_age_seconds``: now minus the record's
  timestamp, so a backlog being drained reads as its age) and of a batch's inference time
  (``streaminfer_inference_seconds``), interpolated within histogram buckets as Prometheus' ``histogram_quantile``.

Then one verdict per gate, with the figures behind it (the thresholds are flags):

- **compute-bound, TensorRT worth trying**: p99 age over ``--p99-ms`` with ``infer`` at least ``--share`` of the
  stage time (on the CPU execution provider: a GPU first);
- **preprocessing-bound with the GPU idle**: the process uses at least ``--cpu-busy`` cores, the Python stages
  (decode, assemble, encode) take at least ``--python-share`` of the stage time, and the GPU is under
  ``--gpu-idle-pct`` busy (or there is none): move that work out of Python (the design's third gate);
- **Kafka-bound**: p99 age over ``--p99-ms`` with the Kafka client's stages (fetch, produce, commit) the largest of
  the three groups (Kafka client, Python preprocessing, inference): more partitions and members, or the client's
  and broker's settings, not the model;
- and last **verdict**: the first gate that holds in that order, else **nothing to do**.

Several consumers (one URL each) are added up: records, stage seconds, CPU and batches summed, GPU utilisation
averaged, GPU memory the largest. ``--record FILE`` keeps the scrapes (JSON: each URL's two texts and times) and
``--replay FILE`` reads such a file instead of scraping, which is how the tests check the verdicts on scrapes of real
runs (tests/fixtures/gates/).

Exit codes: 0 done; 1 a consumer's ``/metrics`` did not answer; 2 a bad flag or an unreadable ``--replay`` file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

#: The consumer's stages (consumer.ops.metrics.STAGES), in the order they are printed.
STAGES = ("fetch", "decode", "assemble", "infer", "encode", "produce", "commit")
#: The Kafka client's stages and the Python preprocessing stages.
KAFKA_STAGES = ("fetch", "produce", "commit")
PYTHON_STAGES = ("decode", "assemble", "encode")
#: How long one scrape may take, s.
SCRAPE_TIMEOUT_S = 5.0
#: The verdicts, in the order they are tried (the last is what remains).
COMPUTE, PREPROCESSING, KAFKA, NOTHING = (
    "compute-bound, TensorRT worth trying",
    "preprocessing-bound with the GPU idle",
    "Kafka-bound",
    "nothing to do",
)

Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` text of one consumer and when it was read (epoch s)."""

    url: str
    at_s: float
    text: str


def samples(text: str) -> dict[Key, float]:
    """Every sample of a Prometheus text exposition: (sample name, sorted labels) -> value."""
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def total(values: dict[Key, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and want <= set(ls))


def buckets(values: dict[Key, float], name: str) -> dict[float, float]:
    """A histogram's cumulative buckets, upper bound -> count (``<name>_bucket``, every other label summed)."""
    out: dict[float, float] = {}
    for (n, ls), v in values.items():
        if n == f"{name}_bucket":
            le = float(dict(ls)["le"])
            out[le] = out.get(le, 0.0) + v
    return dict(sorted(out.items()))


def quantile(q: float, cumulative: dict[float, float]) -> float:
    """``q`` of a histogram from cumulative buckets, linear within the bucket it falls in (Prometheus'
    ``histogram_quantile``: the lowest bucket from 0; a quantile in the +Inf bucket is the highest finite bound).
    NaN without observations."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return math.nan
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = cumulative[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = (le if math.isfinite(le) else lower), count
    return lower


@dataclass
class Figures:
    """What the window says, all consumers together.

    Attributes:
        consumers: how many were scraped.
        window_s: the mean window, s.
        records: records answered in the window (every outcome).
        records_per_s: records/s, the consumers' rates summed.
        batches: micro-batches run.
        batch_rows: rows per batch -> share of the batches (each bucket of ``streaminfer_batch_rows`` by its bound).
        mean_rows: mean rows per batch (``_sum`` / ``_count``).
        stage_us: stage -> its seconds per record, microseconds.
        cpu_cores: process CPU, cores busy (CPU s / window s), summed.
        cpu_us_per_record: process CPU per record, microseconds.
        gpu_utilization: mean GPU busy share 0..1 over the devices sampled (None: no GPU sampled).
        gpu_memory_bytes: the largest GPU memory in use (None: no GPU sampled).
        p99_age_s: p99 of the record age at acknowledgement, s.
        p99_infer_s: p99 of a batch's ONNX Runtime time, s.
    """

    consumers: int
    window_s: float
    records: float
    records_per_s: float
    batches: float
    batch_rows: dict[float, float]
    mean_rows: float
    stage_us: dict[str, float]
    cpu_cores: float
    cpu_us_per_record: float
    gpu_utilization: float | None
    gpu_memory_bytes: float | None
    p99_age_s: float
    p99_infer_s: float

    def share(self, stages: Sequence[str]) -> float:
        """The share of the stages' total time spent in ``stages`` (NaN without stage time)."""
        whole = sum(v for v in self.stage_us.values() if math.isfinite(v))
        return sum(self.stage_us.get(s, 0.0) for s in stages) / whole if whole > 0 else math.nan

    @property
    def ones(self) -> float:
        """The share of batches of one row."""
        return self.batch_rows.get(1.0, 0.0)


def figures(pairs: Sequence[tuple[Scrape, Scrape]]) -> Figures:
    """The window's figures from each consumer's (before, after) scrapes.

    Raises:
        ValueError: no pairs, or a pair whose after is not later than its before.
    """
    if not pairs:
        raise ValueError("no scrapes")
    records = rate = batches = rows = cpu_s = cpu_cores = 0.0
    windows: list[float] = []
    stage_s = dict.fromkeys(STAGES, 0.0)
    hist: dict[str, dict[float, float]] = {"batch": {}, "age": {}, "infer": {}}
    utilisations: list[float] = []
    memories: list[float] = []
    for before, after in pairs:
        window = after.at_s - before.at_s
        if window <= 0:
            raise ValueError(f"{after.url}: the second scrape is not later than the first")
        windows.append(window)
        a, b = samples(before.text), samples(after.text)
        answered = total(b, "streaminfer_records_total") - total(a, "streaminfer_records_total")
        records += answered
        rate += answered / window
        for stage in STAGES:
            stage_s[stage] += total(b, "streaminfer_stage_seconds_total", stage=stage) - total(
                a, "streaminfer_stage_seconds_total", stage=stage
            )
        used = total(b, "process_cpu_seconds_total") - total(a, "process_cpu_seconds_total")
        cpu_s += used
        cpu_cores += used / window
        batches += total(b, "streaminfer_batch_rows_count") - total(a, "streaminfer_batch_rows_count")
        rows += total(b, "streaminfer_batch_rows_sum") - total(a, "streaminfer_batch_rows_sum")
        for key, name in (
            ("batch", "streaminfer_batch_rows"),
            ("age", "streaminfer_record_age_seconds"),
            ("infer", "streaminfer_inference_seconds"),
        ):
            first, second = buckets(a, name), buckets(b, name)
            for le, count in second.items():
                hist[key][le] = hist[key].get(le, 0.0) + count - first.get(le, 0.0)
        utilisations += [v for (n, _), v in b.items() if n == "streaminfer_gpu_utilization_ratio"]
        memories += [v for (n, _), v in b.items() if n == "streaminfer_gpu_memory_used_bytes"]
    per_bucket: dict[float, float] = {}
    below = 0.0
    for le, count in sorted(hist["batch"].items()):
        per_bucket[le] = (count - below) / batches if batches > 0 else math.nan
        below = count
    return Figures(
        consumers=len(pairs),
        window_s=sum(windows) / len(windows),
        records=records,
        records_per_s=rate,
        batches=batches,
        batch_rows=per_bucket,
        mean_rows=rows / batches if batches > 0 else math.nan,
        stage_us={s: 1e6 * v / records if records > 0 else math.nan for s, v in stage_s.items()},
        cpu_cores=cpu_cores,
        cpu_us_per_record=1e6 * cpu_s / records if records > 0 else math.nan,
        gpu_utilization=sum(utilisations) / len(utilisations) if utilisations else None,
        gpu_memory_bytes=max(memories) if memories else None,
        p99_age_s=quantile(0.99, hist["age"]),
        p99_infer_s=quantile(0.99, hist["infer"]),
    )


@dataclass(frozen=True)
class Thresholds:
    """The gates' thresholds (the command's flags)."""

    p99_ms: float = 100.0
    share: float = 0.5
    python_share: float = 0.3
    cpu_busy: float = 0.8
    gpu_idle_pct: float = 30.0


@dataclass
class Gate:
    """One gate's verdict and the figures behind it."""

    name: str
    holds: bool
    because: str


@dataclass
class Reading:
    """Every gate, and the verdict: the first gate that holds, else :data:`NOTHING`."""

    gates: list[Gate] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return next((g.name for g in self.gates if g.holds), NOTHING)


def _pct(value: float) -> str:
    return f"{100 * value:.0f} %" if math.isfinite(value) else "n/a"


def _gpu(f: Figures) -> str:
    if f.gpu_utilization is None:
        return "no GPU sampled"
    return f"GPU {100 * f.gpu_utilization:.0f} % busy"


def gates(f: Figures, t: Thresholds) -> Reading:
    """The three gates on ``f`` (in the order the verdict tries them)."""
    infer = f.share(["infer"])
    python = f.share(PYTHON_STAGES)
    kafka = f.share(KAFKA_STAGES)
    p99_ms = 1000 * f.p99_age_s
    gpu_idle = f.gpu_utilization is None or 100 * f.gpu_utilization < t.gpu_idle_pct
    on_gpu = f.gpu_utilization is not None
    compute = Gate(
        COMPUTE,
        math.isfinite(p99_ms) and p99_ms > t.p99_ms and math.isfinite(infer) and infer >= t.share,
        f"p99 age {p99_ms:.0f} ms (threshold {t.p99_ms:.0f}), infer {_pct(infer)} of the stage time "
        f"(threshold {_pct(t.share)}), p99 batch inference {1000 * f.p99_infer_s:.1f} ms"
        + ("" if on_gpu else "; no GPU sampled: on the CPU execution provider a GPU comes before TensorRT"),
    )
    preprocessing = Gate(
        PREPROCESSING,
        f.cpu_cores >= t.cpu_busy and math.isfinite(python) and python >= t.python_share and gpu_idle,
        f"process CPU {f.cpu_cores:.2f} cores (threshold {t.cpu_busy:.2f}), {f.cpu_us_per_record:.1f} us/record; "
        f"decode+assemble+encode {_pct(python)} of the stage time (threshold {_pct(t.python_share)}); "
        f"{_gpu(f)} (idle under {t.gpu_idle_pct:.0f} %)",
    )
    groups = [v if math.isfinite(v) else 0.0 for v in (kafka, python, infer)]
    kafka_gate = Gate(
        KAFKA,
        math.isfinite(p99_ms) and p99_ms > t.p99_ms and groups[0] > 0 and groups[0] == max(groups),
        f"p99 age {p99_ms:.0f} ms (threshold {t.p99_ms:.0f}); fetch+produce+commit {_pct(kafka)} of the stage "
        f"time against decode+assemble+encode {_pct(python)} and infer {_pct(infer)} (the largest is the bound); "
        f"process CPU {f.cpu_cores:.2f} cores",
    )
    return Reading([compute, preprocessing, kafka_gate])


def report(f: Figures, reading: Reading) -> list[str]:
    """The printed lines."""
    lines = [
        f"streaminfer-gates: {f.consumers} consumer{'s' if f.consumers != 1 else ''}, window {f.window_s:.1f} s",
        f"records/s: {f.records_per_s:,.0f} ({f.records:,.0f} records)",
    ]
    if f.batches > 0:
        dist = " ".join(
            f"<={le:g}:{_pct(share)}" if math.isfinite(le) else f">:{_pct(share)}"
            for le, share in f.batch_rows.items()
            if share > 0
        )
        lines.append(f"batches: {f.batches:,.0f}, mean {f.mean_rows:.1f} rows; rows per batch {dist}")
        if f.ones > 0.5:
            lines.append(
                f"  most batches hold 1 row ({_pct(f.ones)}): max_batch_delay_ms is too short, or the traffic too low "
                "for batching to help"
            )
    else:
        lines.append("batches: none in the window")
    stage = " ".join(f"{s}={us:.1f} ({_pct(f.share([s]))})" for s, us in f.stage_us.items() if math.isfinite(us))
    lines.append(f"stages, us/record: {stage or 'no records'}")
    lines.append(f"process CPU: {f.cpu_cores:.2f} cores, {f.cpu_us_per_record:.1f} us/record")
    if f.gpu_utilization is None:
        lines.append("GPU: none sampled (CPU execution provider, or no NVIDIA driver)")
    else:
        memory = f.gpu_memory_bytes or 0.0
        lines.append(f"GPU: {100 * f.gpu_utilization:.0f} % busy, {memory / 2**30:.2f} GiB in use")
    lines.append(f"p99: record age {1000 * f.p99_age_s:.1f} ms, batch inference {1000 * f.p99_infer_s:.2f} ms")
    for gate in reading.gates:
        lines.append(f"gate {gate.name}: {'YES' if gate.holds else 'no'} ({gate.because})")
    lines.append(f"verdict: {reading.verdict}")
    return lines


def scrape(url: str) -> Scrape:
    """One ``/metrics`` read of ``url`` (``http://host:port``, ``/metrics`` added when absent).

    Raises:
        OSError: it did not answer within :data:`SCRAPE_TIMEOUT_S`.
    """
    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    if not target.startswith(("http://", "https://")):
        target = "http://" + target
    with urllib.request.urlopen(target, timeout=SCRAPE_TIMEOUT_S) as response:  # noqa: S310 (http(s) only)
        return Scrape(url, time.time(), response.read().decode())


def record(path: Path, pairs: Sequence[tuple[Scrape, Scrape]]) -> None:
    """Keep the scrapes in ``path`` (what ``--replay`` reads)."""
    data = [{"url": b.url, "before": {"at_s": b.at_s, "text": b.text}, "after": {"at_s": a.at_s, "text": a.text}}
            for b, a in pairs]  # fmt: skip
    path.write_text(json.dumps({"scrapes": data}, indent=1) + "\n")


def replay(path: Path) -> list[tuple[Scrape, Scrape]]:
    """The scrapes kept in ``path`` by ``--record``.

    Raises:
        ValueError: the file is not such a record (OSError: it cannot be read).
    """
    try:
        data = json.loads(path.read_text())["scrapes"]
        return [
            (Scrape(d["url"], float(d["before"]["at_s"]), d["before"]["text"]),
             Scrape(d["url"], float(d["after"]["at_s"]), d["after"]["text"]))
            for d in data
        ]  # fmt: skip
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a streaminfer-gates record ({exc!r})") from exc


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="streaminfer-gates",
        description="Scrape consumers' /metrics over a window; print where the time goes and the V1 -> V2 gates.",
    )
    p.add_argument("urls", nargs="*", help="each consumer's metrics address (http://host:port[/metrics])")
    p.add_argument("--window", type=float, default=30.0, help="seconds between the two scrapes (default 30)")
    p.add_argument("--p99-ms", type=float, default=100.0, help="the p99 record age threshold, ms (default 100)")
    p.add_argument("--share", type=float, default=0.5, help="infer share of stage time for compute-bound (0.5)")
    p.add_argument(
        "--python-share", type=float, default=0.3, help="share of stage time in decode+assemble+encode (0.3)"
    )
    p.add_argument("--cpu-busy", type=float, default=0.8, help="process CPU, cores, that counts as saturated (0.8)")
    p.add_argument("--gpu-idle-pct", type=float, default=30.0, help="GPU busy below this %% is idle (30)")
    p.add_argument("--record", type=Path, default=None, help="also keep the scrapes in this JSON file")
    p.add_argument("--replay", type=Path, default=None, help="read the scrapes from a --record file; no URLs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``streaminfer-gates`` (exit codes in the module docstring)."""
    p = parser()
    args = p.parse_args(argv)
    if bool(args.urls) == (args.replay is not None):
        p.error("give consumers' URLs or --replay FILE, one of the two")
    if args.window <= 0:
        p.error(f"--window must be > 0 s, got {args.window}")
    thresholds = Thresholds(args.p99_ms, args.share, args.python_share, args.cpu_busy, args.gpu_idle_pct)
    if args.replay is not None:
        try:
            pairs = replay(args.replay)
        except (OSError, ValueError) as exc:
            print(f"streaminfer-gates: {exc}", file=sys.stderr)
            return 2
    else:
        try:
            before = [scrape(url) for url in args.urls]
            time.sleep(args.window)
            pairs = list(zip(before, [scrape(url) for url in args.urls], strict=True))
        except OSError as exc:
            print(f"streaminfer-gates: a consumer's /metrics did not answer: {exc}", file=sys.stderr)
            return 1
    if args.record is not None:
        record(args.record, pairs)
    f = figures(pairs)
    for line in report(f, gates(f, thresholds)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
