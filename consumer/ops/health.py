"""HTTP endpoints: ``/metrics`` (Prometheus text format), ``/healthz`` (liveness) and ``/readyz`` (readiness).

Served by a ``wsgiref`` server (prometheus-client's own ``ThreadingWSGIServer``) in a daemon thread, so a busy
event loop cannot hide the metrics; the server is up before the model loads so the health checks answer during warm-up.

- ``/healthz`` 200 unless: a background task died; the event loop does not run a no-op within
  ``LOOP_TIMEOUT_S``; or the consumer has neither fetched nor committed for ``stall_timeout_s`` while it has work:
  lag > 0, or the cluster silent for ``stall_timeout_s`` (the lag cannot be known; see
  :meth:`consumer.app.StreamInferApp.liveness`). Kubernetes restarts the pod on repeated failures.
- ``/readyz`` 200 once warmup is done, the group has been joined, the required execution provider is active,
  the Kafka cluster answered the last metadata check (:class:`consumer.kafka.link.BrokerLink`: one every 5 s, failing
  after 5 s without an answer, so a cut-off consumer turns unready within 10 s and ready again within 5 s of the
  cluster answering), and the consumer is not stopping.

Bodies are JSON ``{"ok": bool, "reason": str}``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

#: The endpoint paths (the Kubernetes probes and the ServiceMonitor name these; tests/unit/test_k8s.py checks).
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"

#: How long /healthz waits for the event loop to run a no-op, seconds.
LOOP_TIMEOUT_S = 2.0

Check = Callable[[], tuple[bool, str]]
"""Returns (ok, reason); called from the HTTP thread."""


class AppLike(Protocol):
    """What the health checks read from :class:`consumer.app.StreamInferApp`."""

    def readiness(self) -> tuple[bool, str]: ...

    def liveness(self) -> tuple[bool, str]: ...


class HealthChecks:
    """Liveness and readiness of one consumer process, through its phases: loading, warm, serving, stopping.

    Attributes:
        warm: set once the model is loaded and warmed.
        provider_ok: whether the required execution provider is active (False fails readiness).
        app: the consumer, once created.
        loop: the consumer's event loop, once running.

    Args:
        ready_gauge: a gauge (``streaminfer_ready``) that reports readiness as 0/1 at scrape time.
    """

    def __init__(self, ready_gauge: Gauge | None = None) -> None:
        self.warm = False
        self.provider_ok = True
        self.app: AppLike | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        if ready_gauge is not None:
            ready_gauge.set_function(lambda: float(self.readyz()[0]))

    def healthz(self) -> tuple[bool, str]:
        """Liveness: see the module docstring."""
        if self.app is None or self.loop is None:
            return True, "starting"
        alive, reason = self.app.liveness()
        if not alive:
            return False, reason
        if self.loop.is_closed():
            return False, "event loop closed"
        noop = asyncio.sleep(0)
        try:
            asyncio.run_coroutine_threadsafe(noop, self.loop).result(timeout=LOOP_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            return False, f"event loop did not answer within {LOOP_TIMEOUT_S} s"
        except RuntimeError as exc:  # closed between the check and the call
            noop.close()
            return False, f"event loop unavailable: {exc}"
        return True, "ok"

    def readyz(self) -> tuple[bool, str]:
        """Readiness: see the module docstring."""
        if not self.warm:
            return False, "loading or warming up the model"
        if not self.provider_ok:
            return False, "the required execution provider is not active"
        if self.app is None:
            return False, "joining the consumer group"
        return self.app.readiness()


def make_app(registry: CollectorRegistry, healthz: Check, readyz: Check) -> Callable[..., Iterable[bytes]]:
    """A WSGI app routing ``/healthz`` and ``/readyz`` to the health checks and everything else to the metrics."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        check = {HEALTHZ_PATH: healthz, READYZ_PATH: readyz}.get(path)
        if check is None:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        ok, reason = check()
        body = json.dumps({"ok": ok, "reason": reason}).encode()
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(host: str, port: int, registry: CollectorRegistry, healthz: Check, readyz: Check) -> ThreadingWSGIServer:
    """Start the endpoints on ``host:port`` in a daemon thread; ``shutdown()`` on the result stops them.

    Raises:
        OSError: the port is taken.
    """
    # prometheus_client.start_wsgi_server serves only the metrics app; this is the same server around our router.
    httpd = make_server(host, port, make_app(registry, healthz, readyz), ThreadingWSGIServer, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, name="streaminfer-http", daemon=True)
    thread.start()
    return httpd


class _Quiet(WSGIRequestHandler):
    """No access log line per health check."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
