"""Entry point: ``streaminfer-consumer`` / ``python -m consumer``.

Reads settings (flags and ``STREAMINFER_*``), loads and warms the model, serves ``/metrics``, ``/healthz`` and
``/readyz``, then consumes until SIGTERM or SIGINT.

Exit codes: 0 clean stop; 1 a background task failed (the orchestrator should restart us); 2 bad settings (a
model file that is not the one ``validation_record`` describes included);
3 the model cannot be served; 4 the Kafka cluster cannot be reached or refuses us at start-up.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

import numpy as np
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from consumer.answers.enrich import check_enriched
from consumer.app import StreamInferApp
from consumer.budget import budget_problem, memory_limit_bytes
from consumer.config import Settings, load_settings
from consumer.errors import ConfigError, ModelError, RecordError
from consumer.events.mapping import load_mapping
from consumer.kafka.security import secret_values
from consumer.model.record import check_model, load_record
from consumer.model.record import summary as record_summary
from consumer.model.runner import OnnxRunner, describe, warmup_plan
from consumer.model.session import CUDA, TENSORRT, SessionOptions
from consumer.oip.decode import decode_request
from consumer.oip.encode import check_output
from consumer.ops.health import HealthChecks, serve
from consumer.ops.logs import setup_logging
from consumer.ops.metrics import Metrics
from consumer.ops.tracing import Tracing, from_environment
from consumer.shadow.candidate import check_record as check_shadow_record
from consumer.shadow.candidate import load_candidate
from consumer.signature import ModelSignature
from consumer.work import Limits

log = logging.getLogger("consumer")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_MODEL, EXIT_KAFKA = 0, 1, 2, 3, 4
#: Container allocations between two young-generation collections (CPython's default: 700).
GC_YOUNG_THRESHOLD = 10_000


async def serve_until_signal(app: StreamInferApp, checks: HealthChecks) -> int:
    """Run the consumer until SIGTERM/SIGINT; returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    checks.loop = loop
    checks.app = app
    try:
        return await app.run(stop)
    except KafkaError as exc:
        log.error("cannot start on bootstrap_servers=%s: %r", app.settings.bootstrap_servers, exc)
        return EXIT_KAFKA
    except ConfigError as exc:  # a topic missing; the registry URL not its API; a mapped field absent
        log.error("%s", exc)
        return EXIT_CONFIG
    except ModelError as exc:  # the requests subject's latest writer schema cannot feed the model
        log.error("model cannot be served: %s", exc)
        return EXIT_MODEL


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, start the endpoints, load, warm, serve. Returns the exit code (also used by the console script)."""
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"streaminfer-consumer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        tracing = from_environment(settings.group_id, os.environ)
    except ConfigError as exc:
        print(f"streaminfer-consumer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    problem = budget_problem(settings.max_in_flight_bytes, settings.max_batch_unpacked_bytes, memory_limit_bytes())
    if problem is not None:
        print(f"streaminfer-consumer: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        secrets = secret_values(settings)
    except ConfigError as exc:
        print(f"streaminfer-consumer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    limiter = setup_logging(settings.log_level, settings.log_json, secrets)
    metrics = Metrics(CollectorRegistry(auto_describe=True))
    checks = HealthChecks(ready_gauge=metrics.ready)
    httpd = None
    if settings.http_port:
        try:
            httpd = serve(settings.http_host, settings.http_port, metrics.registry, checks.healthz, checks.readyz)
        except OSError as exc:
            log.error("http_port %s: cannot listen on %s: %s", settings.http_port, settings.http_host, exc)
            return EXIT_CONFIG
    try:
        return _load_and_serve(settings, metrics, checks, lambda: limiter.suppressed_total, tracing)
    finally:
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()


def _load_and_serve(
    settings: Settings,
    metrics: Metrics,
    checks: HealthChecks,
    suppressed_client_logs: Callable[[], int],
    tracing: Tracing | None,
) -> int:
    if settings.validation_record is not None:  # before the model is loaded: a wrong file is refused at once
        try:
            record = load_record(settings.validation_record)
            check_model(record, settings.model_path)
        except ConfigError as exc:
            log.error("%s", exc)
            return EXIT_CONFIG
        log.info("validation record %s", json.dumps(record_summary(record)))
    try:
        check_shadow_record(settings)  # as for validation_record: before any model is loaded
    except ConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    mapping = None
    try:
        runner = load_runner(settings)
        if settings.request_format != "oip":  # the model must be fed from events as mapped: else exit 3, not later
            mapping = load_mapping(runner.signature, settings.input_mapping, settings.enrich)
        sizes, lengths = warmup_plan(runner, settings.max_batch_size)
        if runner.signature.sequence is not None:
            log.info(
                "warming up at batch sizes %s x sequence lengths %s, %d runs each", sizes, lengths, settings.warmup_runs
            )
        else:
            log.info("warming up at batch sizes %s, %d runs each", sizes, settings.warmup_runs)
        runner.warmup(sizes, settings.warmup_runs, lengths)
        candidate = load_candidate(settings, runner, warmup_sample=_warmup_of(settings), checked=True)
    except ConfigError as exc:  # a setting the loaded model shows to be wrong (image_preprocessing)
        log.error("%s", exc)
        return EXIT_CONFIG
    except ModelError as exc:
        log.error("model cannot be served: %s", exc)
        return EXIT_MODEL
    except Exception as exc:  # noqa: BLE001 (warmup failure of any kind means we cannot serve)
        log.error("warmup at batch sizes 1 and max_batch_size=%d failed: %r", settings.max_batch_size, exc)
        return EXIT_MODEL
    summary = describe(runner)
    log.info("model ready %s", json.dumps(summary))
    metrics.model.info({k: str(summary[k]) for k in ("model_name", "model_version", "provider", "batch_axis")})
    on_gpu = runner.provider in (CUDA, TENSORRT)
    if on_gpu and not metrics.track_gpu_memory(runner.device_id):
        log.warning("CUDA is active but NVML is not available: streaminfer_gpu_memory_used_bytes is not exported")
    checks.provider_ok = on_gpu or not settings.require_gpu
    checks.warm = True
    app = StreamInferApp(
        settings,
        runner,
        metrics,
        suppressed_client_logs=suppressed_client_logs,
        tracing=tracing,
        mapping=mapping,
        candidate=candidate,
    )
    settle_garbage_collector()
    return asyncio.run(serve_until_signal(app, checks))


def load_runner(settings: Settings) -> OnnxRunner:
    """The model of ``settings``, opened with its provider and session options and probed on the decoded
    ``warmup_request`` (:func:`warmup_sample`) when one is set.

    Raises:
        ModelError: as :meth:`consumer.model.runner.OnnxRunner.load`; or ``warmup_request`` cannot be read or is
            not a valid request for the model.
        ConfigError: ``image_preprocessing`` does not fit the model.
    """
    return OnnxRunner.load(
        settings.model_path,
        SessionOptions.from_settings(settings),
        warmup_sample=_warmup_of(settings),
        answer_encoders=(check_enriched,) if settings.enrich else (check_output,),
    )


def _warmup_of(settings: Settings) -> Callable[[ModelSignature], dict[str, np.ndarray]] | None:
    """The probe and warmup rows of ``warmup_request`` (:func:`warmup_sample`), or None for placeholder rows.

    Raises:
        ModelError: ``warmup_request`` cannot be read.
    """
    try:
        warmup = settings.warmup_request.read_bytes() if settings.warmup_request is not None else None
    except OSError as exc:
        raise ModelError(f"warmup_request: {exc}") from None
    return None if warmup is None else functools.partial(warmup_sample, warmup)


def warmup_sample(value: bytes, signature: ModelSignature) -> dict[str, np.ndarray]:
    """The inputs of the ``warmup_request`` (an OIP request, JSON), validated like any request: the rows the model
    is probed and warmed up with, ``[rows, ...]`` per input, of the model's dtypes.

    Raises:
        ModelError: it is not a valid request for this model (the reason and message named).
    """
    try:
        request = decode_request(value, signature, Limits(max_record_bytes=len(value), max_record_rows=1 << 20))
    except RecordError as err:
        raise ModelError(f"warmup_request is not a valid request for this model: {err.reason}: {err}") from None
    return dict(request.inputs)


def settle_garbage_collector() -> None:
    """Move everything alive after start-up (modules, the model, the settings) out of the collector's sight and
    collect young objects less often: every record allocates a dozen containers (its parsed JSON, its work item),
    so CPython's default (a collection every 700 allocations, a full one every 100 of those, each walking every
    live object) costs a pipeline of small records several percent of its throughput. Reference cycles are still
    collected, just in fewer, larger rounds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


if __name__ == "__main__":
    sys.exit(main())
