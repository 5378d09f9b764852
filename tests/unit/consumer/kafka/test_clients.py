"""Group membership of the real clients, without a broker: the sticky assignor's stickiness and its state apart per
consumer, and the static member's leave on stop."""

from __future__ import annotations

import inspect
from typing import Any

import aiokafka
import pytest
from aiokafka import TopicPartition
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from consumer.kafka.clients import INSTANCE_ID, LEAVE_STEP, LeavingConsumer, leaves_static_members, sticky_assignor

TOPIC = "requests"


class Cluster:
    """The part of aiokafka's ClusterMetadata the assignors read: one topic of ``partitions`` partitions."""

    def __init__(self, partitions: int) -> None:
        self._partitions = set(range(partitions))

    def topics(self) -> set[str]:
        return {TOPIC}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._partitions if topic == TOPIC else None


def joined(owned: dict[str, list[int]]) -> dict[str, ConsumerProtocolMemberMetadata]:
    """Each member's JoinGroup metadata: the sticky assignor's user data carries its last assignment."""
    assignor = sticky_assignor()
    return {
        member: assignor._metadata([TOPIC], [TopicPartition(TOPIC, p) for p in partitions] if partitions else None)
        for member, partitions in owned.items()
    }


def assigned(result: dict[str, ConsumerProtocolMemberAssignment]) -> dict[str, set[int]]:
    return {member: {p for _, ps in a.assignment for p in ps} for member, a in result.items()}


def test_the_sticky_assignor_moves_only_what_balance_needs() -> None:
    cluster = Cluster(8)
    first = assigned(sticky_assignor().assign(cluster, joined({"a": list(range(8)), "b": []})))
    assert first["a"] | first["b"] == set(range(8))
    assert len(first["a"]) == len(first["b"]) == 4
    second = assigned(
        sticky_assignor().assign(cluster, joined({"a": sorted(first["a"]), "b": sorted(first["b"]), "c": []}))
    )
    assert sorted(len(ps) for ps in second.values()) == [2, 3, 3]
    moved = sum(len(first[m] - second[m]) for m in ("a", "b"))
    assert moved == len(second["c"])  # nothing moved between a and b: c got only what balance took from them
    third = assigned(sticky_assignor().assign(cluster, joined({"a": sorted(second["a"]), "c": sorted(second["c"])})))
    assert second["a"] <= third["a"]
    assert second["c"] <= third["c"]


def test_each_consumers_sticky_assignor_keeps_its_own_assignment() -> None:
    one, other = sticky_assignor(), sticky_assignor()
    one.on_assignment(ConsumerProtocolMemberAssignment(0, [(TOPIC, [0, 1])], b""))
    assert one.member_assignment == [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    assert other.member_assignment is None  # aiokafka's own class keeps it in a class attribute, shared
    assert one.name == other.name == "sticky"  # the protocol name the group agrees on


class FakeCoordinator:
    """aiokafka's GroupCoordinator as far as the leave step: it sends LeaveGroup only without an instance id."""

    def __init__(self, instance_id: str | None) -> None:
        self._group_instance_id = instance_id
        self.left_as: list[str | None] = []

    async def _maybe_leave_group(self) -> None:
        self.left_as.append(self._group_instance_id)


async def test_a_leaving_consumer_leaves_as_a_dynamic_member_would(monkeypatch: pytest.MonkeyPatch) -> None:
    async def aiokafka_stop(self: Any) -> None:  # what AIOKafkaConsumer.stop does last: the coordinator's leave step
        await self._coordinator._maybe_leave_group()

    monkeypatch.setattr(aiokafka.AIOKafkaConsumer, "stop", aiokafka_stop)
    consumer = object.__new__(LeavingConsumer)
    coordinator = FakeCoordinator("pod-0")
    consumer._coordinator = coordinator
    await consumer.stop()
    assert coordinator.left_as == [None]  # aiokafka sends LeaveGroup for a member without an instance id


def test_aiokafka_still_has_what_the_leaving_consumer_relies_on() -> None:
    """The installed aiokafka's coordinator skips the leave for a static member, in the step LeavingConsumer wraps."""
    leave_step = inspect.getsource(getattr(GroupCoordinator, LEAVE_STEP))
    assert f"self.{INSTANCE_ID} is None" in leave_step
    assert LEAVE_STEP in inspect.getsource(GroupCoordinator.close)
    assert INSTANCE_ID in inspect.getsource(GroupCoordinator.__init__)
    assert leaves_static_members(FakeCoordinator("pod-0"))
    assert not leaves_static_members(object())
