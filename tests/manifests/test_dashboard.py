"""The Grafana dashboard only queries metrics the consumer really exports, and shows the ones operators need."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from consumer.ops.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "k8s" / "grafana" / "streaminfer-dashboard.json"
METRIC = re.compile(r"\b(streaminfer_[a-z_]+)")


def exported_names() -> set[str]:
    """Every sample name the metrics module can export (histogram _bucket/_sum/_count, counter _total ...)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.gpu_memory_used_bytes.labels("0").set(0)
    metrics.consumer_lag.labels("requests", "0").set(0)
    metrics.commit_failures.labels("CommitFailedError").inc(0)
    metrics.model.info({"model_name": "m", "model_version": "1", "provider": "CPUExecutionProvider"})
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
    ):
        assert needed in queried


def test_panel_ids_unique() -> None:
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))
