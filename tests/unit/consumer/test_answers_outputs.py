"""Answers.shape: a batch whose requests all ask for the same outputs is encoded for the whole batch, with the bytes
(and the non_finite_output dead letters) the record-by-record path gives."""

from __future__ import annotations

import numpy as np
import pytest
from aiokafka import TopicPartition

from consumer.answers.outputs import Answers, non_finite_error
from consumer.oip.encode import encode_response
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Work
from tests.unit.fakes import record

SIGNATURE = ModelSignature(
    name="m",
    version="1",
    inputs=(TensorSpec("input", np.dtype(np.float32), (None, 4)),),
    outputs=(
        TensorSpec("label", np.dtype(np.int64), (None,)),
        TensorSpec("probabilities", np.dtype(np.float32), (None, 3)),
        TensorSpec("table", np.dtype(np.float32), (2,), batched=False),
    ),
)


@pytest.mark.parametrize("asked", [("probabilities", "label"), ("label",), ("table", "probabilities"), None])
@pytest.mark.parametrize("rows", [[1, 1, 1, 1], [1, 2, 1, 3]])
def test_same_outputs_asked_by_every_request(asked: tuple[str, ...] | None, rows: list[int]) -> None:
    total = sum(rows)
    rng = np.random.default_rng(1)
    outputs = {
        "label": rng.integers(0, 9, total).astype(np.int64),
        "probabilities": rng.random((total, 3), dtype=np.float32),
        "table": np.array([0.5, 2.0], np.float32),
    }
    outputs["probabilities"][1] = np.nan  # the second request's first row
    requests = [DecodedRequest(None, {"input": np.zeros((n, 4), np.float32)}, n, asked) for n in rows]
    works = [
        Work(record("t", 0, i, b"v"), TopicPartition("t", 0), None, f"c{i}".encode(), r, None, r.rows, 0.0)  # type: ignore[arg-type]
        for i, r in enumerate(requests)
    ]
    Answers(SIGNATURE).shape(works, requests, outputs, 0)
    start = 0
    for i, (work, n) in enumerate(zip(works, rows, strict=True)):
        names = asked or SIGNATURE.output_names
        part = [(name, outputs[name] if name == "table" else outputs[name][start : start + n]) for name in names]
        nan = "probabilities" in names and start <= 1 < start + n
        if nan:
            assert work.result is None
            assert repr(work.error) == repr(non_finite_error(["probabilities"]))
        else:
            assert work.error is None
            assert work.result == encode_response(f"c{i}", SIGNATURE, part)
        start += n
