"""streaminfer-dlq without a broker: dead letters as the consumer writes them (consumer.answers.records) split back into
the request and the error, the selection flags, the replayed record's headers, the refusals."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from consumer.answers.records import REASON_HEADER, AnswerRecords
from consumer.errors import DeadLetterReason, RecordError
from consumer.kafka.unpack import Dropped
from producer_tools.cli import BadArgument
from producer_tools.dlq import (
    REPLAY_HEADER,
    REPLAYED_FROM_HEADER,
    DeadLetter,
    Selection,
    parse_time_ms,
    parser,
    preview,
    refusal,
    replayed_headers,
    selection,
    split,
    summarise,
)

SINK = AnswerRecords(results_topic="results", dead_letter_topic="requests.dlq", group_id="g")


@dataclass
class Rec:
    topic: str = "requests"
    partition: int = 2
    offset: int = 41
    timestamp: int = 1_700_000_000_000
    key: bytes | None = b"k"
    value: bytes | None = b'{"inputs": []}'
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def letter_of(
    rec: Rec,
    reason: DeadLetterReason = DeadLetterReason.TOO_LARGE,
    *,
    cid: bytes = b"cid-1",
    reduced: bool = False,
    dl_offset: int = 7,
    dl_time_ms: int = 1_700_000_001_000,
) -> DeadLetter:
    topic, key, value, headers = SINK.dead_letter(rec, cid, RecordError(reason, "too many rows"), reduced=reduced)
    assert topic == "requests.dlq"
    return split(0, dl_offset, dl_time_ms, key, value, headers)


def test_a_dead_letter_splits_into_the_request_and_the_error() -> None:
    own = [("traceparent", b"00-abc-def-01"), ("correlation_id", b"cid-1"), ("empty", None)]
    letter = letter_of(Rec(headers=own))
    assert letter.request_headers == own  # unchanged, the request's own correlation_id included
    assert letter.key == b"k"
    assert letter.value == b'{"inputs": []}'
    assert letter.reason == "too_large"
    assert letter.correlation_id == b"cid-1"
    assert letter.source == ("requests", 2, 41)
    assert letter.error["streaminfer.consumer.group"] == "g"
    assert letter.kept
    assert letter.replays == 0


def test_a_reduced_dead_letter_or_a_dropped_value_is_not_kept() -> None:
    reduced = letter_of(Rec(headers=[("a", b"b")]), reduced=True)
    assert not reduced.kept
    assert reduced.request_headers == [("a", b"b")]
    assert refusal(reduced, 3) == "value not kept"
    dropped = Dropped.make(41, 41, None, 9_000_000, "max_record_bytes", 1_000_000)
    never_fetched = letter_of(Rec(value=dropped, headers=[("a", b"b")]))
    assert not never_fetched.kept
    assert never_fetched.request_headers == [("a", b"b")]  # the dropped-value headers belong to the error
    assert "streaminfer.error.original_value_bytes" in never_fetched.error


def test_the_replay_keeps_the_correlation_id_and_counts() -> None:
    first = letter_of(Rec(headers=[("traceparent", b"t"), ("correlation_id", b"old")]), cid=b"old")
    headers = replayed_headers(first, "requests.dlq")
    assert headers == [
        ("traceparent", b"t"),
        ("correlation_id", b"old"),
        (REPLAY_HEADER, b"1"),
        (REPLAYED_FROM_HEADER, b"requests.dlq:0:7"),
    ]
    assert not any(name.startswith("__connect.errors.") or name == REASON_HEADER for name, _ in headers)
    # Dead-lettered again after the replay: the count travels with the request and bounds the next replay.
    again = letter_of(Rec(headers=headers), cid=b"old")
    assert again.replays == 1
    assert replayed_headers(again, "requests.dlq")[-2] == (REPLAY_HEADER, b"2")
    assert refusal(again, 2) is None
    assert refusal(letter_of(Rec(headers=replayed_headers(again, "q")), cid=b"old"), 2) == "replayed 2 times already"


def test_an_id_that_came_from_the_request_body_is_kept_as_a_header() -> None:
    letter = letter_of(Rec(headers=[]), cid=b"from-the-body")
    assert ("correlation_id", b"from-the-body") in replayed_headers(letter, "requests.dlq")


def args_of(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["summary", *argv])


def test_the_selection_flags_pick_dead_letters() -> None:
    big = letter_of(Rec(partition=1, offset=10), DeadLetterReason.TOO_LARGE, cid=b"a", dl_time_ms=2_000)
    bad = letter_of(Rec(partition=2, offset=20), DeadLetterReason.INVALID_JSON, cid=b"b", dl_time_ms=3_000)
    both = [big, bad]
    assert [x for x in both if selection(args_of()).picks(x)] == both
    assert [x for x in both if selection(args_of("--reason", "too_large")).picks(x)] == [big]
    assert [x for x in both if selection(args_of("--since", "2500")).picks(x)] == [bad]
    assert [x for x in both if selection(args_of("--until", "1970-01-01T00:00:02")).picks(x)] == [big]
    assert [x for x in both if selection(args_of("--source-partition", "2")).picks(x)] == [bad]
    assert [x for x in both if selection(args_of("--offsets", "5-15")).picks(x)] == [big]
    assert [x for x in both if selection(args_of("--correlation-id", "b")).picks(x)] == [bad]
    assert Selection(reasons=frozenset({"too_large"})).tag() != Selection().tag()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reason", "to_large"], "--reason 'to_large' is not a dead-letter reason"),
        (["--offsets", "9-3"], "--offsets must be FIRST-LAST"),
        (["--since", "yesterday"], "--since must be ms since the epoch or an ISO 8601 time"),
        (["--since", "2000", "--until", "1000"], "--since '2000' is after --until '1000'"),
        (["--source-partition", "-1"], "--source-partition must be >= 0"),
    ],
)
def test_a_bad_selection_names_its_flag(argv: list[str], message: str) -> None:
    with pytest.raises(BadArgument, match=message):
        selection(args_of(*argv))


def test_show_refuses_a_negative_limit_and_replay_needs_its_target(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BadArgument, match="--limit must be >= 0"):
        selection(parser().parse_args(["show", "--limit", "-1"]))
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["replay", "--reason", "too_large"])  # no --to: nothing is sent anywhere by default
    assert exited.value.code == 2
    assert "--to" in capsys.readouterr().err
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "10.1.2.3:9092")  # what kafka-local run sets
    assert parser().parse_args(["summary"]).bootstrap_servers == "10.1.2.3:9092"


def test_times_are_utc_unless_they_say_otherwise() -> None:
    assert parse_time_ms("1700000000000", "--since") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20", "--since") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T23:13:20+01:00", "--since") == 1_700_000_000_000


def test_the_summary_counts_by_reason_partition_and_time() -> None:
    letters = [
        letter_of(Rec(partition=1), DeadLetterReason.TOO_LARGE, dl_time_ms=5),
        letter_of(Rec(partition=1), DeadLetterReason.TOO_LARGE, dl_time_ms=9),
        letter_of(Rec(partition=3), DeadLetterReason.TOO_LARGE, dl_time_ms=7),
        letter_of(Rec(partition=0), DeadLetterReason.INVALID_JSON, dl_time_ms=1),
    ]
    rows = summarise(letters)
    assert list(rows) == ["too_large", "invalid_json"]  # most frequent first
    assert rows["too_large"].count == 3
    assert dict(rows["too_large"].partitions) == {"requests:1": 2, "requests:3": 1}
    assert (rows["too_large"].first_ms, rows["too_large"].last_ms) == (5, 9)


def test_previews_are_safe_and_bounded() -> None:
    assert preview(None) == "(null)"
    assert preview(b"a\x00b\xff\n") == "a\\x00b\\xff\\n"
    assert preview(b"x" * 500).endswith("... (500 bytes)")


@pytest.mark.parametrize(
    ("argv", "progress", "topic"),
    [
        (["summary"], True, "requests.dlq"),
        (["--no-progress", "summary"], False, "requests.dlq"),
        (["summary", "--no-progress"], False, "requests.dlq"),
        (["--dead-letter-topic", "a.dlq", "show"], True, "a.dlq"),
        (["replay", "--to", "requests", "--dead-letter-topic", "b.dlq", "--no-progress"], False, "b.dlq"),
    ],
)
def test_common_flags_go_before_or_after_the_verb(argv: list[str], progress: bool, topic: str) -> None:
    args = parser().parse_args(["--bootstrap-servers", "127.0.0.1:9092", *argv])
    assert (args.progress, args.dead_letter_topic) == (progress, topic)
