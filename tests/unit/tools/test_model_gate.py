"""streaminfer-model's gate without ONNX Runtime: a text set's padded batches, the cosine figures, which outputs are
embeddings, and what is judged on them (fake sessions behind the consumer's runner)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from consumer.model.runner import OnnxRunner
from consumer.signature import ModelSignature, SequenceSpec, TensorSpec
from producer_tools.evaluate import SetOutputs, padding_of, predictions
from producer_tools.gate import COSINE_PERCENTILE, Thresholds, compare_outputs, embedding_outputs, gate
from producer_tools.modelset import ComparisonSet, Padding, SetRecord, batches

PADS = {"input_ids": 0, "attention_mask": 0}


def text_record(ids: list[int]) -> SetRecord:
    arr = np.asarray([ids], dtype=np.int64)
    return SetRecord({"input_ids": arr, "attention_mask": np.ones_like(arr)}, None, {})


def text_set(*lengths: int) -> ComparisonSet:
    return ComparisonSet([text_record(list(range(5, 5 + n))) for n in lengths])


def test_a_text_sets_batches_are_padded_to_their_longest_record_in_set_order() -> None:
    comparison = text_set(3, 5, 2, 4)
    got = list(batches(comparison, 3, Padding({"input_ids": 1, "attention_mask": 0})))  # one lane
    assert [idx for _, idx in got] == [[0, 1, 2], [3]]
    feeds = got[0][0]
    assert feeds["input_ids"].tolist() == [[5, 6, 7, 1, 1], [5, 6, 7, 8, 9], [5, 6, 1, 1, 1]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert got[1][0]["input_ids"].shape == (1, 4)
    # without padding, records of different lengths never share a batch
    assert [idx for _, idx in batches(comparison, 3)] == [[0], [1], [2], [3]]
    assert [idx for _, idx in batches(text_set(3, 3, 3, 2), 8)] == [[0, 1, 2], [3]]


def test_a_text_sets_batches_follow_the_consumers_length_buckets_and_token_budget() -> None:
    comparison = text_set(2, 9, 3, 10, 4, 2, 12)
    lanes = Padding(PADS, buckets=(4, 8, 16))
    # lengths 2, 3, 4, 2 share bucket 4; 9, 10, 12 bucket 16; a lane is a batch at 3 rows, the rest at the end
    assert [idx for _, idx in batches(comparison, 3, lanes)] == [[0, 2, 4], [1, 3, 6], [5]]
    # 2 rows x bucket 16 = 32 tokens: a third long record would take the lane past 40
    budget = Padding(PADS, buckets=(4, 8, 16), max_tokens=40)
    assert [idx for _, idx in batches(comparison, 8, budget)] == [[1, 3], [0, 2, 4, 5], [6]]
    # the set's rows come back in set order whatever the batches
    table = np.arange(100, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    parts = [(table[f["input_ids"][:, 0]], idx) for f, idx in batches(comparison, 3, lanes)]
    joined = SetOutputs([{"e": e} for e, _ in parts], [idx for _, idx in parts], [1] * 7).joined("e")
    assert joined is not None
    assert joined[:, 0].tolist() == [5.0] * 7  # every text starts with token 5
    ids = SetOutputs([{"i": np.asarray(idx, np.int64)} for _, idx in parts], [idx for _, idx in parts], [1] * 7).joined(
        "i"
    )
    assert ids is not None
    assert ids.tolist() == list(range(7))


def outputs(*batches_: Mapping[str, np.ndarray]) -> SetOutputs:
    return SetOutputs([dict(b) for b in batches_], [[i] for i in range(len(batches_))])


def test_cosine_figures_per_row_min_mean_and_low_percentile() -> None:
    angles = np.linspace(0.0, 0.5, 11)  # radians: row i's candidate vector is the serving one turned by angles[i]
    serving = np.stack([np.ones_like(angles), np.zeros_like(angles)], axis=1) * 3.0
    candidate = np.stack([np.cos(angles), np.sin(angles)], axis=1) * 2.0  # cosine ignores the norm
    stats, diffs = compare_outputs(
        outputs({"embedding": serving.astype(np.float32)}), outputs({"embedding": candidate.astype(np.float32)})
    )
    e = stats["embedding"]
    cos = np.cos(angles)
    assert e["min_cosine"] == pytest.approx(cos.min(), abs=1e-7)
    assert e["mean_cosine"] == pytest.approx(cos.mean(), abs=1e-7)
    assert e["p1_cosine"] == pytest.approx(np.percentile(cos, COSINE_PERCENTILE), abs=1e-7)
    assert cos.min() < e["p1_cosine"] < cos.mean()
    assert e["max_abs"] == pytest.approx(float(np.abs(candidate - serving).max()), rel=1e-6)
    assert diffs["embedding"].size == serving.size


def test_which_outputs_are_embeddings() -> None:
    out = outputs(
        {
            "embedding": np.zeros((2, 4), np.float32),
            "token_embeddings": np.zeros((2, 3, 4), np.float32),
            "probabilities": np.zeros((2, 10), np.float32),
            "label": np.zeros(2, np.int64),
        }
    )
    assert embedding_outputs(out) == ["embedding"]
    assert embedding_outputs(out, ["probabilities", "token_embeddings"]) == ["probabilities", "token_embeddings"]
    for wrong in ("label", "missing"):
        with pytest.raises(ValueError, match=wrong):
            embedding_outputs(out, [wrong])
    # an embedding is never read as class scores
    vectors = outputs({"embedding": np.eye(3, dtype=np.float32)})
    assert predictions(vectors) is not None
    assert predictions(vectors, skip={"embedding"}) is None


class FakeSession:
    """Outputs ``embedding`` FP32 [rows, 3] (the masked mean of ``table[input_ids]``) and ``scores`` FP32 [rows, 2]
    (its first two values), like a pooled sentence encoder."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        mask = feeds["attention_mask"].astype(np.float32)[..., None]
        pooled = (self.table[feeds["input_ids"]] * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)
        out = {"embedding": pooled.astype(np.float32), "scores": pooled[:, :2].astype(np.float32)}
        return [out[n] for n in (names or list(out))]


def fake_runner(table: np.ndarray) -> OnnxRunner:
    signature = ModelSignature(
        name="fake",
        version="1",
        inputs=tuple(TensorSpec(n, np.dtype(np.int64), (None, None)) for n in PADS),
        outputs=(
            TensorSpec("embedding", np.dtype(np.float32), (None, 3)),
            TensorSpec("scores", np.dtype(np.float32), (None, 2)),
        ),
        sequence=SequenceSpec(inputs=tuple(PADS), pad_values=PADS, max_length=32, optional={}),
    )
    return OnnxRunner(FakeSession(table), signature)


def test_the_gate_judges_an_embeddings_low_percentile_and_never_its_argmax() -> None:
    rng = np.random.default_rng(3)
    table = rng.normal(size=(16, 3)).astype(np.float32)
    broken = table.copy()
    u = table[5] / np.linalg.norm(table[5])
    v = np.cross(u, [1.0, 0.0, 0.0])
    v /= np.linalg.norm(v)
    broken[5] = 0.7 * u + np.sqrt(1 - 0.7**2) * v  # the one-token text [5]: cosine 0.7 with the serving row
    comparison = ComparisonSet(
        [text_record([int(t) for t in rng.integers(6, 16, size=int(n))]) for n in rng.integers(1, 8, size=60)]
        + [text_record([5])]
    )
    serving = fake_runner(table)
    padding = padding_of(serving)
    assert padding is not None
    assert padding.pad_values == PADS
    quick: dict[str, Any] = {"batch_sizes": (4,), "min_runs": 1, "max_seconds": 0.0}
    same = gate(serving, fake_runner(table), comparison, Thresholds(), **quick)
    assert same.passed
    assert same.embeddings == ["embedding"]
    names = [c.name for c in same.checks]
    assert "top-1 agreement" in names  # from scores, not from the embedding
    assert same.outputs["embedding"]["min_cosine"] == pytest.approx(1.0)

    # one row of 61 turned away (cosine 0.7): the mean stays above 0.99, the low percentile does not
    loose = Thresholds(min_agreement=None, min_cosine=None)
    report = gate(serving, fake_runner(broken), comparison, loose, **quick)
    assert report.outputs["embedding"]["mean_cosine"] == pytest.approx((60 + 0.7) / 61, abs=1e-6)
    assert report.outputs["embedding"]["min_cosine"] == pytest.approx(0.7, abs=1e-6)
    failed = {c.name for c in report.failed}
    assert failed == {"embedding: p1 cosine"}, [(c.name, c.value) for c in report.checks]
    p1 = next(c for c in report.checks if c.name == "embedding: p1 cosine")
    assert p1.threshold == ">= 0.98"
    assert p1.value is not None
    assert p1.value < 0.98
    # the same figure on an output that is not an embedding is reported, not judged
    scores = next(c for c in report.checks if c.name == "scores: p1 cosine")
    assert scores.passed is None
    assert scores.threshold == ""
    # unset, nothing is judged on it
    unjudged = Thresholds(min_agreement=None, min_cosine=None, min_p1_cosine=None)
    assert gate(serving, fake_runner(broken), comparison, unjudged, **quick).passed
