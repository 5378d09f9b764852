"""streaminfer-bench's arithmetic: throughput from append times, latency percentiles, mean batch size, last line."""

from __future__ import annotations

import argparse
import math
import os
import socket
from pathlib import Path

import pytest

from harness.bench import latency_pcts, mean_batch, summary_line, throughput
from harness.bench.measure import Run, Sampler, listening_pids
from harness.bench.plan import RATIOS as PLAN_RATIOS
from harness.bench.plan import Bench
from harness.bench.report import cpu_reading, other_cpu_pct, rounds_line

LAST = (
    "bench: digits_vs_passthrough=0.60 digits_vs_naive=125.00 minilm_vs_bare_ort=0.93 digits_eos_vs_alo=0.81 "
    "vision_vs_ceiling=0.87 events_vs_passthrough=0.71 avro_events_vs_passthrough=nan "
    "digits_cpu_vs_passthrough=nan events_cpu_vs_passthrough=nan avro_events_cpu_vs_passthrough=nan "
    "digits_eos_cpu_vs_alo=nan wide_digits_vs_passthrough=nan wide_digits_cpu_vs_passthrough=nan "
    "wide_digits_eos_cpu_vs_alo=nan first_answer_alo_s=nan first_answer_eos_s=nan wide_first_answer_alo_s=nan "
    "wide_first_answer_eos_s=nan shadow_digits_vs_off=nan shadow_digits_cpu_vs_off=nan shadow_digits_shed_share=nan "
    "shadow_slow_digits_vs_off=nan shadow_slow_digits_cpu_vs_off=nan shadow_slow_digits_shed_share=nan"
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


RATIOS = {
    "digits_vs_passthrough": 0.6,
    "digits_vs_naive": 125.0,
    "minilm_vs_bare_ort": 0.934,
    "digits_eos_vs_alo": 0.805,
    "vision_vs_ceiling": 0.8712,
    "events_vs_passthrough": 0.708,
}


def test_summary_line_form() -> None:
    assert summary_line(RATIOS) == LAST  # a ratio not measured is nan


def test_each_ratio_over_rounds_has_its_spread_beside_it_and_every_word_is_key_value() -> None:
    spreads = {"digits_vs_passthrough": 0.054, "events_vs_passthrough": 0.1, "avro_events_vs_passthrough": math.nan}
    line = summary_line(RATIOS, spreads)
    assert line.startswith("bench: digits_vs_passthrough=0.60 digits_vs_passthrough_spread=0.05 digits_vs_naive=")
    assert " events_vs_passthrough=0.71 events_vs_passthrough_spread=0.10 avro_events_vs_passthrough=nan " in line
    words = dict(w.split("=") for w in line.split()[1:])
    assert [k for k in words if not k.endswith("_spread")] == list(PLAN_RATIOS)
    assert list(PLAN_RATIOS[: len(RATIOS) + 1]) == [*RATIOS, "avro_events_vs_passthrough"]  # the old keys first
    assert words["avro_events_vs_passthrough_spread"] == "nan"
    assert "digits_vs_naive_spread" not in words  # one run, no rounds


def run(
    model: str, mode: str, rps: float, round_: int | None = None, default: bool = False, cpu_us: float = math.nan
) -> Run:
    extra: dict[str, object] = {"default": default}
    if round_ is not None:
        extra["round"] = round_
    return Run(model, mode, "s", 1000, rps, cpu_us_per_record=cpu_us, extra=extra)


def test_ratios_pair_runs_of_the_same_round_and_leave_the_cold_first_runs_out() -> None:
    bench = Bench(argparse.Namespace(bootstrap_servers="unused:9092", out=Path("unused")))
    bench.runs = [
        run("digits", "passthrough", 20_000.0),  # the first pass of the run (warm-up aside): not a round
        run("digits", "streaminfer", 17_000.0, default=True),  # the sweep's default setting: not a round
        run("digits", "naive", 85.0),
        # rounds, each back to back: passthrough, streaminfer, eos (rotated)
        run("digits", "passthrough", 40_000.0, 1), run("digits", "streaminfer", 20_000.0, 1),
        run("digits", "streaminfer-eos", 16_000.0, 1),
        run("digits", "streaminfer", 22_000.0, 2), run("digits", "streaminfer-eos", 22_000.0, 2),
        run("digits", "passthrough", 40_000.0, 2),
        run("digits", "streaminfer-eos", 12_000.0, 3), run("digits", "passthrough", 30_000.0, 3),
        run("digits", "streaminfer", 15_000.0, 3),
        run("events-json", "passthrough", 30_000.0, 1), run("events-json", "streaminfer", 21_000.0, 1),
        run("events-json", "streaminfer", 18_000.0, 2), run("events-json", "passthrough", 30_000.0, 2),
        run("events-avro", "passthrough", 40_000.0, 1),  # a round whose streaminfer run is missing: left out
        # MiniLM: round 1 is the first run of each, untagged (the fastest bare ORT batching is the ceiling)
        run("minilm", "bare-ort", 100.0), run("minilm", "bare-ort", 145.0),
        run("minilm", "streaminfer", 130.0, default=True),
        run("minilm", "bare-ort", 150.0, 2), run("minilm", "streaminfer", 120.0, 2),
    ]  # fmt: skip
    per_round = bench.per_round()
    assert per_round["digits_vs_passthrough"] == pytest.approx([0.5, 0.55, 0.5])
    assert per_round["digits_eos_vs_alo"] == pytest.approx([0.8, 1.0, 0.8])
    assert per_round["events_vs_passthrough"] == pytest.approx([0.7, 0.6])
    assert per_round["avro_events_vs_passthrough"] == []
    assert per_round["minilm_vs_bare_ort"] == pytest.approx([130 / 145, 0.8])
    ratios, spreads = bench.ratios(), bench.spreads()
    assert ratios["digits_vs_passthrough"] == pytest.approx(0.5)  # the median, not the cold 17,000 / 20,000
    assert spreads["digits_vs_passthrough"] == pytest.approx(0.05)
    assert ratios["digits_vs_naive"] == pytest.approx(17_000 / 85)
    assert (ratios["events_vs_passthrough"], spreads["events_vs_passthrough"]) == pytest.approx((0.65, 0.1))
    assert math.isnan(ratios["avro_events_vs_passthrough"])
    assert math.isnan(spreads["avro_events_vs_passthrough"])
    assert math.isnan(spreads["vision_vs_ceiling"])
    words = dict(w.split("=") for w in summary_line(ratios, spreads).split()[1:])
    assert words["digits_vs_passthrough"] == "0.50"
    assert words["digits_vs_passthrough_spread"] == "0.05"


def test_the_summary_line_ends_with_the_other_work_on_the_machine_and_rounds_lines_say_it_too() -> None:
    line = summary_line(RATIOS, {"digits_vs_passthrough": 0.1}, other_cpu=57.4)
    assert line.endswith(" shadow_slow_digits_shed_share=nan other_cpu_pct=57")
    assert rounds_line("streaminfer/passthrough", [0.5, 0.62, 0.55], 57.4) == (
        "rounds streaminfer/passthrough: 0.50 0.62 0.55 (the ratio is their median; spread 0.12; other work on the "
        "machine: 57 % CPU)"
    )
    assert rounds_line("x", [0.5], math.nan) == "rounds x: 0.50 (the ratio is their median; spread 0.00)"
    runs = [
        {"extra": {"round": 1, "other_cpu_pct": 40.0}},
        {"extra": {"round": 2, "other_cpu_pct": 80.0}},
        {"extra": {"other_cpu_pct": 190.0}},  # not a round: the sweep, the warm-up
        {"extra": {"round": 3, "other_cpu_pct": None}},  # strict JSON's NaN
    ]
    assert other_cpu_pct(runs) == 60.0
    assert math.isnan(other_cpu_pct([]))


def test_the_broker_is_found_by_its_listening_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert os.getpid() in listening_pids(f"127.0.0.1:{port}")
    assert listening_pids(f"127.0.0.1:{port}") == []  # closed


def sampler(samples: list[tuple[float, float]]) -> Sampler:
    """A Sampler of this process whose readings are ``samples`` (epoch s, CPU s), never started."""
    out = Sampler(os.getpid())
    out.samples = [(t, cpu, 0) for t, cpu in samples]
    return out


def test_cpu_per_record_is_the_cpu_time_read_at_both_ends_of_the_results_window() -> None:
    # CPU time 2 s/s from t=100 to 110 (a process using two cores), results at 1,000/s from 101 s to 105 s
    s = sampler([(100.0 + 0.1 * i, 2.0 * 0.1 * i) for i in range(101)])
    assert s.cpu_s_at(100.05) == pytest.approx(0.1)  # between two readings: linear
    assert math.isnan(s.cpu_s_at(99.0))
    stamps = [(101_000 + i, 0) for i in range(4001)]  # 4,001 results, 4,000 after the first
    assert s.cpu_us_per_record(stamps) == pytest.approx(2e6 * 4.0 / 4000)  # 8 s of CPU / 4,000 records = 2,000 us
    early = [(99_000 + i, 0) for i in range(4001)]  # results from before the first reading: the window is clipped
    assert s.cpu_us_per_record(early) == pytest.approx(2e6 * 3.0 / 3000)
    assert math.isnan(s.cpu_us_per_record(stamps[:1]))
    assert math.isnan(sampler([(100.0, 0.0)]).cpu_us_per_record(stamps))


def test_cpu_ratios_are_the_ceilings_cpu_per_record_over_streaminfers_per_round() -> None:
    bench = Bench(argparse.Namespace(bootstrap_servers="unused:9092", out=Path("unused")))
    bench.runs = [
        run("digits", "passthrough", 40_000.0, 1, cpu_us=8.0), run("digits", "streaminfer", 20_000.0, 1, cpu_us=20.0),
        run("digits", "streaminfer-eos", 16_000.0, 1, cpu_us=25.0),
        run("digits", "passthrough", 30_000.0, 2, cpu_us=9.0), run("digits", "streaminfer", 15_000.0, 2, cpu_us=18.0),
        run("digits", "streaminfer-eos", 15_000.0, 2, cpu_us=math.nan),  # not measured: that round is left out
        run("digits-wide", "passthrough", 30_000.0, 1, cpu_us=10.0),
        run("digits-wide", "streaminfer", 10_000.0, 1, cpu_us=40.0),
    ]  # fmt: skip
    bench.runs[1].extra["first_answer_s"] = 0.4
    bench.runs[4].extra["first_answer_s"] = 0.6
    per_round = bench.per_round()
    assert per_round["digits_cpu_vs_passthrough"] == pytest.approx([0.4, 0.5])
    assert per_round["digits_eos_cpu_vs_alo"] == pytest.approx([0.8])
    assert per_round["wide_digits_cpu_vs_passthrough"] == pytest.approx([0.25])
    assert per_round["wide_digits_vs_passthrough"] == pytest.approx([1 / 3])
    assert per_round["first_answer_alo_s"] == pytest.approx([0.4, 0.6])
    ratios, spreads = bench.ratios(), bench.spreads()
    assert ratios["digits_cpu_vs_passthrough"] == pytest.approx(0.45)
    assert spreads["digits_cpu_vs_passthrough"] == pytest.approx(0.1)
    assert ratios["digits_vs_passthrough"] == pytest.approx(0.5)  # the throughput ratio stays beside it
    assert ratios["first_answer_alo_s"] == pytest.approx(0.5)
    assert math.isnan(ratios["events_cpu_vs_passthrough"])
    text = "\n".join(cpu_reading({"ratios": ratios, "spreads": spreads, "wide_partitions": 128}))
    assert "| `digits_vs_passthrough` / `digits_cpu_vs_passthrough` | 0.50 (spread 0.00) | 0.45 (spread 0.10) |" in text
    assert "**The CPU ratio is the one that reproduces.**" in text
    assert "128-partition" in text
    assert "at most the throughput ratio's in 2 of 3 pairs" in text


def test_the_shadow_row_pairs_rounds_with_and_without_a_shadow_and_takes_the_median_shed_share() -> None:
    bench = Bench(argparse.Namespace(bootstrap_servers="unused:9092", out=Path("unused")))
    shadow = "streaminfer-shadow"
    bench.runs = [
        run("digits", "streaminfer", 20_000.0, 1, cpu_us=20.0), run("digits", shadow, 19_000.0, 1, cpu_us=22.0),
        run("digits", "streaminfer", 18_000.0, 2, cpu_us=21.0), run("digits", shadow, 18_000.0, 2, cpu_us=21.0),
        run("digits", "streaminfer", 10_000.0, 3, cpu_us=20.0), run("digits", shadow, 8_000.0, 3, cpu_us=25.0),
    ]  # fmt: skip
    for r, shed in zip(bench.runs[1::2], (0.0, 0.02, 0.5), strict=True):
        r.extra["shadow_shed_share"] = shed
    per_round = bench.per_round()
    assert per_round["shadow_digits_vs_off"] == pytest.approx([0.95, 1.0, 0.8])
    assert per_round["shadow_digits_cpu_vs_off"] == pytest.approx([20 / 22, 1.0, 0.8])
    assert per_round["shadow_digits_shed_share"] == pytest.approx([0.0, 0.02, 0.5])
    ratios = bench.ratios()
    assert ratios["shadow_digits_vs_off"] == pytest.approx(0.95)
    assert ratios["shadow_digits_cpu_vs_off"] == pytest.approx(20 / 22)
    assert ratios["shadow_digits_shed_share"] == pytest.approx(0.02)
    assert math.isnan(ratios["shadow_slow_digits_vs_off"])  # no slow-shadow run: its keys nan, not the other's


def test_the_slow_shadow_row_pairs_its_own_runs_and_shed_share() -> None:
    bench = Bench(argparse.Namespace(bootstrap_servers="unused:9092", out=Path("unused")))
    same, slow = "streaminfer-shadow", "streaminfer-shadow-slow"
    bench.runs = [
        run("digits", "streaminfer", 20_000.0, 1, cpu_us=20.0), run("digits", same, 19_000.0, 1, cpu_us=21.0),
        run("digits", slow, 16_000.0, 1, cpu_us=40.0),
        run("digits", "streaminfer", 18_000.0, 2, cpu_us=20.0), run("digits", same, 18_000.0, 2, cpu_us=20.0),
        run("digits", slow, 9_000.0, 2, cpu_us=50.0),
    ]  # fmt: skip
    for r, shed in zip(bench.runs, (math.nan, 0.0, 0.7, math.nan, 0.01, 0.9), strict=True):
        r.extra["shadow_shed_share"] = shed
    per_round = bench.per_round()
    assert per_round["shadow_slow_digits_vs_off"] == pytest.approx([0.8, 0.5])
    assert per_round["shadow_slow_digits_cpu_vs_off"] == pytest.approx([0.5, 0.4])
    assert per_round["shadow_slow_digits_shed_share"] == pytest.approx([0.7, 0.9])
    assert per_round["shadow_digits_vs_off"] == pytest.approx([0.95, 1.0])
    ratios = bench.ratios()
    assert ratios["shadow_slow_digits_vs_off"] == pytest.approx(0.65)
    assert ratios["shadow_slow_digits_shed_share"] == pytest.approx(0.8)


def test_plots_without_digits_runs_draw_nothing(tmp_path: Path) -> None:
    """--skip-digits leaves no closed digits run: no figure (a log axis over no bars raised in matplotlib)."""
    from harness.bench.report import plots

    assert plots({"runs": []}, tmp_path) == []
    assert list(tmp_path.iterdir()) == []
