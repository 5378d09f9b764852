"""Kafka client security: TLS and SASL (PLAIN, SCRAM-SHA-256/512) arguments for aiokafka, from the settings.

Secrets are read here, at start-up, from ``sasl_password`` (environment ``STREAMINFER_SASL_PASSWORD``) or
``sasl_password_file`` (a mounted Kubernetes Secret), and handed to the client only; they are never logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from aiokafka.helpers import create_ssl_context
from pydantic import SecretStr

from consumer.config import Settings
from consumer.errors import ConfigError


def secret_values(settings: Settings) -> list[str]:
    """Every secret the settings hold (SASL password, from the file too; TLS key password; the schema registry's
    password, from its file too), for log redaction.

    Raises:
        ConfigError: ``sasl_password_file`` or ``schema_registry_password_file`` is set, used, and unreadable (the
            setting named).
    """
    values = []
    if settings.sasl_password is not None:
        values.append(settings.sasl_password.get_secret_value())
    if settings.sasl_password_file is not None and settings.security_protocol.startswith("SASL"):
        values.append(_read_secret("sasl_password_file", settings.sasl_password_file))
    if settings.ssl_key_password is not None:
        values.append(settings.ssl_key_password.get_secret_value())
    if settings.schema_registry_password is not None:
        values.append(settings.schema_registry_password.get_secret_value())
    if settings.schema_registry_password_file is not None and settings.schema_registry_username is not None:
        values.append(_read_secret("schema_registry_password_file", settings.schema_registry_password_file))
    return [v for v in values if v]


def _read_secret(name: str, path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{name}: {exc}") from None


class SecuritySettings(Protocol):
    """The security part of :class:`~consumer.config.Settings` (the user tools' ``ClientSecurity`` has it too)."""

    @property
    def security_protocol(self) -> str: ...
    @property
    def sasl_mechanism(self) -> str: ...
    @property
    def sasl_username(self) -> str | None: ...
    @property
    def sasl_password(self) -> SecretStr | None: ...
    @property
    def sasl_password_file(self) -> Path | None: ...
    @property
    def ssl_cafile(self) -> Path | None: ...
    @property
    def ssl_certfile(self) -> Path | None: ...
    @property
    def ssl_keyfile(self) -> Path | None: ...
    @property
    def ssl_key_password(self) -> SecretStr | None: ...
    @property
    def ssl_check_hostname(self) -> bool: ...


def kafka_security_kwargs(settings: SecuritySettings) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaConsumer`` / ``AIOKafkaProducer`` / ``AIOKafkaAdminClient``.

    Raises:
        OSError: a certificate, key or password file cannot be read.
        ssl.SSLError: a certificate or key is invalid, or the key password is wrong.
    """
    kwargs: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        key_password = settings.ssl_key_password.get_secret_value() if settings.ssl_key_password else None
        context = create_ssl_context(
            cafile=settings.ssl_cafile,
            certfile=settings.ssl_certfile,
            keyfile=settings.ssl_keyfile,
            password=key_password,
        )
        context.check_hostname = settings.ssl_check_hostname
        kwargs["ssl_context"] = context
    if settings.security_protocol.startswith("SASL"):
        if settings.sasl_password is not None:  # an explicit password wins over the file
            password = settings.sasl_password.get_secret_value()
        else:
            assert settings.sasl_password_file is not None  # enforced by Settings
            password = settings.sasl_password_file.read_text().strip()
        kwargs.update(
            sasl_mechanism=settings.sasl_mechanism,
            sasl_plain_username=settings.sasl_username,
            sasl_plain_password=password,
        )
    return kwargs
