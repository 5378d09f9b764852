from __future__ import annotations

import asyncio

import pytest

from consumer.batcher import MicroBatcher
from tests.unit.conftest import FakeClock
from tests.unit.quiet import quiet


def make(clock: FakeClock, rows: int = 4, delay_ms: float = 5.0) -> MicroBatcher[str]:
    return MicroBatcher(max_batch_rows=rows, max_batch_delay_ms=delay_ms, clock=clock)


def test_count_flush_at_max_rows(clock: FakeClock) -> None:
    b = make(clock, rows=4)
    for i in range(3):
        b.put(f"r{i}", 1)
    assert b.pop_ready(clock()) is None
    b.put("r3", 1)
    assert b.pop_ready(clock()) == ["r0", "r1", "r2", "r3"]
    assert b.pending_rows == 0


def test_count_flush_counts_rows_not_records(clock: FakeClock) -> None:
    b = make(clock, rows=4)
    b.put("two", 2)
    assert b.pop_ready(clock()) is None
    b.put("three", 3)  # 5 rows pending: flush what fits, keep the rest
    assert b.pop_ready(clock()) == ["two"]
    assert b.pending_rows == 3


def test_no_early_flush_before_deadline(clock: FakeClock) -> None:
    b = make(clock, delay_ms=5)
    b.put("a", 1)
    clock.advance_ms(4.9)
    assert b.pop_ready(clock()) is None
    assert b.time_to_deadline(clock()) == pytest.approx(0.0001)


def test_deadline_flush_of_oldest(clock: FakeClock) -> None:
    b = make(clock, delay_ms=5)
    b.put("a", 1)
    clock.advance_ms(3)
    b.put("b", 1)
    clock.advance_ms(2)
    assert b.pop_ready(clock()) == ["a", "b"]


def test_shapes_kept_apart(clock: FakeClock) -> None:
    b = make(clock, rows=2)
    b.put("short-1", 1, key=(("x", (8,)),))
    b.put("long-1", 1, key=(("x", (16,)),))
    assert b.pop_ready(clock()) is None  # 2 rows pending, but in two groups
    b.put("short-2", 1, key=(("x", (8,)),))
    assert b.pop_ready(clock()) == ["short-1", "short-2"]
    clock.advance_ms(5)
    assert b.pop_ready(clock()) == ["long-1"]


def test_oversized_item_flushed_alone(clock: FakeClock) -> None:
    b = make(clock, rows=4)
    b.put("small", 1)
    b.put("huge", 10)
    assert b.pop_ready(clock()) == ["small"]
    assert b.pop_ready(clock()) == ["huge"]


def test_close_flushes_everything_then_ends(clock: FakeClock) -> None:
    b = make(clock, rows=4, delay_ms=1000)
    b.put("a", 1)
    b.close()
    with pytest.raises(RuntimeError):
        b.put("late", 1)
    assert b.pop_ready(clock()) == ["a"]
    assert b.pop_ready(clock()) is None


def test_rejects_bad_limits(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="max_batch_rows"):
        MicroBatcher(0, 5, clock)
    with pytest.raises(ValueError, match="max_batch_delay_ms"):
        MicroBatcher(1, -1, clock)


async def test_next_batch_wakes_on_full_group_without_waiting(clock: FakeClock) -> None:
    b = make(clock, rows=2, delay_ms=60_000)
    waiter = asyncio.create_task(b.next_batch())
    await quiet()  # it waits on its event: nothing else can wake it
    assert not waiter.done()
    b.put("a", 1)
    b.put("b", 1)
    assert await asyncio.wait_for(waiter, timeout=5) == ["a", "b"]


async def test_next_batch_returns_due_batch_after_clock_advances(clock: FakeClock) -> None:
    b = make(clock, rows=64, delay_ms=5)
    b.put("lone", 1)
    clock.advance_ms(5)
    assert await b.next_batch() == ["lone"]


async def test_next_batch_none_when_closed_and_empty(clock: FakeClock) -> None:
    b = make(clock)
    b.close()
    assert await b.next_batch() is None


def test_discard_removes_matching_items_and_their_rows(clock: FakeClock) -> None:
    b = make(clock, rows=10)
    b.put("p0-a", 2, key="x")
    b.put("p1-a", 3, key="x")
    b.put("p1-b", 1, key="y")
    assert sorted(b.discard(lambda item: item.startswith("p1"))) == ["p1-a", "p1-b"]
    assert b.pending_rows == 2
    clock.advance_ms(5)
    assert b.pop_ready(clock()) == ["p0-a"]
    assert b.pop_ready(clock()) is None


def test_caught_up_makes_pending_items_due_and_later_ones_wait(clock: FakeClock) -> None:
    b = make(clock, rows=8, delay_ms=5)
    b.put("a", 1)
    b.put("b", 1, key="other")
    assert b.pop_ready(clock()) is None
    b.caught_up()
    assert b.time_to_deadline(clock()) == 0.0
    assert b.pop_ready(clock()) == ["a"]
    assert b.pop_ready(clock()) == ["b"]
    clock.advance_ms(1)
    b.put("c", 1)  # queued after caught_up(): waits for its own deadline
    assert b.pop_ready(clock()) is None
    assert b.time_to_deadline(clock()) == pytest.approx(0.005)


class Sleeper:
    """The batcher's injected sleep: the fake clock's, recording each wait and setting ``asleep`` when one begins."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.asked: list[float] = []
        self.asleep = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        self.asleep.set()
        await self.clock.sleep(seconds)


async def test_next_batch_waits_for_the_deadline_on_the_injected_sleep(clock: FakeClock) -> None:
    """The waiting path under the fake clock: asleep until the oldest item's deadline, woken by the clock's step."""
    sleep = Sleeper(clock)
    b = MicroBatcher(max_batch_rows=64, max_batch_delay_ms=5.0, clock=clock, sleep=sleep)
    b.put("lone", 1)
    waiter = asyncio.create_task(b.next_batch())
    await asyncio.wait_for(sleep.asleep.wait(), timeout=5)
    assert sleep.asked == [pytest.approx(0.005)]
    clock.advance_ms(4.9)  # before the deadline: its sleep is not over, the batch not due
    assert clock.sleepers == 1
    assert not waiter.done()
    clock.advance_ms(0.1)
    assert await asyncio.wait_for(waiter, timeout=5) == ["lone"]
    assert clock.sleepers == 0


async def test_an_arrival_wakes_the_wait_before_its_deadline(clock: FakeClock) -> None:
    """A full lane is due at once: the waiter wakes on the arrival, its deadline's sleep is cancelled."""
    sleep = Sleeper(clock)
    b = MicroBatcher(max_batch_rows=2, max_batch_delay_ms=60_000, clock=clock, sleep=sleep)
    b.put("a", 1)
    waiter = asyncio.create_task(b.next_batch())
    await asyncio.wait_for(sleep.asleep.wait(), timeout=5)
    b.put("b", 1)
    assert await asyncio.wait_for(waiter, timeout=5) == ["a", "b"]
    assert clock.sleepers == 0


def test_put_many_with_interleaved_and_equal_keys_fills_each_lane_as_put_does(clock: FakeClock) -> None:
    key_a, key_b = ("a", (3,)), ("b", (5,))
    entries = [("a0", 1, key_a, 2), ("a1", 2, ("a", (3,)), 3), ("b0", 1, key_b, 4), ("a2", 1, key_a, 5)]
    many, one = make(clock, rows=4), make(clock, rows=4)
    many.put_many(entries)
    for item, rows, key, tokens in entries:
        one.put(item, rows, key, tokens)
    for b in (many, one):
        assert b.pending_rows == 5
        assert {k: (lane.rows, lane.tokens) for k, lane in b._lanes.items()} == {key_a: (4, 10), key_b: (1, 4)}
        assert b.pop_ready(clock()) == ["a0", "a1", "a2"]
        assert b.pending_rows == 1


def test_a_lane_within_its_rows_but_over_its_tokens_is_taken_in_parts(clock: FakeClock) -> None:
    b: MicroBatcher[str] = MicroBatcher(max_batch_rows=8, max_batch_delay_ms=5.0, clock=clock, max_batch_tokens=10)
    b.put_many([("s0", 1, 16, 6), ("s1", 1, 16, 6), ("s2", 1, 16, 3)])  # 3 rows of 8, 15 tokens of 10
    assert b.pop_ready(clock()) == ["s0"]  # full by tokens: due at once, as many as fit
    assert b.pop_ready(clock()) is None  # 2 rows, 9 tokens: waits for its deadline
    clock.advance_ms(5)
    assert b.pop_ready(clock()) == ["s1", "s2"]  # the whole lane fits now
    assert b.pending_rows == 0
    assert b.pop_ready(clock()) is None
