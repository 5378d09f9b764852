"""scripts/gpu-check's measurement, on CPU with the small text model: the consumer's pipeline without Kafka answers
every record, and asking for CUDA where it is not active fails instead of falling back to CPU silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.model.session import CUDA, gpu_count
from harness import gpucheck
from harness.bench import corpus


def test_pipeline_and_bare_ort_on_cpu(text_model: tuple[Path, Path]) -> None:
    model, tokenizer = text_model
    result = gpucheck.measure(model, tokenizer, "cpu", corpus(300), batch=16)
    assert result["provider"] == "CPUExecutionProvider"
    assert result["bare_ort_rps"] > 0
    assert result["pipeline_rps"] > 0


def test_cuda_asked_but_not_active_exits_1(text_model: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    import onnxruntime

    if CUDA in onnxruntime.get_available_providers() and gpu_count() > 0:
        pytest.skip("a GPU is present: CUDA would be active")
    model, tokenizer = text_model
    code = gpucheck.main(["--model", str(model), "--tokenizer", str(tokenizer), "--providers", "cuda", "--texts", "10"])
    assert code == 1
    err = capsys.readouterr().err
    if CUDA in onnxruntime.get_available_providers():  # the GPU build where no GPU is: ONNX Runtime fell back to CPU
        assert "running on CPUExecutionProvider" in err
    else:  # the CPU build (make venv's, the cpu extra): refused before a session is made
        assert "a GPU was asked for: this onnxruntime offers only" in err
