"""The serving model's outputs against a candidate's, row by row over one micro-batch (pure numpy, no state).

Which outputs are compared, and how (:func:`plan`), from the two signatures: outputs of the same name that both
models give per row (a batch axis),

- **labels**: a non-float output of one value per row (``[rows]`` or ``[rows, 1]``: a classifier's label): a row
  agrees when the values are equal;
- **top-1**: a float output of two or more columns (``[rows, classes]``: probabilities, scores, logits): a row
  agrees when both models' largest column is the same;
- **difference**: every float output: the largest absolute difference over a row's values, in the output's own
  units (NaN or infinite on one side and not the other: ``inf``).

A candidate whose output has another shape per row than the serving model's in a batch disagrees on every row of
it, with an infinite difference, so a broken candidate shows on the dashboard instead of being skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from consumer.signature import ModelSignature, TensorSpec, floating


@dataclass(frozen=True, slots=True)
class Plan:
    """Which outputs are compared (output names, the serving model's order).

    Attributes:
        labels: compared by equality per row.
        top1: compared by their largest column per row.
        floats: compared by the largest absolute difference per row.
    """

    labels: tuple[str, ...] = ()
    top1: tuple[str, ...] = ()
    floats: tuple[str, ...] = ()

    @property
    def agreement(self) -> tuple[str, ...]:
        """Outputs with an agreement count (labels, then top-1)."""
        return self.labels + self.top1


@dataclass(slots=True)
class Comparison:
    """One micro-batch compared.

    Attributes:
        rows: rows compared.
        agreed: output -> rows on which both models agree (labels and top-1 outputs).
        diffs: output -> the largest absolute difference per row, float64 ``[rows]`` (float outputs).
    """

    rows: int
    agreed: dict[str, int] = field(default_factory=dict)
    diffs: dict[str, np.ndarray] = field(default_factory=dict)


def plan(serving: ModelSignature, candidate: ModelSignature) -> Plan:
    """The comparisons the two signatures allow (see the module docstring)."""
    theirs = {spec.name: spec for spec in candidate.outputs}
    labels: list[str] = []
    top1: list[str] = []
    floats: list[str] = []
    for ours in serving.outputs:
        other = theirs.get(ours.name)
        if other is None or not ours.batched or not other.batched:
            continue
        if floating(ours.dtype) and floating(other.dtype):
            floats.append(ours.name)
            if _columns(ours) != 1 and _columns(other) != 1 and len(ours.shape) == 2:
                top1.append(ours.name)
        elif not floating(ours.dtype) and not floating(other.dtype) and _columns(ours) == 1:
            labels.append(ours.name)
    return Plan(tuple(labels), tuple(top1), tuple(floats))


def _columns(spec: TensorSpec) -> int | None:
    """Values per row of a ``[rows]`` or ``[rows, n]`` output (1 for ``[rows]``; None when dynamic or deeper)."""
    if len(spec.shape) == 1:
        return 1
    if len(spec.shape) == 2:
        return spec.shape[1]
    return None


def compare(
    plan: Plan, serving: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], rows: int
) -> Comparison:
    """Compare one batch's outputs.

    Args:
        plan: from :func:`plan`.
        serving: the serving model's outputs, name -> ``[rows, ...]``.
        candidate: the candidate's, name -> ``[rows, ...]`` on the same feeds.
        rows: the batch's rows.

    Returns:
        The agreement counts and per-row differences; an output missing from either side counts as disagreeing.
    """
    out = Comparison(rows)
    for name in plan.labels:
        ours, theirs = serving.get(name), candidate.get(name)
        same = ours is not None and theirs is not None and ours.shape == theirs.shape and ours.shape[:1] == (rows,)
        if not same:
            out.agreed[name] = 0
            continue
        assert ours is not None
        assert theirs is not None
        out.agreed[name] = int(np.count_nonzero(ours.reshape(rows) == theirs.reshape(rows)))
    for name in plan.floats:
        ours, theirs = serving.get(name), candidate.get(name)
        if ours is None or theirs is None or ours.shape != theirs.shape or ours.shape[:1] != (rows,):
            out.diffs[name] = np.full(rows, np.inf)
            if name in plan.top1:
                out.agreed[name] = 0
            continue
        a, b = ours.reshape(rows, -1), theirs.reshape(rows, -1)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a - b)  # in the outputs' own dtype (float32 mostly): one pass
        if not np.isfinite(diff).all():  # rare: NaN or inf somewhere, read value by value in float64
            diff = _nan_aware(a.astype(np.float64), b.astype(np.float64))
        out.diffs[name] = diff.max(axis=1) if diff.shape[1] else np.zeros(rows)
        if name in plan.top1:
            out.agreed[name] = int(np.count_nonzero(np.argmax(a, axis=1) == np.argmax(b, axis=1)))
    return out


def _nan_aware(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|a - b|`` where NaN on both sides is 0 and NaN on one side (or inf - inf of one sign) is ``inf``."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff: np.ndarray = np.abs(a - b)
    both_nan = np.isnan(a) & np.isnan(b)
    diff[np.isnan(diff) & ~both_nan] = np.inf
    diff[both_nan] = 0.0
    return diff
