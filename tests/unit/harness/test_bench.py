"""streaminfer-bench's arithmetic: throughput from append times, latency percentiles, mean batch size, last line."""

from __future__ import annotations

import math

import pytest

from harness.bench import latency_pcts, mean_batch, summary_line, throughput

LAST = (
    "bench: digits_vs_passthrough=0.60 digits_vs_naive=125.00 minilm_vs_bare_ort=0.93 digits_eos_vs_alo=0.81 "
    "vision_vs_ceiling=0.87"
)


def test_throughput_from_append_times() -> None:
    stamps = [(1_000 + 10 * i, 0) for i in range(101)]  # 101 results over 1 s
    assert throughput(stamps) == pytest.approx(100.0)
    assert math.isnan(throughput([(5, 0)]))


def test_latency_percentiles_skip_unknown_request_times() -> None:
    stamps = [(100 + i, 100) for i in range(100)] + [(5000, -1)]
    p50, p95, p99 = latency_pcts(stamps)
    assert p50 == pytest.approx(49.5)
    assert p95 == pytest.approx(94.05)
    assert p99 == pytest.approx(98.01)


def test_mean_batch_from_cumulative_buckets() -> None:
    assert mean_batch({"1.0": 10, "2.0": 10, "4.0": 10, "+Inf": 10}) == pytest.approx(1.0)
    assert mean_batch({"32.0": 0, "64.0": 4, "+Inf": 4}) == pytest.approx(48.0)
    assert math.isnan(mean_batch({}))


def test_summary_line_form() -> None:
    ratios = {
        "digits_vs_passthrough": 0.6,
        "digits_vs_naive": 125.0,
        "minilm_vs_bare_ort": 0.934,
        "digits_eos_vs_alo": 0.805,
        "vision_vs_ceiling": 0.8712,
    }
    assert summary_line(ratios) == LAST
