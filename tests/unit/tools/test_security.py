"""The tools' Kafka security settings (producer_tools/security.py): flags, STREAMINFER_* variables and a Kafka client
properties file read into the consumer's settings, with the consumer's checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from producer_tools.cli import BadArgument
from producer_tools.security import ClientSecurity, add_security, read_command_config, security_of


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_security(p)
    return p.parse_args(list(argv))


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("not read until a client is made\n")
    return path


def test_nothing_given_is_plaintext() -> None:
    assert security_of(parse(), {}) == ClientSecurity()
    assert ClientSecurity().kwargs() == {"security_protocol": "PLAINTEXT"}


def test_a_kafka_properties_file_with_a_scram_jaas_line(tmp_path: Path, ca: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "# as for kafka-console-producer.sh --command-config\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="alice" password="p\\\\"w=d;";\n'
        f"ssl.ca.location={ca}\n"
        "ssl.endpoint.identification.algorithm=\n"
        "client.id=ignored\n"
    )
    got = security_of(parse("--command-config", str(props)), {})
    assert (got.security_protocol, got.sasl_mechanism, got.sasl_username) == ("SASL_SSL", "SCRAM-SHA-512", "alice")
    assert got.sasl_password is not None
    assert got.sasl_password.get_secret_value() == 'p"w=d;'
    assert got.ssl_cafile == ca
    assert got.ssl_check_hostname is False


def test_a_flag_wins_over_the_file_which_wins_over_the_environment(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.username=from-file\nsasl.password=file-secret\n")
    env = {"STREAMINFER_SASL_USERNAME": "from-env", "STREAMINFER_SASL_MECHANISM": "SCRAM-SHA-256",
           "STREAMINFER_SASL_PASSWORD": "env-secret"}  # fmt: skip
    got = security_of(parse("--command-config", str(props), "--sasl-username", "from-flag"), env)
    assert got.sasl_username == "from-flag"
    assert got.sasl_mechanism == "SCRAM-SHA-256"  # only the environment gave it
    assert got.sasl_password is not None
    assert got.sasl_password.get_secret_value() == "file-secret"
    assert security_of(parse(), env).sasl_username == "from-env"


def test_a_jks_trust_store_is_refused_with_the_pem_way(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\n")
    with pytest.raises(BadArgument, match=r"JKS trust store.*ssl\.ca\.location=ca\.pem.*keytool -exportcert -rfc"):
        read_command_config(props)


def test_a_pem_trust_store_is_the_ca_file(tmp_path: Path, ca: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text(f"ssl.truststore.type=PEM\nssl.truststore.location={ca}\n")
    assert read_command_config(props) == {"ssl_cafile": str(ca)}


def test_unsupported_keys_are_named_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=PLAINTEXT\nlinger.ms=5\nacks=all\n")
    assert read_command_config(props) == {"security_protocol": "PLAINTEXT"}
    assert "ignored (not supported here): acks, linger.ms" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('sasl.jaas.config=com.example.OAuthLoginModule required token="t";', "only PlainLoginModule or Scram"),
        ('sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="u";',
         "no username or no password"),
    ],
)  # fmt: skip
def test_a_jaas_line_that_is_not_user_and_password_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    props = tmp_path / "client.properties"
    props.write_text(text + "\n")
    with pytest.raises(BadArgument, match=expected):
        read_command_config(props)


def test_an_unreadable_properties_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(BadArgument, match=r"--command-config .*missing\.properties"):
        security_of(parse("--command-config", str(tmp_path / "missing.properties")), {})


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--security-protocol", "SASL_SSL"], {}, r"needs sasl_username \(--sasl-username\)"),
        (["--security-protocol", "SASL_SSL", "--sasl-username", "u"], {}, "needs a SASL password"),
        (["--security-protocol", "SSL", "--ssl-cafile", "/no/such/ca.pem"], {}, "ssl_cafile '/no/such/ca.pem' is not"),
        ([], {"STREAMINFER_SECURITY_PROTOCOL": "SASL"}, "security_protocol: 'SASL' is none of"),
        (["--ssl-check-hostname", "maybe"], {}, "ssl_check_hostname: 'maybe' is neither"),
    ],
)
def test_settings_the_consumer_would_refuse_are_refused(argv: list[str], env: dict[str, str], expected: str) -> None:
    with pytest.raises(BadArgument, match=expected):
        security_of(parse(*argv), env)


def test_a_certificate_without_its_key_is_refused(ca: Path) -> None:
    with pytest.raises(BadArgument, match="ssl_certfile and ssl_keyfile go together"):
        security_of(parse("--security-protocol", "SSL", "--ssl-certfile", str(ca)), {})


def test_an_invalid_ca_file_is_named_when_the_client_is_made(ca: Path) -> None:
    security = security_of(parse("--security-protocol", "SSL", "--ssl-cafile", str(ca)), {})
    with pytest.raises(BadArgument, match="Kafka TLS/SASL files"):
        security.kwargs()


def test_sasl_kwargs_carry_the_password_of_the_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    argv = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "u", "--sasl-password-file", str(secret)]
    security = security_of(parse(*argv, "--sasl-mechanism", "SCRAM-SHA-256"), {})
    assert security.kwargs() == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                                 "sasl_plain_username": "u", "sasl_plain_password": "s3cret"}  # fmt: skip
