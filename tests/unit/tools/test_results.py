"""``streaminfer-results`` without Kafka: enriched results (JSON, and Avro through confluent-kafka's in-process mock
registry) read into answers, their labels and scores checked against a manifest, tombstones as the answers of
tombstone requests, unreadable results named, the summary line, and the flags of each ``--format``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
from confluent_kafka.schema_registry.avro import AsyncAvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from consumer.oip.encode import encode_response
from consumer.signature import ModelSignature
from producer_tools.cli import BadArgument
from producer_tools.events import RegistryUnavailable
from producer_tools.produce import Outgoing
from producer_tools.readers import (
    Answer,
    EventFields,
    EventResults,
    OipResults,
    avro_events,
    event_label,
    event_score,
    field_hints,
    json_event,
)
from producer_tools.results import build_report, main, parser, read_answer, reader_of, score_matches

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "models" / "breast_cancer" / "events.avsc").read_text())
TOPIC = "events.scored"


@dataclass
class Rec:
    """What the reader uses of aiokafka's ConsumerRecord."""

    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int = 1_000_100
    key: bytes | None = b"bc-0001"


def result_headers(cid: str, request_ms: int = 1_000_000) -> tuple[tuple[str, bytes], ...]:
    """An enriched result's headers: the correlation ID and the request's timestamp first, then the request's."""
    return (
        ("correlation_id", cid.encode()),
        ("streaminfer.request.timestamp_ms", str(request_ms).encode()),
        ("traceparent", b"00-abc-def-01"),
    )


def event(i: int = 0) -> dict[str, Any]:
    """A BreastCancerEvent (every field of events.avsc)."""
    body: dict[str, Any] = {"patient_id": f"bc-{i:04d}"}
    body.update({f["name"]: 0.5 * k for k, f in enumerate(SCHEMA["fields"]) if f["type"] == "double"})
    body.update({"clinic": {"region": "south"}, "recorded_at": "2026-03-02T08:00:00Z"})
    return body


def enriched(i: int, label: int, p1: float) -> dict[str, Any]:
    return {**event(i), "label": label, "probabilities": [1.0 - p1, p1]}


# ------------------------------------------------------------------------------------------------ JSON events
async def test_a_json_result_gives_its_label_score_event_and_latency() -> None:
    value = orjson.dumps(enriched(1, 1, 0.75))
    answer = await read_answer(Rec(value, result_headers("c1")), "result", TOPIC, EventResults(json_event))
    assert answer is not None
    assert (answer.correlation_id, answer.kind, answer.label, answer.score) == ("c1", "result", 1, 0.75)
    assert answer.event is not None
    assert answer.event["clinic"] == {"region": "south"}
    assert answer.latency_ms == 100.0
    assert answer.error is None
    assert not answer.tombstone


async def test_a_json_result_framed_by_a_registry_serializer_is_read_too() -> None:
    framed = b"\x00\x00\x00\x00\x07" + orjson.dumps(enriched(1, 0, 0.25))
    assert (await json_event(framed, TOPIC))["label"] == 0


@pytest.mark.parametrize(
    ("value", "why"),
    [(b"{not json", "not JSON"), (b"[1, 2]", "a JSON list, not an object"), (b'"text"', "a JSON str")],
)
async def test_a_json_result_that_is_not_an_object_is_unreadable_but_answered(value: bytes, why: str) -> None:
    answer = await read_answer(Rec(value, result_headers("c1")), "result", TOPIC, EventResults(json_event))
    assert answer is not None
    assert answer.error is not None
    assert answer.error.startswith(why)
    report = build_report({"c1": {"correlation_id": "c1", "label": 1}}, {"c1": answer}, 0)
    assert report.missing == []  # delivered: an answer, though one we cannot read
    assert report.unreadable == [("c1", answer.error)]
    assert report.accuracy == 0.0
    assert report.summary("results").endswith(" unreadable=1")


def test_label_and_score_fields_are_dotted_paths_and_an_array_score_is_indexed() -> None:
    result = {"model": {"label": [2], "score": 0.5}, "probabilities": [0.1, 0.2, 0.7], "flag": True}
    assert event_label(result, "model.label") == 2  # a one-element array of an integer
    assert event_label(result, "flag") is None  # a boolean is no class index
    assert event_label(result, "model.missing") is None
    assert event_score(result, "model.score", 1) == 0.5  # a number: the index does not apply
    assert event_score(result, "probabilities", 2) == pytest.approx(0.7)
    assert event_score(result, "probabilities", -1) == pytest.approx(0.7)
    assert event_score(result, "probabilities", 3) is None
    assert event_score(result, "model", 0) is None  # an object is no score


async def test_other_label_and_score_fields() -> None:
    value = orjson.dumps({**event(), "scores": {"malignant": 0.9}, "predicted": 1})
    reader = EventResults(json_event, EventFields(label="predicted", score="scores.malignant"))
    answer = await read_answer(Rec(value, result_headers("c1")), "result", TOPIC, reader)
    assert answer is not None
    assert (answer.label, answer.score) == (1, 0.9)


# ------------------------------------------------------------------------------------------------ scores and report
def test_scores_equal_within_the_tolerance_as_float32() -> None:
    p = float(np.float32(0.5052816))
    one_ulp = float(np.nextafter(np.float32(p), np.float32(1)))
    assert score_matches(p, p, 0.0)
    assert score_matches(p, float(np.float32(p)) + 1e-12, 0.0)  # the same float32
    assert not score_matches(p, one_ulp, 0.0)
    assert score_matches(p, one_ulp, 1e-6)
    assert not score_matches(p, p + 2e-6, 1e-6)
    assert not score_matches(p, None, 1.0)


def answer(cid: str, *, label: int | None = None, score: float | None = None, **kw: Any) -> Answer:
    return Answer(cid, kw.pop("kind", "result"), 5.0, 1_000_005, 1_000_000, label=label, score=score, **kw)


def test_report_counts_accuracy_and_score_mismatches_against_the_manifest() -> None:
    expected = {
        "a": {"correlation_id": "a", "label": 1, "expected_probability": 0.9},
        "b": {"correlation_id": "b", "label": 0, "expected_probability": 0.1},
        "c": {"correlation_id": "c", "label": 0, "expected_probability": 0.2},
        "d": {"correlation_id": "d", "label": 0},
        "e": {"correlation_id": "e", "expected_reason": "missing_field"},
        "f": {"correlation_id": "f", "label": 1},
    }
    first = {
        "a": answer("a", label=1, score=0.9),
        "b": answer("b", label=1, score=0.1000004),  # within 1e-6, but the wrong class
        "c": answer("c", label=0, score=0.3),  # the right class, another score
        "d": answer("d", label=0),
        "e": answer("e", kind="dead_letter", reason="wrong_type"),
    }
    report = build_report(expected, first, duplicates=2)
    assert (report.sent, report.results, report.dead_letters, report.duplicates) == (6, 4, 1, 2)
    assert report.missing == ["f"]
    assert report.accuracy == 3 / 4
    assert report.scores_checked == 3
    assert report.score_mismatches == [("c", 0.2, 0.3)]
    assert report.reason_mismatches == [("e", "missing_field", "wrong_type")]
    assert report.summary("results").endswith(" throughput_rps=1000.0 score_mismatches=1")
    assert "tombstones=" not in report.summary("results")


def test_accuracy_is_against_the_truth_and_agreement_against_the_direct_run() -> None:
    expected = {
        "a": {"correlation_id": "a", "label": 1, "expected_label": 1},
        "b": {"correlation_id": "b", "label": 0, "expected_label": 1},  # the model is wrong here
        "c": {"correlation_id": "c", "label": 0, "expected_label": 0},
        "d": {"correlation_id": "d", "label": 1, "expected_label": 1},
    }
    first = {cid: answer(cid, label=1 if cid != "c" else 0) for cid in "abc"}
    first["d"] = answer("d", label=0)  # streaminfer changed an answer
    report = build_report(expected, first, duplicates=0)
    assert report.accuracy == 2 / 4
    assert report.agreement == 3 / 4
    assert " accuracy=0.5000 agreement=0.7500 p50_ms=" in report.summary("results")
    without = build_report({"a": {"correlation_id": "a", "label": 1}}, {"a": answer("a", label=1)}, duplicates=0)
    assert without.agreement is None
    assert " accuracy=1.0000 p50_ms=" in without.summary("results")


def test_a_tight_tolerance_finds_what_the_default_lets_through() -> None:
    expected = {"a": {"correlation_id": "a", "expected_probability": 0.25}}
    first = {"a": answer("a", score=0.2500005)}
    assert build_report(expected, first, 0).score_mismatches == []
    assert build_report(expected, first, 0, score_tolerance=0.0).score_mismatches == [("a", 0.25, 0.2500005)]


def test_the_oip_summary_line_is_unchanged() -> None:
    report = build_report({"a": {"correlation_id": "a", "label": 3}}, {"a": answer("a", label=3)}, 0)
    assert report.summary("demo") == (
        "demo: sent=1 results=1 dead_letters=0 accuracy=1.0000 p50_ms=5.0 p99_ms=5.0 throughput_rps=200.0"
    )


# ------------------------------------------------------------------------------------------------ tombstones
@pytest.mark.parametrize("value", [None, b""])  # a keyless tombstone is answered with an empty value
async def test_a_tombstone_result_answers_a_tombstone_request(value: bytes | None) -> None:
    request = Outgoing("t1", None, key=b"bc-0001")
    assert request.manifest() == {"correlation_id": "t1", "tombstone": True}
    reader = EventResults(json_event)
    tomb = await read_answer(Rec(value, result_headers("t1")), "result", TOPIC, reader)
    assert tomb is not None
    assert tomb.tombstone
    assert tomb.error is None  # never read
    scored = await read_answer(Rec(orjson.dumps(enriched(2, 1, 0.8)), result_headers("s1")), "result", TOPIC, reader)
    assert scored is not None
    expected = {"t1": request.manifest(), "s1": {"correlation_id": "s1", "label": 1, "expected_probability": 0.8}}
    report = build_report(expected, {"t1": tomb, "s1": scored}, 0)
    assert (report.results, report.tombstones, report.missing) == (2, 1, [])
    assert report.tombstone_mismatches == []
    assert (report.accuracy, report.scores_checked, report.score_mismatches) == (1.0, 1, [])  # the tombstone: neither
    assert report.summary("results").endswith(" score_mismatches=0 tombstones=1")


def test_a_tombstone_where_an_answer_was_due_and_the_reverse_are_mismatches() -> None:
    expected = {
        "t": {"correlation_id": "t", "tombstone": True},
        "u": {"correlation_id": "u", "tombstone": True},
        "s": {"correlation_id": "s", "label": 1},
    }
    first = {
        "t": answer("t", label=1),  # a tombstone request scored
        "u": answer("u", kind="dead_letter", reason="invalid_json"),  # or dead-lettered
        "s": answer("s", tombstone=True),  # a scored request answered with a tombstone
    }
    report = build_report(expected, first, 0)
    assert sorted(report.tombstone_mismatches) == [("s", False), ("t", True), ("u", True)]
    assert report.accuracy is None  # "s" was answered with a tombstone: a mismatch, not a wrong class
    assert report.tombstones == 1


def test_a_null_poison_record_expects_its_dead_letter_not_a_tombstone() -> None:
    assert "tombstone" not in Outgoing("p", None, expected_reason="invalid_json").manifest()


# ------------------------------------------------------------------------------------------------ Avro events
async def avro_result(client: AsyncSchemaRegistryClient, datum: dict[str, Any]) -> bytes:
    """``datum`` framed with the result schema (the writer schema plus label and probabilities), registered under
    the results subject by confluent-kafka's own serializer."""
    schema = {
        **SCHEMA,
        "fields": [
            *SCHEMA["fields"],
            {"name": "label", "type": ["null", "long"], "default": None},
            {"name": "probabilities", "type": ["null", {"type": "array", "items": "float"}], "default": None},
        ],
    }
    serializer = await AsyncAvroSerializer(client, json.dumps(schema))
    value = await serializer(datum, SerializationContext(TOPIC, MessageField.VALUE))
    assert value is not None
    return bytes(value)


async def test_an_avro_result_is_read_through_the_registry() -> None:
    client = AsyncSchemaRegistryClient.new_client({"url": "mock://results-unit"})
    value = await avro_result(client, enriched(3, 1, 0.6))
    reader = EventResults(avro_events(client))
    got = await read_answer(Rec(value, result_headers("a1")), "result", TOPIC, reader)
    assert got is not None
    assert got.error is None
    assert got.label == 1
    assert got.score == float(np.float32(0.6))  # Avro float: the float32 the model wrote
    assert got.event is not None
    assert got.event["patient_id"] == "bc-0003"
    assert got.event["clinic"] == {"region": "south"}
    assert score_matches(0.6, got.score, 0.0)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (orjson.dumps(enriched(1, 0, 0.1)), "Invalid magic byte"),  # JSON where Avro was due
        (b"\x00\x00\x00\x03\xe7" + b"\x02" * 20, "schema registry: Schema Not Found"),  # an ID nobody registered
        (b"\x00\x00\x01", "Expecting data framing of length 6 bytes or more"),  # too short
        (b"\x01\x00\x00\x00\x01" + b"\x02" * 20, ""),  # another magic byte (a GUID to confluent-kafka)
    ],
)
async def test_an_avro_result_that_cannot_be_read_is_named(value: bytes, why: str) -> None:
    client = AsyncSchemaRegistryClient.new_client({"url": "mock://results-unit-bad"})
    got = await read_answer(Rec(value, result_headers("a1")), "result", TOPIC, EventResults(avro_events(client)))
    assert got is not None
    assert got.error is not None
    assert got.error.startswith(why)
    assert got.label is None


async def test_a_truncated_avro_datum_is_unreadable() -> None:
    client = AsyncSchemaRegistryClient.new_client({"url": "mock://results-unit-cut"})
    value = await avro_result(client, enriched(3, 1, 0.6))
    got = await read_answer(Rec(value[:40], result_headers("a1")), "result", TOPIC, EventResults(avro_events(client)))
    assert got is not None
    assert got.error is not None


class DownRegistry:
    """A registry client whose every request fails to connect."""

    async def get_schema(self, *_args: Any, **_kwargs: Any) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")


async def test_a_registry_that_does_not_answer_stops_the_read() -> None:
    reader = EventResults(avro_events(DownRegistry()))
    with pytest.raises(RegistryUnavailable, match="Connection refused"):
        await read_answer(Rec(b"\x00\x00\x00\x00\x01\x02", result_headers("a1")), "result", TOPIC, reader)


# ------------------------------------------------------------------------------------------------ OIP, unchanged
async def test_an_oip_response_gives_its_label(digits_signature: ModelSignature) -> None:
    outputs = [("label", np.array([7], np.int64)), ("probabilities", np.zeros((1, 10), np.float32))]
    value = encode_response("c1", digits_signature, outputs)
    headers = (("correlation_id", b"c1"), ("content-type", b"application/json"))
    got = await read_answer(Rec(value, headers), "result", "results", OipResults())
    assert got is not None
    assert got.label == 7
    assert got.body is not None
    assert got.event is None


async def test_a_dead_letter_is_never_read() -> None:
    headers = (("correlation_id", b"d1"), ("streaminfer.error.reason", b"invalid_json"))
    got = await read_answer(Rec(b"{not json", headers), "dead_letter", "requests.dlq", EventResults(json_event))
    assert got is not None
    assert (got.kind, got.reason, got.error, got.tombstone) == ("dead_letter", "invalid_json", None, False)


# ------------------------------------------------------------------------------------------------ flags
def flags(*argv: str) -> Any:
    return parser().parse_args(["--manifest", "m.jsonl", *argv])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--label-field", "y"], "--label-field: only with --format json or avro"),
        (["--score-index", "0"], "--score-index: only with --format json or avro"),
        (["--schema-registry-url", "http://r"], "--schema-registry-url: only with --format json or avro"),
        (["--format", "json", "--schema-registry-url", "http://r"], "--schema-registry-url: only with --format avro"),
        (["--format", "avro"], "--schema-registry-url: --format avro needs a schema registry"),
        (["--format", "json", "--score-tolerance", "-1"], "--score-tolerance must be >= 0"),
    ],
)
def test_flags_that_do_not_fit_the_format_are_refused(argv: list[str], named: str) -> None:
    with pytest.raises(BadArgument, match=named.replace("-", r"\-")):
        reader_of(flags(*argv), {})


def test_the_defaults_name_the_examples_fields_and_the_registry_comes_from_the_environment() -> None:
    reader = reader_of(flags("--format", "json"), {})
    assert isinstance(reader, EventResults)
    assert reader.fields == EventFields("label", "probabilities", 1, 1e-6)
    chosen = reader_of(
        flags("--format", "json", "--label-field", "y", "--score-field", "p", "--score-index", "0",
              "--score-tolerance", "0"),
        {},
    )  # fmt: skip
    assert isinstance(chosen, EventResults)
    assert chosen.fields == EventFields("y", "p", 0, 0.0)
    assert isinstance(reader_of(flags("--format", "avro"), {"SCHEMA_REGISTRY_URL": "mock://env"}), EventResults)
    assert isinstance(reader_of(flags(), {"SCHEMA_REGISTRY_URL": "mock://env"}), OipResults)  # oip ignores it


def test_main_exits_2_on_a_bad_flag_before_reading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCHEMA_REGISTRY_URL", raising=False)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"correlation_id": "a"}\n')
    assert main(["--manifest", str(manifest), "--format", "avro"]) == 2
    assert capsys.readouterr().err.startswith("streaminfer-results: --schema-registry-url: --format avro needs")
    assert main(["--manifest", str(manifest), "--score-field", "p"]) == 2
    assert "--score-field: only with --format json or avro" in capsys.readouterr().err


def test_results_without_the_label_and_score_fields_get_a_hint_naming_the_flags() -> None:
    renamed = [{"patient_id": "p-1", "predicted": 1, "probs": [0.2, 0.8]}, {"patient_id": "p-2", "predicted": 0}]
    hints = field_hints(renamed, EventFields())
    assert hints == [
        "hint: no result has the label field 'label': name the field of your input_mapping's outputs with "
        "--label-field PATH; the results' fields: patient_id, predicted, probs",
        "hint: no result has the score field 'probabilities': name the field of your input_mapping's outputs with "
        "--score-field PATH (perhaps --score-field probs); the results' fields: patient_id, predicted, probs",
    ]
    assert field_hints(renamed, EventFields(label="predicted", score="probs")) == []  # the flags given: nothing


def test_a_field_present_in_some_results_or_nested_gets_no_hint() -> None:
    events = [{"out": {"label": 1}}, {"other": 2}]
    assert field_hints(events, EventFields(label="out.label", score="out.label")) == []
    assert field_hints([], EventFields()) == []  # nothing read: nothing to say
