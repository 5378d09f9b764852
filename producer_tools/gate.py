"""The gate: the serving model against a candidate on the same batches of a comparison set.

Both models run in the consumer's runner on the set's batches at one batch size (:func:`producer_tools.evaluate.
run_set`); then, per float output, the absolute difference ``|c - s|`` and the relative one ``|c - s| / max(|s|,
1e-6)`` (max and mean over every value), and for an output of more than one value per row the cosine similarity of
each row's vectors (min, mean and the :data:`COSINE_PERCENTILE`-th percentile over the rows); the top-1 agreement of
the two models' classes (:func:`producer_tools.evaluate.predictions`); the accuracy of each against the set's labels
and its change; and rows/s and p99 per batch size of both (:func:`producer_tools.evaluate.timings`).

An *embedding* output (:func:`embedding_outputs`: named with ``--embedding-output``, else every float output of shape
``[batch, dim]``, dim > 1, whose name contains ``embed``, such as MiniLM's ``embedding``) is a vector, not class
scores: it is judged by cosine (mean, and the low percentile, ``min_p1_cosine``) beside its absolute difference, and
never read as a class (no top-1 agreement on the argmax of an embedding).

Thresholds (:class:`Thresholds`, ``streaminfer-model gate`` flags) decide pass or fail; one left unset is reported and
not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from consumer.model.runner import OnnxRunner
from producer_tools.evaluate import SetOutputs, accuracy, padding_of, predictions, run_set, timings
from producer_tools.modelset import ComparisonSet

#: Denominator floor of the relative difference: values of the serving model nearer 0 than this count as this.
REL_FLOOR = 1e-6
#: The low percentile of the per-row cosine similarity reported (``p1 cosine``), percent.
COSINE_PERCENTILE = 1


@dataclass(frozen=True)
class Thresholds:
    """What a candidate must meet (None: not judged).

    Attributes:
        min_agreement: top-1 agreement with the serving model, fraction of rows (default 0.99).
        max_accuracy_drop: accuracy against the labels may fall by at most this, absolute (default 0.01).
        min_cosine: the mean over rows of each row's cosine similarity, per float output of more than one value per
            row (default 0.99).
        min_row_cosine: the worst row's cosine similarity, likewise (default: not judged; an INT8 classifier's
            probabilities reach 0.98 on a row whose classes are near a tie, with top-1 agreement still 1).
        min_p1_cosine: the :data:`COSINE_PERCENTILE`-th percentile of the rows' cosine similarity, per embedding
            output (default 0.98; reported, not judged, for other outputs). On the real MiniLM export over 300
            texts of the bench corpus (docs/rollout.md): FP16 0.999999, INT8 dynamic 0.919 (per channel: 0.985),
            INT8 static 0.034.
        max_abs_diff: the largest absolute difference of any float output value (default: not judged).
        max_mean_abs_diff: the mean absolute difference per float output (default: not judged).
        max_p99_ratio: candidate p99 over serving p99, at every batch size timed (default: not judged).
    """

    min_agreement: float | None = 0.99
    max_accuracy_drop: float | None = 0.01
    min_cosine: float | None = 0.99
    min_row_cosine: float | None = None
    min_p1_cosine: float | None = 0.98
    max_abs_diff: float | None = None
    max_mean_abs_diff: float | None = None
    max_p99_ratio: float | None = None


@dataclass
class Check:
    """One judged (or reported) figure: what, its value, the threshold and whether it passed (None: not judged)."""

    name: str
    value: float | None
    threshold: str = ""
    passed: bool | None = None


@dataclass
class GateReport:
    """A gate's figures and verdict."""

    checks: list[Check] = field(default_factory=list)
    outputs: dict[str, dict[str, float]] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    performance: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    differences: dict[str, np.ndarray] = field(default_factory=dict)
    embeddings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No judged check failed."""
        return all(c.passed is not False for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        """The checks that failed."""
        return [c for c in self.checks if c.passed is False]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the differences themselves left out)."""
        return {
            "passed": self.passed,
            "checks": [c.__dict__ for c in self.checks],
            "outputs": self.outputs,
            "embeddings": self.embeddings,
            "accuracy": self.accuracy,
            "performance": self.performance,
        }


def compare_outputs(serving: SetOutputs, candidate: SetOutputs) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Per float output present in both: max/mean abs and rel difference, and (more than one value per row) the
    min, mean and :data:`COSINE_PERCENTILE`-th percentile (``p1_cosine``) over rows of the cosine similarity of each
    row's values (flattened, float64); with the absolute differences per value (for a plot).

    Raises:
        ValueError: the two runs' batches or an output's shapes differ (not the same set or not the same model
            interface).
    """
    if serving.members != candidate.members:
        raise ValueError("the two models did not run the same batches")
    stats: dict[str, dict[str, float]] = {}
    diffs: dict[str, Any] = {}
    for name in serving.batches[0] if serving.batches else {}:
        pairs = [(s[name], c.get(name)) for s, c in zip(serving.batches, candidate.batches, strict=True)]
        if any(c is None for _, c in pairs) or serving.batches[0][name].dtype.kind != "f":
            continue
        abs_parts, rel_parts, cos_parts = [], [], []
        for s, c in pairs:
            assert c is not None
            if s.shape != c.shape:
                raise ValueError(f"output {name!r}: serving shape {s.shape}, candidate shape {c.shape}")
            s64, c64 = s.astype(np.float64), c.astype(np.float64)
            d = np.abs(c64 - s64)
            abs_parts.append(d.ravel())
            rel_parts.append((d / np.maximum(np.abs(s64), REL_FLOOR)).ravel())
            if s.ndim >= 2 and s[0].size > 1:
                sf, cf = s64.reshape(s.shape[0], -1), c64.reshape(c.shape[0], -1)
                norms = np.linalg.norm(sf, axis=1) * np.linalg.norm(cf, axis=1)
                cos_parts.append(np.sum(sf * cf, axis=1) / np.maximum(norms, 1e-30))
        a, r = np.concatenate(abs_parts), np.concatenate(rel_parts)
        entry = {
            "max_abs": float(a.max()),
            "mean_abs": float(a.mean()),
            "max_rel": float(r.max()),
            "mean_rel": float(r.mean()),
        }
        if cos_parts:
            cos = np.concatenate(cos_parts)
            entry["min_cosine"] = float(cos.min())
            entry["mean_cosine"] = float(cos.mean())
            entry["p1_cosine"] = float(np.percentile(cos, COSINE_PERCENTILE))
        stats[name] = entry
        diffs[name] = a
    return stats, diffs


def embedding_outputs(outputs: SetOutputs, named: Sequence[str] | None = None) -> list[str]:
    """The outputs judged as embeddings: ``named`` where given (each must be a float output of more than one value
    per row), else every float output ``[rows, dim]`` (dim > 1) whose name contains ``embed`` (case-insensitive).

    Raises:
        ValueError: a named output is not in the outputs, or not such a float vector.
    """
    first = outputs.batches[0] if outputs.batches else {}
    if named:
        for name in named:
            arr = first.get(name)
            if arr is None or arr.dtype.kind != "f" or arr.ndim < 2 or arr[0].size < 2:
                raise ValueError(
                    f"--embedding-output {name!r}: not a float output of more than one value per row "
                    f"(outputs: {', '.join(first) or 'none'})"
                )
        return list(named)
    return [
        name
        for name, arr in first.items()
        if arr.dtype.kind == "f" and arr.ndim == 2 and arr.shape[1] > 1 and "embed" in name.lower()
    ]


def gate(
    serving: OnnxRunner,
    candidate: OnnxRunner,
    comparison: ComparisonSet,
    thresholds: Thresholds,
    *,
    batch_size: int = 32,
    batch_sizes: Sequence[int] = (1, 32),
    label_output: str | None = None,
    embeddings: Sequence[str] | None = None,
    min_runs: int = 20,
    max_seconds: float = 2.0,
) -> GateReport:
    """Run both models on the set's batches of ``batch_size`` rows, compare and judge.

    Args:
        embeddings: the embedding outputs (:func:`embedding_outputs`); None: found by shape and name.

    Raises:
        ValueError: the models' outputs cannot be compared (:func:`compare_outputs`), or ``embeddings`` names an
            output that is not a float vector.
        consumer.errors.InferenceError: a batch failed.
    """
    t = thresholds
    padding = padding_of(serving)  # both models on the serving model's batches (a sequence model's)
    out_s = run_set(serving, comparison, batch_size, padding)
    out_c = run_set(candidate, comparison, batch_size, padding)
    report = GateReport()
    report.outputs, report.differences = compare_outputs(out_s, out_c)
    report.embeddings = embedding_outputs(out_s, embeddings)
    skip = set(report.embeddings)
    ps, pc = predictions(out_s, label_output, skip), predictions(out_c, label_output, skip)
    if ps is not None and pc is not None:
        agreement = float(np.mean(ps[1] == pc[1]))
        report.checks.append(_judge("top-1 agreement", agreement, t.min_agreement, at_least=True))
    acc_s, acc_c = accuracy(out_s, comparison, label_output, skip), accuracy(out_c, comparison, label_output, skip)
    if acc_s and acc_c:
        change = acc_c["top1"] - acc_s["top1"]
        report.accuracy = {"serving": acc_s["top1"], "candidate": acc_c["top1"], "change": round(change, 6)}
        report.checks.append(Check("accuracy (serving)", acc_s["top1"]))
        report.checks.append(Check("accuracy (candidate)", acc_c["top1"]))
        drop = None if t.max_accuracy_drop is None else -t.max_accuracy_drop
        report.checks.append(_judge("accuracy change", change, drop, at_least=True))
    for name, entry in report.outputs.items():
        report.checks.append(_judge(f"{name}: max abs diff", entry["max_abs"], t.max_abs_diff, at_least=False))
        report.checks.append(_judge(f"{name}: mean abs diff", entry["mean_abs"], t.max_mean_abs_diff, at_least=False))
        report.checks.append(Check(f"{name}: max rel diff", entry["max_rel"]))
        report.checks.append(Check(f"{name}: mean rel diff", entry["mean_rel"]))
        if "min_cosine" in entry:
            report.checks.append(_judge(f"{name}: mean cosine", entry["mean_cosine"], t.min_cosine, at_least=True))
            report.checks.append(_judge(f"{name}: min cosine", entry["min_cosine"], t.min_row_cosine, at_least=True))
            low = t.min_p1_cosine if name in skip else None
            report.checks.append(_judge(f"{name}: p{COSINE_PERCENTILE} cosine", entry["p1_cosine"], low, at_least=True))
    if padding is not None:
        # 1: padding a row leaves the candidate's answer as it is (the consumer's load-time probe); 0: the consumer
        # would batch it by exact length (dynamic INT8 quantises activations per batch, padding included)
        safe = candidate.signature.sequence is not None and candidate.signature.sequence.padding_safe
        report.checks.append(Check("padding-safe (candidate)", float(safe)))
    perf_s = timings(serving, comparison, batch_sizes, min_runs=min_runs, max_seconds=max_seconds, padding=padding)
    perf_c = timings(candidate, comparison, batch_sizes, min_runs=min_runs, max_seconds=max_seconds, padding=padding)
    report.performance = {"serving": perf_s, "candidate": perf_c}
    for s, c in zip(perf_s, perf_c, strict=True):
        b = s["batch_size"]
        report.checks.append(Check(f"rows/s at {b} (serving)", s["rows_per_s"]))
        report.checks.append(Check(f"rows/s at {b} (candidate)", c["rows_per_s"]))
        report.checks.append(Check(f"p99 ms at {b} (serving)", s["p99_ms"]))
        ratio = c["p99_ms"] / max(s["p99_ms"], 1e-9)
        report.checks.append(Check(f"p99 ms at {b} (candidate)", c["p99_ms"]))
        report.checks.append(_judge(f"p99 ratio at {b}", ratio, t.max_p99_ratio, at_least=False))
    return report


def _judge(name: str, value: float, threshold: float | None, *, at_least: bool) -> Check:
    if threshold is None:
        return Check(name, value)
    ok = value >= threshold if at_least else value <= threshold
    return Check(name, value, (">= " if at_least else "<= ") + f"{threshold:g}", ok)
