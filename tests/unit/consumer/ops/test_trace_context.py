"""W3C trace context travels from a request to its answer: traceparent, tracestate and baggage on the result (in
their order, nothing else of the request's), and every request header on the dead letter."""

from __future__ import annotations

from dataclasses import dataclass, field

from consumer.answers.records import AnswerRecords
from consumer.errors import DeadLetterReason, RecordError

SINK = AnswerRecords(results_topic="results", dead_letter_topic="requests.dlq", group_id="g")
TRACE = [
    ("tracestate", b"vendor=x"),
    ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ("baggage", b"user=42"),
]


@dataclass
class Rec:
    topic: str = "requests"
    partition: int = 0
    offset: int = 3
    timestamp: int = 1
    key: bytes | None = None
    value: bytes | None = b"{}"
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def test_a_result_carries_the_requests_trace_context_and_nothing_else_of_its_headers() -> None:
    rec = Rec(headers=[("authorization", b"secret"), *TRACE, ("x-other", b"1")])
    _, _, _, headers = SINK.result(rec, b"cid", b"{}")
    assert [h for h in headers if h[0] in {"traceparent", "tracestate", "baggage"}] == TRACE
    assert not {"authorization", "x-other"} & {name for name, _ in headers}
    _, _, _, binary = SINK.result(rec, b"cid", b"{}", json_length=2)
    assert binary[-3:] == TRACE


def test_a_result_without_trace_context_has_none() -> None:
    _, _, _, headers = SINK.result(Rec(headers=[("x-other", b"1")]), b"cid", b"{}")
    assert [name for name, _ in headers] == ["correlation_id", "content-type", "streaminfer.request.timestamp_ms"]


def test_a_dead_letter_keeps_the_trace_context_with_every_request_header() -> None:
    rec = Rec(headers=[("authorization", b"secret"), *TRACE])
    _, _, _, headers = SINK.dead_letter(rec, b"cid", RecordError(DeadLetterReason.INVALID_JSON, "x"))
    assert headers[:4] == rec.headers
