"""The unit tests' waits (tests/unit/quiet.py): quiet() returns once every task waits on the test, until() fails
as soon as nothing can make its condition true, and both wait for the jobs of the loop's threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.unit.fakes import FakeClock
from tests.unit.quiet import quiet, until, watch_threads


async def test_quiet_returns_while_a_task_waits_on_the_test_and_the_task_goes_on_once_given_what_it_waits_for() -> None:
    clock = FakeClock()
    gate = asyncio.Event()
    steps: list[str] = []

    async def worker() -> None:
        for name in "abc":  # a few turns of its own before it waits
            steps.append(name)
            await asyncio.sleep(0)
        await gate.wait()
        steps.append("gate")
        await clock.sleep(5)
        steps.append("slept")

    task = asyncio.ensure_future(worker())
    await quiet()
    assert steps == ["a", "b", "c"]  # everything it could do without the test, and no more
    gate.set()
    await quiet()
    assert steps == ["a", "b", "c", "gate"]
    clock.advance_ms(4999)
    await quiet()
    assert not task.done()
    clock.advance_ms(1)
    await quiet()
    assert steps[-1] == "slept"
    assert task.done()


async def test_until_fails_once_every_task_waits_and_the_condition_does_not_hold() -> None:
    gate = asyncio.Event()
    task = asyncio.ensure_future(gate.wait())
    with pytest.raises(AssertionError, match="every task waits on the test"):
        await until(lambda: gate.is_set())
    gate.set()
    await until(task.done)


async def test_until_waits_for_a_condition_that_other_tasks_make_true() -> None:
    count = [0]

    async def counter() -> None:
        for _ in range(10_000):  # more turns than any fixed budget a test would give
            count[0] += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(counter())
    await until(lambda: count[0] == 10_000)
    await task


async def test_quiet_waits_for_a_job_in_a_thread() -> None:
    watch_threads()
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    job = loop.run_in_executor(None, gate.wait)
    loop.call_soon(gate.set)  # the job ends once the loop has run this
    await quiet()
    assert job.done()
    assert await job is True
    to_thread = asyncio.ensure_future(asyncio.to_thread(lambda: 42))
    await until(to_thread.done)
    assert to_thread.result() == 42
