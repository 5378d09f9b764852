"""Reading a running consumer's ``/metrics`` (the soak and the benchmark): fetched over HTTP and parsed with
prometheus-client's own text-format parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

#: How long a scrape may take, seconds.
SCRAPE_TIMEOUT_S = 5.0


def metric_families(port: int, host: str = "127.0.0.1") -> list[Metric]:
    """The metric families of ``http://host:port/metrics``.

    Raises:
        OSError: the endpoint does not answer within :data:`SCRAPE_TIMEOUT_S` (urllib's URLError included).
    """
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=SCRAPE_TIMEOUT_S) as response:
        return list(text_string_to_metric_families(response.read().decode()))
