"""Logs an operator can trust (consumer/ops/logs.py): the Kafka client's noise bounded per template and window, other
loggers never suppressed, a fresh cluster's coordinator wait not an error. No broker, no sleeping: fake clocks."""

from __future__ import annotations

import io
import logging

from consumer.ops.logs import CLIENT_LOG_INTERVAL_S, ClientLogLimiter


def limited_logger(limiter: ClientLogLimiter, name: str = "aiokafka") -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(limiter)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger(f"{name}.test-{id(limiter)}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, out


def test_client_errors_pass_once_per_template_per_window_then_say_how_many_were_suppressed() -> None:
    now = [0.0]
    limiter = ClientLogLimiter(clock=lambda: now[0])
    logger, out = limited_logger(limiter)
    for i in range(1000):  # an outage: the same failure, again and again, for many nodes
        logger.error("Unable connect to node with id %s: %s", i % 3, "Connect call failed")
        logger.error("Unable to update metadata from %s", [1])
        now[0] += 0.02  # 20 s in all
    lines = out.getvalue().splitlines()
    assert lines == [
        f"ERROR aiokafka.test-{id(limiter)}: Unable connect to node with id 0: Connect call failed",
        f"ERROR aiokafka.test-{id(limiter)}: Unable to update metadata from [1]",
    ]
    assert limiter.suppressed_total == 1998
    now[0] += CLIENT_LOG_INTERVAL_S
    logger.error("Unable connect to node with id %s: %s", 2, "Connect call failed")
    last = out.getvalue().splitlines()[-1]
    assert last.endswith("Unable connect to node with id 2: Connect call failed [999 more like this in the last 50 s "
                         "not logged]")  # fmt: skip


def test_records_of_other_loggers_are_never_suppressed() -> None:
    limiter = ClientLogLimiter(clock=lambda: 0.0)
    logger, out = limited_logger(limiter, name="consumer")
    for _ in range(50):
        logger.warning("publish failed, retrying")
    assert len(out.getvalue().splitlines()) == 50
    assert limiter.suppressed_total == 0


def test_a_fresh_clusters_coordinator_wait_is_not_an_error() -> None:
    limiter = ClientLogLimiter(clock=lambda: 0.0)
    logger, out = limited_logger(limiter)
    logger.error("Group Coordinator Request failed: %s", "[Error 15] GroupCoordinatorNotAvailableError")
    logger.error("Failed fetch messages from %s: %s", 1, "NodeNotReadyError")
    assert out.getvalue().splitlines()[0].startswith("INFO ")
    assert out.getvalue().splitlines()[1].startswith("ERROR ")
