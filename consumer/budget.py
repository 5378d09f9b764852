"""What the consumer holds: rows and record bytes fetched and not yet answered, against their limits.

Both delivery modes size every fetch with :meth:`InFlight.room` and pause the partitions while
:attr:`InFlight.full`. A fetch takes no more records than rows are free (every record holds at least one row), and
no more than the free bytes could hold if each record were as large as ``max_record_bytes`` (a larger value never
stays: :mod:`consumer.kafka.unpack` keeps only its size), so the record bytes held never pass ``max_in_flight_bytes``
by more than one record. Bytes are a record's key, value and headers as the client materialised them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from consumer.ops.metrics import Metrics
from consumer.work import Work


def held_bytes(work: Work) -> int:
    """The key, value and header bytes ``work``'s record holds (a stand-in for a dropped value or batch: what it
    kept)."""
    record = work.record
    key, value, headers = record.key, record.value, record.headers
    size = (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    for name, header in headers or ():
        size += len(name) + (len(header) if header is not None else 0)
    return size


class InFlight:
    """Rows and bytes held, exported as ``streaminfer_in_flight_rows`` and ``streaminfer_in_flight_bytes``.

    Args:
        max_rows: ``max_in_flight_rows``, rows.
        max_bytes: ``max_in_flight_bytes``, bytes (at least ``max_record_bytes``).
        max_record_bytes: the largest value a record keeps, bytes.
        metrics: the two gauges.
    """

    def __init__(self, max_rows: int, max_bytes: int, max_record_bytes: int, metrics: Metrics) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._max_record_bytes = max_record_bytes
        self._metrics = metrics
        self.rows = 0
        self.bytes = 0

    @property
    def full(self) -> bool:
        """No room for another record of any size."""
        return self.rows >= self.max_rows or self.max_bytes - self.bytes < self._max_record_bytes

    def room(self, max_records: int) -> int:
        """Records the next fetch may take (>= 1: a fetch while full only keeps the member in the group)."""
        by_bytes = (self.max_bytes - self.bytes) // self._max_record_bytes
        return max(1, min(max_records, self.max_rows - self.rows, by_bytes))

    def add(self, works: Iterable[Work]) -> None:
        """Hold ``works`` (just fetched); each one's bytes are counted once, here, and kept on it (``held``)."""
        rows = size = 0
        for work in works:
            rows += work.rows
            work.held = held = held_bytes(work)
            size += held
        self.rows += rows
        self.bytes += size
        self._export()

    def remove(self, works: Iterable[Work]) -> None:
        """Stop holding ``works`` (answered, or dropped on revoke): the bytes :meth:`add` counted."""
        rows = size = 0
        for work in works:
            rows += work.rows
            held = work.held
            size += held if held >= 0 else held_bytes(work)
        self.rows -= rows
        self.bytes -= size
        self._export()

    def clear(self) -> None:
        """Stop holding anything (exactly_once: a window ended, committed or aborted)."""
        self.rows = self.bytes = 0
        self._export()

    def _export(self) -> None:
        self._metrics.in_flight_rows.set(self.rows)
        self._metrics.in_flight_bytes.set(self.bytes)


#: Where a container's memory limit is read from: cgroup v2, then v1 (bytes; "max" or a huge v1 value: none).
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
#: Share of the container's memory limit the fetch budget may take; the rest is the model, ONNX Runtime's arena,
#: the interpreter and the clients' own buffers.
MEMORY_LIMIT_SHARE = 0.5


def memory_limit_bytes(files: Iterable[str] = CGROUP_LIMIT_FILES) -> tuple[int, str] | None:
    """This process's container memory limit and the file that gave it, or None where there is none."""
    for path in files:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text), path
        return None
    return None


def budget_problem(
    max_in_flight_bytes: int, max_batch_unpacked_bytes: int, limit: tuple[int, str] | None
) -> str | None:
    """Why the fetch budget cannot fit the memory limit, or None. The budget is ``max_in_flight_bytes`` plus twice
    ``max_batch_unpacked_bytes`` (a batch being unpacked and the client's copy of it); it may take
    :data:`MEMORY_LIMIT_SHARE` of the limit."""
    if limit is None:
        return None
    need = max_in_flight_bytes + 2 * max_batch_unpacked_bytes
    allowed = int(limit[0] * MEMORY_LIMIT_SHARE)
    if need <= allowed:
        return None
    return (
        f"max_in_flight_bytes ({max_in_flight_bytes}) + 2 x max_batch_unpacked_bytes ({max_batch_unpacked_bytes}) = "
        f"{need} bytes, more than half the memory limit ({limit[0]} bytes in {limit[1]}); lower them or raise the limit"
    )
