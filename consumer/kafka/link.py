"""Whether the Kafka cluster answers, said once: one line when it stops answering, one when it answers again.

:class:`BrokerLink` asks the cluster for its metadata (the consumer's ``topics()``: one request to any broker)
every :data:`LINK_CHECK_S`; a request that fails or takes longer than :data:`LINK_TIMEOUT_S` marks the link down.
So an outage is reported within ``LINK_CHECK_S + LINK_TIMEOUT_S`` (10 s) and its end within ``LINK_CHECK_S`` of
the first answer, with the outage's length and how many client log lines :class:`consumer.ops.logs.ClientLogLimiter`
suppressed meanwhile (the line says "held back", as docs/operations.md quotes it). The gauge
``streaminfer_kafka_reachable`` is 1 or 0 accordingly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaError
from prometheus_client import Gauge

from consumer.ops.logs import CLIENT_LOG_INTERVAL_S
from consumer.timeouts import within

log = logging.getLogger(__name__)

#: Seconds between two metadata requests, and the longest one may take before the link counts as down.
LINK_CHECK_S = 5.0
LINK_TIMEOUT_S = 5.0


class BrokerLink:
    """Watches the cluster's answers to metadata requests.

    Args:
        check: one metadata request (raises ``KafkaError`` or ``OSError`` when the cluster does not answer).
        bootstrap_servers: named in the log lines.
        clock: monotonic seconds.
        sleep: ``asyncio.sleep`` or a test's fake.
        gauge: ``streaminfer_kafka_reachable``, set to 1 or 0.
        suppressed: how many client log records have been suppressed so far (``ClientLogLimiter.suppressed_total``).
        interval_s: seconds between checks.
        timeout_s: a check taking longer fails, seconds.
    """

    def __init__(
        self,
        check: Callable[[], Awaitable[object]],
        bootstrap_servers: str,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        gauge: Gauge | None = None,
        suppressed: Callable[[], int] | None = None,
        interval_s: float = LINK_CHECK_S,
        timeout_s: float = LINK_TIMEOUT_S,
    ) -> None:
        self._check = check
        self._bootstrap = bootstrap_servers
        self._clock = clock
        self._sleep = sleep
        self._gauge = gauge
        self._suppressed = suppressed or (lambda: 0)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        #: When the current outage began (the first failed check), or None while the cluster answers.
        self.down_since: float | None = None
        #: When a check last succeeded (start-up counts), monotonic seconds.
        self.last_ok = clock()
        self._suppressed_at_loss = 0
        if gauge is not None:
            gauge.set(1)

    @property
    def reachable(self) -> bool:
        """Whether the last check succeeded (True until one fails)."""
        return self.down_since is None

    async def check_once(self) -> bool:
        """One metadata request; logs and records a change of state. Returns whether the cluster answered."""
        try:
            answered = await within(self._check(), self._timeout_s, self._sleep)
        except (KafkaError, OSError) as exc:
            self._lost(exc)
            return False
        if not answered:
            self._lost(TimeoutError())
            return False
        self._answered()
        return True

    async def watch(self) -> None:
        """Check every ``interval_s`` until cancelled."""
        while True:
            await self._sleep(self._interval_s)
            await self.check_once()

    def _lost(self, exc: BaseException) -> None:
        if not self.reachable:
            return
        self.down_since = self._clock()
        self._suppressed_at_loss = self._suppressed()
        if self._gauge is not None:
            self._gauge.set(0)
        reason = f"no answer within {self._timeout_s:.0f} s" if isinstance(exc, TimeoutError) else repr(exc)
        log.warning(
            "kafka: cluster unreachable at bootstrap_servers=%s (%s); the client keeps retrying, its own errors are "
            "logged at most once per kind every %.0f s",
            self._bootstrap,
            reason,
            CLIENT_LOG_INTERVAL_S,
        )

    def _answered(self) -> None:
        now = self._clock()
        self.last_ok = now
        if self.reachable:
            return
        assert self.down_since is not None
        log.info(
            "kafka: cluster reachable again after %.1f s (%d client log lines held back meanwhile)",
            now - self.down_since,
            self._suppressed() - self._suppressed_at_loss,
        )
        self.down_since = None
        if self._gauge is not None:
            self._gauge.set(1)
