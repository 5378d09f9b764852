"""The in-flight budget (consumer/budget.py) without Kafka: fetch sizes by rows and bytes, the memory limit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from consumer.budget import InFlight, budget_problem, memory_limit_bytes
from consumer.offsets import OffsetTracker
from consumer.ops.metrics import Metrics
from consumer.work import Work
from tests.unit.fakes import record


# -- the in-flight budget
def work_of(value: bytes, rows: int = 1) -> Work:
    tp = TopicPartition("t", 0)
    offsets = OffsetTracker[TopicPartition]().partition(tp)
    rec = dataclasses.replace(record("t", 0, 0, value), headers=[])  # key and value only: the bytes are the value's
    return Work(rec, tp, offsets, b"c", None, None, rows, 0.0)  # type: ignore[arg-type]


def test_fetches_are_sized_by_rows_and_bytes() -> None:
    metrics = Metrics(CollectorRegistry())
    held = InFlight(max_rows=100, max_bytes=10_000, max_record_bytes=1_000, metrics=metrics)
    assert held.room(500) == 10  # ten records of the largest size fit
    big = [work_of(b"x" * 1_000) for _ in range(5)]
    held.add(big)
    assert (held.rows, held.bytes, held.room(500), held.full) == (5, 5_000, 5, False)
    held.add([work_of(b"y" * 4_500)])
    assert held.full  # 500 bytes left: not one more record of the largest size
    assert held.room(500) == 1  # a fetch while full keeps the member in the group
    held.remove(big)
    assert (held.rows, held.bytes, held.full) == (1, 4_500, False)
    held.add([work_of(b"", rows=99)])
    assert held.full  # rows
    assert metrics.in_flight_bytes._value.get() == 4_500
    held.clear()
    assert (held.rows, held.bytes) == (0, 0)
    headed = work_of(b"x")
    headed.record = dataclasses.replace(headed.record, headers=[("h", b"y" * 99)])
    held.add([headed])
    assert held.bytes == 1 + 1 + 99  # headers count


def test_memory_limit_and_budget(tmp_path: Path) -> None:
    v2 = tmp_path / "memory.max"
    v2.write_text("2147483648\n")
    assert memory_limit_bytes([str(v2)]) == (2 << 30, str(v2))
    v2.write_text("max\n")
    assert memory_limit_bytes([str(v2)]) is None
    assert memory_limit_bytes([str(tmp_path / "absent")]) is None
    assert budget_problem(256 << 20, 64 << 20, (2 << 30, "f")) is None  # the cpu overlay's 2 GiB limit
    problem = budget_problem(900 << 20, 64 << 20, (2 << 30, "f"))
    assert problem is not None
    assert "max_in_flight_bytes" in problem
    assert "max_batch_unpacked_bytes" in problem
    assert budget_problem(1 << 40, 1 << 40, None) is None
