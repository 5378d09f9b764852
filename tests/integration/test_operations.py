"""Operations against a real broker: /readyz and /healthz follow the consumer's state, metrics move with traffic."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from consumer.app import StreamInferApp
from consumer.model.runner import OnnxRunner
from consumer.model.session import SessionOptions
from consumer.ops.health import HealthChecks, serve
from consumer.ops.metrics import Metrics
from harness.ports import free_port
from producer_tools.produce import digits_requests, send_all
from tests.integration.conftest import answers, settings_for

pytestmark = pytest.mark.integration


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(url: str) -> tuple[int, str]:
    """GET off the event loop (the liveness probe needs the loop free to answer)."""
    return await asyncio.to_thread(_get, url)


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class GatedSession:
    """Wraps an ORT session; ``run`` waits until the gate is open (a model that hangs)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.gate = threading.Event()
        self.gate.set()

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.gate.wait(timeout=60)
        return self.session.run(output_names, input_feed)  # type: ignore[no-any-return]


async def wait_for(predicate: Any, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s * 10)):
        if await predicate():
            return
        await asyncio.sleep(0.1)
    pytest.fail("condition not reached in time")


async def test_probes_and_metrics_follow_the_consumer(
    kafka_bootstrap: str, topics: dict[str, str], digits_model: Path
) -> None:
    settings = settings_for(kafka_bootstrap, topics, digits_model / "digits.onnx")
    metrics = Metrics(CollectorRegistry())
    probes = HealthChecks(ready_gauge=metrics.ready)
    port = free_port()
    httpd = serve("127.0.0.1", port, metrics.registry, probes.healthz, probes.readyz)
    base = f"http://127.0.0.1:{port}"
    app: StreamInferApp | None = None
    try:
        status, body = await get(base + "/readyz")
        assert status == 503
        assert "warming" in json.loads(body)["reason"]
        assert (await get(base + "/healthz"))[0] == 200

        runner = OnnxRunner.load(settings.model_path, SessionOptions(execution_provider="cpu"))
        runner.warmup([1, settings.max_batch_size], 1)
        probes.warm = True
        assert (await get(base + "/readyz"))[0] == 503  # warm, not yet in the group

        app = StreamInferApp(settings, runner, metrics)
        probes.app, probes.loop = app, asyncio.get_running_loop()
        await app.start()

        async def ready() -> bool:
            return (await get(base + "/readyz"))[0] == 200

        await wait_for(ready)

        records = list(digits_requests("ops", digits_model / "heldout.npz", limit=50))
        await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
        report = await answers(kafka_bootstrap, topics, records)
        assert report.missing == []

        async def committed() -> bool:
            values = scrape((await get(base + "/metrics"))[1])
            return values.get(("streaminfer_commits_total", ()), 0) >= 1

        await wait_for(committed)
        values = scrape((await get(base + "/metrics"))[1])
        assert values[("streaminfer_records_total", (("outcome", "result"),))] == 50
        assert values[("streaminfer_batch_rows_sum", ())] == 50
        assert values[("streaminfer_inference_seconds_count", ())] >= 1
        assert values[("streaminfer_preprocess_seconds_count", ())] == 50
        assert values[("streaminfer_record_age_seconds_count", ())] == 50
        assert values[("streaminfer_in_flight_rows", ())] == 0
        assert values[("streaminfer_ready", ())] == 1
        lags = {k: v for k, v in values.items() if k[0] == "streaminfer_consumer_lag_records"}
        assert len(lags) == 4  # one series per assigned partition
        assert all(v == 0 for v in lags.values())
        assert values[("streaminfer_rebalances_total", ())] >= 1
        assert (await get(base + "/healthz"))[0] == 200

        await app.stop()
        assert (await get(base + "/readyz"))[0] == 503
    finally:
        if app is not None:
            await app.stop()
        httpd.shutdown()
        httpd.server_close()


async def test_liveness_fails_while_stalled_and_recovers(
    kafka_bootstrap: str, topics: dict[str, str], digits_model: Path
) -> None:
    settings = settings_for(kafka_bootstrap, topics, digits_model / "digits.onnx", stall_timeout_s=1.0)
    real = OnnxRunner.load(settings.model_path, SessionOptions(execution_provider="cpu"))
    gated = GatedSession(real.session)
    runner = OnnxRunner(gated, real.signature, real.provider)
    app = StreamInferApp(settings, runner, Metrics(CollectorRegistry()))
    await app.start()
    try:
        await wait_for(lambda: asyncio.sleep(0, app.joined))
        assert app.liveness() == (True, "ok")
        gated.gate.clear()  # the model hangs: nothing finishes, nothing is committed
        records = list(digits_requests("stall", digits_model / "heldout.npz", limit=5))
        await send_all(kafka_bootstrap, topics["requests"], records, progress=False)

        async def stalled() -> bool:
            return not app.liveness()[0]

        await wait_for(stalled, timeout_s=30)
        _alive, reason = app.liveness()
        assert "stalled" in reason
        assert app.lag == 5

        gated.gate.set()  # the model recovers: answers are published and committed

        async def recovered() -> bool:
            return app.liveness()[0] and app.lag == 0

        await wait_for(recovered, timeout_s=30)
    finally:
        gated.gate.set()
        await app.stop()
