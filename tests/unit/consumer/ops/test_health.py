"""The HTTP health checks (consumer/ops/health.py): /readyz through the phases, /healthz and the event loop."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from consumer.ops.health import HealthChecks
from consumer.ops.metrics import Metrics


class FakeApp:
    def __init__(self) -> None:
        self.ready = (False, "joining the consumer group")
        self.alive = (True, "ok")

    def readiness(self) -> tuple[bool, str]:
        return self.ready

    def liveness(self) -> tuple[bool, str]:
        return self.alive


def test_readyz_follows_the_phases() -> None:
    metrics = Metrics(CollectorRegistry())
    probes = HealthChecks(ready_gauge=metrics.ready)
    assert probes.readyz() == (False, "loading or warming up the model")
    probes.warm = True
    assert probes.readyz()[0] is False  # no consumer yet
    app = FakeApp()
    probes.app = app
    assert probes.readyz() == (False, "joining the consumer group")  # not joined
    app.ready = (True, "ready")
    assert probes.readyz() == (True, "ready")
    assert metrics.registry.get_sample_value("streaminfer_ready") == 1
    probes.provider_ok = False
    assert probes.readyz()[0] is False
    assert metrics.registry.get_sample_value("streaminfer_ready") == 0


async def test_healthz_reports_the_apps_liveness_and_a_running_loop() -> None:
    probes = HealthChecks()
    assert probes.healthz() == (True, "starting")
    app = FakeApp()
    probes.app, probes.loop = app, asyncio.get_running_loop()
    assert await asyncio.to_thread(probes.healthz) == (True, "ok")
    app.alive = (False, "stalled: lag 5 records")
    assert await asyncio.to_thread(probes.healthz) == (False, "stalled: lag 5 records")


def test_healthz_fails_when_the_loop_is_closed() -> None:
    probes = HealthChecks()
    loop = asyncio.new_event_loop()
    loop.close()
    probes.app, probes.loop = FakeApp(), loop
    ok, reason = probes.healthz()
    assert not ok
    assert "event loop" in reason


def test_correlation_ids_are_logged_as_text() -> None:
    from consumer.work import MAX_LOGGED_ID_BYTES, loggable

    assert loggable(b"demo-1") == "demo-1"
    assert loggable(b"caf\xc3\xa9-\xff") == "caf\u00e9-\\xff"  # not UTF-8: escaped, not dropped
    assert loggable(b"a\nforged log line") == "a\\nforged log line"  # no line breaks into the log
    long = loggable(b"x" * (MAX_LOGGED_ID_BYTES + 5))
    assert long.endswith(f"...({MAX_LOGGED_ID_BYTES + 5} bytes)")
