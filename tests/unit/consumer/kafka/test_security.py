"""Kafka security settings (consumer/kafka/security.py): secrets read at start-up, never printed, bad settings named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from consumer.config import load_settings
from consumer.errors import ConfigError
from consumer.kafka.security import kafka_security_kwargs


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"x")
    return path


def test_plaintext_has_no_secrets(model: Path) -> None:
    assert kafka_security_kwargs(load_settings(["--model-path", str(model)], os.environ)) == {
        "security_protocol": "PLAINTEXT"
    }


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
        ], os.environ,
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
        ["--model-path", str(model), "--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "bob"],
        os.environ,
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
        load_settings(["--model-path", str(model), *flags], os.environ)


def test_unused_secret_files_are_not_required(model: Path) -> None:
    # A Deployment mounts an optional Secret; with PLAINTEXT its absent file must not stop start-up.
    settings = load_settings(["--model-path", str(model), "--sasl-password-file", "/nonexistent/password"], os.environ)
    assert settings.security_protocol == "PLAINTEXT"
