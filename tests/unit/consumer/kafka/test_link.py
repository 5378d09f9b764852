"""The broker link (consumer/kafka/link.py) on a fake clock: outages logged once, readiness and liveness while the
cluster is silent."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError
from prometheus_client import CollectorRegistry, Gauge

from consumer.kafka.link import BrokerLink
from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock
from tests.unit.quiet import quiet
from tests.unit.wired import Wired


class Cluster:
    """A metadata request that succeeds, fails, or never answers."""

    def __init__(self) -> None:
        self.state = "up"

    async def topics(self) -> set[str]:
        if self.state == "down":
            raise KafkaConnectionError("Connect call failed")
        if self.state == "hung":
            await asyncio.Event().wait()
        return {"requests"}


async def test_an_outage_is_one_warning_and_its_end_one_line_with_its_length(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = Cluster()
    registry = CollectorRegistry()
    gauge = Gauge("reachable", "", registry=registry)
    suppressed = [0]
    link = BrokerLink(
        cluster.topics, "broker:9092", clock=clock, sleep=clock.sleep, gauge=gauge, suppressed=lambda: suppressed[0]
    )
    caplog.set_level(logging.INFO, logger="consumer.kafka.link")
    assert await link.check_once()
    assert caplog.records == []  # nothing to say while all is well
    cluster.state = "down"
    for _ in range(8):  # 40 s of failing checks
        assert not await link.check_once()
        clock.advance_ms(5_000)
        suppressed[0] += 400
    assert link.reachable is False
    assert registry.get_sample_value("reachable") == 0
    cluster.state = "hung"  # a paused broker: the request never returns; the injected clock times it out
    hung = asyncio.ensure_future(link.check_once())
    await quiet()
    clock.advance_ms(5_000)
    assert await hung is False
    cluster.state = "up"
    assert await link.check_once()
    assert link.reachable is True
    assert registry.get_sample_value("reachable") == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("kafka: cluster unreachable at bootstrap_servers=broker:9092 (KafkaConnectionError")
    assert messages[1] == "kafka: cluster reachable again after 45.0 s (3200 client log lines held back meanwhile)"
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


async def test_a_check_that_never_answers_marks_the_link_down(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = Cluster()
    cluster.state = "hung"
    link = BrokerLink(cluster.topics, "broker:9092", clock=clock, sleep=clock.sleep, timeout_s=5.0)
    caplog.set_level(logging.INFO, logger="consumer.kafka.link")
    check = asyncio.ensure_future(link.check_once())
    await quiet()
    clock.advance_ms(4_900)
    await quiet()
    assert not check.done()  # not before the timeout
    clock.advance_ms(200)
    assert await check is False
    assert "no answer within 5 s" in caplog.records[0].getMessage()


async def test_the_consumer_watches_the_link_and_says_serving_once_joined(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="consumer")
    h = Wired(tmp_path, digits_signature, clock)
    await h.app.start()
    assert not [r for r in caplog.records if "serving" in r.getMessage()]  # started, not yet in the group
    await h.consumer.assign({TopicPartition("requests", 0), TopicPartition("requests", 1)})
    await h.consumer.revoke({TopicPartition("requests", 1)})
    await h.consumer.assign({TopicPartition("requests", 1)})
    serving = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving")]
    assert len(serving) == 1  # the first assignment only
    assert serving[0].startswith("serving: joined group 'g', partitions assigned: ")
    assert "partition=0" in serving[0]
    assert any(r.getMessage().startswith("partitions assigned:") for r in caplog.records)  # the later rebalance
    h.consumer.topics_error = KafkaConnectionError("Connect call failed")
    await h.until_in_time(lambda: h.metrics.registry.get_sample_value("streaminfer_kafka_reachable") == 0)
    h.consumer.topics_error = None
    await h.until_in_time(lambda: h.metrics.registry.get_sample_value("streaminfer_kafka_reachable") == 1)
    link_lines = [r.getMessage() for r in caplog.records if r.name == "consumer.kafka.link"]
    assert len(link_lines) == 2
    assert link_lines[0].startswith("kafka: cluster unreachable")
    assert link_lines[1].startswith("kafka: cluster reachable again after")
    await h.stop()


async def test_readiness_turns_false_while_the_cluster_does_not_answer(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock)
    await h.start()
    assert h.app.readiness() == (True, "ready")
    h.consumer.topics_error = KafkaConnectionError("Connect call failed")
    await h.until_in_time(lambda: not h.app.ready, limit_ms=10_000)  # within one check interval + timeout
    clock.advance_ms(7_000)
    ok, reason = h.app.readiness()
    assert not ok
    assert reason.startswith("kafka cluster unreachable for ")
    h.consumer.topics_error = None
    await h.until_in_time(lambda: h.app.ready, limit_ms=5_100)
    await h.stop()
    assert h.app.readiness() == (False, "stopping")


async def test_liveness_fails_once_the_cluster_is_silent_for_the_stall_timeout(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, stall_timeout_s=30)
    await h.start()
    await h.until_in_time(lambda: clock.sleepers > 0)  # the link's first check is waiting
    clock.advance_ms(31_000)
    await h.quiet()
    assert h.app.liveness() == (True, "ok")  # idle with no lag and the cluster answering: alive
    h.consumer.topics_error = KafkaConnectionError("Connect call failed")
    await h.until_in_time(lambda: not h.app.ready, limit_ms=10_000)
    assert h.app.liveness() == (True, "ok")  # silent for less than the stall timeout
    clock.advance_ms(31_000)
    await h.quiet()
    alive, reason = h.app.liveness()
    assert not alive
    assert reason.startswith("stalled: kafka cluster silent for ")
    assert "(lag unknown)" in reason
    h.consumer.topics_error = None
    await h.until_in_time(lambda: h.app.ready, limit_ms=5_100)
    assert h.app.liveness() == (True, "ok")  # the cluster answers again: no restart needed
    await h.stop()
