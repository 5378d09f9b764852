"""AnswerRecords.result / kept_headers: the headers a result carries, whatever the order of the requests'
timestamps (the last one's text is reused) and whichever trace context headers the request holds."""

from __future__ import annotations

from consumer.answers.records import REQUEST_TIMESTAMP_HEADER, AnswerRecords
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
