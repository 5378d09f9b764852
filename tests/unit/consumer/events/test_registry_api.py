"""The start-up check of the registry URL (:meth:`consumer.events.registry.Schemas.check_api`) with confluent-kafka's
real async client against a fake HTTP server on loopback: what the client raises for a web page, a 404 at a wrong
path and a real answer is what the check reads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient

from consumer.errors import ConfigError
from consumer.events.mapping import load_mapping
from consumer.events.registry import Schemas
from consumer.signature import ModelSignature, TensorSpec
from consumer.timeouts import Backoff
from tests.unit.consumer.events.fakes import InstantClock

SIGNATURE = ModelSignature("m", "1", (TensorSpec("amount", np.dtype(np.float32), (None, 1)),), ())

#: path -> (status, content type, body): an Apicurio-like server whose API lives under /apis/ccompat/v7 only.
PAGES = {
    "/apis/ccompat/v7/schemas/types": (200, "application/json", b'["JSON","PROTOBUF","AVRO"]'),
    "/apis/ccompat/v7/subjects/payments-value/versions/latest": (404, "application/json",
                                                                 b'{"error_code":40401,"message":"no subject"}'),
    "/console/schemas/types": (200, "text/html", b"<!doctype html><html><body>Registry console</body></html>"),
}  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, kind, body = PAGES.get(self.path.split("?")[0], (404, "application/json", b'{"detail":"nothing"}'))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def schemas_at(url: str) -> Schemas:
    client = AsyncSchemaRegistryClient({"url": url, "max.retries": 0, "timeout": 10})
    clock = InstantClock()
    return Schemas(client, load_mapping(SIGNATURE, None, False), SIGNATURE, None, register=False, unknown_retries=0,
                   backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep, url=url)  # fmt: skip


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("", r"HTTP 404\); for Apicurio Registry add its Confluent-compatible path: http://127.0.0.1:\d+/apis/ccompat"),
        ("/console", r"an answer that is not JSON"),
        ("/apis/registry/v2", r"HTTP 404\); for Apicurio Registry the URL ends in /apis/ccompat/v7"),
    ],
)
async def test_a_url_that_is_not_the_api_stops_start_up(server: str, path: str, expected: str) -> None:
    schemas = schemas_at(server + path)
    try:
        with pytest.raises(ConfigError, match=r"^schema_registry_url=\S+ answers, but not as a Confluent-compatible "
                           r"Schema Registry API \(GET \S+/schemas/types: " + expected):  # fmt: skip
            await schemas.start("payments-value")
    finally:
        await schemas.close()


async def test_the_compatible_path_passes_and_an_empty_subject_is_skipped(server: str) -> None:
    schemas = schemas_at(server + "/apis/ccompat/v7")
    try:
        await schemas.start("payments-value")  # types answered; the subject has no versions yet
    finally:
        await schemas.close()
