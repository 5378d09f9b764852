"""HealthChecks, security settings and GPU metrics without Kafka or a GPU."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from consumer.config import load_settings
from consumer.errors import ConfigError
from consumer.kafka.security import kafka_security_kwargs
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


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"x")
    return path


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


def test_plaintext_has_no_secrets(model: Path) -> None:
    assert kafka_security_kwargs(load_settings(["--model-path", str(model)])) == {"security_protocol": "PLAINTEXT"}


def test_sasl_password_from_file_and_never_printed(model: Path, tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cr3t-value\n")
    settings = load_settings(
        [
            "--model-path", str(model),
            "--security-protocol", "SASL_PLAINTEXT",
            "--sasl-mechanism", "SCRAM-SHA-512",
            "--sasl-username", "alice",
            "--sasl-password-file", str(secret),
        ]
    )  # fmt: skip
    kwargs = kafka_security_kwargs(settings)
    assert kwargs == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "s3cr3t-value",
    }
    assert "s3cr3t" not in repr(settings)


def test_sasl_password_from_environment_is_masked(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMINFER_SASL_PASSWORD", "env-secret")
    settings = load_settings(
        ["--model-path", str(model), "--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "bob"]
    )
    assert kafka_security_kwargs(settings)["sasl_plain_password"] == "env-secret"
    assert "env-secret" not in repr(settings)
    assert "env-secret" not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--security-protocol", "SASL_SSL"], "sasl_username"),
        (["--security-protocol", "SASL_SSL", "--sasl-username", "u"], "sasl_password"),
        (["--security-protocol", "SSL", "--ssl-cafile", "/nonexistent/ca.pem"], "ssl_cafile"),
        (["--security-protocol", "SSL", "--ssl-certfile", "__MODEL__"], "ssl_keyfile"),
        (["--security-protocol", "TLS"], "security_protocol"),
    ],
)
def test_bad_security_settings_are_named(model: Path, flags: list[str], named: str) -> None:
    flags = [str(model) if f == "__MODEL__" else f for f in flags]
    with pytest.raises(ConfigError, match=named):
        load_settings(["--model-path", str(model), *flags])


def test_unused_secret_files_are_not_required(model: Path) -> None:
    # A Deployment mounts an optional Secret; with PLAINTEXT its absent file must not stop start-up.
    settings = load_settings(["--model-path", str(model), "--sasl-password-file", "/nonexistent/password"])
    assert settings.security_protocol == "PLAINTEXT"


def test_gpu_memory_is_read_at_scrape_time() -> None:
    metrics = Metrics(CollectorRegistry())
    used = [1024.0]
    assert metrics.track_gpu_memory(0, read_used_bytes=lambda: used[0])
    assert metrics.registry.get_sample_value("streaminfer_gpu_memory_used_bytes", {"device": "0"}) == 1024
    used[0] = 4096.0
    assert metrics.registry.get_sample_value("streaminfer_gpu_memory_used_bytes", {"device": "0"}) == 4096


def test_gpu_memory_absent_without_nvml() -> None:
    metrics = Metrics(CollectorRegistry())
    if metrics.track_gpu_memory(0):
        pytest.skip("this machine has an NVIDIA driver")
    assert metrics.registry.get_sample_value("streaminfer_gpu_memory_used_bytes", {"device": "0"}) is None


def test_bulk_histograms_expose_buckets_count_and_sum() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_age_seconds.observe_many([0.001, 0.02, 0.02, 100.0])
    metrics.preprocess_seconds.observe(0.0003, 500)
    r = metrics.registry
    assert r.get_sample_value("streaminfer_record_age_seconds_bucket", {"le": "0.001"}) == 1  # le is inclusive
    assert r.get_sample_value("streaminfer_record_age_seconds_bucket", {"le": "0.025"}) == 3
    assert r.get_sample_value("streaminfer_record_age_seconds_bucket", {"le": "+Inf"}) == 4
    assert r.get_sample_value("streaminfer_record_age_seconds_count") == 4
    assert r.get_sample_value("streaminfer_record_age_seconds_sum") == pytest.approx(100.041)
    assert r.get_sample_value("streaminfer_preprocess_seconds_count") == 500
    assert r.get_sample_value("streaminfer_preprocess_seconds_bucket", {"le": "0.00025"}) == 0
    assert r.get_sample_value("streaminfer_preprocess_seconds_bucket", {"le": "0.0005"}) == 500


def test_correlation_ids_are_logged_as_text() -> None:
    from consumer.work import MAX_LOGGED_ID_BYTES, loggable

    assert loggable(b"demo-1") == "demo-1"
    assert loggable(b"caf\xc3\xa9-\xff") == "caf\u00e9-\\xff"  # not UTF-8: escaped, not dropped
    assert loggable(b"a\nforged log line") == "a\\nforged log line"  # no line breaks into the log
    long = loggable(b"x" * (MAX_LOGGED_ID_BYTES + 5))
    assert long.endswith(f"...({MAX_LOGGED_ID_BYTES + 5} bytes)")
