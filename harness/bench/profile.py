"""Profile streaminfer on the bench's own digits records with py-spy: where the consumer process's CPU goes.

Writes a backlog of ``--records`` one-row digits requests (:func:`harness.bench.data.digits_backlog`, what the bench's
rounds drain), starts ``streaminfer-consumer`` at default settings on it (``--delivery``), attaches
``py-spy record --format raw`` (``--rate`` samples/s, active threads only: a thread waiting in the event loop's
``select`` is not sampled) once it is ready, stops py-spy when the last result is read, and prints (and, with
``--out``, writes as markdown) the functions with the largest share of the samples: by own time (the innermost
frame) and by total time (every function on the stack, once per sample), and by source file.

py-spy is not a dependency of the project (a Rust binary): ``--py-spy`` names it (default: on ``PATH``), e.g.
``pip install --target /tmp/pyspy py-spy`` then ``--py-spy /tmp/pyspy/bin/py-spy``.

Usage: ``python -m harness.localkafka --state .bench/profile run -- python -m harness.bench.profile --out x.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from harness.bench.data import DIGITS_MODEL, digits_backlog
from harness.bench.events import EVENTS_MODEL, backlog_records, default_registry_url, schema_registry
from harness.bench.measure import new_topics, read_results, results_topic, start_streaminfer, stop, throughput
from producer_tools.produce import send_all

#: A function on at least this share of the samples is the spine of every stack (runpy, the event loop), left out
#: of the total-time table.
SPINE = 0.9
#: A raw (collapsed) py-spy line: ``frame;frame;... count``; a frame: ``function (file:line)``.
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def parse(raw: str) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    """Own-time, total-time and per-file sample counts from py-spy's raw output, and the samples in all."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    files: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1][0]] += n
        files[frames[-1][1]] += n
        for name in {f[0] for f in frames}:
            inclusive[name] += n
    return own, inclusive, files, total


def short(frame: str) -> tuple[str, str]:
    """(``function (file)``, file) of a frame, the file shortened to what follows site-packages or the repo."""
    m = FRAME.match(frame.strip())
    func, path = (m["func"], m["file"]) if m else (frame.strip(), "?")
    for marker in ("site-packages/", "/lib/python3", str(Path.cwd()) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{func} ({path})", path


def table(title: str, counts: Counter[str], total: int, top: int) -> list[str]:
    """A markdown table of the ``top`` largest counts as shares of ``total``."""
    rows = [f"### {title}", "", "| share of samples | function |", "|---:|---|"]
    rows += [f"| {100 * n / total:.1f} % | `{name}` |" for name, n in counts.most_common(top)]
    return [*rows, ""]


async def profile(args: argparse.Namespace) -> list[str]:
    """The run, and its report's lines (markdown)."""
    bootstrap = args.bootstrap_servers
    tag = uuid.uuid4().hex[:6]
    topics = await new_topics(bootstrap, f"profile-{tag}", args.partitions)
    topics["results"] = await results_topic(bootstrap, f"profile-{tag}-out")
    settings: dict[str, Any] = {"delivery": args.delivery}
    if args.shadow is not None:  # a shadow candidate scores every micro-batch (consumer.shadow)
        settings["shadow_model_path"] = DIGITS_MODEL if args.shadow == "same" else args.shadow
    if args.delivery == "exactly_once":
        settings["transactional_id_prefix"] = f"profile-{tag}"
    with tempfile.TemporaryDirectory() as tmp:
        async with schema_registry(args.schema_registry_url, Path(tmp), wanted=args.format == "avro") as registry:
            if args.format == "oip":
                model, backlog = DIGITS_MODEL, digits_backlog("p", args.records)
            else:
                model = EVENTS_MODEL
                backlog = backlog_records("p", args.records, args.format, registry, topics["requests"])
                settings["request_format"] = args.format
                if registry is not None:
                    settings["schema_registry_url"] = registry
            await send_all(bootstrap, topics["requests"], backlog, progress=False)
            return await _profiled(args, bootstrap, topics, model, Path(tmp), settings)


async def _profiled(
    args: argparse.Namespace, bootstrap: str, topics: dict[str, str], model: Path, tmp: Path, settings: dict[str, Any]
) -> list[str]:
    """Run the consumer on the backlog under py-spy; the report's lines."""
    raw = tmp / "raw.txt"
    child = start_streaminfer(bootstrap, topics, model, tmp / "consumer.log", **settings)
    spy = subprocess.Popen(  # noqa: S603, ASYNC220 (our py-spy; Popen returns at once)
        [args.py_spy, "record", "--pid", str(child.proc.pid), "--format", "raw", "--rate", str(args.rate),
         "--nonblocking", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        stamps = await read_results(bootstrap, topics["results"], args.records, timeout_s=args.timeout_s)
    finally:
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        stop(child)
    text = raw.read_text() if raw.is_file() else ""
    if args.raw is not None:
        args.raw.write_text(text)
    own, inclusive, files, total = parse(text)
    if not total:
        raise SystemExit(f"py-spy recorded nothing: {err.decode(errors='replace')[-500:]}")
    what = (
        "digits (the bench's own: one-row OIP JSON requests)"
        if args.format == "oip"
        else f"breast-cancer {args.format} events (the bench's own, enriched results)"
    )
    head = [
        f"{args.records:,} {what} records, streaminfer-consumer at "
        f"default settings, {args.partitions} request partitions, delivery {args.delivery}{shadowed(args)}, "
        f"{len(stamps):,} results at "
        f"{throughput(stamps):,.0f} records/s; py-spy {args.rate} samples/s of the consumer's active threads, "
        f"{total:,} samples. "
        f"Machine: {os.cpu_count()} cores (shared).",
        "",
    ]
    return [
        *head,
        *table("Own time (innermost frame)", own, total, args.top),
        *table(
            f"Total time (on the stack; the frames under every sample, {SPINE:.0%} or more, left out: the "
            "entry point and the event loop)",
            Counter({k: v for k, v in inclusive.items() if v < SPINE * total}),
            total,
            args.top,
        ),
        *table("Own time by source file", files, total, args.top),
    ]


def shadowed(args: argparse.Namespace) -> str:
    """The report's words for ``--shadow`` (empty without one)."""
    if args.shadow is None:
        return ""
    return ", shadow of the same model" if args.shadow == "same" else f", shadow {args.shadow}"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m harness.bench.profile", description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--records", type=int, default=150_000, help="digits backlog, records (the bench's rounds)")
    p.add_argument("--partitions", type=int, default=4, help="requests topic partitions (the wide row: 128)")
    p.add_argument("--delivery", choices=["at_least_once", "exactly_once"], default="at_least_once")
    p.add_argument("--format", choices=["oip", "json", "avro"], default="oip", help="digits OIP, or events")
    p.add_argument("--schema-registry-url", default=default_registry_url(), help="Avro: else a local one is started")
    p.add_argument(
        "--shadow",
        default=None,
        help="shadow_model_path: 'same' (the digits model itself, the bench's shadow row) or an ONNX file",
    )
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25, help="rows per table")
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy", help="the py-spy binary")
    p.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for the results, s")
    p.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    p.add_argument("--raw", type=Path, default=None, help="also keep py-spy's raw stacks here")
    args = p.parse_args()
    lines = asyncio.run(profile(args))
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
