"""The benchmark page's reading is generated from the run: every figure it states is the run's, a comparison whose
runs are missing is left out, and a target is judged from the figure (harness/bench/reading.py)."""

from __future__ import annotations

import math
from typing import Any

from harness.bench.reading import cpu_us_per_record, reading


def run(model: str, mode: str, setting: str, rps: float, cpu: float = math.nan, **extra: Any) -> dict[str, Any]:
    return {"model": model, "mode": mode, "setting": setting, "throughput_rps": rps, "p50_ms": math.nan,
            "p99_ms": math.nan, "cpu_pct": cpu, "extra": extra}  # fmt: skip


def events_result(ratio: float) -> dict[str, Any]:
    return {
        "runs": [
            run("events-json", "passthrough", "client only, round 1", 60_000, 66, round=1),
            run("events-json", "streaminfer", "b64/d5ms, round 1", 30_000, 84, round=1),
            run("events-json", "passthrough", "client only, round 2", 64_000, 70, round=2),
            run("events-json", "streaminfer", "b64/d5ms, round 2", 31_000, 86, round=2),
        ],
        "ratios": {"events_vs_passthrough": ratio, "minilm_vs_bare_ort": 0.95},
        "rounds": {"events-json streaminfer/passthrough": [0.50, 0.48]},
        "other_cpu_pct": {"events_vs_passthrough": 3.0},
    }


def test_the_events_rows_are_read_with_their_own_figures() -> None:
    (bullet,) = reading(events_result(0.49))
    assert bullet.startswith("- **JSON events**")
    assert "30,000 to 31,000 records/s over the rounds, against 60,000 to 64,000 records/s" in bullet
    assert "**0.49** of it (the median of the rounds 0.50 0.48; spread 0.02; other work on the machine 3 %" in bullet
    # CPU per record: 84 % of a core at 30,000/s is 28.0 us; 86 % at 31,000/s 27.7 us; median 27.9 us
    assert "CPU per record, the process's own (medians over the rounds): 27.9 us against 11.0 us." in bullet


def test_a_ratio_without_its_runs_is_left_out_and_a_target_is_judged() -> None:
    assert reading({"runs": [], "ratios": {"events_vs_passthrough": 0.5}}) == []
    assert reading(events_result(math.nan)) == []
    result = {
        "runs": [
            run("minilm", "streaminfer", "b64/d5ms text, round 2", 430, round=2),
            run("minilm", "bare-ort", "b32 sorted, round 2", 470, round=2),
        ],
        "ratios": {"minilm_vs_bare_ort": 0.91},
        "rounds": {"minilm streaminfer/bare-ort": [0.91]},
    }
    (bullet,) = reading(result)
    assert "target 0.90: met" in bullet
    result["ratios"]["minilm_vs_bare_ort"] = 0.89
    assert "target 0.90: not met" in reading(result)[0]


def test_cpu_per_record() -> None:
    assert cpu_us_per_record(run("d", "m", "s", 50_000, 100)) == 20.0
    assert math.isnan(cpu_us_per_record(run("d", "m", "s", 50_000)))


def test_unmeasured_figures_do_not_break_the_reading() -> None:
    result = events_result(0.49)
    result["runs"][1]["throughput_rps"] = math.nan  # a run that measured nothing
    (bullet,) = reading(result)
    assert "31,000 records/s over the rounds" in bullet


def test_the_shadow_bullet_gives_the_cost_the_cpu_ratio_and_the_shed_share() -> None:
    result = {
        "runs": [
            run("digits", "streaminfer", "b64/d5ms, round 1", 20_000, 90, round=1),
            run("digits", "streaminfer-shadow", "b64/d5ms, round 1", 19_000, 95, round=1),
        ],
        "ratios": {"shadow_digits_vs_off": 0.95, "shadow_digits_cpu_vs_off": 0.9, "shadow_digits_shed_share": 0.012},
        "rounds": {"streaminfer-shadow/streaminfer": [0.95]},
        "other_cpu_pct": {},
    }
    (bullet,) = reading(result)
    assert bullet.startswith("- **shadow scoring** on digits")
    assert "**0.95** of it" in bullet
    assert "target 0.90: met" in bullet
    assert "without the shadow over with it: **0.90**" in bullet
    assert "shed 1.2 % of the rows" in bullet
    result["ratios"]["shadow_digits_vs_off"] = 0.85
    assert "target 0.90: not met" in reading(result)[0]


def test_the_slow_shadow_bullet_reads_its_own_runs_and_keys() -> None:
    result = {
        "runs": [
            run("digits", "streaminfer", "b64/d5ms, round 1", 20_000, 90, round=1),
            run("digits", "streaminfer-shadow-slow", "b64/d5ms, round 1", 15_000, 120, round=1),
        ],
        "ratios": {
            "shadow_slow_digits_vs_off": 0.75,
            "shadow_slow_digits_cpu_vs_off": 0.6,
            "shadow_slow_digits_shed_share": 0.87,
            "shadow_digits_cpu_vs_off": 0.99,  # the same-model row's: not this bullet's
        },
        "rounds": {"streaminfer-shadow-slow/streaminfer": [0.75]},
        "other_cpu_pct": {},
    }
    (bullet,) = reading(result)  # no streaminfer-shadow run: no same-model bullet
    assert bullet.startswith("- **a slow shadow** on digits")
    assert "**0.75** of it" in bullet
    assert "target" not in bullet  # bounded by shedding, no target of its own
    assert "without the shadow over with it: **0.60**" in bullet
    assert "shed 87.0 % of the rows" in bullet
