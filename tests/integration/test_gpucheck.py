"""scripts/gpu-check's measurement, on CPU with the small text model: the consumer's pipeline without Kafka answers
every record, and asking for CUDA where it is not active fails instead of falling back to CPU silently."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from consumer.config import Settings
from consumer.model.runner import OnnxRunner
from consumer.model.session import CUDA, SessionOptions, gpu_count
from consumer.oip.client import encode_request
from harness import gpucheck
from harness.bench import corpus


def test_pipeline_and_bare_ort_on_cpu(text_model: tuple[Path, Path]) -> None:
    model, tokenizer = text_model
    result = gpucheck.measure(model, tokenizer, "cpu", corpus(300), batch=16)
    assert result["provider"] == "CPUExecutionProvider"
    assert result["bare_ort_rps"] > 0
    assert result["pipeline_rps"] > 0  # measure() raises unless the pipeline answered all 300 with a result


def test_a_batch_that_inference_failed_fails_the_check(text_model: tuple[Path, Path]) -> None:
    model, tokenizer = text_model
    runner = OnnxRunner.load(model, SessionOptions(execution_provider="cpu", max_batch_size=16))
    settings = Settings(model_path=model, tokenizer_path=tokenizer, max_batch_size=16, http_port=0)
    values = [encode_request(None, {"text": [t]}) for t in corpus(40)]
    assert asyncio.run(gpucheck.pipeline(settings, runner, values)) > 0

    def broken(feeds: object, rows: int) -> dict[str, np.ndarray]:
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : a kernel failed")

    runner.execute = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=r"answered 0 of 40 records with a result; first: inference_error"):
        asyncio.run(gpucheck.pipeline(settings, runner, values))


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
