"""Entry point: ``streaminfer-consumer`` / ``python -m consumer``.

Reads settings (flags and ``STREAMINFER_*``), loads and warms the model, serves ``/metrics``, ``/healthz`` and
``/readyz``, then consumes until SIGTERM or SIGINT.

Exit codes: 0 clean stop; 1 a background task failed (the orchestrator should restart us); 2 bad settings;
3 the model cannot be served.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from consumer.app import StreamInferApp
from consumer.config import Settings, load_settings
from consumer.errors import ConfigError, ModelError
from consumer.health import serve
from consumer.metrics import Metrics
from consumer.runner import OnnxRunner, describe

log = logging.getLogger("consumer")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_MODEL = 0, 1, 2, 3


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, as_json: bool) -> None:
    """Log to stderr, as text or one JSON object per line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter() if as_json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("aiokafka").setLevel(max(logging.getLevelName(level), logging.WARNING))


async def serve_forever(settings: Settings, runner: OnnxRunner) -> int:
    """Run the consumer until a signal; returns the exit code."""
    metrics = Metrics(CollectorRegistry(auto_describe=True))
    metrics.model.info({k: str(v) for k, v in describe(runner).items() if k != "inputs" and k != "outputs"})
    app = StreamInferApp(settings, runner, metrics)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    httpd = None
    if settings.http_port:
        httpd = serve(
            settings.http_host,
            settings.http_port,
            metrics.registry,
            healthz=lambda: (app.failed is None, "ok" if app.failed is None else repr(app.failed)),
            readyz=lambda: (app.ready, "ready" if app.ready else "warming up or joining the group"),
        )
    try:
        code = await app.run(stop)
    finally:
        if httpd is not None:
            httpd.shutdown()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, load, warm, serve. Returns the exit code (also used by the console script)."""
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"streaminfer-consumer: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(settings.log_level, settings.log_json)
    try:
        runner = OnnxRunner.load(
            settings.model_path,
            execution_provider=settings.execution_provider,
            require_gpu=settings.require_gpu,
            intra_op_threads=settings.intra_op_threads,
            model_name=settings.model_name,
            model_version=settings.model_version,
        )
        runner.warmup(sorted({1, settings.max_batch_size}), settings.warmup_runs)
    except ModelError as exc:
        log.error("model cannot be served: %s", exc)
        return EXIT_MODEL
    except Exception as exc:  # noqa: BLE001 (warmup failure of any kind means we cannot serve)
        log.error("warmup failed: %r", exc)
        return EXIT_MODEL
    log.info("serving %s", json.dumps(describe(runner)))
    return asyncio.run(serve_forever(settings, runner))


if __name__ == "__main__":
    sys.exit(main())
