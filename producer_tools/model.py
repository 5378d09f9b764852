"""``streaminfer-model``: validation records, comparison sets and the gate for a candidate model.

Subcommands (docs/models.md, "Rolling out a model: record, set, gate"):

- ``set``: build a comparison set from a topic (requests or events; by ``--offsets`` or ``--since``/``--until``,
  ``--count`` records, read without a consumer group, nothing committed) or a ``--jsonl`` file, decoded by the
  consumer's own intake (the consumer's settings: flags here, the rest from ``STREAMINFER_*``); written to ``--out``
  (format: :mod:`producer_tools.modelset`);
- ``record``: run a model over a set and write its validation record (JSON; :mod:`consumer.model.record`), the
  file the consumer's ``validation_record`` setting takes;
- ``gate``: the serving model against a candidate (``--candidate FILE`` or ``--variant fp16|int8-dynamic|
  int8-dynamic-per-channel|int8-static``, built with the ONNX toolchain's converters) on the same batches of a set;
  prints the table, and writes the passing candidate's own record (``--record-out``).

Exit codes: 0 done (gate: the candidate passed); 1 the gate failed (the table says which threshold), or a topic
could not be read; 2 bad usage: a flag, a file that is not a model, set or record, or a variant the toolchain does
not apply to (the graph's operators named).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from consumer.errors import ConfigError, ModelError
from producer_tools.cli import BadArgument, ToolParser, add_bootstrap, kafka_error_text, quiet_client_logs
from producer_tools.security import add_security, security_of

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of batch sizes: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive: {text!r}")
    return sizes


def _offsets(text: str) -> dict[int, int]:
    try:
        pairs = [part.split(":") for part in text.split(",") if part.strip()]
        return {int(p): int(o) for p, o in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--offsets is PARTITION:OFFSET[,...], not {text!r}") from None


def _time_ms(text: str) -> int:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def parser() -> argparse.ArgumentParser:
    p = ToolParser(prog="streaminfer-model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("set", help="build a comparison set from a topic or a JSONL file")
    s.add_argument("--model", type=Path, required=True, help="the serving ONNX model (its inputs decide decoding)")
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--topic", help="read this topic (requests or events)")
    where.add_argument("--jsonl", type=Path, help="read record values from this JSONL file, one per line")
    s.add_argument("--out", type=Path, required=True, help="the set file to write (JSONL)")
    s.add_argument("--count", type=int, default=500, help="records in the set, at most (default %(default)s)")
    s.add_argument("--offsets", type=_offsets, default={}, help="PARTITION:OFFSET[,...]: where to start reading")
    s.add_argument("--since", type=_time_ms, help="first record time, ISO 8601 (Kafka's offsets for times)")
    s.add_argument("--until", type=_time_ms, help="records before this time only, ISO 8601")
    s.add_argument("--timeout-s", type=float, default=10.0, help="give up when nothing arrives this long, s")
    s.add_argument("--request-format", choices=("oip", "json", "avro"), help="as the consumer's request_format")
    s.add_argument("--input-mapping", type=Path, help="as the consumer's input_mapping (events)")
    s.add_argument("--tokenizer-path", type=Path, help="as the consumer's tokenizer_path (text models)")
    s.add_argument("--schema-registry-url", help="as the consumer's schema_registry_url (avro)")
    s.add_argument("--label-field", help="events: the field holding the class label (dotted for nested fields)")
    s.add_argument("--manifest", type=Path, help="OIP requests: streaminfer-produce's --manifest, labels by ID")
    add_bootstrap(s)
    add_security(s)

    r = sub.add_parser("record", help="write a model's validation record over a comparison set")
    r.add_argument("--model", type=Path, required=True, help="the ONNX model")
    r.add_argument("--set", type=Path, required=True, help="the comparison set (streaminfer-model set)")
    r.add_argument("--out", type=Path, help="the record to write (default: <model>.record.json beside it)")
    _run_flags(r)

    g = sub.add_parser("gate", help="the serving model against a candidate on a comparison set")
    g.add_argument("--model", type=Path, required=True, help="the serving ONNX model")
    g.add_argument("--set", type=Path, required=True, help="the comparison set")
    cand = g.add_mutually_exclusive_group(required=True)
    cand.add_argument("--candidate", type=Path, help="another ONNX file")
    cand.add_argument(
        "--variant",
        choices=("fp16", "int8-dynamic", "int8-dynamic-per-channel", "int8-static"),  # producer_tools.variants
        help="built from --model",
    )
    g.add_argument("--variant-out", type=Path, help="where --variant is written (default <model>.<variant>.onnx)")
    g.add_argument("--batch-size", type=int, default=32, help="rows per compared batch (default %(default)s)")
    g.add_argument("--min-agreement", type=float, default=0.99, help="top-1 agreement, fraction (default 0.99)")
    g.add_argument("--max-accuracy-drop", type=float, default=0.01, help="accuracy fall allowed (default 0.01)")
    g.add_argument("--min-cosine", type=float, default=0.99, help="mean per-row cosine of vector outputs (0.99)")
    g.add_argument("--min-row-cosine", type=float, help="worst row's cosine of vector outputs (not judged)")
    g.add_argument(
        "--min-p1-cosine", type=float, default=0.98, help="1st percentile of the rows' cosine, embeddings (0.98)"
    )
    g.add_argument(
        "--embedding-output",
        action="append",
        help="an output judged as an embedding, by cosine (repeatable; default: float [batch, dim] outputs named "
        "*embed*)",
    )
    g.add_argument("--max-abs-diff", type=float, help="largest abs difference of a float output (not judged)")
    g.add_argument("--max-mean-abs-diff", type=float, help="mean abs difference per float output (not judged)")
    g.add_argument("--max-p99-ratio", type=float, help="candidate p99 / serving p99 per batch size (not judged)")
    g.add_argument("--report", type=Path, help="write the figures as JSON here too")
    g.add_argument("--plot", type=Path, help="a histogram of the abs differences per output (PNG; matplotlib)")
    g.add_argument("--record-out", type=Path, help="a passing candidate's record (default <candidate>.record.json)")
    _run_flags(g, default_sizes="1,32")
    return p


def _run_flags(p: argparse.ArgumentParser, default_sizes: str = "1,8,32,64") -> None:
    p.add_argument(
        "--batch-sizes", type=_batch_sizes, default=_batch_sizes(default_sizes), help="timed batch sizes, rows"
    )
    p.add_argument("--min-runs", type=int, default=20, help="timed runs per batch size, at least")
    p.add_argument("--max-seconds", type=float, default=3.0, help="timing per batch size, about, s")
    p.add_argument("--provider", choices=("cpu", "cuda", "auto"), default="cpu", help="execution provider")
    p.add_argument("--label-output", help="the output holding the class (default: found from the outputs)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; returns the exit code."""
    args = parser().parse_args(argv)
    quiet_client_logs()
    try:
        if args.command == "set":
            return _set(args)
        if args.command == "record":
            return _record(args)
        return _gate(args)
    except (BadArgument, ConfigError, ModelError, ValueError) as exc:
        print(f"streaminfer-model {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (KafkaError, OSError) as exc:
        print(f"streaminfer-model {args.command}: {kafka_error_text(exc)}", file=sys.stderr)
        return EXIT_FAILED


def _set(args: argparse.Namespace) -> int:
    from consumer.config import Settings
    from consumer.model.session import SessionOptions, open_session
    from producer_tools.modelset import Source, build_set, write_set

    overrides: dict[str, Any] = {"model_path": args.model, "bootstrap_servers": args.bootstrap_servers}
    for name in ("request_format", "input_mapping", "tokenizer_path", "schema_registry_url"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.topic is not None:
        overrides["requests_topic"] = args.topic
        security = security_of(args, os.environ)  # the other tools' flags, --command-config, STREAMINFER_*
        overrides.update({f.name: getattr(security, f.name) for f in dataclasses.fields(security)})
    try:
        settings = Settings(**overrides)
    except Exception as exc:  # noqa: BLE001 (pydantic's ValidationError: the setting and the problem named)
        raise BadArgument(f"the consumer's settings: {exc}") from None
    if args.count < 1:
        raise BadArgument("--count must be at least 1")
    signature = open_session(args.model, SessionOptions(execution_provider="cpu")).signature
    source = Source(
        topic=args.topic,
        jsonl=args.jsonl,
        count=args.count,
        offsets=args.offsets,
        since_ms=args.since,
        until_ms=args.until,
        timeout_s=args.timeout_s,
    )
    comparison = build_set(settings, signature, source, label_field=args.label_field, manifest=args.manifest)
    write_set(args.out, comparison)
    h = comparison.header
    print(
        f"streaminfer-model set: {h['records']} records ({h['rows']} rows, {h['labelled']} labelled) -> {args.out}"
        + (f"; skipped {h['skipped']}" if h["skipped"] else "")
    )
    return EXIT_OK


def _record(args: argparse.Namespace) -> int:
    from producer_tools.evaluate import make_record, open_runner
    from producer_tools.modelset import read_set

    comparison = read_set(args.set)
    runner = open_runner(args.model, args.provider)
    out = args.out or args.model.with_suffix(".record.json")
    record = make_record(
        args.model,
        runner,
        comparison,
        batch_sizes=args.batch_sizes,
        label_output=args.label_output,
        min_runs=args.min_runs,
        max_seconds=args.max_seconds,
    )
    out.write_text(json.dumps(record, indent=2) + "\n")
    acc = record["accuracy"].get("top1")
    print(
        f"streaminfer-model record: {record['model']['name']} v{record['model']['version']} sha256 "
        f"{record['sha256'][:12]}... on {record['runtime']['provider']}, {record['set']['records']} records"
        + (f", accuracy {acc}" if acc is not None else "")
        + f" -> {out}"
    )
    return EXIT_OK


def _gate(args: argparse.Namespace) -> int:
    from producer_tools.evaluate import make_record, open_runner, padding_of
    from producer_tools.gate import Thresholds, gate
    from producer_tools.modelset import read_set
    from producer_tools.variants import NotApplicable, build_variant

    comparison = read_set(args.set)
    serving = open_runner(args.model, args.provider)
    candidate_path = args.candidate
    if args.variant is not None:
        candidate_path = args.variant_out or args.model.with_suffix(f".{args.variant}.onnx")
        try:
            build_variant(args.model, args.variant, candidate_path, comparison, padding_of(serving))
        except NotApplicable as exc:
            print(f"streaminfer-model gate: {exc}", file=sys.stderr)
            return EXIT_USAGE
    candidate = open_runner(candidate_path, args.provider)
    thresholds = Thresholds(
        min_agreement=args.min_agreement,
        max_accuracy_drop=args.max_accuracy_drop,
        min_cosine=args.min_cosine,
        min_row_cosine=args.min_row_cosine,
        min_p1_cosine=args.min_p1_cosine,
        max_abs_diff=args.max_abs_diff,
        max_mean_abs_diff=args.max_mean_abs_diff,
        max_p99_ratio=args.max_p99_ratio,
    )
    report = gate(
        serving,
        candidate,
        comparison,
        thresholds,
        batch_size=args.batch_size,
        batch_sizes=args.batch_sizes,
        label_output=args.label_output,
        embeddings=args.embedding_output,
        min_runs=args.min_runs,
        max_seconds=args.max_seconds,
    )
    _print_table(report, args.model, candidate_path, len(comparison.records))
    if args.report is not None:
        args.report.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if args.plot is not None:
        _plot(report.differences, args.plot)
    if not report.passed:
        failed = ", ".join(f"{c.name} {c.value:.6g} (needs {c.threshold})" for c in report.failed)
        print(f"streaminfer-model gate: FAIL: {failed}")
        return EXIT_FAILED
    out = args.record_out or candidate_path.with_suffix(".record.json")
    record = make_record(
        candidate_path,
        candidate,
        comparison,
        batch_sizes=args.batch_sizes,
        label_output=args.label_output,
        min_runs=args.min_runs,
        max_seconds=args.max_seconds,
    )
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"streaminfer-model gate: PASS: {candidate_path} (its record: {out})")
    return EXIT_OK


def _print_table(report: Any, model: Path, candidate: Path, records: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{candidate} against {model} ({records} records)")
    for column in ("check", "value", "threshold", "verdict"):
        table.add_column(column)
    for c in report.checks:
        verdict = "" if c.passed is None else ("pass" if c.passed else "FAIL")
        table.add_row(c.name, f"{c.value:.6g}" if c.value is not None else "-", c.threshold, verdict)
    Console(width=120).print(table)


def _plot(differences: dict[str, Any], path: Path) -> None:
    """A log-scale histogram of the absolute differences, one panel per float output.

    Raises:
        BadArgument: matplotlib is not installed (the bench extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadArgument("--plot needs matplotlib (pip install 'streaminfer[bench]')") from None
    import numpy as np

    names = list(differences) or ["(no float output)"]
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        d = differences.get(name)
        if d is not None and d.size:
            ax.hist(np.maximum(d, 1e-12), bins=np.logspace(-12, max(0.0, float(np.log10(d.max() + 1e-12))) + 0.1, 60))
            ax.set_xscale("log")
        ax.set_title(f"{name}: |candidate - serving|")
        ax.set_xlabel("absolute difference")
        ax.set_ylabel("values")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
