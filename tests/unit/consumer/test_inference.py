"""The inference stage (consumer/inference.py) in a consumer wired to fakes: out-of-memory batches retried whole after a
backoff, then bisected."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from consumer.answers.outputs import non_finite
from consumer.inference import RunSpan, join_runs
from consumer.signature import ModelSignature
from consumer.work import DecodedRequest
from tests.unit.fakes import FakeClock
from tests.unit.wired import INFERENCE_OOM, Wired, digits_value, in_offset_order, per_destination

#: The CUDA execution provider's message when a batch does not fit in GPU memory.
CUDA_OOM = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running MatMul node. "
    "CUDA failure 2: out of memory ; GPU=0"
)


async def test_an_out_of_memory_batch_is_run_again_after_a_backoff_and_answered_whole(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, inference_retries=3, retry_backoff_ms=100, retry_backoff_max_ms=150)
    failures = iter([True, True])
    h.session.fail_when = lambda feeds: next(failures, False)
    h.session.fail_with = CUDA_OOM
    await h.start(partitions=(0,))
    started = clock()
    h.send(0, [digits_value() for _ in range(4)])
    await h.until_in_time(lambda: len(h.results()) == 4, step_ms=10)
    assert clock() - started >= 0.1 + 0.15  # 100 ms, then 200 ms capped at 150, on the injected clock
    assert h.session.batches == [4, 4, 4]  # the same batch, whole: no bisection
    assert h.dead_letters() == []
    assert h.metrics.registry.get_sample_value("streaminfer_retries_total", INFERENCE_OOM) == 2
    assert h.metrics.registry.get_sample_value("streaminfer_batch_failures_total") == 0
    assert all(in_offset_order(answers) for answers in per_destination(h.handed_over()).values())
    await h.stop()


async def test_a_record_that_keeps_running_out_of_memory_is_dead_lettered_alone_once_retries_are_spent(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock, inference_retries=1, retry_backoff_ms=10)
    h.session.fail_when = lambda feeds: bool((feeds["input"][:, 63] == 9).any())
    h.session.fail_with = CUDA_OOM
    await h.start(partitions=(0,))
    h.send(0, [digits_value(), digits_value(), digits_value(marker=9.0), digits_value()])
    await h.until_in_time(lambda: len(h.results()) + len(h.dead_letters()) == 4, step_ms=10)
    assert h.reasons() == {(0, 2): "inference_error"}
    assert len(h.results()) == 3
    # One retry at each level the culprit's batch failed: 4 rows, then its half, then alone.
    assert h.metrics.registry.get_sample_value("streaminfer_retries_total", INFERENCE_OOM) == 3
    assert all(in_offset_order(answers) for answers in per_destination(h.handed_over()).values())
    await h.stop()


def test_non_finite_names_the_outputs_of_each_request_once_per_batch() -> None:
    ok = np.ones((3, 2), dtype=np.float32)
    bad = np.ones((3, 2), dtype=np.float32)
    bad[1, 0] = np.nan
    ints = np.array([1, 2, 3])
    assert non_finite([("ok", ok), ("ints", ints)], [1, 2], frozenset()) is None
    assert non_finite([("ok", ok), ("bad", bad), ("ints", ints)], [1, 2], frozenset()) == [[], ["bad"]]
    whole = np.array([np.inf], dtype=np.float32)  # no batch axis: spoils every request
    assert non_finite([("w", whole), ("bad", bad)], [2, 1], frozenset({"w"})) == [["w", "bad"], ["w"]]


def test_join_runs_joins_spans_that_continue_each_other_and_nothing_else() -> None:
    a, b = {"input": np.zeros((8, 64), np.float32)}, {"input": np.zeros((8, 64), np.float32)}  # equal, not one
    spans = [(a, 0, 1), (a, 1, 2), (a, 4, 1), (b, 5, 3), (b, 8, 0), (b, 8, 1), (a, 5, 0), (a, 5, 1)]
    runs = join_runs([RunSpan(*span) for span in spans])
    assert runs == [(a, 0, 3), (a, 4, 5), (b, 5, 9), (a, 5, 6)]  # a gap, another block, back to the first
    assert [run[0] is a for run in runs] == [True, True, False, True]  # the same block object, not an equal one
    assert join_runs([RunSpan(a, 2, 3)]) == [(a, 2, 5)]
    assert join_runs([]) is None
    assert join_runs([RunSpan(None, 0, 1), RunSpan(a, 1, 1)]) is None  # a span of no block: the requests' path
    assert join_runs([RunSpan(a, 0, 1), RunSpan(None, 1, 1)]) is None


def test_join_runs_reads_requests() -> None:
    block = {"input": np.zeros((4, 64), np.float32)}
    requests = [DecodedRequest(None, None, 1, None, block=block, start=i) for i in (0, 1, 3)]
    assert join_runs(requests) == [(block, 0, 2), (block, 3, 4)]
    assert join_runs([DecodedRequest(None, {"input": block["input"][:1]}, 1, None)]) is None
