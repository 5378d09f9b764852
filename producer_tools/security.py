"""Kafka client security of the tools: the consumer's settings, read the same way by every tool.

``streaminfer-produce``, ``-results`` and ``-dlq`` reach a cluster that the consumer reaches: TLS (a CA, an optional
client certificate for mutual TLS) and SASL (PLAIN, SCRAM-SHA-256/512). The settings have the consumer's names
(``docs/settings.md``), each a flag and a ``STREAMINFER_*`` variable, and may come from a Kafka client properties
file as Kafka's own tools take it (``--command-config FILE``). A flag wins over the file, the file over the
environment. :func:`security_of` reads them once; the aiokafka keyword arguments are the consumer's own
(:func:`consumer.kafka.security.kafka_security_kwargs`).

What ``--command-config`` reads (any other key is named on stderr and ignored)::

    security.protocol                   PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
    sasl.mechanism                      PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    sasl.jaas.config                    ...PlainLoginModule / ...ScramLoginModule required username="u" password="p";
    sasl.username, sasl.password        librdkafka's names, instead of the JAAS line
    ssl.ca.location                     PEM CA file (librdkafka's name)
    ssl.truststore.location             a PEM file only, with ssl.truststore.type=PEM: a JKS or PKCS12 trust store
                                        is refused (convert it: keytool -exportcert -rfc -alias A -keystore F)
    ssl.certificate.location, ssl.key.location, ssl.key.password   PEM client certificate and key (mutual TLS)
    ssl.endpoint.identification.algorithm   empty: the broker's host name is not checked (else https)

Pattern after Kafka's ``kafka-console-producer.sh --command-config`` (the Java client's names) and librdkafka's
``CONFIGURATION.md`` (the PEM names).
"""

from __future__ import annotations

import argparse
import re
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import javaproperties
from pydantic import SecretStr

from consumer.kafka.security import kafka_security_kwargs
from producer_tools.cli import BadArgument

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ENV_PREFIX = "STREAMINFER_"
#: aiokafka's TLS/SASL keyword arguments (:meth:`ClientSecurity.kwargs`) as the tools' functions take them; None: none.
Security = Mapping[str, Any] | None

#: Setting -> (flag's help). The settings' names, defaults and meaning are the consumer's (consumer/config.py).
FLAGS = {
    "security_protocol": f"Kafka security protocol: {', '.join(PROTOCOLS)} (default PLAINTEXT)",
    "sasl_mechanism": f"SASL mechanism: {', '.join(MECHANISMS)} (default PLAIN)",
    "sasl_username": "SASL user name",
    "sasl_password": "SASL password (visible to other users in the process list: prefer $STREAMINFER_SASL_PASSWORD "
    "or --sasl-password-file)",
    "sasl_password_file": "file holding the SASL password",
    "ssl_cafile": "PEM file of the CA certificates that sign the brokers' certificates",
    "ssl_certfile": "PEM client certificate (mutual TLS)",
    "ssl_keyfile": "PEM private key of --ssl-certfile",
    "ssl_key_password": "password of --ssl-keyfile, if encrypted (prefer $STREAMINFER_SSL_KEY_PASSWORD)",
    "ssl_check_hostname": "check the broker certificate's host name: true (default) or false",
}
_FILES = ("sasl_password_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile")
_SECRETS = ("sasl_password", "ssl_key_password")
#: A JAAS line's login module and its options: ``org.apache...ScramLoginModule required username="u" password="p";``
_JAAS = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)\s*(?P<options>.*?);?\s*$", re.S
)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+?))(?=\s|;|$)')


@dataclass(frozen=True)
class ClientSecurity:
    """The consumer's Kafka security settings (same names, same meaning), for a tool's clients."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    def kwargs(self) -> dict[str, Any]:
        """aiokafka's keyword arguments (``security_protocol``, ``ssl_context``, ``sasl_*``) for every client.

        Raises:
            BadArgument: a certificate, key or password file cannot be read or is invalid (the file named).
        """
        try:
            return kafka_security_kwargs(self)
        except (OSError, ssl.SSLError) as exc:
            raise BadArgument(f"Kafka TLS/SASL files: {exc}") from None


def add_security(parser: argparse.ArgumentParser) -> None:
    """The security flags (``--security-protocol`` ... ``--ssl-check-hostname``) and ``--command-config``; every
    default is None so that :func:`security_of` can tell a flag given from one absent."""
    group = parser.add_argument_group(
        "Kafka security", f"as the consumer's settings; each also {ENV_PREFIX}<NAME>; a flag wins over "
        "--command-config, which wins over the environment"
    )  # fmt: skip
    group.add_argument("--command-config", type=Path, default=None, metavar="FILE",
                       help="Kafka client properties file, as Kafka's own tools take it (security.protocol, "
                       "sasl.mechanism, sasl.jaas.config, ssl.ca.location, ...; docs/commands.md)")  # fmt: skip
    for name, text in FLAGS.items():
        choices = PROTOCOLS if name == "security_protocol" else MECHANISMS if name == "sasl_mechanism" else None
        group.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, choices=choices, help=text)


def security_of(args: argparse.Namespace, env: Mapping[str, str]) -> ClientSecurity:
    """The security settings of the parsed flags, ``args.command_config`` and the ``STREAMINFER_*`` variables.

    Raises:
        BadArgument: an invalid value, a properties file that cannot be read or asks for what is not supported
            (a JKS trust store), a missing file, SASL without a user name or password, a certificate without
            its key (the setting or the file's key named).
    """
    values: dict[str, str] = {}
    for name in FLAGS:
        if (text := env.get(ENV_PREFIX + name.upper())) not in (None, ""):
            values[name] = str(text)
    if args.command_config is not None:
        values.update(read_command_config(args.command_config))
    values.update({name: str(getattr(args, name)) for name in FLAGS if getattr(args, name, None) is not None})
    return _checked(values)


def read_command_config(path: Path) -> dict[str, str]:
    """The settings a Kafka client properties file gives (module docstring); unsupported keys are named on stderr.

    Raises:
        BadArgument: the file cannot be read, a JAAS line has no user name or password, a JKS or PKCS12 store.
    """
    where = f"--command-config {path}"
    try:
        with path.open(encoding="utf-8") as fh:
            props: dict[str, str] = javaproperties.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadArgument(f"{where}: {exc}") from None
    out: dict[str, str] = {}
    simple = {"security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism",
              "sasl.username": "sasl_username", "sasl.password": "sasl_password", "ssl.ca.location": "ssl_cafile",
              "ssl.certificate.location": "ssl_certfile", "ssl.key.location": "ssl_keyfile",
              "ssl.key.password": "ssl_key_password"}  # fmt: skip
    ignored = []
    for key, value in props.items():
        if key in simple:
            out[simple[key]] = value.strip()
        elif key == "sasl.jaas.config":
            out.update(_jaas(value, where))
        elif key == "ssl.truststore.location":
            kind = props.get("ssl.truststore.type", "JKS").upper()
            if kind != "PEM":
                raise BadArgument(
                    f"{where}: ssl.truststore.location is a {kind} trust store, which a Python client cannot read: "
                    "give the CA as PEM (ssl.ca.location=ca.pem, or ssl.truststore.type=PEM; export it with "
                    f"keytool -exportcert -rfc -alias ALIAS -keystore {value.strip()} > ca.pem)"
                )
            out["ssl_cafile"] = value.strip()
        elif key == "ssl.endpoint.identification.algorithm":
            out["ssl_check_hostname"] = "false" if value.strip() == "" else "true"
        elif key not in ("ssl.truststore.type", "ssl.truststore.password"):
            ignored.append(key)
    if ignored:
        print(f"streaminfer: {where}: ignored (not supported here): {', '.join(sorted(ignored))}", file=sys.stderr)
    return out


def _jaas(line: str, where: str) -> dict[str, str]:
    """User name and password of a ``sasl.jaas.config`` line (PlainLoginModule or ScramLoginModule)."""
    match = _JAAS.match(line)
    if match is None or not match["module"].endswith(("PlainLoginModule", "ScramLoginModule")):
        raise BadArgument(f"{where}: sasl.jaas.config: only PlainLoginModule or ScramLoginModule with username and "
                          'password are supported (e.g. org.apache.kafka.common.security.scram.ScramLoginModule '
                          'required username="u" password="p";)')  # fmt: skip
    options = {m[1]: m[2] if m[2] is not None else m[3] for m in _JAAS_OPTION.finditer(match["options"])}
    if not options.get("username") or "password" not in options:
        raise BadArgument(f"{where}: sasl.jaas.config has no username or no password")
    return {"sasl_username": _unescape(options["username"]), "sasl_password": _unescape(options["password"])}


def _unescape(text: str) -> str:
    """A JAAS option's value without its backslash escapes (``\\"`` is ``"``)."""
    return re.sub(r"\\(.)", r"\1", text)


def _checked(values: Mapping[str, str]) -> ClientSecurity:
    """Values (text, by setting name) checked as the consumer's settings are, as a :class:`ClientSecurity`."""
    protocol = values.get("security_protocol", "PLAINTEXT").upper()
    mechanism = values.get("sasl_mechanism", "PLAIN").upper()
    if protocol not in PROTOCOLS:
        raise BadArgument(f"security_protocol: {protocol!r} is none of {', '.join(PROTOCOLS)}")
    if mechanism not in MECHANISMS:
        raise BadArgument(f"sasl_mechanism: {mechanism!r} is none of {', '.join(MECHANISMS)}")
    hostname = values.get("ssl_check_hostname", "true").lower()
    if hostname not in ("true", "false"):
        raise BadArgument(f"ssl_check_hostname: {hostname!r} is neither true nor false")
    files = {name: Path(values[name]) for name in _FILES if values.get(name)}
    used = [n for n in files if (n.startswith("ssl") and protocol.endswith("SSL")) or
            (n.startswith("sasl") and protocol.startswith("SASL"))]  # fmt: skip
    for name in used:
        if not files[name].is_file():
            raise BadArgument(f"{name} {str(files[name])!r} is not a file")
    secrets = {name: SecretStr(values[name]) for name in _SECRETS if values.get(name)}
    if protocol.startswith("SASL"):
        if not values.get("sasl_username"):
            raise BadArgument(f"security_protocol={protocol} needs sasl_username (--sasl-username)")
        if "sasl_password" not in secrets and "sasl_password_file" not in files:
            raise BadArgument(f"security_protocol={protocol} needs a SASL password ({ENV_PREFIX}SASL_PASSWORD or "
                              "--sasl-password-file)")  # fmt: skip
    if ("ssl_certfile" in files) != ("ssl_keyfile" in files):
        raise BadArgument("ssl_certfile and ssl_keyfile go together")
    return ClientSecurity(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=values.get("sasl_username") or None,
        sasl_password=secrets.get("sasl_password"),
        sasl_password_file=files.get("sasl_password_file"),
        ssl_cafile=files.get("ssl_cafile"),
        ssl_certfile=files.get("ssl_certfile"),
        ssl_keyfile=files.get("ssl_keyfile"),
        ssl_key_password=secrets.get("ssl_key_password"),
        ssl_check_hostname=hostname == "true",
    )
