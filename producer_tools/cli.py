"""What the command-line tools share: one-line Kafka errors, and the client library kept quiet.

A tool reports its own failure in one line (what failed, the broker asked, what was done so far), so the Kafka
client's records would only repeat it: while a broker is unreachable the client logs each failed connection and
metadata refresh, thousands of lines a minute. :func:`quiet_client_logs` keeps records of the ``aiokafka`` loggers
below CRITICAL from the terminal.
"""

from __future__ import annotations

import logging


class BadArgument(ValueError):
    """A flag's value the tool cannot use; the message is the whole line the user sees (exit 2)."""


def quiet_client_logs() -> None:
    """Drop the Kafka client's log records below CRITICAL (the tool says what failed itself)."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def kafka_error_text(exc: BaseException) -> str:
    """``Type: message`` once: aiokafka's errors already start their text with the class name."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(name) else f"{name}: {text}" if text else name
