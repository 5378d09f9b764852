"""The events part of the benchmark (issue 26): the breast-cancer events (``models/breast_cancer``), as JSON objects
and as registry-framed Avro, scored by the tabular model (30 ``[batch, 1]`` inputs fed by the event fields of the
same names: the zero-configuration mapping) into enriched results, against a client-only ceiling.

- **passthrough** (``events-json`` / ``events-avro``), the ceiling: the worker ``passthrough-events``
  (:mod:`harness.bench.workers`), no streaminfer code: the same aiokafka client fetches, decodes every event as the
  consumer does (``orjson.loads``; fastavro's ``schemaless_reader`` with the writer schema after the 5-byte frame),
  and appends a fixed answer of an enriched result's size with the same key and headers into producer batches;
- **streaminfer**: ``streaminfer-consumer --request-format json|avro`` at default settings (enriched results; Avro:
  the writer schema fetched by ID from the registry, the result schema registered under the results subject).

Both drain the same backlog (``--events`` records: the 114 held-out events of ``events.jsonl`` cycled, keyed by
``patient_id``, their expectations taken off), in ``--rounds`` back-to-back rounds, each format's pair in a rotated
order; ``events_vs_passthrough`` (JSON) and ``avro_events_vs_passthrough`` are the medians of the per-round ratios.

The Avro backlog is written by confluent-kafka's own ``AvroSerializer`` against a schema registry:
``--schema-registry-url`` (default ``$SCHEMA_REGISTRY_URL``), else a :class:`harness.registry.LocalRegistry` started
for the run and stopped after it. Without one (no JDK >= 21, say) the Avro rows are left out with a note (its
ratio is then nan).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from harness.bench.data import ROOT
from harness.bench.measure import Run, new_topics
from producer_tools.events import avro_encoder, json_encoder, read_events, take_expectations
from producer_tools.produce import Outgoing, send_all

EVENTS_DIR = ROOT / "models" / "breast_cancer"
#: The tabular model: one ``[batch, 1]`` FLOAT input per feature (the zero-configuration mapping).
EVENTS_MODEL = EVENTS_DIR / "artifacts" / "breast_cancer.onnx"
EVENTS_FILE = EVENTS_DIR / "artifacts" / "events.jsonl"
EVENTS_SCHEMA = EVENTS_DIR / "events.avsc"
#: The request formats measured, in each round's order.
FORMATS = ("json", "avro")
#: The ratio keys of the summary line, per format.
RATIO_KEYS = {"json": "events_vs_passthrough", "avro": "avro_events_vs_passthrough"}


class BenchLike(Protocol):
    """What the events runs use of :class:`harness.bench.plan.Bench`."""

    args: argparse.Namespace
    bootstrap: str
    tag: str
    runs: list[Run]

    def step(self, what: str) -> None:
        """Advance the progress bar."""

    async def closed_streaminfer(
        self, model_name: str, model: Path, topics_backlog: str, n: int, setting: str, **settings: Any
    ) -> Run:
        """streaminfer over a backlog."""

    async def closed_worker(
        self,
        mode: str,
        model: Path,
        backlog: str,
        n: int,
        seconds: float,
        model_name: str = "digits",
        extra: tuple[str, ...] = (),
    ) -> Run:
        """A baseline worker over a backlog."""


def model_name(request_format: str) -> str:
    """The model column of a format's rows: ``events-json``, ``events-avro``."""
    return f"events-{request_format}"


def check_files() -> None:
    """Stop before anything is measured when the model or its events are missing.

    Raises:
        SystemExit: they are (``make model`` builds them).
    """
    if not EVENTS_MODEL.is_file() or not EVENTS_FILE.is_file():
        raise SystemExit(f"streaminfer-bench: {EVENTS_MODEL} or {EVENTS_FILE} missing; run make model")


@contextlib.asynccontextmanager
async def schema_registry(url: str | None, log_dir: Path, wanted: bool = True) -> AsyncIterator[str | None]:
    """The schema registry's URL for the run: ``url`` when given, else a local Apicurio Registry started now and
    stopped (its schemas deleted, its log copied into ``log_dir``) on exit; None, with a note on stderr, when none
    can be started, and when none is ``wanted``."""
    if not wanted:
        yield None
        return
    if url:
        yield url
        return
    from harness.registry import LocalRegistry, RegistrySetupError

    with tempfile.TemporaryDirectory(prefix="bench-registry-") as state:
        registry = LocalRegistry(Path(state), log=False)
        try:
            started = await asyncio.to_thread(registry.start, discard_stale=True)
        except RegistrySetupError as exc:
            print(f"streaminfer-bench: no schema registry, Avro events left out: {exc}", file=sys.stderr)
            yield None
            return
        try:
            yield started
        finally:
            with contextlib.suppress(OSError):  # keep its log beside the others
                (log_dir / "registry.log").write_bytes(registry.log_file.read_bytes())
            await asyncio.to_thread(registry.stop)


def backlog_records(tag: str, n: int, request_format: str, registry_url: str | None, topic: str) -> list[Outgoing]:
    """``n`` event records: the events of events.jsonl (expectations taken off) cycled, keyed by ``patient_id``,
    each distinct event encoded once (JSON, or Avro by confluent-kafka's serializer, registered under
    ``<topic>-value``)."""
    events = read_events(EVENTS_FILE)
    for number, event in enumerate(events, start=1):
        take_expectations(event, number)
    if request_format == "json":
        encode = json_encoder()
    else:
        assert registry_url is not None
        encode = avro_encoder(registry_url, EVENTS_SCHEMA.read_text(), topic)
    values = [encode(event) for event in events]
    keys = [str(event["patient_id"]).encode() for event in events]
    return [Outgoing(f"{tag}-{i}", values[i % len(values)], key=keys[i % len(keys)]) for i in range(n)]


async def backlogs(bench: BenchLike, registry_url: str | None) -> dict[str, str]:
    """Request format -> the topic holding its backlog (``--events`` records; Avro only with a registry), written
    early so the broker's fresh logs have settled before they are read."""
    topics = {}
    for request_format in FORMATS:
        if request_format == "avro" and registry_url is None:
            continue
        topic = (await new_topics(bench.bootstrap, f"{bench.tag}-events-{request_format}"))["requests"]
        records = await asyncio.to_thread(
            backlog_records, request_format[0], bench.args.events, request_format, registry_url, topic
        )
        await send_all(bench.bootstrap, topic, records, progress=False)
        topics[request_format] = topic
    return topics


async def events(bench: BenchLike, topics: dict[str, str], registry_url: str | None) -> None:
    """Every events run, appended to ``bench.runs``: per round, each format's ceiling and streaminfer back to back
    (their order rotated from round to round)."""
    a = bench.args
    n = a.events
    for i in range(a.rounds):
        for request_format, topic in topics.items():
            name = model_name(request_format)
            order = ("passthrough", "streaminfer") if i % 2 == 0 else ("streaminfer", "passthrough")
            for mode in order:
                if mode == "passthrough":
                    extra = ("--format", request_format, "--schema", str(EVENTS_SCHEMA))
                    run = await bench.closed_worker(
                        "passthrough-events", EVENTS_MODEL, topic, n, a.passthrough_s, model_name=name, extra=extra
                    )
                    run.mode = "passthrough"
                else:
                    settings: dict[str, Any] = {"request_format": request_format}
                    if request_format == "avro":
                        settings["schema_registry_url"] = registry_url
                    run = await bench.closed_streaminfer(name, EVENTS_MODEL, topic, n, "b64/d5ms", **settings)
                run.setting = f"{run.setting}, round {i + 1}"
                run.extra["round"] = i + 1
                bench.runs.append(run)
        bench.step(f"events: round {i + 1}")


def default_registry_url() -> str | None:
    """``SCHEMA_REGISTRY_URL`` when set (the bench then starts no registry of its own)."""
    return os.environ.get("SCHEMA_REGISTRY_URL") or None
