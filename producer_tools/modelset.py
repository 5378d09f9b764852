"""The comparison set: a fixed list of model inputs (and labels) that every validation record and gate runs on.

A set is built once (``streaminfer-model set``) from records as the consumer sees them: the requests topic (OIP
requests) or an events topic (JSON or Avro events), by start offsets or a time range, ``N`` records, read without a
consumer group (nothing is committed); or from a JSONL file, one record value per line (OIP JSON requests or JSON
events). Every record is decoded by the consumer's own intake (:class:`consumer.intake.Intake`: OIP decoding and
validation, the tokenizer of a text model, image preprocessing, the events' field mapping and schema registry), so a
set holds exactly the tensors the consumer would have fed the model; a record the consumer would dead-letter is left
out (and counted by reason).

File format (JSONL, UTF-8), so a set is diffable and anyone can rerun a gate on it:

- line 1, the header: ``{"streaminfer_set": 1, "model": {"name", "version", "sha256"}, "source": {...},
  "inputs": {name: datatype}, "records": n, "labelled": n, "skipped": {reason: n}}``;
- one line per record, in set order: ``{"source": {"topic", "partition", "offset", "timestamp"}`` (JSONL: ``{"file",
  "line"}``), ``"inputs": {name: {"shape": [rows, ...], "data": [row-major values]}}``, ``"label": int | null}``.

Values are the model's dtypes (a float32 written as its float64 decimal, so it reads back bit for bit). Labels
come from a field of the record (``--label-field``, dotted for nested fields: an event's field, or a field of an OIP
JSON request such as ``parameters.label``, which the consumer ignores) or, for OIP requests, from a manifest of
``streaminfer-produce --manifest`` (``{"correlation_id", "label"}`` per line) matched by correlation ID.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
from prometheus_client import CollectorRegistry

from consumer.config import Settings
from consumer.delivery.stages import backoff
from consumer.events.decode import EventDecoder
from consumer.events.mapping import load_mapping
from consumer.events.registry import Schemas, client_config
from consumer.intake import Intake
from consumer.kafka.security import kafka_security_kwargs
from consumer.model.record import file_sha256
from consumer.model.sequence import TextEncoder, bucket
from consumer.model.vision import ImageEncoder
from consumer.offsets import OffsetTracker
from consumer.ops.metrics import Metrics
from consumer.signature import NUMPY_TO_OIP, OIP_TO_NUMPY, ModelSignature
from consumer.work import Limits
from producer_tools.topics import TopicMissingError, partitions_of

SET_FORMAT = 1


class SetError(ValueError):
    """A set cannot be built or read (the source, the file or the option named)."""


@dataclass
class SetRecord:
    """One record of a set: the model inputs ``[rows, ...]`` of the model's dtypes, its label, where it came from."""

    inputs: dict[str, np.ndarray]
    label: int | None
    source: dict[str, Any]

    @property
    def rows(self) -> int:
        """Rows (axis 0, shared by every input)."""
        return int(next(iter(self.inputs.values())).shape[0])


@dataclass
class ComparisonSet:
    """A comparison set in memory.

    Attributes:
        records: in set order.
        header: the file's header line (model, source, counts).
        path: the file read, or None.
    """

    records: list[SetRecord]
    header: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def rows(self) -> int:
        """Rows over every record."""
        return sum(r.rows for r in self.records)

    @property
    def labelled(self) -> bool:
        """Every record has a label."""
        return bool(self.records) and all(r.label is not None for r in self.records)

    def labels(self) -> np.ndarray:
        """int64 ``[rows]``: each record's label repeated over its rows (-1 where a record has none)."""
        return np.concatenate(
            [np.full(r.rows, -1 if r.label is None else r.label, dtype=np.int64) for r in self.records]
        )


def write_set(path: Path, comparison: ComparisonSet) -> None:
    """Write ``comparison`` to ``path`` in the format of this module's docstring."""
    with path.open("wb") as fh:
        fh.write(orjson.dumps(comparison.header) + b"\n")
        for rec in comparison.records:
            line = {
                "source": rec.source,
                "inputs": {n: {"shape": list(a.shape), "data": a.ravel().tolist()} for n, a in rec.inputs.items()},
                "label": rec.label,
            }
            fh.write(orjson.dumps(line) + b"\n")


def read_set(path: Path) -> ComparisonSet:
    """Read a set written by :func:`write_set`.

    Raises:
        SetError: the file cannot be read or is not a set (the line named).
    """
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise SetError(f"comparison set {str(path)!r}: {exc}") from None
    try:
        header = orjson.loads(lines[0]) if lines else None
    except orjson.JSONDecodeError as exc:
        raise SetError(f"{path}:1: {exc}") from None
    if not isinstance(header, dict) or header.get("streaminfer_set") != SET_FORMAT:
        raise SetError(f"{path}: not a comparison set of format {SET_FORMAT} (streaminfer-model set)")
    dtypes = {name: OIP_TO_NUMPY[datatype] for name, datatype in header["inputs"].items()}
    records = []
    for number, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
            inputs = {
                name: np.asarray(t["data"], dtype=dtypes[name]).reshape(t["shape"])
                for name, t in line["inputs"].items()
            }
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SetError(f"{path}:{number}: not a set record: {exc!r}") from None
        records.append(SetRecord(inputs, line.get("label"), line.get("source", {})))
    if not records:
        raise SetError(f"{path}: the set holds no records")
    return ComparisonSet(records, header, path)


@dataclass(frozen=True)
class Padding:
    """How a sequence model's records are batched, as the consumer batches them (:mod:`consumer.batcher`).

    Attributes:
        pad_values: input name -> the value padded positions get (:attr:`consumer.signature.SequenceSpec.
            pad_values`: ``input_ids`` the pad token id, the rest 0, so ``attention_mask`` is 0 on padding).
        buckets: the length bucket bounds, tokens (:data:`consumer.model.sequence.CPU_BUCKETS` cut to the model's
            ``max_sequence_length``); empty: one lane for every length.
        max_tokens: a batch's padded tokens (rows x its bucket) at most, tokens (the consumer's
            ``max_batch_tokens``: :data:`consumer.inference.CPU_BATCH_TOKENS`); None: rows only.
    """

    pad_values: Mapping[str, int]
    buckets: tuple[int, ...] = ()
    max_tokens: int | None = None


def batches(
    comparison: ComparisonSet, batch_size: int, padding: Padding | None = None
) -> Iterator[tuple[dict[str, np.ndarray], list[int]]]:
    """The set's micro-batches, always the same for a given set and arguments, so every model sees the same ones.

    Without ``padding``: consecutive records of the same non-batch input shapes, up to ``batch_size`` rows (a
    record of more rows alone), in set order. With ``padding`` (a sequence model): records go to the lane of their
    length bucket, in set order, and a lane is a batch when the next record would take it past ``batch_size`` rows
    or ``max_tokens`` padded tokens (then the lanes left, in the order of their first record), as the consumer's
    batcher groups them; each ``[rows_i, L_i]`` input is padded to the batch's longest ``L`` as the consumer pads a
    micro-batch (:meth:`consumer.model.buffers.BatchBuffers.pad`). :meth:`SetOutputs.joined
    <producer_tools.evaluate.SetOutputs.joined>` puts the rows back in set order.

    Yields:
        (feeds ``[rows, ...]`` per input (fresh arrays), the indices of the records in the batch)
    """
    records = comparison.records

    def feeds(members: list[int]) -> dict[str, np.ndarray]:
        names = records[members[0]].inputs.keys()
        if padding is None:
            return {n: np.concatenate([records[i].inputs[n] for i in members]) for n in names}
        total = sum(records[i].rows for i in members)
        out: dict[str, np.ndarray] = {}
        for n in names:
            parts = [records[i].inputs[n] for i in members]
            length = max(int(a.shape[1]) for a in parts)
            arr = np.full((total, length), padding.pad_values.get(n, 0), dtype=parts[0].dtype)
            start = 0
            for a in parts:
                arr[start : start + a.shape[0], : a.shape[1]] = a
                start += a.shape[0]
            out[n] = arr
        return out

    if padding is not None:
        lanes: dict[int, list[int]] = {}
        lane_rows: dict[int, int] = {}
        for i, rec in enumerate(records):
            length = int(next(iter(rec.inputs.values())).shape[1])
            bound = bucket(length, padding.buckets) if padding.buckets else 0
            group = lanes.get(bound)
            rows = lane_rows.get(bound, 0) + rec.rows
            over_tokens = padding.max_tokens is not None and rows * max(bound, length) > padding.max_tokens
            if group and (rows > batch_size or over_tokens):
                yield feeds(group), group
                group = None
            if group is None:
                lanes[bound] = group = []
                lane_rows[bound] = 0
            group.append(i)
            lane_rows[bound] += rec.rows
        for group in sorted(lanes.values(), key=lambda g: g[0]):
            if group:
                yield feeds(group), group
        return

    group = []
    rows = 0
    key: tuple[Any, ...] | None = None
    for i, rec in enumerate(records):
        shape = tuple((n, a.shape[1:]) for n, a in sorted(rec.inputs.items()))
        if group and (shape != key or rows + rec.rows > batch_size):
            yield feeds(group), group
            group, rows = [], 0
        group.append(i)
        rows += rec.rows
        key = shape
    if group:
        yield feeds(group), group


@dataclass(frozen=True)
class Source:
    """Where a set's records come from.

    Attributes:
        topic: the topic (requests or events); None with ``jsonl``.
        jsonl: a JSONL file of record values; None with ``topic``.
        count: records wanted (at most).
        offsets: partition -> first offset; empty: every partition from its beginning (or ``since``).
        since_ms: the first record timestamp (epoch ms, inclusive; Kafka's offsets-for-times), or None.
        until_ms: the last record timestamp (epoch ms, exclusive), or None.
        timeout_s: give up reading when nothing arrives for this long, s.
    """

    topic: str | None = None
    jsonl: Path | None = None
    count: int = 500
    offsets: Mapping[int, int] = field(default_factory=dict)
    since_ms: int | None = None
    until_ms: int | None = None
    timeout_s: float = 10.0

    def describe(self) -> dict[str, Any]:
        """The header's ``source``."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, {}) and k != "timeout_s"}
        if self.jsonl is not None:
            d["jsonl"] = str(self.jsonl)
        if self.offsets:
            d["offsets"] = {str(p): o for p, o in self.offsets.items()}
        return d


@dataclass(frozen=True)
class LineRecord:
    """A JSONL line as a record (the fields of aiokafka's ``ConsumerRecord`` the intake reads)."""

    topic: str
    partition: int
    offset: int
    value: bytes
    timestamp: int = -1
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def build_set(
    settings: Settings,
    signature: ModelSignature,
    source: Source,
    *,
    label_field: str | None = None,
    manifest: Path | None = None,
) -> ComparisonSet:
    """Read ``source`` and decode its records with the consumer's intake under ``settings`` (``request_format``,
    ``input_mapping``, ``tokenizer_path``, ``schema_registry_url``, the limits...).

    Raises:
        SetError: nothing could be read, no record decoded, or a label is not an integer.
        consumer.errors.ModelError / ConfigError: the model cannot be fed as configured (as at the consumer's
            start-up).
    """
    return asyncio.run(_build(settings, signature, source, label_field, manifest))


async def _build(
    s: Settings, signature: ModelSignature, source: Source, label_field: str | None, manifest: Path | None
) -> ComparisonSet:
    records: Sequence[Any] = _read_jsonl(source) if source.jsonl is not None else await _read_topic(s, source)
    if not records:
        raise SetError(f"no records read from {source.describe()}")
    intake = _intake(s, signature, source)
    try:
        tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        fetched: dict[TopicPartition, list[Any]] = {}
        for rec in records:
            fetched.setdefault(TopicPartition(rec.topic, rec.partition), []).append(rec)
        works = await intake.decode(fetched, tracker)
    finally:
        intake.close()
    labels = _manifest_labels(manifest) if manifest is not None else {}
    by_coords = {(w.record.partition, w.record.offset): w for w in works}
    kept: list[SetRecord] = []
    skipped: dict[str, int] = {}
    for rec in records:
        work = by_coords[(rec.partition, rec.offset)]
        if work.request is None:
            reason = str(work.error.reason) if work.error is not None else "tombstone"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        label = None
        if label_field is not None:
            event = work.request.event
            label = _label(event.fields if event is not None else _json_object(rec.value), label_field, rec)
        elif labels:
            label = labels.get(bytes(work.correlation_id))
        where = (
            {"file": str(source.jsonl), "line": rec.offset + 1}
            if source.jsonl is not None
            else {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp}
        )
        inputs = {n: np.array(a) for n, a in work.request.inputs.items()}
        kept.append(SetRecord(inputs, label, where))
    if not kept:
        raise SetError(f"none of the {len(records)} records read decodes for this model: skipped {skipped}")
    header = {
        "streaminfer_set": SET_FORMAT,
        "model": {"name": signature.name, "version": signature.version, "sha256": file_sha256(s.model_path)},
        "source": source.describe() | {"request_format": s.request_format},
        "inputs": {spec.name: NUMPY_TO_OIP[spec.dtype] for spec in signature.inputs},
        "records": len(kept),
        "rows": sum(r.rows for r in kept),
        "labelled": sum(r.label is not None for r in kept),
        "skipped": skipped,
        "label_field": label_field,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return ComparisonSet(kept, header)


def _intake(s: Settings, signature: ModelSignature, source: Source) -> Intake:
    """The consumer's intake for ``settings`` (as :func:`consumer.delivery.stages.build_stages` wires it; results
    are not enriched here, so no result schema is registered)."""
    metrics = Metrics(CollectorRegistry())
    limits = Limits(s.max_record_bytes, s.max_record_rows, s.max_record_tokens)
    text = (
        TextEncoder(s.tokenizer_path, signature.sequence, s.text_input_name)
        if s.tokenizer_path is not None and signature.sequence is not None
        else None
    )
    images = (
        ImageEncoder(signature.image, s.image_input_name, max_pixels=s.image_max_pixels, threads=s.image_threads)
        if signature.image is not None
        else None
    )
    events = None
    fmt = s.request_format
    if fmt == "avro" and source.jsonl is not None:
        fmt = "json"  # a JSONL file holds JSON events; the mapping is the same
    if fmt != "oip":
        mapping = load_mapping(signature, s.input_mapping, False)
        schemas = None
        if fmt == "avro":
            schemas = Schemas(
                AsyncSchemaRegistryClient(client_config(s)),
                mapping,
                signature,
                None,
                register=False,
                unknown_retries=s.unknown_schema_retries,
                backoff=backoff(s),
                clock=time.monotonic,
                sleep=asyncio.sleep,
                url=s.schema_registry_url or "",
            )
        events = EventDecoder(fmt, mapping, limits, schemas)
    return Intake(signature, limits, text, metrics, time.monotonic, images, events)


def _read_jsonl(source: Source) -> list[LineRecord]:
    assert source.jsonl is not None
    try:
        lines = source.jsonl.read_bytes().splitlines()
    except OSError as exc:
        raise SetError(f"--jsonl {str(source.jsonl)!r}: {exc}") from None
    out = [LineRecord(f"jsonl:{source.jsonl.name}", 0, i, line) for i, line in enumerate(lines) if line.strip()]
    return out[: source.count]


async def _read_topic(s: Settings, source: Source) -> list[Any]:
    """Up to ``count`` records of ``source.topic``, without a consumer group: per partition from its start offset
    (``offsets``, ``since_ms`` or the beginning) up to the end offset seen when reading began (or ``until_ms``),
    then ordered by (timestamp, partition, offset) and cut to ``count``."""
    assert source.topic is not None
    consumer = AIOKafkaConsumer(
        bootstrap_servers=s.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **kafka_security_kwargs(s),
    )
    partitions = await _partitions(s, source.topic)
    await consumer.start()
    try:
        if source.offsets:
            missing = sorted(set(source.offsets) - set(partitions))
            if missing:
                raise SetError(f"topic {source.topic!r} has no partition {missing} (it has {partitions})")
            partitions = sorted(source.offsets)
        tps = [TopicPartition(source.topic, p) for p in partitions]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        if source.since_ms is not None:
            found = await consumer.offsets_for_times(dict.fromkeys(tps, source.since_ms))
            starts = {tp: (found[tp].offset if found[tp] is not None else ends[tp]) for tp in tps}
        for tp in tps:
            first = source.offsets.get(tp.partition, starts[tp])
            starts[tp] = first
            consumer.seek(tp, first)
        wanted = {tp for tp in tps if starts[tp] < ends[tp]}
        got: dict[TopicPartition, list[Any]] = {tp: [] for tp in tps}
        while wanted:
            chunk = await consumer.getmany(*wanted, timeout_ms=int(source.timeout_s * 1000))
            if not chunk:
                raise SetError(
                    f"no records arrived for {source.timeout_s} s from {sorted(t.partition for t in wanted)}"
                )
            for tp, recs in chunk.items():
                for rec in recs:
                    if rec.offset >= ends[tp] or (source.until_ms is not None and rec.timestamp >= source.until_ms):
                        wanted.discard(tp)
                        break
                    got[tp].append(rec)
                    if len(got[tp]) >= source.count:
                        wanted.discard(tp)
                        break
                if tp in wanted and consumer.highwater(tp) is not None and await consumer.position(tp) >= ends[tp]:
                    wanted.discard(tp)
    finally:
        await consumer.stop()
    merged = sorted((r for recs in got.values() for r in recs), key=lambda r: (r.timestamp, r.partition, r.offset))
    return merged[: source.count]


async def _partitions(s: Settings, topic: str) -> list[int]:
    """``topic``'s partitions, asked of the cluster (a consumer outside a group knows only assigned topics).

    Raises:
        SetError: the topic does not exist.
    """
    try:
        return sorted(await partitions_of(s.bootstrap_servers, topic, kafka_security_kwargs(s)))
    except TopicMissingError:
        raise SetError(f"topic {topic!r} does not exist on {s.bootstrap_servers}") from None


def _manifest_labels(path: Path) -> dict[bytes, int]:
    """correlation ID -> label of a ``streaminfer-produce --manifest`` file (lines without a label are skipped)."""
    labels: dict[bytes, int] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise SetError(f"--manifest {str(path)!r}: {exc}") from None
    for line in lines:
        if line.strip():
            entry = orjson.loads(line)
            if entry.get("label") is not None:
                labels[str(entry["correlation_id"]).encode()] = int(entry["label"])
    return labels


def _json_object(value: bytes | None) -> Mapping[str, Any]:
    """An OIP JSON request's object (where the label field is looked up); {} for any other value."""
    try:
        parsed = orjson.loads(value) if value else None
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _label(event: Mapping[str, Any], label_field: str, rec: Any) -> int | None:
    """The integer at ``label_field`` (dotted path) of an event; None where absent.

    Raises:
        SetError: present but not an integer.
    """
    value: Any = event
    for part in label_field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise SetError(f"record {rec.partition}:{rec.offset}: label field {label_field!r} is {value!r}, not a class")
    return int(value)
