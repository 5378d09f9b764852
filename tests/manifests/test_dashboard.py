"""The Grafana dashboard only queries metrics the consumer really exports, and shows the ones operators need."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from consumer.ops.metrics import Metrics
from consumer.shadow.compare import Plan
from consumer.shadow.metrics import ShadowMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "k8s" / "grafana" / "streaminfer-dashboard.json"
METRIC = re.compile(r"\b((?:streaminfer|process)_[a-z_]+)")


def exported_names() -> set[str]:
    """Every sample name the metrics module can export (histogram _bucket/_sum/_count, counter _total ...)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.gpu_memory_used_bytes.labels("0").set(0)
    metrics.gpu_utilization.track(0, lambda: 0.0)
    metrics.consumer_lag.labels("requests", "0").set(0)
    metrics.commit_failures.labels("CommitFailedError").inc(0)
    metrics.model.info({"model_name": "m", "model_version": "1", "provider": "CPUExecutionProvider"})
    ShadowMetrics(registry, Plan(labels=("label",), top1=("probabilities",), floats=("probabilities",)))
    return {sample.name for family in registry.collect() for sample in family.samples}


def queried_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    return {name for expr in exprs for name in METRIC.findall(expr)}


def test_every_queried_metric_is_exported() -> None:
    missing = queried_names() - exported_names()
    assert not missing, f"dashboard queries metrics the consumer does not export: {sorted(missing)}"


def test_dashboard_covers_what_operators_ask() -> None:
    queried = queried_names()
    for needed in (
        "streaminfer_records_total",
        "streaminfer_batch_rows_bucket",
        "streaminfer_inference_seconds_bucket",
        "streaminfer_preprocess_seconds_bucket",
        "streaminfer_consumer_lag_records",
        "streaminfer_dead_letters_total",
        "streaminfer_model_info",
        "streaminfer_rebalance_seconds_sum",
        "streaminfer_rebalances_total",
    ):
        assert needed in queried


def test_panel_ids_unique() -> None:
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))


def test_a_rebalance_panel_sits_beside_the_lag_panel() -> None:
    """An operator sees what a scale step cost next to the lag it caused: each phase's time and the count."""
    panels = json.loads(DASHBOARD.read_text())["panels"]

    def queries(panel: dict[str, object]) -> str:
        return " ".join(t["expr"] for t in panel.get("targets", []))  # type: ignore[attr-defined]

    lag = next(p for p in panels if "streaminfer_consumer_lag_records" in queries(p))
    rebalance = next(p for p in panels if "streaminfer_rebalance_seconds_sum" in queries(p))
    assert "by (phase)" in queries(rebalance)
    assert "streaminfer_rebalances_total" in queries(rebalance)
    assert rebalance["gridPos"]["y"] == lag["gridPos"]["y"]
    assert rebalance["gridPos"]["x"] == lag["gridPos"]["x"] + lag["gridPos"]["w"]


def test_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        g = panel["gridPos"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {panel['id']} overlaps another"
        taken |= cells


def test_a_gates_row_shows_what_streaminfer_gates_reads() -> None:
    """CPU per record, the stages' shares, GPU utilisation, batches of 1 and p99, in one row under its header."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    row = next(p for p in panels if p["type"] == "row" and "gates" in p["title"])
    below = [p for p in panels if p["gridPos"]["y"] == row["gridPos"]["y"] + row["gridPos"]["h"]]
    exprs = " ".join(t["expr"] for p in below for t in p["targets"])
    for needed in (
        "process_cpu_seconds_total",
        "streaminfer_gpu_utilization_ratio",
        'stage=~"decode|assemble|encode"',
        'le="1.0"',
        "streaminfer_record_age_seconds_bucket",
    ):
        assert needed in exprs, needed


def test_a_shadow_row_shows_agreement_differences_shedding_and_time() -> None:
    """With shadow_model_path set: agreement per output, the differences' quantiles, the shed share, the
    candidate's time beside the serving model's, in one row under its header."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    row = next(p for p in panels if p["type"] == "row" and "Shadow" in p["title"])
    below = [p for p in panels if p["gridPos"]["y"] == row["gridPos"]["y"] + row["gridPos"]["h"]]
    exprs = " ".join(t["expr"] for p in below for t in p["targets"])
    for needed in (
        "streaminfer_shadow_agreed_rows_total",
        "streaminfer_shadow_rows_total",
        "streaminfer_shadow_max_abs_diff_bucket",
        "streaminfer_shadow_shed_rows_total",
        "streaminfer_shadow_seconds_bucket",
        "streaminfer_inference_seconds_bucket",
    ):
        assert needed in exprs, needed
