"""Logging an operator can read: text or JSON lines on stderr, secrets redacted, the Kafka client's noise bounded.

The Kafka client (aiokafka) logs every failed connection attempt, metadata refresh, fetch and heartbeat at ERROR,
many times a second per broker while one is unreachable (measured: about 1,700 lines in a 20 s broker pause with
an idle consumer, about 10,900 lines/s under load). :class:`ClientLogLimiter` lets through at most one record per
message template per :data:`CLIENT_LOG_INTERVAL_S` and says how many it suppressed; streaminfer's own
:class:`consumer.kafka.link.BrokerLink` writes the one line that matters ("broker unreachable", then "reachable
again after N s"). :data:`DEMOTED` client errors that are retried as a matter of course (the group coordinator of a
fresh cluster is not available for a moment) are logged at INFO, so a healthy start logs no ERROR.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence

#: At most one client-library record per (logger, message template) per this many seconds.
CLIENT_LOG_INTERVAL_S = 30.0
#: The client library's logger tree.
CLIENT_LOGGER = "aiokafka"
#: The schema registry client's HTTP library (httpx2, under confluent-kafka), which logs every request at INFO: kept to
#: warnings (streaminfer logs the registry's outages and returns itself, consumer.events.registry).
HTTP_LOGGERS = ("httpx2", "httpx", "httpcore", "httpcore2")
#: Substrings of client ERROR records that describe a retried, expected condition: logged at INFO instead.
DEMOTED = ("GroupCoordinatorNotAvailableError",)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (epoch seconds), ``level``, ``logger``, ``message`` and ``exc`` if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class RedactSecrets(logging.Filter):
    """Replaces every known secret in a log record's message with ``***`` (defence in depth: a library that
    logs its wire bytes at DEBUG, as aiokafka does for SASL PLAIN, cannot leak a password through our handler)."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            redacted = message
            for secret in self._secrets:
                redacted = redacted.replace(secret, "***")
            if redacted != message:
                record.msg, record.args = redacted, None
        return True


class ClientLogLimiter(logging.Filter):
    """Rate-limits the Kafka client's records (loggers under :data:`CLIENT_LOGGER`); others pass untouched.

    A record passes when no record of the same logger and message template (the format string before its
    arguments: "Unable connect to node with id %s: %s" whatever the node) passed in the last ``interval_s``; the
    next one that passes after some were suppressed ends with ``[N more like this in the last S s not logged]``.
    Records matching :data:`DEMOTED` are logged at INFO.

    Args:
        interval_s: the window per template, seconds.
        clock: monotonic seconds (a test's fake clock).
    """

    def __init__(self, interval_s: float = CLIENT_LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: Counter[tuple[str, str]] = Counter()
        #: Records suppressed since start, all templates.
        self.suppressed_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name != CLIENT_LOGGER and not name.startswith(CLIENT_LOGGER + "."):
            return True
        key = (name, str(record.msg))
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] += 1
            self.suppressed_total += 1
            return False
        self._last[key] = now
        message = record.getMessage()
        suppressed = self._suppressed.pop(key, 0)
        if suppressed and last is not None:
            message = f"{message} [{suppressed} more like this in the last {now - last:.0f} s not logged]"
        if record.levelno >= logging.ERROR and any(d in message for d in DEMOTED):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        record.msg, record.args = message, None
        return True


def setup_logging(level: str, as_json: bool, secrets: Sequence[str] = ()) -> ClientLogLimiter:
    """Log to stderr, as text or one JSON object per line, with ``secrets`` redacted from every message and the
    Kafka client's records rate-limited. Returns the limiter (its ``suppressed_total`` counts what it suppressed)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactSecrets(secrets))
    limiter = ClientLogLimiter()
    handler.addFilter(limiter)
    handler.setFormatter(
        JsonFormatter() if as_json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger(CLIENT_LOGGER).setLevel(max(logging.getLevelName(level), logging.WARNING))
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.getLevelName(level), logging.WARNING))
    return limiter
