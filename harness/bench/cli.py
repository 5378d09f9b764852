"""``python -m harness.bench``'s command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from harness.bench.data import DEFAULT_MINILM, DEFAULT_VISION, DIGITS_MODEL, ROOT
from harness.bench.events import default_registry_url
from harness.bench.plan import ROUND_LABELS, WARMUP_PASSES, WIDE, WIDE_PARTITIONS, Bench
from harness.bench.report import (
    check_docs,
    other_cpu_pct,
    plots,
    rounds_line,
    stage_line,
    strict_json,
    summary_line,
    table,
    write_docs,
)
from harness.bench.vision import vision_line
from harness.bench.workers import worker

DESCRIPTION = "streaminfer against its ceilings (the Kafka client alone, ONNX Runtime alone) and a naive consumer."


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(prog="streaminfer-bench", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command")
    w = sub.add_parser("worker", help="internal: a baseline consumer process (harness.bench.workers)")
    w.add_argument("mode", choices=["naive", "passthrough", "passthrough-events", "decode-encode", "naive-vision"])
    w.add_argument("--bootstrap-servers", required=True)
    w.add_argument("--requests", required=True)
    w.add_argument("--results", required=True)
    w.add_argument("--model-path", type=Path, required=True)
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--format", choices=["json", "avro"], default="json", help="passthrough-events: the events' format")
    w.add_argument("--schema", type=Path, default=None, help="passthrough-events, avro: the writer schema (.avsc)")
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--out", type=Path, default=ROOT / "bench-results", help="results folder (JSON, PNG, logs)")
    p.add_argument(
        "--docs",
        type=Path,
        default=None,
        help="also rewrite the generated block of this page and copy the plots beside it (make bench: "
        "docs/benchmarks.md)",
    )
    p.add_argument("--records", type=int, default=50_000, help="digits backlog, records")
    p.add_argument(
        "--round-records",
        type=int,
        default=150_000,
        help="the digits backlog of the ratios' rounds, records (longer runs average out a shared machine's bursts)",
    )
    p.add_argument(
        "--wide-partitions",
        type=int,
        default=WIDE_PARTITIONS,
        help="the digits rounds again on a requests topic of this many partitions (the rows "
        f"{WIDE!r}; the wide_* keys); 0: none",
    )
    p.add_argument("--wide-rounds", type=int, default=3, help="rounds on the wide topic")
    p.add_argument("--events", type=int, default=50_000, help="events backlog (JSON, and Avro), records")
    p.add_argument(
        "--schema-registry-url",
        default=default_registry_url(),
        help="Avro events: the schema registry (default $SCHEMA_REGISTRY_URL; unset: a local one for the run)",
    )
    p.add_argument("--texts", type=int, default=2_000, help="MiniLM backlog, texts")
    p.add_argument("--minilm-dir", type=Path, default=DEFAULT_MINILM, help="models/minilm/build.py output")
    p.add_argument("--minilm-batch", type=int, default=64, help="MiniLM max_batch_size and bare ORT batch, rows")
    p.add_argument("--images", type=int, default=1024, help="vision backlog, records of one JPEG each")
    p.add_argument("--vision-dir", type=Path, default=DEFAULT_VISION, help="models/efficientnet_lite0/build.py output")
    p.add_argument("--naive-s", type=float, default=10.0, help="time box of the naive consumer, s")
    p.add_argument(
        "--passthrough-s", type=float, default=60.0, help="time box of the passthrough and decode-encode consumers, s"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="back-to-back rounds behind each ratio (its median; the spread is the largest minus the smallest)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=WARMUP_PASSES,
        help="untimed passthrough passes over a backlog before anything is measured (the broker's JIT)",
    )
    p.add_argument("--open-s", type=float, default=8.0, help="duration of each open-loop run, s")
    p.add_argument("--lone-s", type=float, default=3.0, help="duration of the lone-record run (10 rec/s), s")
    p.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for one run's results, s")
    p.add_argument("--skip-minilm", action="store_true", help="digits only")
    p.add_argument("--skip-digits", action="store_true", help="no digits runs (the digits ratios are then nan)")
    p.add_argument("--skip-vision", action="store_true", help="no EfficientNet-Lite0 runs (vision_vs_ceiling nan)")
    p.add_argument(
        "--skip-events", action="store_true", help="no events runs (events_vs_passthrough and the Avro one nan)"
    )
    p.add_argument(
        "--skip-shadow", action="store_true", help="no shadow run in the digits rounds (the shadow_* keys nan)"
    )
    p.add_argument(
        "--only-shadow",
        action="store_true",
        help="only the shadow rows: digits rounds of streaminfer without a shadow, with a shadow of the same model "
        "and with a slow one (--round-records each); every other key nan",
    )
    p.add_argument("--quick", action="store_true", help="small sizes and a short sweep (tests)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m harness.bench``."""
    p = parser()
    args = p.parse_args(argv)
    if args.command == "worker":
        asyncio.run(worker(args.mode, args))
        return 0
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.wide_partitions < 0 or args.wide_rounds < 1:
        p.error("--wide-partitions must be >= 0 and --wide-rounds >= 1")
    if args.only_shadow and args.skip_shadow:
        p.error("--only-shadow and --skip-shadow exclude each other")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.quick:
        args.records = min(args.records, 2000)
        args.round_records = min(args.round_records, 2000)
        args.events = min(args.events, 2000)
        args.warmup = min(args.warmup, 1)
        args.texts = min(args.texts, 200)
        args.images = min(args.images, 256)
        args.rounds = min(args.rounds, 2)
        args.wide_partitions, args.wide_rounds = min(args.wide_partitions, 16), min(args.wide_rounds, 1)
        args.naive_s, args.open_s, args.lone_s = min(args.naive_s, 3.0), min(args.open_s, 2.0), min(args.lone_s, 1.0)
    if not DIGITS_MODEL.is_file() and not args.skip_digits:
        raise SystemExit("streaminfer-bench: digits model missing; run make model")
    if args.docs is not None:
        check_docs(args.docs)
    result = asyncio.run(Bench(args).run())
    (args.out / "bench.json").write_text(json.dumps(strict_json(result), indent=2) + "\n")
    print(table(result["runs"]))
    lines = [stage_line(r) for r in result["runs"] if r["extra"].get("stage_us") and r["extra"].get("default")]
    for line in lines:
        print(line)
    written = [] if args.only_shadow else plots(result, args.out)  # --only-shadow: no sweep to draw
    for path in written:
        print(f"wrote {path}")
    print(f"wrote {args.out / 'bench.json'}")
    if result["warmup"]:
        lines.append(
            "warm-up (passthrough, untimed, before any round), rec/s: " + " ".join(f"{v:.0f}" for v in result["warmup"])
        )
        print(lines[-1])
    for key, label in ROUND_LABELS.items():
        values = result["rounds"][label]
        if values:
            lines.append(rounds_line(label, values, result["other_cpu_pct"].get(key, math.nan)))
            print(lines[-1])
    vision = vision_line(result["runs"])
    if vision is not None:
        lines.append(vision)
        print(vision)
    lines.append(summary_line(result["ratios"], result["spreads"], other_cpu_pct(result["runs"])))
    if args.docs is not None:
        write_docs(args.docs, result, lines, written, datetime.now(UTC).date().isoformat())
        print(f"wrote {args.docs}")
    print(lines[-1])
    return 0
