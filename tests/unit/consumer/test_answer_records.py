"""AnswerRecords.result / kept_headers: the headers a result carries, whatever the order of the requests'
timestamps (the last one's text is reused) and whichever trace context headers the request holds; AnswerRecords.many
(the bulk build) against AnswerRecords.of; SizeLadder.all_fit."""

from __future__ import annotations

from aiokafka import TopicPartition

from consumer.answers.ladder import SizeLadder
from consumer.answers.records import REQUEST_TIMESTAMP_HEADER, AnswerRecords
from consumer.errors import DeadLetterReason, RecordError
from consumer.work import DecodedRequest, Work
from tests.unit.fakes import record


def test_each_result_carries_its_own_timestamp_and_trace_context() -> None:
    answers = AnswerRecords(results_topic="out", dead_letter_topic="dlq", group_id="g")
    stamps = [5, 5, 6, 5, -1, 1_764_800_000_123, 1_764_800_000_123]
    extras: list[list[tuple[str, bytes]]] = [[], [("traceparent", b"00-a"), ("x", b"1"), ("baggage", b"b=1")], []]
    for i, stamp in enumerate(stamps):
        rec = record("requests", 0, i, b"v", extra=extras[i % 3])
        rec.timestamp = stamp
        got = answers.result(rec, b"cid", b"v")
        trace = [h for h in extras[i % 3] if h[0] in ("traceparent", "baggage")]
        assert got.headers == [
            ("correlation_id", b"cid"),
            ("content-type", b"application/json"),
            (REQUEST_TIMESTAMP_HEADER, str(stamp).encode()),
            *trace,
        ]
        rec.headers = [*rec.headers, ("__value_schema_id", b"7")] if i % 2 else rec.headers
        kept = answers.kept_headers(rec, b"cid")
        assert kept == [
            ("correlation_id", b"cid"),
            (REQUEST_TIMESTAMP_HEADER, str(stamp).encode()),
            *extras[i % 3],  # the request's own but for its correlation ID, timestamp and schema IDs
        ]


def _works() -> list[Work]:
    """One of every kind of answer: JSON, binary and protobuf results, trace context, keyless, a tombstone, dead
    letters (one reduced), a result that was never produced."""
    works = []
    for i in range(12):
        extra = [("traceparent", b"00-a")] if i == 3 else []
        rec = record("requests", 0, i, b"v", key=None if i == 4 else f"k{i}".encode(), extra=extra)
        rec.timestamp = 1_764_800_000_000 + i // 4
        request = DecodedRequest(None, None, 1, None)
        work = Work(rec, TopicPartition("requests", 0), None, f"c{i}".encode(), request, None, 1, 0.0)  # type: ignore[arg-type]
        work.result = f'{{"id":"c{i}"}}'.encode()
        works.append(work)
    works[5].result_json_length = 3
    request = works[6].request
    assert request is not None
    request.protobuf = True
    works[7].tombstone = True
    works[8].error = RecordError(DeadLetterReason.INVALID_JSON, "bad")
    works[9].error = RecordError(DeadLetterReason.INVALID_JSON, "bad")
    works[9].reduced = True
    works[10].result = None
    return works


def test_many_is_of_for_every_kind_of_answer() -> None:
    for enrich in (False, True):
        answers = AnswerRecords(results_topic="out", dead_letter_topic="dlq", group_id="g", enrich=enrich)
        works = _works()
        built, size = answers.many(works)
        assert built == [answers.of(w) for w in works]
        assert size == -1  # some carry more than three headers
        plain = [w for i, w in enumerate(works) if i in (0, 1, 2, 4, 11)]
        built, size = answers.many(plain)
        assert built == [answers.of(w) for w in plain]
        assert size == max(len(w.result or b"") + len(w.record.key or b"") for w in plain)  # 3 headers or fewer


def test_all_fit_only_far_below_the_limit() -> None:
    ladder = SizeLadder(1000)
    assert ladder.all_fit(0)
    assert ladder.all_fit(499)
    assert not ladder.all_fit(500)
    assert not ladder.all_fit(-1)
