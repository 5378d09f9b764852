"""Unit tests never touch Kafka or a real ONNX Runtime session: constructing either raises here."""

from __future__ import annotations

from collections.abc import Callable

import aiokafka
import numpy as np
import pytest

from consumer.signature import ModelSignature, TensorSpec
from tests.unit.fakes import FakeClock

__all__ = ["FakeClock"]


def _forbidden(what: str) -> Callable[..., None]:
    def boom(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(f"unit tests must not create a {what}; use tests/integration")

    return boom


@pytest.fixture(autouse=True)
def _no_kafka_no_ort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka.AIOKafkaConsumer, "__init__", _forbidden("Kafka consumer"))
    monkeypatch.setattr(aiokafka.AIOKafkaProducer, "__init__", _forbidden("Kafka producer"))
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "InferenceSession", _forbidden("ONNX Runtime session"))


@pytest.fixture
def digits_signature() -> ModelSignature:
    """The digits model's signature: input FP32 [batch, 64]; outputs INT64 [batch], FP32 [batch, 10]."""
    return ModelSignature(
        name="digits",
        version="1",
        inputs=(TensorSpec("input", np.dtype(np.float32), (None, 64)),),
        outputs=(
            TensorSpec("label", np.dtype(np.int64), (None,)),
            TensorSpec("probabilities", np.dtype(np.float32), (None, 10)),
        ),
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
