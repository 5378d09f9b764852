"""Group membership against the real broker: a static member that stops leaves at once (or, told not to, holds its
partitions for its session timeout), and the sticky assignor leaves a member the partitions it had. Members join
together, as KEDA adds pods: a group whose members offered two assignors rebalanced for ever here (aiokafka sends a
JoinGroup per assignor)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import uuid
from typing import Any

import pytest
from aiokafka import ConsumerRebalanceListener, TopicPartition

from consumer.kafka.clients import KafkaClients
from tests.integration.conftest import MODEL_PLACEHOLDER, settings_for

pytestmark = pytest.mark.integration

#: Session timeout of the static members here, ms: far above the time a leave takes.
SESSION_MS = 30_000


class Member(ConsumerRebalanceListener):  # type: ignore[misc]
    """A group member made by :class:`KafkaClients` (the consumer's own), noting its assignments."""

    def __init__(self, bootstrap: str, topics: dict[str, str], group: str, **settings: Any) -> None:
        s = settings_for(bootstrap, topics, MODEL_PLACEHOLDER, group_id=group, session_timeout_ms=SESSION_MS,
                         heartbeat_interval_ms=500, **settings)  # fmt: skip
        self.consumer = KafkaClients(s, {}).consumer()
        self._topic = topics["requests"]
        self.assignments: list[set[int]] = []
        self._polling: asyncio.Task[None] | None = None

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assignments.append({tp.partition for tp in assigned})

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe([self._topic], listener=self)
        self._polling = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await self.consumer.getmany(timeout_ms=100)

    async def stop(self) -> None:
        if self._polling is not None:
            self._polling.cancel()
            await asyncio.gather(self._polling, return_exceptions=True)
        await self.consumer.stop()

    @property
    def owned(self) -> set[int]:
        return self.assignments[-1] if self.assignments else set()


async def until(condition: Any, timeout_s: float) -> float:
    """Seconds until ``condition()`` held (polled every 50 ms), or inf after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    return float("inf")


@pytest.mark.parametrize("leave", [True, False])
async def test_a_static_member_that_stops_leaves_at_once_unless_told_to_stay(
    kafka_bootstrap: str, topics: dict[str, str], leave: bool
) -> None:
    group = f"it-{uuid.uuid4().hex[:8]}"
    members = [
        Member(kafka_bootstrap, topics, group, group_instance_id=f"{group}-{i}", leave_group_on_shutdown=leave)
        for i in range(2)
    ]
    stay, go = members
    try:
        for member in members:
            await member.start()
        assert await until(lambda: len(stay.owned) == len(go.owned) == 2, 30) < 30, [m.assignments for m in members]
        await go.stop()
        took = await until(lambda: len(stay.owned) == 4, 6)
        if leave:
            assert took < 6  # the LeaveGroup moved them: about a heartbeat
        else:
            assert took == float("inf")  # KIP-345: they wait for the session timeout (30 s)
    finally:
        for member in members:
            await member.stop()


async def test_a_sticky_member_keeps_its_partitions_when_another_joins(
    kafka_bootstrap: str, topics: dict[str, str]
) -> None:
    group = f"it-{uuid.uuid4().hex[:8]}"
    members = [Member(kafka_bootstrap, topics, group, partition_assignor="sticky") for _ in range(3)]

    def balanced(joined: list[Member]) -> bool:
        return all(len(m.owned) >= 4 // len(joined) for m in joined)

    try:
        for joined in range(1, len(members) + 1):
            await members[joined - 1].start()
            assert await until(functools.partial(balanced, members[:joined]), 30) < 30
        first = members[0].assignments
        assert all(later <= earlier for earlier, later in itertools.pairwise(first))  # it only ever gives some up
    finally:
        for member in members:
            await member.stop()
