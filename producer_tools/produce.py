"""``streaminfer-produce``: send inference requests, or domain events, to the requests topic.

``--format oip`` (the default) sends Open Inference Protocol requests. Sources:
- ``digits``: the held-out split written by ``models/digits/build.py`` (one 1x64 FP32 row per record, labels known);
- ``FILE.jsonl``: one OIP inference request object per line (its ``id``, if any, is kept);
- ``FILE.npy``: an array ``[n, ...]``; each row becomes a one-row request for ``--input-name`` (default: the only
  input of ``--model-path``);
- ``DIR`` (a folder of JPEG/PNG/... files) or ``samples`` (scikit-image's sample photographs): image requests
  (:mod:`consumer.model.vision`), ``--images-per-record`` images each (default 1), for ``--input-name`` (default
  ``image``), BYTES in the binary data extension (``--base64``: in JSON); ``--limit`` cycles through the images
  until that many records.
``--poison`` adds every kind of :mod:`producer_tools.poison` (for the digits model), interleaved.

``--format json`` and ``--format avro`` send domain events from ``--source FILE.jsonl`` (one JSON object a line,
:mod:`producer_tools.events`): as they are, or as Confluent-framed Avro (``--schema FILE.avsc``
``--schema-registry-url URL``, default ``$SCHEMA_REGISTRY_URL``: confluent-kafka's ``AvroSerializer``, subject
``<topic>-value``, the schema registered if absent). ``--key-field PATH`` keys each record by that field (dotted
paths reach into nested objects); ``true_label``, ``expected_label`` and ``expected_probability`` go to the manifest,
not the topic.
A flag that does not apply to the chosen format is refused (exit 2, naming it).

Each record gets a correlation ID ``<run-id>-<n>`` (header ``correlation_id``; for OIP also the request ``id`` unless
the JSONL line has one; the record key unless ``--key-field`` names another). ``--manifest`` writes one JSON line per
record as the broker acknowledges it: ``{"correlation_id", "label"?, "expected_label"?, "expected_probability"?,
"expected_reason"?, "tombstone"?}``,
which ``streaminfer-results`` matches against; a run that fails midway leaves exactly the records that reached the
topic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from tqdm import tqdm

from consumer.answers.headers import CORRELATION_HEADER
from consumer.json_object import json_object
from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER
from producer_tools.cli import BadArgument, ToolParser, add_bootstrap, quiet_client_logs, refuse, unreachable
from producer_tools.events import (
    EXPECTATION_FIELDS,
    Encoder,
    RegistryUnavailable,
    avro_encoder,
    check_avro,
    json_encoder,
    key_of,
    load_schema,
    read_events,
    take_expectations,
)
from producer_tools.images import folder_images, sample_images
from producer_tools.poison import catalogue
from producer_tools.security import Security, add_security, security_of
from producer_tools.topics import TopicMissingError, require_topic

#: The name a line the tool says on stderr starts with.
TOOL = "streaminfer-produce"
DEFAULT_HELDOUT = Path(__file__).resolve().parent.parent / "models" / "digits" / "artifacts" / "heldout.npz"
#: ``--format``: Open Inference Protocol requests, or domain events as JSON objects or registry-framed Avro.
FORMATS = ("oip", "json", "avro")
#: Flags of ``--format oip`` only (dest, flag).
OIP_ONLY = (
    ("poison", "--poison"),
    ("base64", "--base64"),
    ("images_per_record", "--images-per-record"),
    ("heldout", "--heldout"),
    ("input_name", "--input-name"),
    ("model_path", "--model-path"),
)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One request record to send and what we expect back.

    Attributes:
        correlation_id: the ID the answer must carry.
        value: the record value (None for a tombstone).
        label: the true class, when known (digits; events: ``true_label``, the held-out truth).
        expected_reason: the dead-letter reason a poison record must get.
        headers: extra record headers (e.g. ``inference-header-content-length`` of a binary request).
        source: where its content came from, for a reader (image sources: the file names, comma-separated).
        key: the record key (None: the correlation ID).
        expected_probability: the probability the model should give (events: ``expected_probability``).
        expected_label: the label the model should give, from a direct ONNX Runtime run (events: ``expected_label``).
    """

    correlation_id: str
    value: bytes | None
    label: int | None = None
    expected_reason: str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    source: str | None = None
    key: bytes | None = None
    expected_probability: float | None = None
    expected_label: int | None = None

    def manifest(self) -> dict[str, Any]:
        """The manifest line for this record."""
        entry: dict[str, Any] = {"correlation_id": self.correlation_id}
        if self.source is not None:
            entry["source"] = self.source
        if self.label is not None:
            entry["label"] = self.label
        if self.expected_label is not None:
            entry["expected_label"] = self.expected_label
        if self.expected_probability is not None:
            entry["expected_probability"] = self.expected_probability
        if self.expected_reason is not None:
            entry["expected_reason"] = self.expected_reason
        if self.value is None and self.expected_reason is None:  # events: a tombstone is answered with one
            entry["tombstone"] = True
        return entry


def digits_requests(run_id: str, heldout: Path = DEFAULT_HELDOUT, limit: int | None = None) -> Iterator[Outgoing]:
    """One request per held-out digit: input ``input`` FP32 ``[1, 64]``.

    Raises:
        FileNotFoundError: the model has not been built (``python models/digits/build.py``).
    """
    data = np.load(heldout)
    x, y = data["x"], data["y"]
    n = len(y) if limit is None else min(limit, len(y))
    for i in range(n):
        cid = f"{run_id}-{i:06d}"
        yield Outgoing(cid, encode_request(cid, {"input": x[i : i + 1]}), label=int(y[i]))


def _line_body(line: bytes, where: str) -> dict[str, Any]:
    """A requests file's line (``where``: ``path:line``), a JSON object.

    Raises:
        ValueError: the line is not JSON (orjson's message), or not an object.
    """
    return json_object(line, ValueError, lambda _kind: ValueError(f"{where}: not a JSON object"))


def jsonl_requests(run_id: str, path: Path, limit: int | None = None) -> Iterator[Outgoing]:
    """One request per line of an OIP JSONL file; lines are sent as they are, an ``id`` is added if absent.

    Raises:
        ValueError: a line is not a JSON object.
    """
    with path.open("rb") as fh:
        for i, line in enumerate(fh):
            if limit is not None and i >= limit:
                return
            body = _line_body(line, f"{path}:{i + 1}")
            cid = body.get("id") or f"{run_id}-{i:06d}"
            body.setdefault("id", cid)
            yield Outgoing(str(cid), orjson.dumps(body))


def npy_requests(run_id: str, path: Path, input_name: str, limit: int | None = None) -> Iterator[Outgoing]:
    """One one-row request per row of a ``.npy`` array ``[n, ...]``."""
    arr = np.load(path)
    n = len(arr) if limit is None else min(limit, len(arr))
    for i in range(n):
        cid = f"{run_id}-{i:06d}"
        yield Outgoing(cid, encode_request(cid, {input_name: arr[i : i + 1]}))


def image_requests(
    run_id: str,
    images: Sequence[tuple[str, bytes]],
    input_name: str = "image",
    per_record: int = 1,
    limit: int | None = None,
    binary: bool = True,
) -> Iterator[Outgoing]:
    """Image requests: ``per_record`` encoded images per record (BYTES ``[per_record]``), cycling through
    ``images`` until ``limit`` records (default: every image once, the last record possibly shorter).

    Args:
        images: (name, encoded bytes) pairs (:mod:`producer_tools.images`).
        binary: the binary data extension (raw bytes, response binary too); False: base64 strings in JSON.
    """
    if limit is None:
        groups = [images[i : i + per_record] for i in range(0, len(images), per_record)]
    else:
        groups = [[images[(i * per_record + k) % len(images)] for k in range(per_record)] for i in range(limit)]
    for i, group in enumerate(groups):
        cid = f"{run_id}-{i:06d}"
        picked = [data for _, data in group]
        source = ",".join(name for name, _ in group)
        if binary:
            value, json_length = encode_request_binary(cid, {input_name: picked}, binary_output=False)
            yield Outgoing(cid, value, headers=((BINARY_HEADER, str(json_length).encode()),), source=source)
        else:
            yield Outgoing(cid, encode_request(cid, {input_name: picked}), source=source)


def poison_requests(run_id: str) -> list[Outgoing]:
    """Every poison kind, with its expected reason."""
    return [Outgoing(f"{run_id}-poison-{p.kind}", p.value, expected_reason=p.reason.value) for p in catalogue()]


def interleave(good: list[Outgoing], bad: list[Outgoing]) -> list[Outgoing]:
    """Spread ``bad`` evenly through ``good`` so poison records sit between valid neighbours."""
    if not bad:
        return good
    step = max(1, len(good) // (len(bad) + 1))
    out: list[Outgoing] = []
    bad_iter = iter(bad)
    for i, item in enumerate(good):
        if i % step == step - 1:
            poison = next(bad_iter, None)
            if poison is not None:
                out.append(poison)
        out.append(item)
    out.extend(bad_iter)
    return out


Headers = list[tuple[str, bytes | None]]


async def send_all(
    bootstrap_servers: str,
    topic: str,
    records: Sequence[Outgoing],
    rate: float | None = None,
    progress: bool = True,
    headers: Callable[[Outgoing], Headers] | None = None,
    linger_ms: int = 5,
    on_acked: Callable[[Outgoing], None] | None = None,
    max_request_bytes: int = 1_048_576,
    security: Security = None,
) -> None:
    """Send ``records`` (key = the record's key, else its correlation ID; headers ``correlation_id`` = the ID unless
    ``headers`` gives them), paced at ``rate`` records/s if given, and wait until the broker acknowledged every one.

    Args:
        linger_ms: the producer's linger, ms (0 for latency measurements of single records).
        on_acked: called with each record once the broker acknowledged it (in acknowledgement order), so a run
            that fails midway still knows exactly what reached the topic.
        max_request_bytes: the producer's ``max_request_size``, bytes (the client's and the broker's default
            ``message.max.bytes`` are 1 MiB).
        security: aiokafka's TLS/SASL keyword arguments (:meth:`producer_tools.security.ClientSecurity.kwargs`).

    Raises:
        aiokafka.errors.KafkaError: a send failed.
        producer_tools.topics.TopicMissingError: ``topic`` does not exist (nothing was sent).
    """
    producer = AIOKafkaProducer(
        **(security or {}),
        bootstrap_servers=bootstrap_servers,
        client_id="streaminfer-produce",
        acks="all",
        enable_idempotence=True,  # a send retried after a broker failure is not written twice
        linger_ms=linger_ms,
        max_request_size=max_request_bytes,
    )
    try:
        await producer.start()
    except BaseException:
        await producer.stop()  # close what the constructor and the failed start opened (no "Unclosed" warning)
        raise
    try:
        await require_topic(producer, topic)
        futures = []
        started = time.monotonic()
        with tqdm(
            total=len(records), desc=f"produce -> {topic}", unit="rec", disable=None if progress else True
        ) as bar:  # None: only on a TTY
            for i, rec in enumerate(records):
                if rate:
                    delay = started + i / rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                cid = rec.correlation_id.encode()
                hdrs = headers(rec) if headers else [(CORRELATION_HEADER, cid), *rec.headers]
                key = rec.key if rec.key is not None else cid
                future = await producer.send(topic, value=rec.value, key=key, headers=hdrs)
                if on_acked is not None:
                    future.add_done_callback(
                        lambda f, rec=rec: on_acked(rec) if not f.cancelled() and f.exception() is None else None
                    )
                futures.append(future)
                bar.update(1)
            await asyncio.gather(*futures)
    finally:
        await producer.stop()


def event_records(
    run_id: str, events: list[dict[str, Any]], encode: Encoder, key_field: str | None = None
) -> list[Outgoing]:
    """One record per event (:mod:`producer_tools.events`): the expectations taken off into the manifest, the key
    from ``key_field``, the value from ``encode``.

    Raises:
        BadArgument: an event lacks the key field or carries a malformed expectation.
        producer_tools.events.RegistryUnavailable: the Avro encoder could not reach the registry.
    """
    out: list[Outgoing] = []
    for number, event in enumerate(events, start=1):
        expected = take_expectations(event, number)
        key = key_of(event, key_field, number) if key_field else None
        out.append(Outgoing(f"{run_id}-{number - 1:06d}", encode(event), label=expected.label, key=key,
                            expected_label=expected.expected_label,
                            expected_probability=expected.expected_probability))  # fmt: skip
    return out


def check_format(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Refuse flags that do not apply to ``--format``, and take ``--schema-registry-url`` from
    ``SCHEMA_REGISTRY_URL`` for Avro when it is not given.

    Raises:
        BadArgument: a bad combination (the flag named).
    """
    events_only = {"key_field": "--key-field"}
    avro_only = {"schema": "--schema", "schema_registry_url": "--schema-registry-url"}
    if args.format == "oip":
        for dest, flag in {**avro_only, **events_only}.items():
            if getattr(args, dest) is not None:
                wanted = "json or avro" if dest in events_only else "avro"
                raise BadArgument(f"{flag}: only with --format {wanted}, not --format oip (requests)")
        return
    for dest, flag in OIP_ONLY:
        if getattr(args, dest) not in (None, False):
            raise BadArgument(f"{flag}: only with --format oip (requests), not --format {args.format} (events)")
    if not args.source.endswith(".jsonl"):
        raise BadArgument(f"--source: --format {args.format} sends events from a .jsonl file, got {args.source!r}")
    if args.format == "json":
        for dest, flag in avro_only.items():
            if getattr(args, dest) is not None:
                raise BadArgument(f"{flag}: only with --format avro, not --format json")
        return
    if args.schema is None:
        raise BadArgument("--schema: --format avro needs the events' Avro schema (FILE.avsc)")
    args.schema_registry_url = args.schema_registry_url or env.get("SCHEMA_REGISTRY_URL") or None
    if args.schema_registry_url is None:
        raise BadArgument("--schema-registry-url: --format avro needs a schema registry (or set SCHEMA_REGISTRY_URL)")


def event_source(args: argparse.Namespace) -> list[Outgoing]:
    """The records of ``--format json|avro``: the events of ``--source``, encoded.

    Raises:
        BadArgument: an event cannot be used, or does not match ``--schema`` (checked for every event before the
            registry is asked anything).
        OSError, ValueError: the source cannot be read.
        producer_tools.events.RegistryUnavailable: the schema registry could not be reached.
    """
    events = read_events(Path(args.source), args.limit)
    if args.format == "json":
        return event_records(args.run_id, events, json_encoder(), args.key_field)
    text, parsed = load_schema(args.schema)
    check_avro([{k: v for k, v in e.items() if k not in EXPECTATION_FIELDS} for e in events], parsed, args.schema)
    encode = avro_encoder(args.schema_registry_url, text, args.topic)
    return event_records(args.run_id, events, encode, args.key_field)


def build_records(args: argparse.Namespace) -> list[Outgoing]:
    """The records an invocation sends, from its ``--format``, ``--source``, ``--limit`` and ``--poison`` flags
    (after :func:`check_format`).

    Raises:
        BadArgument: a flag's value cannot be used (named).
        OSError, ValueError: the source cannot be read.
        producer_tools.events.RegistryUnavailable: the schema registry could not be reached (``--format avro``).
    """
    source: str = args.source
    if args.format != "oip":
        good = event_source(args)
    elif source == "digits":
        good = list(digits_requests(args.run_id, args.heldout or DEFAULT_HELDOUT, args.limit))
    elif source.endswith(".jsonl"):
        good = list(jsonl_requests(args.run_id, Path(source), args.limit))
    elif source.endswith(".npy"):
        good = list(npy_requests(args.run_id, Path(source), input_name(args), args.limit))
    elif source == "samples" or Path(source).is_dir():
        per_record = 1 if args.images_per_record is None else args.images_per_record
        if per_record < 1:
            raise BadArgument("--images-per-record must be >= 1")
        images = sample_images() if source == "samples" else folder_images(Path(source))
        name = args.input_name or "image"
        good = list(image_requests(args.run_id, images, name, per_record, args.limit, binary=not args.base64))
    else:
        raise BadArgument(
            f"--source must be 'digits', 'samples', a folder of images, a .jsonl or a .npy file, got {source!r}"
        )
    if not good:
        raise BadArgument(f"--source {source}: no records to send" + (f" (--limit {args.limit})" if args.limit else ""))
    for rec in good:  # refused before anything is sent, not halfway through
        key = rec.key if rec.key is not None else rec.correlation_id.encode()
        size = len(rec.value or b"") + len(key) + sum(len(k) + len(v) for k, v in rec.headers)
        if size > args.max_request_bytes:
            raise BadArgument(
                f"record {rec.correlation_id}" + (f" ({rec.source})" if rec.source else "") + f" is {size} bytes, "
                f"above --max-request-bytes {args.max_request_bytes} (raise it, and the topic's max.message.bytes "
                "and the consumer's max_record_bytes with it; or send fewer images per record)"
            )
    return interleave(good, poison_requests(args.run_id) if args.poison else [])


def input_name(args: argparse.Namespace) -> str:
    """The input ``.npy`` rows go to: ``--input-name``, else the only input of ``--model-path``, else ``input``.

    Raises:
        BadArgument: the model cannot be read, or has several inputs and ``--input-name`` is not given.
    """
    if args.input_name:
        return str(args.input_name)
    if args.model_path is None:
        return "input"
    from consumer.errors import ModelError
    from consumer.model.session import import_onnxruntime

    try:
        ort = import_onnxruntime()
    except ModelError as exc:
        raise BadArgument(f"--model-path {args.model_path}: {exc}") from None
    try:
        names = [
            i.name for i in ort.InferenceSession(str(args.model_path), providers=["CPUExecutionProvider"]).get_inputs()
        ]
    except Exception as exc:  # noqa: BLE001 (onnxruntime raises its own classes)
        raise BadArgument(f"--model-path {args.model_path}: {exc}") from None
    if len(names) != 1:
        raise BadArgument(f"the model has inputs {names}: say which with --input-name")
    return str(names[0])


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = ToolParser(prog="streaminfer-produce", description=__doc__.split("\n\n")[0])
    add_bootstrap(p)
    add_security(p)
    p.add_argument("--topic", default="requests", help="requests topic")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="oip",
        help="oip: inference requests (default); json / avro: domain events from --source FILE.jsonl, as JSON "
        "objects or as Confluent-framed Avro (--schema, --schema-registry-url)",
    )
    p.add_argument(
        "--source",
        default="digits",
        help="oip: 'digits', FILE.jsonl, FILE.npy, a folder of images or 'samples' (scikit-image's photographs); "
        "json / avro: FILE.jsonl of events",
    )
    p.add_argument("--schema", type=Path, default=None, help="--format avro: the events' Avro schema (FILE.avsc)")
    p.add_argument(
        "--schema-registry-url",
        default=None,
        help="--format avro: the schema registry (Confluent-compatible API; default $SCHEMA_REGISTRY_URL)",
    )
    p.add_argument(
        "--key-field",
        default=None,
        help="--format json / avro: key each record by this field (a dotted path, e.g. patient_id); default: the "
        "correlation ID",
    )
    p.add_argument("--images-per-record", type=int, default=None, help="image sources: images per request record (1)")
    p.add_argument("--base64", action="store_true", help="image sources: base64 in JSON, not binary data")
    p.add_argument(
        "--heldout", type=Path, default=None, help=f"digits held-out split (.npz; default {DEFAULT_HELDOUT})"
    )
    p.add_argument(
        "--input-name",
        default=None,
        help="model input for .npy rows (default: --model-path's only input, else 'input'); images: 'image'",
    )
    p.add_argument("--model-path", type=Path, default=None, help="the served model: its input name for .npy rows")
    p.add_argument("--limit", type=int, default=None, help="send at most this many valid records")
    p.add_argument("--poison", action="store_true", help="interleave every poison kind")
    p.add_argument("--rate", type=float, default=None, help="records per second (default: as fast as possible)")
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=1_048_576,
        help="largest record the producer sends (max_request_size), bytes; larger records are refused up front",
    )
    p.add_argument("--run-id", default=None, help="correlation ID prefix (default: random)")
    p.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="write each acknowledged record's correlation ID here, as it goes (JSONL)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``streaminfer-produce``. Exit codes: 0 every record acknowledged; 1 the broker or the schema
    registry could not be reached, or a send failed (the manifest lists what was acknowledged); 2 bad arguments (a
    flag that does not apply to ``--format`` included), an unreadable source or schema, an event that does not
    match the schema, or a ``--topic`` that does not exist."""
    args = parser().parse_args(argv)
    if args.rate is not None and args.rate <= 0:
        parser().error("--rate must be > 0")
    if args.limit is not None and args.limit < 1:
        parser().error("--limit must be >= 1")
    args.run_id = args.run_id or uuid.uuid4().hex[:8]
    quiet_client_logs()
    try:
        check_format(args, os.environ)
        security = security_of(args, os.environ).kwargs()
        records = build_records(args)
    except BadArgument as exc:
        return refuse(TOOL, exc)
    except RegistryUnavailable as exc:
        return refuse(TOOL, exc, f"{exc}; nothing sent")
    except (OSError, ValueError) as exc:  # a missing or malformed source file
        return refuse(TOOL, exc, f"--source {args.source}: {exc}")
    acked = 0
    manifest = args.manifest.open("wb") if args.manifest else None

    def record(rec: Outgoing) -> None:
        nonlocal acked
        acked += 1
        if manifest is not None:
            manifest.write(orjson.dumps(rec.manifest()) + b"\n")

    try:
        asyncio.run(
            send_all(
                args.bootstrap_servers,
                args.topic,
                records,
                args.rate,
                not args.no_progress,
                on_acked=record,
                max_request_bytes=args.max_request_bytes,
                security=security,
            )
        )
    except KafkaError as exc:
        listed = f", listed in {args.manifest}" if manifest else ""
        done = f"{acked} of {len(records)} records acknowledged{listed}"
        return refuse(TOOL, exc, f"{unreachable(exc, args.bootstrap_servers)}; {done}")
    except TopicMissingError as exc:
        return refuse(TOOL, exc, f"--topic: {exc}")
    finally:
        if manifest is not None:
            manifest.close()
    print(f"produce: sent={len(records)} topic={args.topic} run_id={args.run_id}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
