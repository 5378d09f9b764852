"""``streaminfer-results``: read the results and dead-letter topics and match them against what was sent.

Reads both topics from the beginning (no consumer group: partitions are assigned directly, nothing is committed)
until every correlation ID of the manifest has an answer or ``--timeout-s`` passes, then reports counts, missing
IDs, duplicates, latency percentiles and accuracy.

Latency of an answer = its record timestamp (the broker's append time when the topic has
``message.timestamp.type=LogAppendTime``, as ``make demo`` creates it) minus the request record's timestamp
(header ``streaminfer.request.timestamp_ms`` on results, ``streaminfer.source.timestamp_ms`` on dead letters), ms.

``--format`` says what a result holds: ``oip`` (the default) an Open Inference Protocol response (JSON, binary
extension or protobuf); ``json`` and ``avro`` an enriched event (``result_format=enrich``: the request's event plus
the model's outputs as fields), as a JSON object or as registry-framed Avro (magic byte 0, the schema ID, the datum),
read with confluent-kafka's own ``AsyncAvroDeserializer`` (``--schema-registry-url``, default
``$SCHEMA_REGISTRY_URL``). An enriched result's label is its ``--label-field`` (default ``label``), its score the
``--score-index`` (default 1) of ``--score-field`` (default ``probabilities``; a field holding a number is the
score itself): the label counts towards accuracy against the manifest's ``label`` (the held-out truth) and towards
agreement against its ``expected_label`` (what a direct ONNX Runtime run of the model gave: 1.0 unless streaminfer
changed an answer), the score must equal the manifest's ``expected_probability`` within ``--score-tolerance`` (default
1e-6, absolute, both read as float32).

A tombstone on the results topic (a null value; an empty one for a keyless record) is the answer of a tombstone
request (manifest ``"tombstone": true``): counted as a result, never read, and a mismatch either way when only one
side is a tombstone. Mismatches (reasons, scores, tombstones) and unreadable results are printed; the exit code
speaks for delivery only (every ID answered or not), as for reasons.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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

from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import REASON_HEADER, REQUEST_TIMESTAMP_HEADER, TIMESTAMP_HEADER
from producer_tools.cli import BadArgument, ToolParser, add_bootstrap, quiet_client_logs, refuse, unreachable
from producer_tools.events import RegistryUnavailable
from producer_tools.readers import (
    DEFAULT_SCORE_TOLERANCE,
    Answer,
    EventFields,
    EventResults,
    OipResults,
    ResultReader,
    field_hints,
    result_reader,
)
from producer_tools.security import Security, add_security, security_of

#: The name a line the tool says on stderr starts with.
TOOL = "streaminfer-results"
#: ``--format``: what a result's value holds (an OIP response, or an enriched event as JSON or registry Avro).
FORMATS = ("oip", "json", "avro")
#: Flags of ``--format json|avro`` only (dest, flag).
EVENTS_ONLY = (
    ("label_field", "--label-field"),
    ("score_field", "--score-field"),
    ("score_index", "--score-index"),
    ("score_tolerance", "--score-tolerance"),
)


@dataclass(slots=True)
class Report:
    """What came back for a manifest.

    Attributes:
        sent: records in the manifest.
        results: correlation IDs answered with a result (first answer per ID; tombstones included).
        dead_letters: correlation IDs answered with a dead letter.
        missing: IDs with no answer.
        duplicates: answers beyond the first per ID (at-least-once redeliveries).
        accuracy: share of labelled results whose ``label`` output equals the label (the truth), or None.
        agreement: share of results whose label equals the manifest's ``expected_label`` (a direct ONNX Runtime
            run's), or None when the manifest has none.
        reason_mismatches: (id, expected, got) for poison records whose reason differs.
        latencies_ms: latency of every first answer, ms.
        throughput_rps: answers / (last answer time - first request time), records/s.
        score_mismatches: (id, expected, got) for results whose score is not the manifest's
            ``expected_probability`` (got None: the result has no score).
        scores_checked: results whose score was compared.
        tombstones: results that are tombstones.
        tombstone_mismatches: (id, whether the manifest expected a tombstone) where only one side is one.
        unreadable: (id, why) for results that could not be read.
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
    score_mismatches: list[tuple[str, float, float | None]] = field(default_factory=list)
    scores_checked: int = 0
    tombstones: int = 0
    tombstone_mismatches: list[tuple[str, bool]] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    agreement: float | None = None

    def percentile_ms(self, q: float) -> float:
        """Latency percentile ``q`` (0..100), ms; NaN when nothing was answered."""
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def summary(self, prefix: str) -> str:
        """One line: ``<prefix>: sent=N results=R dead_letters=D accuracy=A p50_ms=X p99_ms=Y throughput_rps=T``
        (``agreement=G`` after the accuracy when the manifest has expected labels), then ``score_mismatches=M`` when
        scores were checked, ``tombstones=T`` when any was expected or answered
        and ``unreadable=U`` when a result could not be read."""
        acc = f"{self.accuracy:.4f}" if self.accuracy is not None else "nan"
        if self.agreement is not None:
            acc += f" agreement={self.agreement:.4f}"
        line = (
            f"{prefix}: sent={self.sent} results={self.results} dead_letters={self.dead_letters} accuracy={acc} "
            f"p50_ms={self.percentile_ms(50):.1f} p99_ms={self.percentile_ms(99):.1f} "
            f"throughput_rps={self.throughput_rps:.1f}"
        )
        if self.scores_checked or self.score_mismatches:
            line += f" score_mismatches={len(self.score_mismatches)}"
        if self.tombstones or self.tombstone_mismatches:
            line += f" tombstones={self.tombstones}"
        if self.unreadable:
            line += f" unreadable={len(self.unreadable)}"
        return line


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


# ------------------------------------------------------------------------------------------------ reading answers
def _answer(rec: Any, kind: str) -> Answer | None:
    """An answer's headers read (the body not yet: :class:`ResultReader`); None without a correlation ID."""
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
        answer.tombstone = not rec.value  # null; empty for a keyless tombstone (a key or a value is needed)
    return answer


async def read_answer(rec: Any, kind: str, topic: str, reader: ResultReader) -> Answer | None:
    """The :class:`Answer` of one record of the results (``kind`` ``result``) or dead-letter topic; a result that
    is not a tombstone is read by ``reader``."""
    answer = _answer(rec, kind)
    if answer is not None and kind == "result" and not answer.tombstone:
        await reader.read(answer, rec.value, topic)
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
    reader: ResultReader | None = None,
    score_tolerance: float | None = None,
    security: Security = None,
) -> Report:
    """Read answers for ``expected`` (correlation ID -> manifest entry) until all arrived or ``timeout_s``.

    Answers whose correlation ID is not in ``expected`` (earlier runs) are skipped. ``isolation_level``
    ``read_committed`` hides answers of aborted transactions (exactly-once mode). ``settle_s`` keeps reading
    that long after the last expected answer, so late duplicates are counted. ``reader`` reads each first result
    (default: OIP responses; it is closed at the end); ``score_tolerance`` defaults to the reader's. ``security``:
    aiokafka's TLS/SASL keyword arguments (:meth:`producer_tools.security.ClientSecurity.kwargs`).

    Raises:
        aiokafka.errors.KafkaError: the broker cannot be reached.
        producer_tools.events.RegistryUnavailable: Avro results: the schema registry does not answer.
    """
    reader = reader or OipResults()
    if score_tolerance is None:
        fields = getattr(reader, "fields", None)
        score_tolerance = fields.score_tolerance if isinstance(fields, EventFields) else DEFAULT_SCORE_TOLERANCE
    consumer = AIOKafkaConsumer(
        **(security or {}),
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
        await reader.close()
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
                        head = _answer(rec, kind)
                        if head is None or head.correlation_id not in expected:
                            continue
                        if head.correlation_id in first:
                            duplicates += 1
                            continue
                        answer = await read_answer(rec, kind, tp.topic, reader)
                        assert answer is not None
                        first[answer.correlation_id] = answer
                        bar.update(1)
    finally:
        await consumer.stop()
        await reader.close()
    return build_report(expected, first, duplicates, score_tolerance)


def score_matches(want: float, got: float | None, tolerance: float) -> bool:
    """Whether ``got`` equals ``want`` within ``tolerance``, both read as float32 (what the model computes)."""
    if got is None:
        return False
    return bool(abs(np.float32(got) - np.float32(want)) <= np.float32(tolerance))


def build_report(
    expected: Mapping[str, Mapping[str, Any]],
    first: Mapping[str, Answer],
    duplicates: int,
    score_tolerance: float = DEFAULT_SCORE_TOLERANCE,
) -> Report:
    """Summarise answers against the manifest."""
    results = [a for a in first.values() if a.kind == "result"]
    dead = [a for a in first.values() if a.kind == "dead_letter"]
    scored = [a for a in results if not a.tombstone]
    labelled = [(a, expected[a.correlation_id]["label"]) for a in scored if "label" in expected[a.correlation_id]]
    accuracy = sum(a.label == y for a, y in labelled) / len(labelled) if labelled else None
    direct = [
        (a, expected[a.correlation_id]["expected_label"])
        for a in scored
        if "expected_label" in expected[a.correlation_id]
    ]
    agreement = sum(a.label == y for a, y in direct) / len(direct) if direct else None
    mismatches = []
    tombstone_mismatches = []
    for cid, entry in expected.items():
        want = entry.get("expected_reason")
        got = first.get(cid)
        if want is not None and got is not None and got.reason != want:
            mismatches.append((cid, want, got.reason))
        if got is not None and bool(entry.get("tombstone")) != got.tombstone:
            tombstone_mismatches.append((cid, bool(entry.get("tombstone"))))
    checked = [
        (a.correlation_id, float(expected[a.correlation_id]["expected_probability"]), a.score)
        for a in scored
        if expected[a.correlation_id].get("expected_probability") is not None
    ]
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
        agreement=agreement,
        reason_mismatches=mismatches,
        latencies_ms=latencies,
        throughput_rps=len(first) / span_s if span_s > 0 else float("nan"),
        answers=dict(first),
        score_mismatches=[(cid, w, g) for cid, w, g in checked if not score_matches(w, g, score_tolerance)],
        scores_checked=len(checked),
        tombstones=sum(1 for a in results if a.tombstone),
        tombstone_mismatches=tombstone_mismatches,
        unreadable=[(a.correlation_id, a.error) for a in results if a.error is not None],
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
    by the manifest entries ``sources``; events: score and tombstone mismatches, unreadable results), the one-line
    summary to stdout."""
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
    if report.scores_checked:
        print(f"scores checked={report.scores_checked} mismatches={len(report.score_mismatches)}", file=err)
    for cid, want_p, got_p in report.score_mismatches[:show]:
        print(f"score mismatch: {cid} expected {want_p!r} got {got_p!r}", file=err)
    for cid, tombstone in report.tombstone_mismatches[:show]:
        what = "a tombstone, got a result or dead letter" if tombstone else "an answer, got a tombstone"
        print(f"tombstone mismatch: {cid} expected {what}", file=err)
    for cid, why in report.unreadable[:show]:
        print(f"unreadable result: {cid}: {why}", file=err)
    print(f"latency p95_ms={report.percentile_ms(95):.1f}", file=err)
    print(report.summary(prefix))


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = ToolParser(prog="streaminfer-results", description=__doc__.split("\n\n")[0])
    add_bootstrap(p)
    add_security(p)
    p.add_argument("--results-topic", default="results")
    p.add_argument("--dead-letter-topic", default="requests.dlq")
    p.add_argument("--manifest", type=Path, required=True, help="JSONL written by streaminfer-produce --manifest")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="oip",
        help="oip: inference responses (default); json / avro: enriched events (result_format=enrich), as JSON "
        "objects or as registry-framed Avro (--schema-registry-url)",
    )
    p.add_argument(
        "--schema-registry-url",
        default=None,
        help="--format avro: the schema registry (Confluent-compatible API; default $SCHEMA_REGISTRY_URL)",
    )
    defaults = EventFields()
    p.add_argument(
        "--label-field",
        default=None,
        help=f"--format json / avro: the result's label field, a dotted path (default {defaults.label}), "
        "compared with the manifest's label",
    )
    p.add_argument(
        "--score-field",
        default=None,
        help=f"--format json / avro: the result's score field, a dotted path (default {defaults.score}); a number, "
        "or an array indexed by --score-index; compared with the manifest's expected_probability",
    )
    p.add_argument(
        "--score-index",
        type=int,
        default=None,
        help=f"--format json / avro: the element of an array --score-field (default {defaults.score_index}: the "
        "probability of class 1)",
    )
    p.add_argument(
        "--score-tolerance",
        type=float,
        default=None,
        help="--format json / avro: the largest absolute difference from expected_probability that counts as "
        f"equal, both read as float32 (default {defaults.score_tolerance:g})",
    )
    p.add_argument("--timeout-s", type=float, default=60.0, help="stop waiting after this long, s")
    p.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_uncommitted",
        help="read_committed for a consumer in exactly_once mode",
    )
    p.add_argument("--show", type=int, default=10, help="image classifiers: print the top-1 label of this many")
    p.add_argument("--no-progress", action="store_true")
    return p


def reader_of(args: argparse.Namespace, env: Mapping[str, str]) -> ResultReader:
    """The :class:`ResultReader` of ``--format`` and its flags (``--schema-registry-url`` from
    ``SCHEMA_REGISTRY_URL`` for Avro when it is not given).

    Raises:
        BadArgument: a flag that does not apply to ``--format``, a missing registry or a negative tolerance.
    """
    if args.format == "oip":
        for dest, flag in (*EVENTS_ONLY, ("schema_registry_url", "--schema-registry-url")):
            if getattr(args, dest) is not None:
                raise BadArgument(f"{flag}: only with --format json or avro (enriched events), not --format oip")
        return OipResults()
    if args.format == "json" and args.schema_registry_url is not None:
        raise BadArgument("--schema-registry-url: only with --format avro, not --format json")
    if args.score_tolerance is not None and not args.score_tolerance >= 0:
        raise BadArgument(f"--score-tolerance must be >= 0, got {args.score_tolerance}")
    defaults = EventFields()
    fields = EventFields(
        label=args.label_field or defaults.label,
        score=args.score_field or defaults.score,
        score_index=defaults.score_index if args.score_index is None else args.score_index,
        score_tolerance=defaults.score_tolerance if args.score_tolerance is None else args.score_tolerance,
    )
    url = args.schema_registry_url or env.get("SCHEMA_REGISTRY_URL") or None
    return result_reader(args.format, fields, url)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``streaminfer-results``. Exit codes: 0 every ID answered; 1 an ID is missing, or the broker
    (or, for Avro results, the schema registry) cannot be reached; 2 the manifest cannot be read, or a bad argument
    (a flag that does not apply to ``--format``, ``--format avro`` without a registry)."""
    args = parser().parse_args(argv)
    quiet_client_logs()
    try:
        expected = read_manifest(args.manifest)
    except (OSError, ValueError) as exc:  # missing, unreadable or not JSON lines
        return refuse(TOOL, exc, f"--manifest {args.manifest}: {exc}")
    try:
        security = security_of(args, os.environ).kwargs()
        reader = reader_of(args, os.environ)
    except BadArgument as exc:
        return refuse(TOOL, exc)
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
                reader=reader,
                security=security,
            )
        )
    except KafkaError as exc:
        return refuse(TOOL, exc, unreachable(exc, args.bootstrap_servers))
    except RegistryUnavailable as exc:
        return refuse(TOOL, exc, f"{exc} (--schema-registry-url)")
    print_report(report, show=args.show, sources=expected)
    if isinstance(reader, EventResults):  # accuracy=0 after a mapping renamed the outputs: say where to look
        events = [a.event for a in report.answers.values() if a.event is not None]
        for line in field_hints(events, reader.fields):
            print(line, file=sys.stderr)
    return 1 if report.missing else 0


if __name__ == "__main__":
    sys.exit(main())
