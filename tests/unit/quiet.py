"""Waiting on the event loop's own state instead of counting its turns: :func:`quiet` returns once nothing can
happen without the test (no callback ready, no executor job in flight), so a test shows that something did *not*
happen by reaching that state, never by letting an arbitrary number of turns pass.

What the consumer waits on in the unit tests is the test's to give: fake time (:class:`tests.unit.fakes.FakeClock`),
a fake broker's acknowledgements and records, an event. Its threads (the intake's decode thread, ONNX Runtime's)
are the one thing that runs on its own: :func:`watch_threads` counts the jobs handed to them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

#: Executor jobs in flight, per loop whose threads are watched.
_IN_THREADS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[int]] = weakref.WeakKeyDictionary()


def watch_threads() -> None:
    """Count the running loop's ``run_in_executor`` jobs (``asyncio.to_thread`` included) from now on, so that
    :func:`quiet` waits for them. Idempotent."""
    loop = asyncio.get_running_loop()
    if loop in _IN_THREADS:
        return
    count = _IN_THREADS[loop] = [0]
    original = loop.run_in_executor

    def done(_: asyncio.Future[Any]) -> None:
        count[0] -= 1

    def counted(executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        future = original(executor, func, *args)
        count[0] += 1
        future.add_done_callback(done)  # runs on the loop, in the turn that also wakes the job's awaiter
        return future

    loop.run_in_executor = counted  # type: ignore[method-assign]


def _is_quiet(loop: asyncio.AbstractEventLoop) -> bool:
    ready = loop._ready  # type: ignore[attr-defined]  # BaseEventLoop's callbacks to run next (CPython asyncio)
    return not ready and _IN_THREADS.get(loop, [0])[0] == 0


async def quiet() -> None:
    """Let every other task run until none can go on without the test: no callback is ready on the loop and no
    watched executor job is in flight (each task waits on fake time, a fake broker, an event)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0)
    while not _is_quiet(loop):  # noqa: ASYNC110 (no event says "every task waits": the loop is looked at)
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until ``condition()`` holds.

    Raises:
        AssertionError: everything waits on the test (:func:`quiet`) and ``condition()`` still does not hold.
    """
    loop = asyncio.get_running_loop()
    while not condition():
        await asyncio.sleep(0)
        if _is_quiet(loop) and not condition():
            raise AssertionError("condition does not hold, and every task waits on the test (fake time, the broker)")
