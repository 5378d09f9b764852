"""``streaminfer-results --format json|avro`` against a real broker, a real schema registry and the consumer serving
the breast-cancer events (zero-config mapping, enriched results): every event answered, its label and probability
equal to the model's answers written into events.jsonl, a tombstone answered by a tombstone, and a dead letter with
its reason; the command line's summary line and exit code."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from producer_tools.events import avro_encoder, json_encoder, read_events
from producer_tools.produce import Outgoing, event_records, send_all
from producer_tools.readers import result_reader
from producer_tools.results import collect, main
from tests.integration.conftest import AppFactory

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "models" / "breast_cancer" / "events.avsc"
#: Events sent per test (events.jsonl holds the 114 held-out rows).
EVENTS = 40


def held_out_accuracy(events: list[dict[str, Any]]) -> float:
    """The accuracy against the truth that results equal to the direct ONNX Runtime run must show (not 1.0: the model
    is wrong on some held-out rows, and among the first 40 too, so agreement and accuracy are told apart)."""
    accuracy = sum(e["true_label"] == e["expected_label"] for e in events) / len(events)
    assert accuracy < 1.0
    return accuracy


def write_manifest(path: Path, records: list[Outgoing]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r.manifest()) + b"\n" for r in records))


async def run_cli(argv: list[str]) -> int:
    """``streaminfer-results`` (it runs its own event loop) beside the consumer serving in this one."""
    return await asyncio.to_thread(main, argv)


def cli_args(bootstrap: str, topics: dict[str, str], manifest: Path) -> list[str]:
    return [
        "--bootstrap-servers", bootstrap, "--results-topic", topics["results"], "--dead-letter-topic", topics["dlq"],
        "--manifest", str(manifest), "--no-progress", "--timeout-s", "60",
    ]  # fmt: skip


def lines(text: str) -> list[str]:
    return text.strip().splitlines()


async def test_json_results_match_the_manifest(
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
    breast_cancer_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await start_app(model_path=breast_cancer_model / "breast_cancer.onnx", request_format="json")
    events = read_events(breast_cancer_model / "events.jsonl", EVENTS)
    accuracy = held_out_accuracy(events)
    expectations = ("mean_radius", "true_label", "expected_label", "expected_probability")
    broken = {k: v for k, v in events[0].items() if k not in expectations}
    records = [
        *event_records("j", events, json_encoder(), "patient_id"),
        Outgoing("j-tombstone", None, key=b"bc-0501"),
        Outgoing("j-missing", orjson.dumps(broken), key=b"bc-0501", expected_reason="missing_field"),
    ]
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    manifest = tmp_path / "sent.jsonl"
    write_manifest(manifest, records)
    argv = cli_args(kafka_bootstrap, topics, manifest)
    code = await run_cli([*argv, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = lines(out)[-1]
    assert summary.startswith(
        f"results: sent={EVENTS + 2} results={EVENTS + 1} dead_letters=1 accuracy={accuracy:.4f} agreement=1.0000 "
    )
    assert summary.endswith(" score_mismatches=0 tombstones=1")
    assert f"scores checked={EVENTS} mismatches=0" in lines(err)
    assert "dead letters by reason: missing_field=1" in lines(err)
    assert not [line for line in lines(err) if "mismatch:" in line or line.startswith("unreadable")]

    # The check can fail: class 0's probability is not the manifest's (class 1's) but where both are near 0.5.
    assert await run_cli([*argv, "--format", "json", "--score-index", "0"]) == 0  # delivery is still complete
    out, err = capsys.readouterr()
    mismatches = int(lines(out)[-1].split("score_mismatches=")[1].split()[0])
    assert mismatches >= EVENTS - 2
    assert any(line.startswith("score mismatch: j-") for line in lines(err))


async def test_avro_results_match_the_manifest(
    kafka_bootstrap: str,
    topics: dict[str, str],
    start_app: AppFactory,
    schema_registry_url: str,
    breast_cancer_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await start_app(
        model_path=breast_cancer_model / "breast_cancer.onnx",
        request_format="avro",
        schema_registry_url=schema_registry_url,
    )
    events = read_events(breast_cancer_model / "events.jsonl", EVENTS)
    accuracy = held_out_accuracy(events)
    encode = avro_encoder(schema_registry_url, SCHEMA.read_text(), topics["requests"])
    records = [
        *event_records("a", events, encode, "patient_id"),
        Outgoing("a-tombstone", None, key=b"bc-0501"),
        Outgoing("a-not-framed", b'{"patient_id": "bc-0501"}', key=b"bc-0501", expected_reason="not_in_wire_format"),
    ]
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    manifest = tmp_path / "sent.jsonl"
    write_manifest(manifest, records)
    argv = cli_args(kafka_bootstrap, topics, manifest)
    code = await run_cli([*argv, "--format", "avro", "--schema-registry-url", schema_registry_url])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = lines(out)[-1]
    assert summary.startswith(
        f"results: sent={EVENTS + 2} results={EVENTS + 1} dead_letters=1 accuracy={accuracy:.4f} agreement=1.0000 "
    )
    assert summary.endswith(" score_mismatches=0 tombstones=1")
    assert "dead letters by reason: not_in_wire_format=1" in lines(err)
    assert not [line for line in lines(err) if "mismatch:" in line or line.startswith("unreadable")]

    # Read as JSON, the same results are unreadable: each is named, delivery is still complete.
    expected: dict[str, Any] = {r.correlation_id: r.manifest() for r in records}
    report = await collect(
        kafka_bootstrap, topics["results"], topics["dlq"], expected, 30, progress=False, reader=result_reader("json")
    )
    assert report.missing == []
    assert len(report.unreadable) == EVENTS
    assert report.accuracy == 0.0
    assert [a.score for a in report.answers.values() if a.kind == "result"] == [None] * (EVENTS + 1)
