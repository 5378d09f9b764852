"""The shadow room's metrics (``streaminfer_shadow_*``), on the service's registry (never the global one).

Labels come from fixed sets only: ``output`` from the two models' signatures (known at start-up), ``outcome``
from :data:`ANSWER_OUTCOMES`. The agreement of an output is ``streaminfer_shadow_agreed_rows_total{output}`` over
``streaminfer_shadow_rows_total``; the shed share is ``streaminfer_shadow_shed_rows_total`` over the shed and
scored rows together.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from consumer.ops.metrics import STAGE_SECONDS_BUCKETS
from consumer.shadow.compare import Comparison, Plan

#: Largest absolute difference per row between the two models' values, in the output's own units: from float32
#: rounding (1e-7) to a different answer (1).
DIFF_BUCKETS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.25, 0.5, 1.0)
#: What became of a candidate's answer bound for ``shadow_results_topic``: acked by the broker, failed (the
#: producer gave up on it), shed (the shadow producer's queue was full).
ANSWER_OUTCOMES = ("acked", "failed", "shed")


class ShadowMetrics:
    """Every ``streaminfer_shadow_*`` metric.

    Args:
        registry: the service's registry.
        plan: the outputs compared (their names label the agreement and difference metrics).
    """

    def __init__(self, registry: CollectorRegistry, plan: Plan) -> None:
        self.registry = registry
        self.rows = Counter(
            "streaminfer_shadow_rows", "Rows the candidate model scored and compared with the serving model.",
            registry=registry,
        )  # fmt: skip
        self.agreed = Counter(
            "streaminfer_shadow_agreed_rows",
            "Rows on which the candidate agrees with the serving model: same label, or same top-1 column of a "
            "[rows, classes] float output.",
            ["output"],
            registry=registry,
        )
        self.max_abs_diff = LabelledBulkHistogram(
            "streaminfer_shadow_max_abs_diff",
            "Largest absolute difference per row between the candidate's and the serving model's float output, "
            "in the output's units (inf: NaN or a different shape on one side).",
            "output",
            plan.floats,
            DIFF_BUCKETS,
            registry,
        )
        self.seconds = Histogram(
            "streaminfer_shadow_seconds",
            "Time the candidate took per run (the micro-batches queued together; feeds assembled and ONNX Runtime, "
            "its own thread), seconds.",
            buckets=STAGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.shed_batches = Counter(
            "streaminfer_shadow_shed_batches",
            "Micro-batches the candidate did not score: shadow_max_pending were already waiting.",
            registry=registry,
        )
        self.shed_rows = Counter("streaminfer_shadow_shed_rows", "Rows of the shed micro-batches.", registry=registry)
        self.failures = Counter(
            "streaminfer_shadow_failures",
            "Micro-batches the candidate failed on (ONNX Runtime raised): not compared, never retried.",
            registry=registry,
        )
        self.pending = Gauge(
            "streaminfer_shadow_pending_batches",
            "Micro-batches offered to the candidate and not yet scored (at most shadow_max_pending).",
            registry=registry,
        )
        self.answers = Counter(
            "streaminfer_shadow_answers",
            "The candidate's answers for shadow_results_topic, by outcome (acked, failed, shed).",
            ["outcome"],
            registry=registry,
        )
        for output in plan.agreement:
            self.agreed.labels(output)
        for outcome in ANSWER_OUTCOMES:
            self.answers.labels(outcome)

    def observe(self, comparison: Comparison, seconds: float) -> None:
        """Count one compared batch (called from the shadow thread: every update is thread-safe)."""
        self.rows.inc(comparison.rows)
        for output, agreed in comparison.agreed.items():
            self.agreed.labels(output).inc(agreed)
        for output, diffs in comparison.diffs.items():
            self.max_abs_diff.observe_many(output, diffs)
        self.seconds.observe(seconds)


class LabelledBulkHistogram:
    """A Prometheus histogram with one label, observed a batch of values at a time (one numpy pass per batch),
    exposed like ``prometheus_client.Histogram``: ``<name>_bucket{label, le}``, ``<name>_count``, ``<name>_sum``.

    Args:
        name: metric name.
        documentation: help text.
        label: the label's name.
        values: the label's values (a fixed set).
        buckets: upper bounds, increasing; ``+Inf`` is added.
        registry: where to register.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        label: str,
        values: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._label = label
        self._upper = np.array([*buckets, math.inf], dtype=np.float64)
        self._counts = {value: np.zeros(len(self._upper), dtype=np.int64) for value in values}
        self._sums = dict.fromkeys(values, 0.0)
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, value: str, observed: np.ndarray) -> None:
        """Count every value of ``observed`` under label ``value`` (one of the fixed set)."""
        arr = np.asarray(observed, dtype=np.float64)
        if arr.size == 0:
            return
        counts = np.bincount(np.searchsorted(self._upper, arr, side="left"), minlength=len(self._upper))
        finite = arr[np.isfinite(arr)]
        total = float(finite.sum())
        with self._lock:
            self._counts[value] += counts
            self._sums[value] += total

    def describe(self) -> list[Metric]:
        """The metric's name and type, for the registry."""
        return [HistogramMetricFamily(self._name, self._documentation, labels=[self._label])]

    def collect(self) -> Iterator[Metric]:
        """The current buckets (cumulative), count and sum per label value (the sum of the finite values)."""
        family = HistogramMetricFamily(self._name, self._documentation, labels=[self._label])
        bounds = [floatToGoString(le) for le in self._upper.tolist()]  # type: ignore[no-untyped-call]
        with self._lock:
            for value, counts in self._counts.items():
                cumulative = np.cumsum(counts).tolist()
                family.add_metric([value], list(zip(bounds, cumulative, strict=True)), self._sums[value])
        yield family
