"""``streaminfer-results``: read the results and dead-letter topics and match them against what was sent.

Reads both topics from the beginning (no consumer group: partitions are assigned directly, nothing is committed)
until every correlation ID of the manifest has an answer or ``--timeout-s`` passes, then reports counts, missing
IDs, duplicates, latency percentiles and accuracy.

Latency of an answer = its record timestamp (the broker's append time when the topic has
``message.timestamp.type=LogAppendTime``, as ``make demo`` creates it) minus the request record's timestamp
(header ``streaminfer.request.timestamp_ms`` on results, ``streaminfer.source.timestamp_ms`` on dead letters), ms.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from tqdm import tqdm

from consumer.oip.client import decode_response
from consumer.oip.proto import PROTO_RESPONSE, SELDON_TYPE_HEADER, parse_response
from consumer.oip.records import REASON_HEADER, REQUEST_TIMESTAMP_HEADER, TIMESTAMP_HEADER
from consumer.oip.wire import BINARY_HEADER, CORRELATION_HEADER
from producer_tools.cli import add_bootstrap, kafka_error_text, quiet_client_logs


@dataclass(slots=True)
class Answer:
    """One result or dead letter read back."""

    correlation_id: str
    kind: str  # "result" | "dead_letter"
    latency_ms: float | None
    timestamp_ms: int
    request_timestamp_ms: int | None
    reason: str | None = None
    label: int | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    body: dict[str, Any] | None = None


@dataclass(slots=True)
class Report:
    """What came back for a manifest.

    Attributes:
        sent: records in the manifest.
        results: correlation IDs answered with a result (first answer per ID).
        dead_letters: correlation IDs answered with a dead letter.
        missing: IDs with no answer.
        duplicates: answers beyond the first per ID (at-least-once redeliveries).
        accuracy: share of labelled results whose ``label`` output equals the label, or None.
        reason_mismatches: (id, expected, got) for poison records whose reason differs.
        latencies_ms: latency of every first answer, ms.
        throughput_rps: answers / (last answer time - first request time), records/s.
    """

    sent: int
    results: int
    dead_letters: int
    missing: list[str]
    duplicates: int
    accuracy: float | None
    reason_mismatches: list[tuple[str, str | None, str | None]]
    latencies_ms: list[float]
    throughput_rps: float
    answers: dict[str, Answer]

    def percentile_ms(self, q: float) -> float:
        """Latency percentile ``q`` (0..100), ms; NaN when nothing was answered."""
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def summary(self, prefix: str) -> str:
        """One line: ``<prefix>: sent=N results=R dead_letters=D accuracy=A p50_ms=X p99_ms=Y throughput_rps=T``."""
        acc = f"{self.accuracy:.4f}" if self.accuracy is not None else "nan"
        return (
            f"{prefix}: sent={self.sent} results={self.results} dead_letters={self.dead_letters} accuracy={acc} "
            f"p50_ms={self.percentile_ms(50):.1f} p99_ms={self.percentile_ms(99):.1f} "
            f"throughput_rps={self.throughput_rps:.1f}"
        )


def read_manifest(path: Path) -> dict[str, dict[str, Any]]:
    """Correlation ID -> manifest entry, from a ``streaminfer-produce --manifest`` file.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not JSON, or not an object with a string ``correlation_id``.
    """
    out: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        entry = orjson.loads(line)
        if not isinstance(entry, dict) or not isinstance(entry.get("correlation_id"), str):
            raise ValueError(f"line {number} is not a manifest entry (a JSON object with a string correlation_id)")
        out[entry["correlation_id"]] = entry
    return out


def _answer(rec: Any, kind: str) -> Answer | None:
    headers = dict(reversed(rec.headers))  # first value wins for repeated names
    cid = headers.get(CORRELATION_HEADER)
    if cid is None:
        return None
    ts_header = headers.get(REQUEST_TIMESTAMP_HEADER if kind == "result" else TIMESTAMP_HEADER)
    req_ts = int(ts_header) if ts_header else None
    answer = Answer(
        correlation_id=cid.decode("utf-8", "backslashreplace"),
        kind=kind,
        latency_ms=float(rec.timestamp - req_ts) if req_ts is not None else None,
        timestamp_ms=rec.timestamp,
        request_timestamp_ms=req_ts,
        headers=headers,
    )
    if kind == "dead_letter":
        reason = headers.get(REASON_HEADER)
        answer.reason = reason.decode() if reason else None
    else:
        length = headers.get(BINARY_HEADER)
        if headers.get(SELDON_TYPE_HEADER) == PROTO_RESPONSE:
            body = parse_response(rec.value)
        else:
            body = decode_response(rec.value, int(length) if length is not None else None)
        answer.body = body
        label = body["outputs"].get("label")
        if label is not None and label.size == 1 and label.dtype.kind in "iu":  # digits: the class index
            answer.label = int(label.reshape(-1)[0])
    return answer


async def collect(
    bootstrap_servers: str,
    results_topic: str,
    dead_letter_topic: str,
    expected: Mapping[str, Mapping[str, Any]],
    timeout_s: float = 60.0,
    progress: bool = True,
    isolation_level: str = "read_uncommitted",
    settle_s: float = 0.0,
) -> Report:
    """Read answers for ``expected`` (correlation ID -> manifest entry) until all arrived or ``timeout_s``.

    Answers whose correlation ID is not in ``expected`` (earlier runs) are skipped. ``isolation_level``
    ``read_committed`` hides answers of aborted transactions (exactly-once mode). ``settle_s`` keeps reading
    that long after the last expected answer, so late duplicates are counted.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="streaminfer-results",
        isolation_level=isolation_level,
    )
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()  # close what the failed start opened (no "Unclosed" warning)
        raise
    first: dict[str, Answer] = {}
    duplicates = 0
    try:
        # No group: every partition of both topics is read from the earliest offset, nothing is committed.
        consumer.subscribe([results_topic, dead_letter_topic])
        deadline = time.monotonic() + timeout_s
        with tqdm(
            total=len(expected), desc="answers", unit="rec", disable=None if progress else True
        ) as bar:  # None: only on a TTY
            settle_until: float | None = None
            while time.monotonic() < deadline:
                if len(first) == len(expected):
                    settle_until = settle_until or time.monotonic() + settle_s
                    if time.monotonic() >= settle_until:
                        break
                batches = await consumer.getmany(timeout_ms=200)
                for tp, records in batches.items():
                    kind = "result" if tp.topic == results_topic else "dead_letter"
                    for rec in records:
                        answer = _answer(rec, kind)
                        if answer is None or answer.correlation_id not in expected:
                            continue
                        if answer.correlation_id in first:
                            duplicates += 1
                            continue
                        first[answer.correlation_id] = answer
                        bar.update(1)
    finally:
        await consumer.stop()
    return build_report(expected, first, duplicates)


def build_report(expected: Mapping[str, Mapping[str, Any]], first: Mapping[str, Answer], duplicates: int) -> Report:
    """Summarise answers against the manifest."""
    results = [a for a in first.values() if a.kind == "result"]
    dead = [a for a in first.values() if a.kind == "dead_letter"]
    labelled = [(a, expected[a.correlation_id]["label"]) for a in results if "label" in expected[a.correlation_id]]
    accuracy = sum(a.label == y for a, y in labelled) / len(labelled) if labelled else None
    mismatches = []
    for cid, entry in expected.items():
        want = entry.get("expected_reason")
        got = first.get(cid)
        if want is not None and got is not None and got.reason != want:
            mismatches.append((cid, want, got.reason))
    latencies = [a.latency_ms for a in first.values() if a.latency_ms is not None]
    starts = [a.request_timestamp_ms for a in first.values() if a.request_timestamp_ms is not None]
    ends = [a.timestamp_ms for a in first.values()]
    span_s = (max(ends) - min(starts)) / 1000.0 if starts and ends else 0.0
    return Report(
        sent=len(expected),
        results=len(results),
        dead_letters=len(dead),
        missing=sorted(set(expected) - set(first)),
        duplicates=duplicates,
        accuracy=accuracy,
        reason_mismatches=mismatches,
        latencies_ms=latencies,
        throughput_rps=len(first) / span_s if span_s > 0 else float("nan"),
        answers=dict(first),
    )


#: The output an image classifier names its class names in, best first (models/efficientnet_lite0).
TOP_LABELS = "top_k_labels"


def top_labels(answer: Answer) -> list[tuple[str, float | None]] | None:
    """An image classifier's answer: each row's top-1 class name and, when the answer has ``probabilities`` and
    ``top_k_indices``, its probability; None for answers without :data:`TOP_LABELS`."""
    outputs = answer.body["outputs"] if answer.body is not None else {}
    labels = outputs.get(TOP_LABELS)
    if labels is None or labels.ndim != 2 or labels.shape[1] == 0:
        return None
    probabilities, indices = outputs.get("probabilities"), outputs.get("top_k_indices")
    out: list[tuple[str, float | None]] = []
    for row in range(labels.shape[0]):
        p = None
        if probabilities is not None and indices is not None:
            p = float(probabilities[row, int(indices[row, 0])])
        out.append((str(labels[row, 0]), p))
    return out


def print_labels(
    report: Report, show: int, out: Any = sys.stderr, sources: Mapping[str, Mapping[str, Any]] | None = None
) -> None:
    """Image classifiers: the top-1 label of the first ``show`` answers (with the manifest's ``source``, the
    file names, when ``sources`` has it) and a count per label."""
    counts: dict[str, int] = {}
    shown = 0
    for cid, answer in report.answers.items():
        rows = top_labels(answer)
        if rows is None:
            continue
        for label, _ in rows:
            counts[label] = counts.get(label, 0) + 1
        if shown < show:
            text = ", ".join(label + (f" (p={p:.3f})" if p is not None else "") for label, p in rows)
            source = (sources or {}).get(cid, {}).get("source")
            print(f"{cid}" + (f" [{source}]" if source else "") + f": top-1 {text}", file=out)
            shown += 1
    if shown < sum(1 for a in report.answers.values() if top_labels(a) is not None):
        print(f"(top-1 labels of the first {show} answers shown; --show N for more)", file=out)
    if counts:
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        print("top-1 labels: " + ", ".join(f"{label}={n}" for label, n in ranked), file=out)


def print_report(
    report: Report,
    prefix: str = "results",
    show: int = 10,
    sources: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Human-readable details to stderr (image classifiers: the top-1 label of the first ``show`` answers, named
    by the manifest entries ``sources``), the one-line summary to stdout."""
    err = sys.stderr
    print_labels(report, show, err, sources)
    print(f"duplicates={report.duplicates} missing={len(report.missing)}", file=err)
    if report.missing:
        print(f"missing (first 10): {report.missing[:10]}", file=err)
    reasons: dict[str, int] = {}
    for a in report.answers.values():
        if a.reason:
            reasons[a.reason] = reasons.get(a.reason, 0) + 1
    if reasons:
        print("dead letters by reason: " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())), file=err)
    for cid, want, got in report.reason_mismatches:
        print(f"reason mismatch: {cid} expected {want} got {got}", file=err)
    print(f"latency p95_ms={report.percentile_ms(95):.1f}", file=err)
    print(report.summary(prefix))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``streaminfer-results``. Exit codes: 0 every ID answered; 1 an ID is missing or the broker
    cannot be reached; 2 the manifest cannot be read."""
    p = argparse.ArgumentParser(prog="streaminfer-results", description=__doc__.split("\n\n")[0])
    add_bootstrap(p)
    p.add_argument("--results-topic", default="results")
    p.add_argument("--dead-letter-topic", default="requests.dlq")
    p.add_argument("--manifest", type=Path, required=True, help="JSONL written by streaminfer-produce --manifest")
    p.add_argument("--timeout-s", type=float, default=60.0, help="stop waiting after this long, s")
    p.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_uncommitted",
        help="read_committed for a consumer in exactly_once mode",
    )
    p.add_argument("--show", type=int, default=10, help="image classifiers: print the top-1 label of this many")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    quiet_client_logs()
    try:
        expected = read_manifest(args.manifest)
    except (OSError, ValueError) as exc:  # missing, unreadable or not JSON lines
        print(f"streaminfer-results: --manifest {args.manifest}: {exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(
            collect(
                args.bootstrap_servers,
                args.results_topic,
                args.dead_letter_topic,
                expected,
                args.timeout_s,
                not args.no_progress,
                isolation_level=args.isolation_level,
                settle_s=2.0,
            )
        )
    except KafkaError as exc:
        print(
            f"streaminfer-results: {kafka_error_text(exc)} (bootstrap_servers={args.bootstrap_servers})",
            file=sys.stderr,
        )
        return 1
    print_report(report, show=args.show, sources=expected)
    return 1 if report.missing else 0


if __name__ == "__main__":
    sys.exit(main())
