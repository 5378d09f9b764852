"""Shadow scoring on a real broker (consumer.shadow): a candidate changes nothing that is served, and its answers
reach shadow_results_topic; a candidate that cannot take the serving model's inputs stops start-up with exit 2."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client import CollectorRegistry

from consumer.__main__ import EXIT_CONFIG, load_runner, main
from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import GROUP_HEADER
from consumer.app import StreamInferApp
from consumer.model.runner import warmup_plan
from consumer.oip.client import encode_request
from consumer.ops.metrics import Metrics
from producer_tools.topics import ensure_topics
from tests.integration.conftest import read_all, settings_for

pytestmark = pytest.mark.integration

#: Requests per partition of the requests topic (4 partitions), poison records among them.
PER_PARTITION = 60


def candidate_copy(digits_model: Path, out: Path, version: str = "2") -> Path:
    """digits.onnx with another ``model_version`` in its metadata: the same answers, told apart by version."""
    model = onnx.load(str(digits_model / "digits.onnx"))
    kept = [p for p in model.metadata_props if p.key != "model_version"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key="model_version", value=version)
    onnx.save(model, str(out))
    return out


def requests(digits_model: Path) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of every request: held-out digits of 1 to 3 rows, and on each partition poison
    records (not JSON, a wrong shape, a wrong datatype)."""
    x = np.load(digits_model / "heldout.npz")["x"]
    out: list[tuple[int, bytes, bytes]] = []
    for p in range(4):
        for i in range(PER_PARTITION):
            cid = f"p{p}-{i:04d}"
            start = (p * PER_PARTITION + i) % (len(x) - 3)
            rows = 1 + i % 3
            if i % 17 == 5:
                value = b'{"inputs": [{"name": "input"'
            elif i % 17 == 11:
                value = encode_request(cid, {"input": x[start : start + rows, :32]})
            elif i % 17 == 13:
                value = orjson.dumps(
                    {
                        "id": cid,
                        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "BYTES", "data": ["a"] * 64}],
                    }
                )
            else:
                value = encode_request(cid, {"input": x[start : start + rows]})
            out.append((p, cid.encode(), value))
    return out


async def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, partition=p, headers=[(CORRELATION_HEADER, key)])
            for p, key, value in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def serve(bootstrap: str, topics: dict[str, str], digits_model: Path, **overrides: Any) -> tuple[Any, Metrics]:
    """Answer every request of ``topics['requests']`` with a consumer of its own group, then stop it. Returns
    (the settings, the metrics)."""
    settings = settings_for(
        bootstrap, topics, digits_model / "digits.onnx", shutdown_grace_s=20, max_batch_delay_ms=2, **overrides
    )
    runner = load_runner(settings)
    sizes, lengths = warmup_plan(runner, settings.max_batch_size)
    runner.warmup(sizes, settings.warmup_runs, lengths)
    metrics = Metrics(CollectorRegistry())
    app = StreamInferApp(settings, runner, metrics)  # the candidate is loaded from shadow_model_path
    await app.start()
    try:
        want = 4 * PER_PARTITION
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while loop.time() < deadline:
            done = sum(
                metrics.registry.get_sample_value("streaminfer_records_total", {"outcome": o}) or 0
                for o in ("result", "dead_letter")
            )
            if done >= want and app.lag == 0:
                break
            await asyncio.sleep(0.2)
    finally:
        await app.stop()
    return settings, metrics


async def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}


def by_partition(records: list[Any], drop_headers: tuple[str, ...] = ()) -> dict[tuple[int, str], list[Any]]:
    """Records as (key, value, headers but ``drop_headers``) in offset order, per (the partition they were written
    to, the request partition they answer: their key's ``p<n>``): the order the consumer keeps is per request
    partition; how two request partitions' answers interleave on a shared partition is timing."""
    out: dict[tuple[int, str], list[Any]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        headers = [(k, v) for k, v in r.headers if k not in drop_headers]
        out.setdefault((r.partition, r.key.split(b"-")[0].decode()), []).append((r.key, r.value, headers))
    return out


async def fresh_outputs(bootstrap: str, topics: dict[str, str]) -> dict[str, str]:
    """Another pair of results and dead-letter topics beside ``topics``' requests topic."""
    tag = uuid.uuid4().hex[:8]
    names = {**topics, "results": f"it-{tag}.results", "dlq": f"it-{tag}.requests.dlq"}
    append = {"message.timestamp.type": "LogAppendTime"}
    await ensure_topics(
        bootstrap, {names["results"]: 4, names["dlq"]: 1}, configs={names["results"]: append, names["dlq"]: append}
    )
    return names


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
async def test_a_shadow_changes_nothing_served_dead_lettered_or_committed(
    kafka_bootstrap: str, topics: dict[str, str], digits_model: Path, tmp_path: Path, delivery: str
) -> None:
    """The same requests, poison records among them, served by two groups: without a shadow, and with one (the
    same model under another version) on every batch. Results (values, headers, order per partition), dead
    letters (but the header naming the group) and committed offsets are the same, byte for byte."""
    candidate = candidate_copy(digits_model, tmp_path / "candidate.onnx")
    await produce(kafka_bootstrap, topics["requests"], requests(digits_model))
    runs = {}
    for shadow in (False, True):
        out = await fresh_outputs(kafka_bootstrap, topics)
        options: dict[str, Any] = {"delivery": delivery}
        if shadow:
            options |= {"shadow_model_path": candidate, "shadow_max_pending": 10_000}
        settings, metrics = await serve(kafka_bootstrap, out, digits_model, **options)
        isolation = "read_committed" if delivery == "exactly_once" else "read_uncommitted"
        counted = {  # read until they are all there: a committed transaction's markers land a moment later
            outcome: int(metrics.registry.get_sample_value("streaminfer_records_total", {"outcome": outcome}) or 0)
            for outcome in ("result", "dead_letter")
        }
        results = await read_all(kafka_bootstrap, out["results"], want=counted["result"], isolation_level=isolation)
        dead = await read_all(kafka_bootstrap, out["dlq"], want=counted["dead_letter"], isolation_level=isolation)
        runs[shadow] = (
            by_partition(results),
            by_partition(dead, drop_headers=(GROUP_HEADER,)),
            await committed(kafka_bootstrap, settings.group_id),
            metrics,
        )
    plain, shadowed = runs[False], runs[True]
    served = sum(len(v) for v in plain[0].values())
    dead_letters = sum(len(v) for v in plain[1].values())
    assert served + dead_letters == 4 * PER_PARTITION
    assert dead_letters >= 4 * 3
    assert shadowed[0] == plain[0]
    assert shadowed[1] == plain[1]
    assert shadowed[2] == plain[2] == {(topics["requests"], p): PER_PARTITION for p in range(4)}
    registry = shadowed[3].registry
    rows = registry.get_sample_value("streaminfer_shadow_rows_total")
    served_rows = registry.get_sample_value("streaminfer_batch_rows_sum")
    assert rows == served_rows  # every served row was scored: nothing shed with room for all
    assert registry.get_sample_value("streaminfer_shadow_shed_batches_total") == 0
    for output in ("label", "probabilities"):  # the same model: it agrees on every row
        assert registry.get_sample_value("streaminfer_shadow_agreed_rows_total", {"output": output}) == rows
    assert plain[3].registry.get_sample_value("streaminfer_shadow_rows_total") is None


async def test_shadow_results_topic_gets_one_answer_per_served_record(
    kafka_bootstrap: str, topics: dict[str, str], digits_model: Path, tmp_path: Path
) -> None:
    """Each served result has a shadow answer with its key and correlation ID and the candidate's version."""
    candidate = candidate_copy(digits_model, tmp_path / "candidate.onnx", version="7")
    shadow_topic = f"{topics['requests']}.shadow"
    await ensure_topics(kafka_bootstrap, {shadow_topic: 2})
    await produce(kafka_bootstrap, topics["requests"], requests(digits_model))
    _, metrics = await serve(
        kafka_bootstrap,
        topics,
        digits_model,
        shadow_model_path=candidate,
        shadow_results_topic=shadow_topic,
        shadow_max_pending=10_000,
    )
    results = await read_all(kafka_bootstrap, topics["results"])
    shadow = await read_all(kafka_bootstrap, shadow_topic, want=len(results), timeout_s=30)
    assert len(shadow) == len(results) > 0
    served = {r.key: orjson.loads(r.value) for r in results}
    answered = {r.key: (dict(r.headers), orjson.loads(r.value)) for r in shadow}
    assert answered.keys() == served.keys()
    for key, (headers, body) in answered.items():
        assert headers[CORRELATION_HEADER] == key
        assert body["id"] == served[key]["id"] == key.decode()
        assert body["model_version"] == "7"
        assert served[key]["model_version"] == "1"
        ours = {o["name"]: o["data"] for o in served[key]["outputs"]}
        theirs = {o["name"]: o["data"] for o in body["outputs"]}
        assert theirs["label"] == ours["label"]
    assert metrics.registry.get_sample_value("streaminfer_shadow_answers_total", {"outcome": "acked"}) == len(results)


def test_a_candidate_that_cannot_take_the_inputs_exits_2(
    kafka_bootstrap: str, topics: dict[str, str], digits_model: Path, breast_cancer_model: Path, capsys: Any
) -> None:
    """breast_cancer (30 named feature inputs) cannot be fed digits' input: exit 2 before any connection."""
    argv = [
        f"--bootstrap-servers={kafka_bootstrap}",
        f"--requests-topic={topics['requests']}",
        f"--results-topic={topics['results']}",
        f"--dead-letter-topic={topics['dlq']}",
        f"--model-path={digits_model / 'digits.onnx'}",
        f"--shadow-model-path={breast_cancer_model / 'breast_cancer.onnx'}",
        "--execution-provider=cpu",
        "--http-port=0",
        "--warmup-runs=1",
    ]
    assert main(argv) == EXIT_CONFIG
