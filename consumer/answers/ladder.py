"""The too-large ladder: what happens to an answer too large to write, written once for both delivery modes.

The client's own limit (``producer_max_request_bytes``) is checked before a record is appended (by
:class:`consumer.delivery.writer.AnswerWriter`): a result over it becomes a ``result_too_large`` dead letter, a
dead letter over it a *reduced* one. A produce request the broker refuses as too large may have held other records,
so each of its records climbs one rung per refusal: 1 = sent alone, 2 = shrunk once (result -> dead letter, or dead
letter -> reduced), 3 = shrunk twice. Rungs are kept per record (topic, partition, offset) until the record's answer
is acknowledged, so exactly_once, which answers a chunk again after an aborted transaction, resumes where the last try
stopped. That a refusal climbs the ladder is the fate table's (:func:`consumer.fate.of_write`).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from consumer.errors import DeadLetterReason, RecordError
from consumer.work import Work


class SizeLadder:
    """The too-large ladder (see the module docstring).

    Args:
        max_request_bytes: the producer's ``max_request_size``, bytes: a record estimated above it is shrunk
            before it is appended.
    """

    def __init__(self, max_request_bytes: int) -> None:
        self._max_request_bytes = max_request_bytes
        self._rungs: dict[tuple[str, int, int], int] = {}

    def fits(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> bool:
        """Whether the client would accept the record (aiokafka's own estimate, as ``send`` checks it)."""
        if len(value or b"") + len(key or b"") < self._max_request_bytes // 2 and len(headers) <= 3:
            return True  # a result far below the limit: our three headers cannot make up the rest
        return bool(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers) <= self._max_request_bytes)

    def all_fit(self, largest: int) -> bool:
        """Whether every record of a write fits, from the key and value bytes of the largest (``largest``, when each
        has at most three headers; -1 otherwise): :meth:`fits`'s quick check for all of them at once."""
        return 0 <= largest < self._max_request_bytes // 2

    def refused(self, work: Work, exc: BaseException) -> None:
        """The broker refused a produce request holding ``work`` as too large: one rung up."""
        key = (work.tp.topic, work.tp.partition, work.record.offset)
        rung = self._rungs[key] = self._rungs.get(key, 0) + 1
        if rung == 1:
            work.solo = True
        else:
            shrink(work, exc)

    def resume(self, work: Work) -> None:
        """A record fetched again (exactly_once, after an aborted transaction): climb the rungs it reached."""
        rung = self._rungs.get((work.tp.topic, work.tp.partition, work.record.offset), 0)
        if rung >= 1:
            work.solo = True
        for _ in range(rung - 1):
            shrink(work, RecordError(DeadLetterReason.RESULT_TOO_LARGE, "the broker refused the response as too large"))

    def forget(self, works: Iterable[Work]) -> None:
        """The answers of ``works`` were acknowledged: their rungs are no longer needed."""
        if self._rungs:
            for work in works:
                self._rungs.pop((work.tp.topic, work.tp.partition, work.record.offset), None)


def shrink(work: Work, exc: BaseException) -> None:
    """An answer was too large: a result (or a request not run yet) becomes a result_too_large dead letter, a dead
    letter a reduced one."""
    if work.error is None:
        size = f"response of {len(work.result)} bytes" if work.result is not None else "response"
        work.error = RecordError(DeadLetterReason.RESULT_TOO_LARGE, f"{size}: {exc!r}")
        work.result = None
        work.result_json_length = None
        work.request = None
    else:
        work.reduced = True
