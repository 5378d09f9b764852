"""harness.bench.slow: the bench's slow shadow candidate answers as digits does, with far more work per row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from harness.bench.slow import slow_candidate


def test_the_slow_candidate_gives_the_digits_answers_bit_for_bit(digits_model: Path, tmp_path: Path) -> None:
    digits = digits_model / "digits.onnx"
    slow = slow_candidate(digits, tmp_path / "m" / "slow.onnx", hidden=64, layers=2)
    x = np.random.default_rng(0).integers(0, 17, (33, 64)).astype(np.float32)
    ours = ReferenceEvaluator(str(digits)).run(None, {"input": x})  # onnx's own evaluator: no ONNX Runtime here
    theirs = ReferenceEvaluator(str(slow)).run(None, {"input": x})
    assert [o.name for o in onnx.load(str(slow)).graph.output] == ["label", "probabilities"]
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_the_side_branch_has_the_layers_asked_for(digits_model: Path, tmp_path: Path) -> None:
    slow = onnx.load(str(slow_candidate(digits_model / "digits.onnx", tmp_path / "slow.onnx", hidden=32, layers=3)))
    weights = {i.name: tuple(i.dims) for i in slow.graph.initializer if i.name.startswith("slow_w")}
    assert weights == {"slow_w0": (64, 32), "slow_w1": (32, 32), "slow_w2": (32, 32), "slow_w3": (32, 32),
                       "slow_w4": (32, 10)}  # fmt: skip
    assert sum(n.op_type == "MatMul" for n in slow.graph.node) == 5


@pytest.mark.parametrize(("hidden", "layers"), [(0, 1), (8, -1)])
def test_bad_sizes_are_refused(digits_model: Path, tmp_path: Path, hidden: int, layers: int) -> None:
    with pytest.raises(ValueError, match="hidden must be"):
        slow_candidate(digits_model / "digits.onnx", tmp_path / "slow.onnx", hidden=hidden, layers=layers)
