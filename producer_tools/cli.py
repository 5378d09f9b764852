"""What the command-line tools share: one-line Kafka errors, and the client library kept quiet.

A tool reports its own failure in one line (what failed, the broker asked, what was done so far), so the Kafka
client's records would only repeat it: while a broker is unreachable the client logs each failed connection and
metadata refresh, thousands of lines a minute. :func:`quiet_client_logs` keeps records of the ``aiokafka`` loggers
below CRITICAL from the terminal.
"""

from __future__ import annotations

import logging
import os
from typing import Any

#: The broker the tools use without ``--bootstrap-servers``: ``KAFKA_BOOTSTRAP_SERVERS`` (what ``kafka-local run``
#: sets for the command it runs), else the Kafka default.
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def default_bootstrap() -> str:
    """``KAFKA_BOOTSTRAP_SERVERS``, else :data:`DEFAULT_BOOTSTRAP`."""
    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or DEFAULT_BOOTSTRAP


def add_bootstrap(parser: Any) -> None:
    """The tools' ``--bootstrap-servers`` flag, its default from :func:`default_bootstrap`."""
    parser.add_argument(
        "--bootstrap-servers",
        default=default_bootstrap(),
        help="Kafka bootstrap servers (default %(default)s: $KAFKA_BOOTSTRAP_SERVERS when set, else 127.0.0.1:9092)",
    )


class BadArgument(ValueError):
    """A flag's value the tool cannot use; the message is the whole line the user sees (exit 2)."""


def quiet_client_logs() -> None:
    """Drop the Kafka client's log records below CRITICAL (the tool says what failed itself)."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def kafka_error_text(exc: BaseException) -> str:
    """``Type: message`` once: aiokafka's errors already start their text with the class name."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(name) else f"{name}: {text}" if text else name
