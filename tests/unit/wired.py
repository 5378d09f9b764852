"""A consumer wired to the fakes of ``tests/unit/fakes.py``: the real stages and delivery modes, no broker, no
model file, no real time."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from consumer.answers.records import OFFSET_HEADER, PARTITION_HEADER, REASON_HEADER
from consumer.app import StreamInferApp
from consumer.config import Settings
from consumer.model.runner import OnnxRunner
from consumer.oip.client import encode_request
from consumer.ops.metrics import Metrics
from consumer.ops.tracing import Tracing
from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClients, FakeClock, FakeCluster, FakeSession, Written, fake_runner
from tests.unit.quiet import quiet, until, watch_threads

REQUESTS, RESULTS, DLQ = "requests", "results", "dlq"


def digits_value(rows: int = 1, marker: float = 0.0) -> bytes:
    """A digits request of ``rows`` rows; ``marker`` goes into pixel 63 (the fake model can fail on it)."""
    x = np.zeros((rows, 64), np.float32)
    x[:, 63] = marker
    return encode_request(None, {"input": x})


def header(written: Written, name: str) -> bytes | None:
    return next((v for k, v in written.headers if k == name), None)


def source_of(written: Written) -> tuple[int, int]:
    """(request partition, request offset) of an answer: from the dead-letter headers, or from the correlation ID
    the harness gives every request (its key ``p<partition>-<offset>``)."""
    partition = header(written, PARTITION_HEADER)
    if partition is not None:
        return int(partition), int(header(written, OFFSET_HEADER) or b"-1")
    p, o = (written.key or b"").decode().lstrip("p").split("-")
    return int(p), int(o)


class Wired:
    """One consumer over fake clients.

    Args:
        tmp_path: where the placeholder model file goes (settings check it exists).
        signature: the model signature the fake session serves (digits).
        clock: the fake clock (also the consumer's sleep).
        tracing: OpenTelemetry spans, or None.
        candidate: a shadow candidate (with ``shadow_model_path`` set to any file), or None.
        settings: overrides of the test defaults (batches of 4 rows, no batch delay, commit after every ack).
    """

    def __init__(
        self,
        tmp_path: Path,
        signature: ModelSignature,
        clock: FakeClock,
        tracing: Tracing | None = None,
        candidate: OnnxRunner | None = None,
        **settings: Any,
    ) -> None:
        model = tmp_path / "model.onnx"
        model.write_bytes(b"placeholder")
        self.clock = clock
        self.cluster = FakeCluster(partitions=3)
        self.clients = FakeClients(self.cluster, clock, batch_records=4)
        self.consumer = self.clients.consumer_
        defaults: dict[str, Any] = {
            "model_path": model,
            "requests_topic": REQUESTS,
            "results_topic": RESULTS,
            "dead_letter_topic": DLQ,
            "group_id": "g",
            "http_port": 0,
            "max_batch_size": 4,
            "max_batch_delay_ms": 0,
            "commit_interval_ms": 0,
        }
        self.settings = Settings(**{**defaults, **settings})
        watch_threads()  # the intake's decode thread: quiet() and until() wait for its jobs
        self.session = FakeSession()
        self.metrics = Metrics(CollectorRegistry())
        self.app = StreamInferApp(
            self.settings,
            fake_runner(signature, self.session),
            self.metrics,
            clock=clock,
            wall_clock=lambda: 1_000_000.0,
            sleep=clock.sleep,
            clients=self.clients,
            tracing=tracing,
            candidate=candidate,
        )

    async def start(self, partitions: tuple[int, ...] = (0, 1)) -> None:
        await self.app.start()
        await self.consumer.assign({TopicPartition(REQUESTS, p) for p in partitions})

    def send(self, partition: int, values: list[bytes], headers: list[list[tuple[str, bytes]]] | None = None) -> None:
        """Append requests to a partition; each keyed (and so correlated) ``p<partition>-<offset>``; ``headers``:
        each one's extra headers."""
        tp = TopicPartition(REQUESTS, partition)
        first = len(self.consumer.records[tp])
        keys = [f"p{partition}-{first + i}".encode() for i in range(len(values))]
        self.consumer.add(tp, values, keys, headers)

    async def until(self, condition: Callable[[], bool]) -> None:
        """Let the consumer's tasks run (no time passes) until ``condition()``.

        Raises:
            AssertionError: every task waits on the test (fake time, acknowledgements) and it does not hold.
        """
        await until(condition)

    async def until_in_time(
        self, condition: Callable[[], bool], step_ms: float = 100, limit_ms: float = 60_000
    ) -> None:
        """Let the tasks run, advancing the fake clock by ``step_ms`` whenever they are idle (backoffs, timeouts),
        until ``condition()``.

        Raises:
            AssertionError: it did not hold within ``limit_ms`` of fake time.
        """
        waited = 0.0
        while waited <= limit_ms:
            await self.quiet()
            if condition():
                return
            self.clock.advance_ms(step_ms)
            waited += step_ms
        raise AssertionError(f"condition did not hold within {limit_ms} ms")

    async def quiet(self) -> None:
        """Let the tasks run until every one waits on the test (fake time, acknowledgements, records): what has not
        happened then cannot happen without it (:func:`tests.unit.quiet.quiet`)."""
        await quiet()

    def results(self) -> list[Written]:
        return self.cluster.records(RESULTS)

    def dead_letters(self) -> list[Written]:
        return self.cluster.records(DLQ)

    def reasons(self) -> dict[tuple[int, int], str]:
        return {source_of(w): (header(w, REASON_HEADER) or b"").decode() for w in self.dead_letters()}

    def committed(self, partition: int) -> int | None:
        return self.cluster.committed.get(TopicPartition(REQUESTS, partition))

    def handed_over(self) -> list[Written]:
        """Every answer in the order the producers were handed it (batch by batch)."""
        return [w for batch in self.cluster.batches for w in batch]

    async def stop(self, step_ms: float = 100, limit_ms: float = 60_000) -> None:
        """Stop the consumer, letting fake time pass while it drains (a fetch call ends on its timeout)."""
        stopping = asyncio.ensure_future(self.app.stop())
        await self.until_in_time(stopping.done, step_ms=step_ms, limit_ms=limit_ms)
        await stopping


def in_offset_order(answers: list[Written]) -> bool:
    """Every request partition's answers come in increasing offset order."""
    last: dict[int, int] = defaultdict(lambda: -1)
    for answer in answers:
        partition, offset = source_of(answer)
        if offset <= last[partition]:
            return False
        last[partition] = offset
    return True


def per_destination(answers: list[Written]) -> dict[tuple[str, int], list[Written]]:
    """Answers grouped by the (topic, partition) they were written to, in the order written."""
    out: dict[tuple[str, int], list[Written]] = defaultdict(list)
    for answer in answers:
        out[(answer.topic, answer.partition)].append(answer)
    return out


#: The labels of ``streaminfer_retries_total`` for a micro-batch retried because it ran out of memory.
INFERENCE_OOM = {"stage": "inference", "reason": "out_of_memory"}
