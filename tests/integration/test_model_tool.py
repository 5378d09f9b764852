"""streaminfer-model (record, set, gate) on real models and a real broker; the consumer's validation_record."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from consumer.oip.client import encode_request
from producer_tools.model import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from producer_tools.modelset import Padding, batches, read_set
from producer_tools.produce import Outgoing, digits_requests, send_all
from producer_tools.topics import ensure_topics
from tests.integration.conftest import AppFactory, answers

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--max-seconds", "0.05", "--min-runs", "3"]


def digits_set(digits_model: Path, out: Path) -> Path:
    code = main(
        [
            "set",
            "--model",
            str(digits_model / "digits.onnx"),
            "--jsonl",
            str(digits_model / "requests.jsonl"),
            "--label-field",
            "parameters.label",
            "--out",
            str(out),
        ]
    )
    assert code == EXIT_OK
    return out


@pytest.fixture(scope="module")
def shuffled_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """digits retrained on permuted labels: the same interface, a broken model."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("shuffled")
    build = ROOT / "models" / "digits" / "build.py"
    subprocess.run([sys.executable, str(build), "--out", str(out), "--shuffle-labels"], check=True, timeout=300)
    return out / "digits.onnx"


@pytest.fixture(scope="module")
def mlp_digits(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Path:
    from tests.mlp_model import build

    return build(tmp_path_factory.mktemp("mlp") / "mlp.onnx", digits_model / "heldout.npz")


def test_record_describes_the_model_the_runtime_and_the_set(digits_model: Path, tmp_path: Path) -> None:
    model = digits_model / "digits.onnx"
    comparison = digits_set(digits_model, tmp_path / "set.jsonl")
    out = tmp_path / "digits.record.json"
    argv = ["record", "--model", str(model), "--set", str(comparison), "--out", str(out), "--batch-sizes", "1,16"]
    assert main([*argv, *QUICK]) == EXIT_OK
    record = json.loads(out.read_text())
    graph = onnx.load(str(model))
    held = np.load(digits_model / "heldout.npz")
    x, y = held["x"], held["y"]
    assert record["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert record["model"]["name"] == "digits"
    assert record["model"]["version"] == "1"
    assert record["model"]["ir_version"] == graph.ir_version
    assert record["model"]["opsets"] == {"ai.onnx": 17, "ai.onnx.ml": 1}  # each domain once (the export's fix)
    assert record["model"]["producer"]["name"] == "streaminfer-models-digits"
    assert set(record["model"]["operators"]) == {
        "ai.onnx.ml/Scaler",
        "ai.onnx.ml/LinearClassifier",
        "ai.onnx.ml/Normalizer",
    }
    assert record["runtime"]["onnxruntime"] == ort.__version__
    assert record["runtime"]["provider"] == "CPUExecutionProvider"
    assert record["signature"]["inputs"] == {"input": ["FP32", [None, 64]]}
    assert record["set"]["records"] == len(y)
    assert record["set"]["labelled"] == len(y)
    observed = record["inputs"]["input"]
    assert observed["range"] == {"min": float(x.min()), "max": float(x.max())}
    assert observed["percentiles"]["p50"] == pytest.approx(float(np.percentile(x.astype(np.float64), 50)))
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    label, proba = session.run(["label", "probabilities"], {"input": x})
    assert record["accuracy"]["top1"] == round(float(np.mean(label == y)), 6)
    assert sum(record["outputs"]["label"]["counts"].values()) == len(y)
    assert record["outputs"]["probabilities"]["max"] == pytest.approx(float(proba.max()), rel=1e-6)
    assert [p["batch_size"] for p in record["performance"]] == [1, 16]
    assert all(p["rows_per_s"] > 0 and p["p99_ms"] >= p["p50_ms"] > 0 for p in record["performance"])


def test_gate_exit_codes(digits_model: Path, shuffled_digits: Path, breast_cancer_model: Path, tmp_path: Path) -> None:
    model = digits_model / "digits.onnx"
    comparison = str(digits_set(digits_model, tmp_path / "set.jsonl"))
    same = tmp_path / "same.onnx"
    same.write_bytes(model.read_bytes())
    record = tmp_path / "same.record.json"
    base = ["gate", "--model", str(model), "--set", comparison, *QUICK]
    assert main([*base, "--candidate", str(same), "--record-out", str(record)]) == EXIT_OK
    assert json.loads(record.read_text())["sha256"] == hashlib.sha256(same.read_bytes()).hexdigest()

    report = tmp_path / "broken.json"
    assert main([*base, "--candidate", str(shuffled_digits), "--report", str(report)]) == EXIT_FAILED
    figures = json.loads(report.read_text())
    failed = {c["name"] for c in figures["checks"] if c["passed"] is False}
    assert {"top-1 agreement", "accuracy change"} <= failed
    assert not (shuffled_digits.with_suffix(".record.json")).exists()  # a failing candidate gets no record


def test_gate_says_where_the_toolchain_does_not_apply(
    digits_model: Path, breast_cancer_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    comparison = str(digits_set(digits_model, tmp_path / "set.jsonl"))
    for variant in ("fp16", "int8-dynamic", "int8-dynamic-per-channel", "int8-static"):
        argv = ["gate", "--model", str(digits_model / "digits.onnx"), "--set", comparison, "--variant", variant]
        assert main([*argv, "--variant-out", str(tmp_path / f"{variant}.onnx")]) == EXIT_USAGE
        assert "LinearClassifier (ai.onnx.ml)" in capsys.readouterr().err
    trees = breast_cancer_model / "breast_cancer_features.onnx"
    argv = ["gate", "--model", str(trees), "--set", comparison, "--variant", "int8-dynamic"]
    assert main([*argv, "--variant-out", str(tmp_path / "trees.onnx")]) == EXIT_USAGE
    assert "TreeEnsembleClassifier (ai.onnx.ml)" in capsys.readouterr().err
    assert main(["gate", "--model", str(trees), "--set", str(tmp_path / "missing.jsonl"), "--variant", "fp16"]) == 2


@pytest.mark.parametrize("variant", ["fp16", "int8-dynamic", "int8-dynamic-per-channel", "int8-static"])
def test_gate_figures_match_a_direct_onnx_runtime_run(
    variant: str, mlp_digits: Path, digits_model: Path, tmp_path: Path
) -> None:
    comparison = digits_set(digits_model, tmp_path / "set.jsonl")
    candidate, report = tmp_path / f"{variant}.onnx", tmp_path / "report.json"
    argv = ["gate", "--model", str(mlp_digits), "--set", str(comparison), "--variant", variant, *QUICK]
    code = main([*argv, "--variant-out", str(candidate), "--report", str(report), "--batch-size", "32"])
    assert code == EXIT_OK
    figures = json.loads(report.read_text())
    assert (tmp_path / f"{variant}.record.json").is_file()
    # the same set, the same batches, in bare ONNX Runtime
    loaded = read_set(comparison)
    serving = ort.InferenceSession(str(mlp_digits), providers=["CPUExecutionProvider"])
    other = ort.InferenceSession(str(candidate), providers=["CPUExecutionProvider"])
    s_lab, c_lab, s_p, c_p = [], [], [], []
    for feeds, _ in batches(loaded, 32):
        a, pa = serving.run(["label", "probabilities"], feeds)
        b, pb = other.run(["label", "probabilities"], feeds)
        s_lab.append(a), c_lab.append(b), s_p.append(pa), c_p.append(pb)
    diff = np.abs(np.concatenate(c_p).astype(np.float64) - np.concatenate(s_p))
    agreement = float(np.mean(np.concatenate(s_lab) == np.concatenate(c_lab)))
    checks = {c["name"]: c for c in figures["checks"]}
    assert checks["top-1 agreement"]["value"] == pytest.approx(agreement)
    assert figures["outputs"]["probabilities"]["max_abs"] == pytest.approx(float(diff.max()), rel=1e-9)
    assert figures["outputs"]["probabilities"]["mean_abs"] == pytest.approx(float(diff.mean()), rel=1e-9)
    labels = loaded.labels()
    assert figures["accuracy"]["candidate"] == round(float(np.mean(np.concatenate(c_lab) == labels)), 6)
    if variant != "fp16":
        assert diff.max() > 0  # quantised: not the same numbers (a test of the comparison, too)


def test_int8_dynamic_per_channel_quantises_each_output_column_with_its_own_scale(
    mlp_digits: Path, tmp_path: Path
) -> None:
    """int8-dynamic-per-channel: each MatMul weight ``[in, out]`` gets a scale per output column, max |column| / 127
    (symmetric int8, zero points 0), its int8 values within half a step of the float weights; int8-dynamic: one
    scale per weight."""
    from onnx import numpy_helper

    from producer_tools.variants import build_variant

    source = onnx.load(str(mlp_digits))
    floats = {i.name: numpy_helper.to_array(i) for i in source.graph.initializer}
    weights = [n.input[1] for n in source.graph.node if n.op_type == "MatMul" and n.input[1] in floats]
    assert len(weights) == 2  # the MLP's two layers
    for variant in ("int8-dynamic", "int8-dynamic-per-channel"):
        out = build_variant(mlp_digits, variant, tmp_path / f"{variant}.onnx")
        copy = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
        for name in weights:
            w = floats[name].astype(np.float64)
            q, scale, zero = copy[f"{name}_quantized"], copy[f"{name}_scale"], copy[f"{name}_zero_point"]
            assert q.dtype == np.int8
            assert q.shape == w.shape
            assert not zero.any()
            if variant == "int8-dynamic":
                assert scale.shape == ()
                assert float(scale) == pytest.approx(np.abs(w).max() / 127, rel=1e-5)
            else:
                assert scale.shape == (w.shape[1],)
                assert scale == pytest.approx(np.abs(w).max(axis=0) / 127, rel=1e-5)
                assert len(set(scale.tolist())) > 1  # not one scale repeated
            error = np.abs(q.astype(np.float64) * scale - w)
            assert np.all(error <= np.broadcast_to(scale, w.shape) / 2 * (1 + 1e-5))


def test_gate_compares_embeddings_by_cosine(text_model: tuple[Path, Path], tmp_path: Path) -> None:
    model, tokenizer = text_model
    texts = ["the quick brown fox", "kafka stream batch model", "consumer group commit offset", "the lazy dog"]
    lines = [
        orjson.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [t]}]}) for t in texts
    ]
    (tmp_path / "texts.jsonl").write_bytes(b"\n".join(lines * 5) + b"\n")
    comparison = tmp_path / "set.jsonl"
    argv = ["set", "--model", str(model), "--jsonl", str(tmp_path / "texts.jsonl"), "--out", str(comparison)]
    assert main([*argv, "--tokenizer-path", str(tokenizer)]) == EXIT_OK
    loaded = read_set(comparison)
    assert len(loaded.records) == 20
    assert loaded.records[0].inputs["input_ids"].shape == (1, 6)  # [CLS] 4 words [SEP]
    report = tmp_path / "report.json"
    argv = ["gate", "--model", str(model), "--set", str(comparison), "--variant", "fp16", *QUICK]
    assert main([*argv, "--variant-out", str(tmp_path / "fp16.onnx"), "--report", str(report)]) == EXIT_OK
    embedding = json.loads(report.read_text())["outputs"]["embedding"]
    assert 0.999 < embedding["min_cosine"] <= embedding["mean_cosine"] <= 1.0 + 1e-9
    assert 0 < embedding["max_abs"] < 0.01


def text_padding() -> Padding:
    """tests/text_model.py's batching as the consumer's on CPU (pad id 0, max_sequence_length 32), written out here
    rather than taken from the gate."""
    from consumer.inference import CPU_BATCH_TOKENS
    from consumer.model.sequence import CPU_BUCKETS, length_buckets

    pads = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}
    return Padding(pads, length_buckets(32, CPU_BUCKETS), CPU_BATCH_TOKENS)


def text_requests(n: int, seed: int) -> list[Outgoing]:
    """``n`` OIP text requests of 1 to 24 of tests/text_model.py's words (so 3 to 26 tokens)."""
    from tests.text_model import WORDS

    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 25)))) for _ in range(n)]
    return [Outgoing(f"t-{i}", encode_request(f"t-{i}", {"text": [t]})) for i, t in enumerate(texts)]


@pytest.mark.parametrize("variant", ["fp16", "int8-dynamic", "int8-static"])
async def test_gate_cosine_figures_on_a_text_set_from_a_topic_match_a_direct_onnx_runtime_run(
    variant: str, kafka_bootstrap: str, topics: dict[str, str], text_model: tuple[Path, Path], tmp_path: Path
) -> None:
    model, tokenizer = text_model
    await send_all(kafka_bootstrap, topics["requests"], text_requests(120, seed=5), progress=False)
    comparison = tmp_path / "set.jsonl"
    argv = ["set", "--model", str(model), "--tokenizer-path", str(tokenizer), "--topic", topics["requests"]]
    argv += ["--bootstrap-servers", kafka_bootstrap, "--out", str(comparison)]
    assert await asyncio.to_thread(main, argv) == EXIT_OK
    loaded = read_set(comparison)
    assert len(loaded.records) == 120
    assert len({r.inputs["input_ids"].shape[1] for r in loaded.records}) > 10  # texts of many lengths
    candidate, report = tmp_path / f"{variant}.onnx", tmp_path / "report.json"
    argv = ["gate", "--model", str(model), "--set", str(comparison), "--variant", variant, *QUICK]
    argv += ["--variant-out", str(candidate), "--report", str(report), "--batch-size", "16"]
    assert await asyncio.to_thread(main, argv) == EXIT_OK
    figures = json.loads(report.read_text())
    assert figures["embeddings"] == ["embedding"]
    names = {c["name"] for c in figures["checks"]}
    assert "top-1 agreement" not in names  # an embedding's argmax is not a class
    assert {"embedding: mean cosine", "embedding: min cosine", "embedding: p1 cosine"} <= names
    # the same set, the same batches (the consumer's length buckets, padded to the longest), in bare ONNX Runtime
    serving = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    other = ort.InferenceSession(str(candidate), providers=["CPUExecutionProvider"])
    cosines, diffs, members = [], [], []
    for feeds, idx in batches(loaded, 16, text_padding()):
        (a,) = serving.run(["embedding"], feeds)
        (b,) = other.run(["embedding"], feeds)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        cosines.append(np.sum(a64 * b64, axis=1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)))
        diffs.append(np.abs(b64 - a64).ravel())
        members += idx
    assert sorted(members) == list(range(120))
    cos, diff = np.concatenate(cosines), np.concatenate(diffs)
    embedding = figures["outputs"]["embedding"]
    assert embedding["mean_cosine"] == pytest.approx(float(cos.mean()), abs=1e-12)
    assert embedding["min_cosine"] == pytest.approx(float(cos.min()), abs=1e-12)
    assert embedding["p1_cosine"] == pytest.approx(float(np.percentile(cos, 1)), abs=1e-12)
    assert embedding["max_abs"] == pytest.approx(float(diff.max()), rel=1e-9)
    assert embedding["mean_abs"] == pytest.approx(float(diff.mean()), rel=1e-9)
    assert 0 < diff.max() < 0.1  # a converted copy: close, not the same numbers
    assert (tmp_path / f"{variant}.record.json").is_file()


def test_gate_fails_an_embedding_model_whose_vectors_turn(text_model: tuple[Path, Path], tmp_path: Path) -> None:
    """A broken text candidate (its word table perturbed): cosine under the threshold, exit 1, the check named."""
    from onnx import numpy_helper

    model, tokenizer = text_model
    broken = onnx.load(str(model))
    for i, init in enumerate(broken.graph.initializer):
        if init.name == "word":
            table = numpy_helper.to_array(init)
            noise = np.random.default_rng(11).normal(scale=0.8, size=table.shape).astype(np.float32)
            broken.graph.initializer[i].CopyFrom(numpy_helper.from_array(table + noise, "word"))
    onnx.save(broken, str(tmp_path / "broken.onnx"))
    lines = [r.value for r in text_requests(40, seed=6) if r.value is not None]
    (tmp_path / "texts.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    comparison = tmp_path / "set.jsonl"
    argv = ["set", "--model", str(model), "--tokenizer-path", str(tokenizer), "--jsonl", str(tmp_path / "texts.jsonl")]
    assert main([*argv, "--out", str(comparison)]) == EXIT_OK
    report = tmp_path / "report.json"
    argv = ["gate", "--model", str(model), "--set", str(comparison), "--candidate", str(tmp_path / "broken.onnx")]
    assert main([*argv, *QUICK, "--report", str(report), "--record-out", str(tmp_path / "r.json")]) == EXIT_FAILED
    failed = {c["name"] for c in json.loads(report.read_text())["checks"] if c["passed"] is False}
    assert {"embedding: mean cosine", "embedding: p1 cosine"} <= failed
    assert not (tmp_path / "r.json").exists()  # no record for a failing candidate


async def test_set_from_an_oip_requests_topic(
    kafka_bootstrap: str, topics: dict[str, str], digits_model: Path, tmp_path: Path
) -> None:
    heldout = digits_model / "heldout.npz"
    records = list(digits_requests(f"set-{uuid.uuid4().hex[:6]}", heldout, limit=40))
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_bytes(b"".join(orjson.dumps(r.manifest()) + b"\n" for r in records))
    out = tmp_path / "set.jsonl"
    argv = ["set", "--model", str(digits_model / "digits.onnx"), "--topic", topics["requests"], "--out", str(out)]
    argv += ["--bootstrap-servers", kafka_bootstrap, "--manifest", str(manifest), "--count", "100"]
    assert await asyncio.to_thread(main, argv) == EXIT_OK
    loaded = read_set(out)
    assert len(loaded.records) == 40
    x, y = np.load(heldout)["x"][:40], np.load(heldout)["y"][:40]
    by_row = {row.tobytes(): int(label) for row, label in zip(x, y, strict=True)}
    for rec in loaded.records:
        assert rec.inputs["input"].shape == (1, 64)
        assert rec.label == by_row[rec.inputs["input"][0].tobytes()]  # the sent values, bit for bit, and labels
        assert rec.source["topic"] == topics["requests"]
    # by time: everything before an hour from now; nothing from an hour from now
    base = ["set", "--model", str(digits_model / "digits.onnx"), "--topic", topics["requests"]]
    base += ["--bootstrap-servers", kafka_bootstrap, "--timeout-s", "5"]
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert await asyncio.to_thread(main, [*base, "--until", later, "--out", str(tmp_path / "t.jsonl")]) == EXIT_OK
    assert len(read_set(tmp_path / "t.jsonl").records) == 40
    assert await asyncio.to_thread(main, [*base, "--since", later, "--out", str(tmp_path / "none.jsonl")]) == 2
    # by offsets: partition 0 only, from its third record
    on_zero = sum(1 for rec in loaded.records if rec.source["partition"] == 0)
    out2 = tmp_path / "p0.jsonl"
    argv2 = ["set", "--model", str(digits_model / "digits.onnx"), "--topic", topics["requests"], "--out", str(out2)]
    argv2 += ["--bootstrap-servers", kafka_bootstrap, "--offsets", "0:2"]
    assert await asyncio.to_thread(main, argv2) == EXIT_OK
    part = read_set(out2)
    assert len(part.records) == on_zero - 2
    assert {r.source["partition"] for r in part.records} == {0}
    assert min(r.source["offset"] for r in part.records) == 2


async def test_set_from_an_events_topic_with_labels(
    kafka_bootstrap: str, breast_cancer_model: Path, tmp_path: Path
) -> None:
    topic = f"it-{uuid.uuid4().hex[:8]}.events"
    await ensure_topics(kafka_bootstrap, {topic: 2})
    events = [json.loads(line) for line in (breast_cancer_model / "events.jsonl").read_text().splitlines()][:30]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i, event in enumerate(events):
            body: dict[str, Any] = {k: v for k, v in event.items() if k != "expected_probability"}
            await producer.send_and_wait(topic, orjson.dumps(body), partition=i % 2)
    finally:
        await producer.stop()
    out = tmp_path / "events.set.jsonl"
    model = breast_cancer_model / "breast_cancer.onnx"
    argv = ["set", "--model", str(model), "--topic", topic, "--request-format", "json", "--out", str(out)]
    argv += ["--bootstrap-servers", kafka_bootstrap, "--label-field", "expected_label"]
    assert await asyncio.to_thread(main, argv) == EXIT_OK
    loaded = read_set(out)
    assert len(loaded.records) == len(events)

    def key(radius: Any, texture: Any) -> tuple[Any, Any]:
        return (np.float32(radius), np.float32(texture))

    by_values = {key(e["mean_radius"], e["mean_texture"]): e for e in events}
    assert len(by_values) == len(events)
    for rec in loaded.records:
        event = by_values[key(rec.inputs["mean_radius"][0, 0], rec.inputs["mean_texture"][0, 0])]
        assert rec.label == event["expected_label"]
        assert rec.inputs["worst_area"].dtype == np.float32
        assert rec.inputs["worst_area"][0, 0] == np.float32(event["worst_area"])  # the consumer's mapping and cast
        assert len(rec.inputs) == 30


async def test_consumer_counts_values_outside_the_record_and_serves_them(
    start_app: AppFactory, kafka_bootstrap: str, topics: dict[str, str], digits_model: Path, tmp_path: Path
) -> None:
    comparison = await asyncio.to_thread(digits_set, digits_model, tmp_path / "set.jsonl")
    record = tmp_path / "digits.record.json"
    argv = ["record", "--model", str(digits_model / "digits.onnx"), "--set", str(comparison), "--out", str(record)]
    assert await asyncio.to_thread(main, [*argv, *QUICK, "--batch-sizes", "1"]) == EXIT_OK
    app = await start_app(validation_record=record)
    records = list(digits_requests(f"range-{uuid.uuid4().hex[:6]}", digits_model / "heldout.npz", limit=10))
    from consumer.oip.client import encode_request

    for i, value in ((3, 99.0), (7, -5.0)):  # valid FP32 rows, far outside 0..16 pixels
        row = np.load(digits_model / "heldout.npz")["x"][i : i + 1].copy()
        row[0, 5] = value
        records[i] = dataclasses.replace(records[i], value=encode_request(records[i].correlation_id, {"input": row}))
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)
    assert not report.missing
    assert report.dead_letters == 0
    assert report.results == len(records)
    value = app.metrics.registry.get_sample_value("streaminfer_input_out_of_range_total", {"input": "input"})
    assert value == 2


async def test_set_from_an_avro_events_topic(
    kafka_bootstrap: str, topics: dict[str, str], breast_cancer_model: Path, schema_registry_url: str, tmp_path: Path
) -> None:
    """Avro in the registry's wire format, decoded by the consumer's own event decoder (writer schema by ID)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from producer_tools.events import registry_config

    schema = (ROOT / "models" / "breast_cancer" / "events.avsc").read_text()
    lines = (breast_cancer_model / "events.jsonl").read_text().splitlines()[:12]
    events = [{k: v for k, v in json.loads(line).items() if not k.startswith("expected_")} for line in lines]
    serialize = AvroSerializer(SchemaRegistryClient(registry_config(schema_registry_url)), schema)
    context = SerializationContext(topics["requests"], MessageField.VALUE)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for event in events:
            await producer.send_and_wait(topics["requests"], serialize(event, context), partition=0)
    finally:
        await producer.stop()
    out = tmp_path / "avro.set.jsonl"
    model = breast_cancer_model / "breast_cancer.onnx"
    argv = ["set", "--model", str(model), "--topic", topics["requests"], "--request-format", "avro"]
    argv += ["--schema-registry-url", schema_registry_url, "--bootstrap-servers", kafka_bootstrap, "--out", str(out)]
    assert await asyncio.to_thread(main, argv) == EXIT_OK
    loaded = read_set(out)
    assert [r.source["offset"] for r in loaded.records] == list(range(len(events)))
    for rec, event in zip(loaded.records, events, strict=True):
        assert rec.label is None
        assert rec.inputs["mean_radius"][0, 0] == np.float32(event["mean_radius"])
        assert rec.inputs["worst_fractal_dimension"][0, 0] == np.float32(event["worst_fractal_dimension"])
