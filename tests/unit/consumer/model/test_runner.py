from __future__ import annotations

import numpy as np
import pytest

from consumer.errors import DeadLetterReason, InferenceError, transient_reason
from consumer.model.buffers import BatchBuffers
from consumer.model.runner import OnnxRunner, split
from consumer.signature import ModelSignature
from consumer.timeouts import Backoff


class FakeSession:
    """Echoes rows: label = row index sum, probabilities = 10 copies of the first feature."""

    def __init__(self, drop_rows: int = 0, fail: bool = False) -> None:
        self.drop_rows = drop_rows
        self.fail = fail
        self.calls: list[int] = []

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.fail:
            raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT")
        x = input_feed["input"]
        self.calls.append(x.shape[0])
        n = x.shape[0] - self.drop_rows
        return [np.arange(n, dtype=np.int64), np.repeat(x[:n, :1], 10, axis=1)]


def test_run_returns_outputs_by_name(digits_signature: ModelSignature) -> None:
    runner = OnnxRunner(FakeSession(), digits_signature)
    out = runner.run({"input": np.ones((3, 64), np.float32)}, rows=3)
    assert set(out) == {"label", "probabilities"}
    assert out["probabilities"].shape == (3, 10)


def test_run_rejects_output_with_wrong_first_dimension(digits_signature: ModelSignature) -> None:
    runner = OnnxRunner(FakeSession(drop_rows=1), digits_signature)
    with pytest.raises(InferenceError, match="first dimension 4") as info:
        runner.run({"input": np.ones((4, 64), np.float32)}, rows=4)
    assert info.value.reason == DeadLetterReason.INFERENCE_ERROR


def test_run_wraps_ort_errors(digits_signature: ModelSignature) -> None:
    runner = OnnxRunner(FakeSession(fail=True), digits_signature)
    with pytest.raises(InferenceError, match="INVALID_ARGUMENT"):
        runner.run({"input": np.ones((1, 64), np.float32)}, rows=1)


def test_warmup_runs_each_batch_size(digits_signature: ModelSignature) -> None:
    session = FakeSession()
    OnnxRunner(session, digits_signature).warmup([1, 64], runs=2)
    assert session.calls == [1, 1, 64, 64]


def test_assemble_and_split_round_trip() -> None:
    a = {"input": np.full((1, 64), 1, np.float32)}
    b = {"input": np.full((3, 64), 2, np.float32)}
    feeds, rows = BatchBuffers({"input": np.dtype(np.float32)}).stack([a, b])
    assert rows == 4
    assert feeds["input"].shape == (4, 64)
    parts = split({"y": feeds["input"][:, 0]}, [1, 3])
    assert parts[0]["y"].tolist() == [1]
    assert parts[1]["y"].tolist() == [2, 2, 2]


def test_split_checks_rows() -> None:
    with pytest.raises(ValueError, match="3 rows, batch has 4"):
        split({"y": np.zeros(3)}, [1, 3])


class BatchOneSession(FakeSession):
    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if input_feed["input"].shape[0] != 1:
            raise RuntimeError("Reshape: input tensor cannot be reshaped to [1, 64]")
        return super().run(output_names, input_feed)


def test_warmup_tolerates_a_model_that_only_runs_at_batch_one(digits_signature: ModelSignature) -> None:
    assert OnnxRunner(BatchOneSession(), digits_signature).warmup([1, 64], runs=1) == [64]


def test_warmup_fails_when_batch_one_fails(digits_signature: ModelSignature) -> None:
    with pytest.raises(InferenceError):
        OnnxRunner(FakeSession(fail=True), digits_signature).warmup([1, 64], runs=1)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory ; GPU=0", "out_of_memory"),
        (
            "BFCArena::AllocateRawInternal Available memory of 0 is smaller than requested bytes of 4096",
            "out_of_memory",
        ),
        ("CUDNN failure 4: CUDNN_STATUS_ALLOC_FAILED", "out_of_memory"),
        ("std::bad_alloc", "out_of_memory"),
        ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input", None),
        ("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation", None),
    ],
)
def test_only_out_of_memory_is_transient(message: str, reason: str | None) -> None:
    assert transient_reason(RuntimeError(message)) == reason
    assert transient_reason(MemoryError()) == "out_of_memory"


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert [Backoff(0.1, 0.5).delay(n) for n in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert Backoff(0.1, 5.0).delay(10_000) == 5.0  # no overflow after a long outage
