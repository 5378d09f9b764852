"""OpenTelemetry traces: a span per micro-batch and one per record, continuing each request's W3C trace context.

Off unless configured (no cost then: one ``is None`` check per batch and per acknowledged chunk). It is on when the
``otel`` extra is installed (``pip install 'streaminfer[otel]'``: the OpenTelemetry SDK and its OTLP/HTTP
exporter) and the standard variables ask for it: ``OTEL_TRACES_EXPORTER`` is set (``otlp`` or ``console``; another
exporter fails at start-up), or an OTLP endpoint is (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off.
Everything else (endpoint, headers, timeouts, the sampler ``OTEL_TRACES_SAMPLER``, the resource
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, the propagators ``OTEL_PROPAGATORS``) is read by the SDK
itself; the service name defaults to ``streaminfer``.

Spans (names and attributes after OpenTelemetry's messaging semantic conventions where they apply):

- ``streaminfer.batch`` (INTERNAL), per micro-batch run, bisection halves as its children:
  ``streaminfer.batch.records``, ``streaminfer.batch.rows``, ``streaminfer.model.name``,
  ``streaminfer.execution_provider``; one link to each record's incoming span context (its ``traceparent`` /
  ``tracestate`` headers) where it has one.
- ``<requests topic> process`` (CONSUMER), per record, from when it was decoded to when the broker acknowledged
  its answer (result or dead letter; in exactly_once, when its transaction committed), child of the record's
  incoming context (a new trace where it has none): ``messaging.system=kafka``, ``messaging.operation.type=process``,
  ``messaging.destination.name``, ``messaging.destination.partition.id``, ``messaging.kafka.offset``,
  ``messaging.consumer.group.name``, ``streaminfer.correlation_id``, ``streaminfer.outcome`` (``result`` or
  ``dead_letter``) and ``streaminfer.dead_letter.reason``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from consumer.errors import ConfigError
from consumer.work import Work

#: W3C Trace Context (``traceparent``, ``tracestate``) and W3C Baggage headers: copied from a request to its result,
#: in their order, so a trace continues across the topic (a dead letter keeps every request header anyway).
TRACE_CONTEXT_HEADERS = frozenset({"traceparent", "tracestate", "baggage"})

#: Span links per batch span: OpenTelemetry's default ``OTEL_SPAN_LINK_COUNT_LIMIT``.
MAX_LINKS = 128


class Tracing:
    """Makes the spans of the module docstring.

    Args:
        tracer: an OpenTelemetry ``Tracer``.
        group: the consumer group (a record span's attribute).
        shutdown: flushes and closes the exporter (the provider's ``shutdown``), or None.
    """

    def __init__(
        self,
        tracer: Any,
        group: str,
        shutdown: Callable[[], object] | None = None,
    ) -> None:
        from opentelemetry import propagate, trace

        self._tracer = tracer
        self._group = group
        self._shutdown = shutdown
        self._propagate = propagate
        self._trace = trace

    def incoming(self, work: Work) -> Any:
        """The OpenTelemetry context a record's trace headers carry (an empty one without them)."""
        carrier = {
            name: value.decode("latin-1")
            for name, value in work.record.headers
            if name in TRACE_CONTEXT_HEADERS and value is not None
        }
        return self._propagate.extract(carrier)

    @contextmanager
    def batch(self, works: Sequence[Work], rows: int, model: str, provider: str) -> Iterator[None]:
        """A span around one micro-batch run (``rows`` rows of ``works``), linked to each record's trace."""
        links = []
        for work in works[:MAX_LINKS]:
            context = self._trace.get_current_span(self.incoming(work)).get_span_context()
            if context.is_valid:
                links.append(self._trace.Link(context))
        attributes = {
            "streaminfer.batch.records": len(works),
            "streaminfer.batch.rows": rows,
            "streaminfer.model.name": model,
            "streaminfer.execution_provider": provider,
        }
        with self._tracer.start_as_current_span("streaminfer.batch", links=links, attributes=attributes):
            yield

    def answered(self, works: Sequence[Work], now_s: float) -> None:
        """One span per record whose answer the broker acknowledged, from its decode to now (``now_s``: the clock
        ``Work.enqueued_at`` was stamped with, seconds)."""
        now_mono = now_s
        now_ns = time.time_ns()
        for work in works:
            record = work.record
            start_ns = now_ns - int(max(0.0, now_mono - work.enqueued_at) * 1e9)
            attributes: dict[str, str | int] = {
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": record.topic,
                "messaging.destination.partition.id": str(record.partition),
                "messaging.kafka.offset": record.offset,
                "messaging.consumer.group.name": self._group,
                "streaminfer.correlation_id": work.correlation_id.decode("utf-8", "backslashreplace"),
                "streaminfer.outcome": "result" if work.error is None else "dead_letter",
            }
            if work.error is not None:
                attributes["streaminfer.dead_letter.reason"] = work.error.reason.value
            span = self._tracer.start_span(
                f"{record.topic} process",
                context=self.incoming(work),
                kind=self._trace.SpanKind.CONSUMER,
                attributes=attributes,
                start_time=start_ns,
            )
            span.end(end_time=now_ns)

    def close(self) -> None:
        """Export what is buffered and close the exporter."""
        if self._shutdown is not None:
            self._shutdown()


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the standard OTEL_* variables ask for traces (module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def from_environment(group: str, env: Mapping[str, str]) -> Tracing | None:
    """Tracing as the OTEL_* variables configure it, or None when they do not ask for it.

    Raises:
        ConfigError: they ask for traces but the ``otel`` extra is not installed, or name an exporter other than
            ``otlp``, ``console`` or ``none``.
    """
    if not wanted(env):
        return None
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter_name not in ("otlp", "console"):
        raise ConfigError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: streaminfer exports with 'otlp' or 'console'")
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        raise ConfigError(
            "OTEL_* variables ask for traces but the OpenTelemetry SDK is not installed: "
            "pip install 'streaminfer[otel]'"
        ) from None
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError(
                "OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http: "
                "pip install 'streaminfer[otel]'"
            ) from None
        exporter = OTLPSpanExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_* (the SDK reads them)
    service = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "streaminfer"}
    provider = TracerProvider(resource=Resource.create(service))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider.get_tracer("streaminfer"), group, shutdown=provider.shutdown)
