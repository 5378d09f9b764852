"""Waits bounded by the injected clock: a test's fake ``sleep`` decides when they time out, never real time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff between retries: ``first_s``, doubling each attempt, at most ``max_s`` (settings
    ``retry_backoff_ms`` and ``retry_backoff_max_ms``)."""

    first_s: float = 0.1
    max_s: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first)."""
        return float(min(self.first_s * 2 ** min(attempt, 32), self.max_s))


async def within(
    step: Awaitable[object],
    seconds: float,
    sleep: Callable[[float], Awaitable[None]],
    unless: asyncio.Event | None = None,
) -> bool:
    """Await ``step`` for at most ``seconds`` (measured with ``sleep``), or until ``unless`` is set; then it is
    cancelled. Returns whether it finished.

    Raises:
        BaseException: whatever ``step`` raised.
    """
    task = asyncio.ensure_future(step)
    waits = {task, asyncio.ensure_future(sleep(seconds))}
    if unless is not None:
        waits.add(asyncio.ensure_future(unless.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits - {task}:
            wait.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    task.result()
    return True
