"""consumer.shadow.compare: which outputs are compared, label and top-1 agreement, max absolute difference per row."""

from __future__ import annotations

import dataclasses

import numpy as np

from consumer.shadow.compare import Plan, compare, plan
from consumer.signature import ModelSignature, TensorSpec


def test_plan_of_a_classifier(digits_signature: ModelSignature) -> None:
    p = plan(digits_signature, digits_signature)
    assert p == Plan(labels=("label",), top1=("probabilities",), floats=("probabilities",))
    assert p.agreement == ("label", "probabilities")


def test_plan_skips_outputs_the_candidate_lacks_or_types_differently(digits_signature: ModelSignature) -> None:
    candidate = dataclasses.replace(
        digits_signature,
        outputs=(
            TensorSpec("label", np.dtype(np.float32), (None,)),
            TensorSpec("other", np.dtype(np.float32), (None,)),
        ),
    )
    assert plan(digits_signature, candidate) == Plan()


def test_plan_of_a_regressor_and_a_one_column_score() -> None:
    sig = ModelSignature(
        name="r",
        version="1",
        inputs=(TensorSpec("x", np.dtype(np.float32), (None, 3)),),
        outputs=(TensorSpec("y", np.dtype(np.float32), (None, 1)), TensorSpec("e", np.dtype(np.float32), (None, 4, 2))),
    )
    assert plan(sig, sig) == Plan(floats=("y", "e"))


def test_agreement_and_differences_row_by_row(digits_signature: ModelSignature) -> None:
    p = plan(digits_signature, digits_signature)
    probs = np.array([[0.9, 0.1], [0.4, 0.6], [0.5, 0.5], [0.2, 0.8]], np.float32)
    other = np.array([[0.8, 0.2], [0.7, 0.3], [0.5, 0.5], [0.2, 0.8]], np.float32)
    serving = {"label": np.array([0, 1, 0, 1]), "probabilities": probs}
    candidate = {"label": np.array([0, 0, 0, 1]), "probabilities": other}
    c = compare(p, serving, candidate, 4)
    assert c.rows == 4
    assert c.agreed == {"label": 3, "probabilities": 3}  # row 1 flips both
    np.testing.assert_allclose(c.diffs["probabilities"], [0.1, 0.3, 0.0, 0.0], atol=1e-6)


def test_nan_on_one_side_is_an_infinite_difference_on_both_sides_none(digits_signature: ModelSignature) -> None:
    p = plan(digits_signature, digits_signature)
    a = np.array([[np.nan, 0.0], [np.nan, 1.0], [0.0, 0.0]], np.float32)
    b = np.array([[np.nan, 0.0], [0.0, 1.0], [np.inf, 0.0]], np.float32)
    c = compare(p, {"probabilities": a, "label": np.zeros(3)}, {"probabilities": b, "label": np.zeros(3)}, 3)
    assert c.diffs["probabilities"].tolist() == [0.0, np.inf, np.inf]


def test_a_candidate_of_another_shape_disagrees_on_every_row(digits_signature: ModelSignature) -> None:
    p = plan(digits_signature, digits_signature)
    serving = {"label": np.zeros(2, np.int64), "probabilities": np.zeros((2, 10), np.float32)}
    candidate = {"label": np.zeros(2, np.int64), "probabilities": np.zeros((2, 9), np.float32)}
    c = compare(p, serving, candidate, 2)
    assert c.agreed == {"label": 2, "probabilities": 0}
    assert c.diffs["probabilities"].tolist() == [np.inf, np.inf]
    missing = compare(p, serving, {"probabilities": serving["probabilities"]}, 2)
    assert missing.agreed == {"label": 0, "probabilities": 2}
