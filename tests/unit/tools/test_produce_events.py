"""``streaminfer-produce --format json|avro`` without Kafka: the argument checks (a flag that does not apply to the
format exits 2 naming it, before anything is read or sent), the events read from JSONL, their keys and expectations,
and their JSON and Confluent-framed Avro values (Avro against confluent-kafka's in-process mock registry)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastavro import parse_schema, schemaless_reader

from producer_tools.cli import BadArgument
from producer_tools.events import field_at, key_of, read_events, take_expectations
from producer_tools.produce import build_records, check_format, main, parser

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = ROOT / "models" / "breast_cancer" / "events.avsc"


def an_event(i: int) -> dict[str, Any]:
    """A BreastCancerEvent (every field of events.avsc) with its expectations, as events.jsonl has them."""
    schema = json.loads(SCHEMA.read_text())
    body: dict[str, Any] = {"patient_id": f"bc-{i:04d}"}
    body.update({f["name"]: 0.25 * k + i for k, f in enumerate(schema["fields"]) if f["type"] == "double"})
    body.update({"clinic": {"region": "north"}, "recorded_at": "2026-03-02T08:00:00Z"})
    # the truth differs from the model's answer for every other event: the manifest must keep them apart
    body.update({"true_label": i // 2 % 2, "expected_label": i % 2, "expected_probability": 0.5 + i / 100})
    return body


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(an_event(i)) + "\n" for i in range(5)))
    return path


def args_for(*argv: str, env: dict[str, str] | None = None) -> Any:
    args = parser().parse_args(["--run-id", "run", *argv])
    check_format(args, env or {})
    return args


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--format", "json", "--source", "E.jsonl", "--poison"], "--poison: only with --format oip"),
        (["--format", "json", "--source", "E.jsonl", "--base64"], "--base64: only with --format oip"),
        (
            [
                "--format",
                "avro",
                "--source",
                "E.jsonl",
                "--schema",
                "s.avsc",
                "--schema-registry-url",
                "http://r",
                "--images-per-record",
                "2",
            ],
            "--images-per-record: only with --format oip",
        ),
        (["--format", "json", "--source", "E.jsonl", "--input-name", "x"], "--input-name: only with --format oip"),
        (["--format", "json", "--source", "E.jsonl", "--model-path", "m.onnx"], "--model-path: only with --format oip"),
        (["--format", "json", "--source", "E.jsonl", "--heldout", "h.npz"], "--heldout: only with --format oip"),
        (["--format", "json", "--source", "digits"], "--source: --format json sends events from a .jsonl file"),
        (["--format", "avro", "--source", "d.npy"], "--source: --format avro sends events from a .jsonl file"),
        (["--format", "json", "--source", "E.jsonl", "--schema", "s.avsc"], "--schema: only with --format avro"),
        (
            ["--format", "json", "--source", "E.jsonl", "--schema-registry-url", "http://r"],
            "--schema-registry-url: only with --format avro",
        ),
        (["--format", "avro", "--source", "E.jsonl"], "--schema: --format avro needs the events' Avro schema"),
        (
            ["--format", "avro", "--source", "E.jsonl", "--schema", "s.avsc"],
            "--schema-registry-url: --format avro needs a schema registry",
        ),
        (["--key-field", "patient_id"], "--key-field: only with --format json or avro"),
        (["--schema", "s.avsc"], "--schema: only with --format avro"),
        (
            ["--source", "E.jsonl", "--schema-registry-url", "http://r"],
            "--schema-registry-url: only with --format avro",
        ),
    ],
)
def test_a_flag_that_does_not_apply_to_the_format_exits_2_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCHEMA_REGISTRY_URL", raising=False)
    assert main(["--no-progress", *argv]) == 2  # files named here do not exist: nothing is read before the check
    err = capsys.readouterr().err
    assert err.startswith(f"streaminfer-produce: {named}"), err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_format_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit) as bad:
        parser().parse_args(["--format", "protobuf"])
    assert bad.value.code == 2


def test_the_registry_url_comes_from_the_environment_for_avro_only() -> None:
    args = args_for("--format", "avro", "--source", "E.jsonl", "--schema", "s.avsc", env={"SCHEMA_REGISTRY_URL": "u"})
    assert args.schema_registry_url == "u"
    assert (
        args_for("--format", "json", "--source", "E.jsonl", env={"SCHEMA_REGISTRY_URL": "u"}).schema_registry_url
        is None
    )
    assert args_for(env={"SCHEMA_REGISTRY_URL": "u"}).format == "oip"  # the default, untouched by the setting


def test_json_events_are_sent_as_they_are_without_their_expectations(events_file: Path) -> None:
    args = args_for("--format", "json", "--source", str(events_file), "--key-field", "patient_id", "--limit", "3")
    records = build_records(args)
    assert [r.correlation_id for r in records] == ["run-000000", "run-000001", "run-000002"]
    for i, rec in enumerate(records):
        expected = an_event(i)
        truth, label = expected.pop("true_label"), expected.pop("expected_label")
        probability = expected.pop("expected_probability")
        assert rec.value is not None
        assert orjson.loads(rec.value) == expected
        assert rec.key == f"bc-{i:04d}".encode()
        assert rec.manifest() == {
            "correlation_id": f"run-{i:06d}",
            "label": truth,
            "expected_label": label,
            "expected_probability": probability,
        }


def test_without_a_key_field_the_key_is_the_correlation_id(events_file: Path) -> None:
    (rec, *_) = build_records(args_for("--format", "json", "--source", str(events_file)))
    assert rec.key is None  # send_all then keys it by the correlation ID, as for requests


def test_avro_events_are_confluent_framed_and_decode_with_the_schema(events_file: Path) -> None:
    args = args_for(
        "--format",
        "avro",
        "--source",
        str(events_file),
        "--schema",
        str(SCHEMA),
        "--schema-registry-url",
        "mock://produce-unit",
        "--topic",
        "t",
        "--key-field",
        "clinic.region",
    )
    records = build_records(args)
    parsed = parse_schema(json.loads(SCHEMA.read_text()))
    assert len(records) == 5
    ids = set()
    for i, rec in enumerate(records):
        assert rec.value is not None
        assert rec.value[0] == 0  # magic byte
        ids.add(int.from_bytes(rec.value[1:5], "big"))
        expected = an_event(i)
        del expected["true_label"], expected["expected_label"], expected["expected_probability"]
        assert schemaless_reader(io.BytesIO(rec.value[5:]), parsed, None) == expected
        assert rec.key == b"north"
        assert (rec.label, rec.expected_label) == (i // 2 % 2, i % 2)
    assert len(ids) == 1  # registered once, every record framed with its ID


def test_an_event_that_does_not_match_the_schema_is_named_and_nothing_is_registered(
    events_file: Path, tmp_path: Path
) -> None:
    bad = an_event(9)
    bad["mean_radius"] = "large"
    events_file.write_text(events_file.read_text() + json.dumps(bad) + "\n")
    args = args_for(
        "--format",
        "avro",
        "--source",
        str(events_file),
        "--schema",
        str(SCHEMA),
        "--schema-registry-url",
        "http://127.0.0.1:9/never-asked",
    )
    with pytest.raises(BadArgument, match=r"event 6 does not match --schema .*mean_radius"):
        build_records(args)


def test_an_unreadable_schema_exits_2_naming_it(
    events_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "bad.avsc"
    schema.write_text("{not json")
    code = main(
        [
            "--format",
            "avro",
            "--source",
            str(events_file),
            "--schema",
            str(schema),
            "--schema-registry-url",
            "mock://x",
            "--no-progress",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err.startswith(f"streaminfer-produce: --schema {schema}: not a readable Avro schema")


def test_events_that_are_not_objects_or_lack_the_key_exit_2(
    tmp_path: Path, events_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"a": 1}\n\n[1, 2]\n')
    assert main(["--format", "json", "--source", str(lines), "--no-progress"]) == 2
    assert "line 3: not a JSON object" in capsys.readouterr().err
    argv = ["--format", "json", "--source", str(events_file), "--key-field", "clinic.city", "--no-progress"]
    assert main(argv) == 2
    assert "--key-field clinic.city: event 1 has no such field" in capsys.readouterr().err
    assert main(["--format", "json", "--source", str(tmp_path / "missing.jsonl"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("streaminfer-produce: --source ")


def test_keys_paths_and_expectations() -> None:
    event = {"id": 7, "ok": True, "nested": {"a": {"b": "x"}}, "list": [1], "none": None}
    assert field_at(event, "nested.a.b") == "x"
    assert key_of(event, "id", 1) == b"7"
    assert key_of(event, "ok", 1) == b"true"
    for field in ("list", "none", "nested"):
        with pytest.raises(BadArgument, match=f"--key-field {field}: event 3 holds"):
            key_of(event, field, 3)
    assert take_expectations({"expected_label": 1, "expected_probability": 1}, 1) == (None, 1, 1.0)
    assert take_expectations({"true_label": 0, "expected_label": 1}, 1) == (0, 1, None)
    with pytest.raises(BadArgument, match="true_label must be an integer"):
        take_expectations({"true_label": 0.0}, 1)
    with pytest.raises(BadArgument, match="expected_label must be an integer"):
        take_expectations({"expected_label": "benign"}, 1)
    with pytest.raises(BadArgument, match="expected_probability must be a number"):
        take_expectations({"expected_probability": True}, 1)


def test_read_events_stops_at_the_limit(events_file: Path) -> None:
    assert [e["patient_id"] for e in read_events(events_file, limit=2)] == ["bc-0000", "bc-0001"]
