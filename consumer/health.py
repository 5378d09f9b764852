"""HTTP endpoints: ``/metrics`` (Prometheus text format), ``/healthz`` (liveness) and ``/readyz`` (readiness).

Served by prometheus-client's own WSGI server in a daemon thread, so a busy event loop cannot hide the metrics.
``/healthz`` answers 200 while the consumer's tasks are alive and the event loop has ticked recently;
``/readyz`` answers 200 once warmup is done and the group has been joined. Bodies are short JSON.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

Probe = Callable[[], tuple[bool, str]]
"""Returns (ok, reason) for a probe; called from the HTTP thread, so it must only read plain attributes."""


def make_app(registry: CollectorRegistry, healthz: Probe, readyz: Probe) -> Callable[..., Iterable[bytes]]:
    """A WSGI app routing ``/healthz`` and ``/readyz`` to the probes and everything else to the metrics."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        probe = {"/healthz": healthz, "/readyz": readyz}.get(path)
        if probe is None:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        ok, reason = probe()
        body = json.dumps({"ok": ok, "reason": reason}).encode()
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(host: str, port: int, registry: CollectorRegistry, healthz: Probe, readyz: Probe) -> Any:
    """Start the endpoints on ``host:port`` in a daemon thread; returns the server (``shutdown()`` stops it).

    Raises:
        OSError: the port is taken.
    """
    # prometheus_client.start_wsgi_server serves only the metrics app; this is the same server around our router.
    httpd = make_server(host, port, make_app(registry, healthz, readyz), ThreadingWSGIServer, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, name="streaminfer-http", daemon=True)
    thread.start()
    return httpd


class _Quiet(WSGIRequestHandler):
    """No access log per probe."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
