"""OpenTelemetry spans, read back with the SDK's in-memory exporter: a batch span linked to every record's incoming
trace, a process span per record continuing it, dead letters included; the OTEL_* variables that turn traces on."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from consumer.errors import ConfigError
from consumer.ops.tracing import Tracing, from_environment, wanted
from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock
from tests.unit.wired import Wired, digits_value

TRACE_IDS = ["4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"]
PARENT = "00f067aa0ba902b7"


def traced(clock: FakeClock) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test"), "g", shutdown=provider.shutdown), exporter


async def test_a_batch_span_links_every_request_and_each_record_continues_its_trace(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    tracing, exporter = traced(clock)
    h = Wired(tmp_path, digits_signature, clock, tracing=tracing)
    await h.start(partitions=(0,))
    headers = [[("traceparent", f"00-{t}-{PARENT}-01".encode())] for t in TRACE_IDS] + [[], []]
    h.send(0, [digits_value(), digits_value(), digits_value(), b"not json"], headers)
    await h.until(lambda: h.committed(0) == 4)
    spans = exporter.get_finished_spans()
    batches = [s for s in spans if s.name == "streaminfer.batch"]
    assert len(batches) == 1
    assert batches[0].attributes["streaminfer.batch.records"] == 3
    assert sorted(f"{link.context.trace_id:032x}" for link in batches[0].links) == sorted(TRACE_IDS)
    process = sorted(
        (s for s in spans if s.name == "requests process"), key=lambda s: s.attributes["messaging.kafka.offset"]
    )
    assert [s.attributes["messaging.kafka.offset"] for s in process] == [0, 1, 2, 3]
    assert all(s.kind is SpanKind.CONSUMER for s in process)
    for span, trace_id in zip(process[:2], TRACE_IDS, strict=True):  # children of the incoming spans
        assert f"{span.context.trace_id:032x}" == trace_id
        assert span.parent is not None
        assert f"{span.parent.span_id:016x}" == PARENT
    assert process[2].parent is None  # no trace context: a trace of its own
    assert f"{process[2].context.trace_id:032x}" not in TRACE_IDS
    assert process[3].attributes["streaminfer.outcome"] == "dead_letter"
    assert process[3].attributes["streaminfer.dead_letter.reason"] == "invalid_json"
    assert process[0].attributes["streaminfer.correlation_id"] == "p0-0"
    assert process[0].end_time >= process[0].start_time
    await h.stop()


async def test_without_tracing_nothing_is_traced(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock)
    await h.start(partitions=(0,))
    h.send(0, [digits_value()], [[("traceparent", f"00-{TRACE_IDS[0]}-{PARENT}-01".encode())]])
    await h.until(lambda: h.committed(0) == 1)
    assert h.app.stages is not None
    assert h.app.stages.tracing is None
    await h.stop()


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_the_standard_variables_turn_traces_on(env: dict[str, str], on: bool) -> None:
    assert wanted(env) is on


def test_an_exporter_streaminfer_does_not_ship_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        from_environment("g", {"OTEL_TRACES_EXPORTER": "zipkin"})
    console = from_environment("g", {"OTEL_TRACES_EXPORTER": "console"})
    assert console is not None
    console.close()
