"""The baseline consumers the benchmark runs as processes of their own (``streaminfer-bench worker MODE``).

- **passthrough**, the Kafka client's ceiling: no streaminfer code at all. The same aiokafka client with the same
  producer settings (acks=all, idempotent, linger 1 ms, 64 KiB batches): fetch a chunk, ``orjson.loads`` every
  value, append a fixed answer (the model's outputs for one row, zeros, as OIP JSON) with the same headers
  streaminfer writes to one producer batch per results partition (the client's own ``DefaultPartitioner``
  picks it, as ``send`` would), hand the batches over, and commit each chunk once its batches are acknowledged,
  behind the fetching. That is the client's fastest path (its batch API); ``send`` per record is slower.
- **passthrough-events**, the same ceiling for domain events (``--format json|avro``): fetch a chunk, decode every
  value as streaminfer's event path does, with no streaminfer code: ``orjson.loads`` (JSON), or fastavro's
  ``schemaless_reader`` with the writer schema (``--schema``, the one the backlog's producer registered) after the
  registry's 5-byte frame (Avro); then a fixed answer of an enriched result's size (the first event with the model's
  two outputs appended, zeros: a JSON object, or the Avro datum followed by the two ``["null", T]`` fields) keyed
  like the event, with the headers streaminfer writes (the correlation ID, the request's timestamp) into producer
  batches, and commit behind, exactly as **passthrough**.
- **decode-encode**: streaminfer's own codec without inference (the previous passthrough): decode and validate
  each record with ``decode_request``, encode a zero response of the model's output shapes with
  ``encode_response``, ``send`` per record; so the codec's cost stays visible.
- **naive**: the straightforward port of notebook code: one record, ``json.loads``, ``session.run`` at batch 1,
  ``send_and_wait``, commit; time-boxed (it is slow).
- **naive-vision**: the same for images, as a notebook or MLServer's image runtimes do it: one record, its JPEG
  decoded whole with PIL, resized (shorter side to the model's declared ``resize``, e.g. 256) and centre-cropped
  (``size``, e.g. 224) in two steps, normalised with numpy, ``session.run`` at batch 1, ``send_and_wait``, commit.

Each prints ``ready`` once started and runs ``--seconds`` at most from its first record.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

#: The producer settings streaminfer uses (consumer.kafka.clients.KafkaClients, settings defaults).
PRODUCER = {"acks": "all", "enable_idempotence": True, "linger_ms": 1, "max_batch_size": 65_536}
#: Records per fetch, as streaminfer's fetch_max_records default.
CHUNK = 500
#: ONNX tensor element types -> OIP datatypes, for the passthrough's fixed answer.
OIP = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(double)": "FP64", "tensor(int32)": "INT32"}


async def worker(mode: str, args: argparse.Namespace) -> None:
    """Run one baseline consumer (``mode``: passthrough, passthrough-events, decode-encode, naive, naive-vision) on
    ``args.requests``."""
    consumer = AIOKafkaConsumer(
        args.requests,
        bootstrap_servers=args.bootstrap_servers,
        group_id=f"bench-{mode}-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap_servers, **PRODUCER)
    await producer.start()
    await consumer.start()
    run = {
        "passthrough": passthrough,
        "passthrough-events": passthrough_events,
        "decode-encode": decode_encode,
        "naive": naive,
        "naive-vision": naive_vision,
    }[mode]
    try:
        print("ready", flush=True)
        first = await consumer.getmany(timeout_ms=60_000, max_records=1)  # the time box starts with the first record
        for tp, records in first.items():
            consumer.seek(tp, records[0].offset)
        await run(consumer, producer, args, time.monotonic() + args.seconds)
    finally:
        await consumer.stop()
        await producer.stop()


def fixed_answer(model_path: str) -> bytes:
    """The model's outputs for one row, zeros, as an OIP response (read with onnxruntime, no streaminfer code)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    outputs = []
    for o in session.get_outputs():
        dims = [1] + [d if isinstance(d, int) else 1 for d in o.shape[1:]]
        outputs.append({"name": o.name, "shape": dims, "datatype": OIP[o.type], "data": [0] * int(np.prod(dims))})
    return orjson.dumps({"id": "0", "model_name": "digits", "model_version": "1", "outputs": outputs})


class _CommitBehind:
    """Commits each chunk's next offsets once its writes are acknowledged, in fetch order, behind the fetching."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer
        self._chunks: asyncio.Queue[tuple[Awaitable[Any], dict[TopicPartition, int]]] = asyncio.Queue(maxsize=8)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            acks, offsets = await self._chunks.get()
            await acks
            await self._consumer.commit(offsets)

    async def put(self, acks: Awaitable[Any], fetched: dict[TopicPartition, list[Any]]) -> None:
        await self._chunks.put((acks, {tp: recs[-1].offset + 1 for tp, recs in fetched.items() if recs}))

    def close(self) -> None:
        self._task.cancel()


async def passthrough(
    consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, args: argparse.Namespace, deadline: float
) -> None:
    answer = fixed_answer(str(args.model_path))
    partitioner = DefaultPartitioner()
    partitions = sorted(await producer.partitions_for(args.results))
    commits = _CommitBehind(consumer)
    try:
        while time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=100, max_records=CHUNK)
            if not fetched:
                continue
            batches: dict[int, Any] = {}
            futures = []
            for recs in fetched.values():
                for rec in recs:
                    orjson.loads(rec.value)
                    headers = [
                        ("correlation_id", rec.key),
                        ("content-type", b"application/json"),
                        ("streaminfer.request.timestamp_ms", str(rec.timestamp).encode()),
                    ]
                    partition = partitioner(rec.key, partitions, partitions)
                    batch = batches.get(partition)
                    if batch is None:
                        batch = batches[partition] = producer.create_batch()
                    if batch.append(key=rec.key, value=answer, timestamp=None, headers=headers) is None:
                        futures.append(await producer.send_batch(batch, args.results, partition=partition))
                        batch = batches[partition] = producer.create_batch()
                        batch.append(key=rec.key, value=answer, timestamp=None, headers=headers)
            for partition, batch in batches.items():
                futures.append(await producer.send_batch(batch, args.results, partition=partition))
            await commits.put(asyncio.gather(*futures), fetched)
    finally:
        commits.close()


def event_decoder(args: argparse.Namespace) -> Callable[[bytes], Any]:
    """The event decoder of ``--format``: ``orjson.loads``, or fastavro's ``schemaless_reader`` with the writer
    schema of ``--schema`` after the registry frame (magic byte 0 and the schema ID)."""
    if args.format == "json":
        return orjson.loads
    from fastavro import parse_schema, schemaless_reader

    writer = parse_schema(json.loads(Path(args.schema).read_text()))

    def decode(value: bytes) -> Any:
        if value[0] != 0:
            raise ValueError("not in the schema registry's wire format")
        return schemaless_reader(io.BytesIO(memoryview(value)[5:]), writer, None)

    return decode


def fixed_event_answer(value: bytes, args: argparse.Namespace) -> bytes:
    """An enriched result's bytes, made once from the first event (``value``): the event with ``label`` 0 and
    ``probabilities`` [0, 0] appended (JSON), or the framed Avro datum followed by those two ``["null", T]`` fields'
    encoding (what the result schema appends)."""
    if args.format == "json":
        return orjson.dumps({**orjson.loads(value), "label": 0, "probabilities": [0.0, 0.0]})
    from fastavro import parse_schema, schemaless_writer

    outputs = parse_schema({"type": "record", "name": "Outputs", "fields": [
        {"name": "label", "type": ["null", "long"]},
        {"name": "probabilities", "type": ["null", {"type": "array", "items": "float"}]},
    ]})  # fmt: skip
    tail = io.BytesIO()
    schemaless_writer(tail, outputs, {"label": 0, "probabilities": [0.0, 0.0]})
    return value + tail.getvalue()


async def passthrough_events(
    consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, args: argparse.Namespace, deadline: float
) -> None:
    decode = event_decoder(args)
    partitioner = DefaultPartitioner()
    partitions = sorted(await producer.partitions_for(args.results))
    commits = _CommitBehind(consumer)
    answer: bytes | None = None
    try:
        while time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=100, max_records=CHUNK)
            if not fetched:
                continue
            batches: dict[int, Any] = {}
            futures = []
            for recs in fetched.values():
                for rec in recs:
                    decode(rec.value)
                    if answer is None:
                        answer = fixed_event_answer(rec.value, args)
                    cid = next((v for k, v in rec.headers if k == "correlation_id"), None) or rec.key
                    headers = [
                        ("correlation_id", cid),
                        ("streaminfer.request.timestamp_ms", str(rec.timestamp).encode()),
                    ]
                    partition = partitioner(rec.key, partitions, partitions)
                    batch = batches.get(partition)
                    if batch is None:
                        batch = batches[partition] = producer.create_batch()
                    if batch.append(key=rec.key, value=answer, timestamp=None, headers=headers) is None:
                        futures.append(await producer.send_batch(batch, args.results, partition=partition))
                        batch = batches[partition] = producer.create_batch()
                        batch.append(key=rec.key, value=answer, timestamp=None, headers=headers)
            for partition, batch in batches.items():
                futures.append(await producer.send_batch(batch, args.results, partition=partition))
            await commits.put(asyncio.gather(*futures), fetched)
    finally:
        commits.close()


async def decode_encode(
    consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, args: argparse.Namespace, deadline: float
) -> None:
    from consumer.model.runner import OnnxRunner
    from consumer.model.session import SessionOptions
    from consumer.oip.decode import decode_request
    from consumer.oip.encode import encode_response
    from consumer.work import Limits

    signature = OnnxRunner.load(args.model_path, SessionOptions(execution_provider="cpu")).signature
    limits = Limits()
    outputs = signature.outputs
    zeros = {o.name: np.zeros((limits.max_record_rows, *(d or 1 for d in o.shape[1:])), o.dtype) for o in outputs}
    commits = _CommitBehind(consumer)

    async def publish(requests: list[tuple[Any, Any]]) -> None:
        futures = []
        for rec, request in requests:
            # a response of the model's output shapes, all zeros: the same bytes as streaminfer writes
            answer = encode_response(
                request.id or "", signature, [(o.name, zeros[o.name][: request.rows]) for o in outputs]
            )
            headers = [
                ("correlation_id", rec.key),
                ("content-type", b"application/json"),
                ("streaminfer.request.timestamp_ms", str(rec.timestamp).encode()),
            ]
            futures.append(await producer.send(args.results, answer, key=rec.key, headers=headers))
        await asyncio.gather(*futures)

    try:
        while time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=100, max_records=CHUNK)
            requests = [
                (rec, decode_request(rec.value, signature, limits)) for recs in fetched.values() for rec in recs
            ]
            if requests:
                await commits.put(asyncio.create_task(publish(requests)), fetched)
    finally:
        commits.close()


async def naive(
    consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, args: argparse.Namespace, deadline: float
) -> None:
    from consumer.model.runner import OnnxRunner
    from consumer.model.session import SessionOptions
    from consumer.oip.encode import encode_response

    runner = OnnxRunner.load(args.model_path, SessionOptions(execution_provider="cpu"))
    session, signature = runner.session, runner.signature
    names = list(signature.output_names)
    while time.monotonic() < deadline:
        rec = await consumer.getone()
        body = json.loads(rec.value)  # the notebook port: json, numpy, one record at a time
        feeds = {i["name"]: np.asarray(i["data"], dtype=np.float32).reshape(i["shape"]) for i in body["inputs"]}
        values = session.run(None, feeds)
        answer = encode_response(body.get("id", ""), signature, list(zip(names, values, strict=True)))
        headers = [("correlation_id", rec.key), ("streaminfer.request.timestamp_ms", str(rec.timestamp).encode())]
        await producer.send_and_wait(args.results, answer, key=rec.key, headers=headers)
        await consumer.commit()


async def naive_vision(
    consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, args: argparse.Namespace, deadline: float
) -> None:
    import io

    from PIL import Image

    from consumer.model.runner import OnnxRunner
    from consumer.model.session import SessionOptions
    from consumer.oip.encode import encode_response

    runner = OnnxRunner.load(args.model_path, SessionOptions(execution_provider="cpu"))
    session, signature = runner.session, runner.signature
    prep = signature.image
    assert prep is not None, "naive-vision serves an image model"
    names = list(signature.output_names)
    mean, std = np.array(prep.mean, np.float32), np.array(prep.std, np.float32)
    while time.monotonic() < deadline:
        rec = await consumer.getone()
        length = int(dict(rec.headers)["inference-header-content-length"])
        body = json.loads(rec.value[:length])
        blob = rec.value[length + 4 :]  # one image: its 4-byte length, then the JPEG
        image = Image.open(io.BytesIO(blob)).convert("RGB")
        scale = prep.resize / min(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BILINEAR)
        left, top = (image.width - prep.width) // 2, (image.height - prep.height) // 2
        pixels = np.asarray(image.crop((left, top, left + prep.width, top + prep.height)), dtype=np.float32)
        feeds = {prep.input: ((pixels - mean) / std).transpose(2, 0, 1)[None]}
        values = session.run(None, feeds)
        answer = encode_response(body.get("id", ""), signature, list(zip(names, values, strict=True)))
        headers = [("correlation_id", rec.key), ("streaminfer.request.timestamp_ms", str(rec.timestamp).encode())]
        await producer.send_and_wait(args.results, answer, key=rec.key, headers=headers)
        await consumer.commit()
