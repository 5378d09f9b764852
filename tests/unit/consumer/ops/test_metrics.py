"""Metrics (consumer/ops/metrics.py): GPU memory read at scrape time, bulk histograms."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from consumer.ops.metrics import Metrics


def test_gpu_memory_is_read_at_scrape_time() -> None:
    metrics = Metrics(CollectorRegistry())
    used = [1024.0]
    assert metrics.track_gpu_memory(0, read_used_bytes=lambda: used[0])
    assert metrics.registry.get_sample_value("streaminfer_gpu_memory_used_bytes", {"device": "0"}) == 1024
    used[0] = 4096.0
    assert metrics.registry.get_sample_value("streaminfer_gpu_memory_used_bytes", {"device": "0"}) == 4096


def test_gpu_memory_absent_without_nvml() -> None:
    metrics = Metrics(CollectorRegistry())
    if metrics.track_gpu_memory(0):
        pytest.skip("this machine has an NVIDIA driver")
    assert metrics.registry.get_sample_value("streaminfer_gpu_memory_used_bytes", {"device": "0"}) is None


def test_bulk_histograms_expose_buckets_count_and_sum() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_age_seconds.observe_many([0.001, 0.02, 0.02, 100.0])
    metrics.preprocess_seconds.observe(0.0003, 500)
    r = metrics.registry
    assert r.get_sample_value("streaminfer_record_age_seconds_bucket", {"le": "0.001"}) == 1  # le is inclusive
    assert r.get_sample_value("streaminfer_record_age_seconds_bucket", {"le": "0.025"}) == 3
    assert r.get_sample_value("streaminfer_record_age_seconds_bucket", {"le": "+Inf"}) == 4
    assert r.get_sample_value("streaminfer_record_age_seconds_count") == 4
    assert r.get_sample_value("streaminfer_record_age_seconds_sum") == pytest.approx(100.041)
    assert r.get_sample_value("streaminfer_preprocess_seconds_count") == 500
    assert r.get_sample_value("streaminfer_preprocess_seconds_bucket", {"le": "0.00025"}) == 0
    assert r.get_sample_value("streaminfer_preprocess_seconds_bucket", {"le": "0.0005"}) == 500
