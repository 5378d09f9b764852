"""When the consumer last made progress: the stall rule of the ``/healthz`` health check."""

from __future__ import annotations

from collections.abc import Callable


class Progress:
    """When the consumer last made progress: fetched records or committed offsets (the stall rule of /healthz).

    Args:
        clock: monotonic seconds.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.last = clock()

    def mark(self) -> None:
        """Progress now."""
        self.last = self._clock()

    def idle_s(self) -> float:
        """Seconds since the last progress."""
        return self._clock() - self.last
