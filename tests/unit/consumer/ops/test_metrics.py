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


class FakeNvml:
    """NVML's utilisation read as a fake: a percentage, or an error once the GPU is lost."""

    def __init__(self, percent: float) -> None:
        self.percent = percent
        self.lost = False

    def utilization(self) -> float:
        if self.lost:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return self.percent / 100.0


def test_gpu_utilization_is_read_at_scrape_time_beside_the_memory() -> None:
    metrics = Metrics(CollectorRegistry())
    nvml = FakeNvml(37.0)
    assert metrics.track_gpu_memory(1, read_used_bytes=lambda: 2048.0, read_utilization=nvml.utilization)
    r = metrics.registry
    assert r.get_sample_value("streaminfer_gpu_utilization_ratio", {"device": "1"}) == pytest.approx(0.37)
    assert r.get_sample_value("streaminfer_gpu_memory_used_bytes", {"device": "1"}) == 2048
    nvml.percent = 95.0
    assert r.get_sample_value("streaminfer_gpu_utilization_ratio", {"device": "1"}) == pytest.approx(0.95)


def test_a_failing_gpu_read_gives_no_sample_and_the_scrape_still_answers() -> None:
    from prometheus_client import generate_latest

    metrics = Metrics(CollectorRegistry())
    nvml = FakeNvml(50.0)
    metrics.track_gpu_memory(0, read_used_bytes=lambda: 1.0, read_utilization=nvml.utilization)
    nvml.lost = True
    text = generate_latest(metrics.registry).decode()
    assert "streaminfer_gpu_utilization_ratio{" not in text
    assert "streaminfer_records_total" in text


def test_no_gpu_no_utilization_sample() -> None:
    metrics = Metrics(CollectorRegistry())
    if metrics.track_gpu_memory(0):
        pytest.skip("this machine has an NVIDIA driver")
    assert metrics.registry.get_sample_value("streaminfer_gpu_utilization_ratio", {"device": "0"}) is None


def test_the_process_cpu_time_is_exported() -> None:
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("prometheus_client's ProcessCollector reads /proc")
    metrics = Metrics(CollectorRegistry())
    cpu = metrics.registry.get_sample_value("process_cpu_seconds_total")
    assert cpu is not None
    assert cpu > 0
