"""streaminfer-gates: the window's figures from two scrapes, the gates on them, and the verdicts on scrapes recorded
from real runs (tests/fixtures/gates/, recorded by ``python -m harness.bench.gates``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from consumer.ops.metrics import Metrics
from producer_tools.gates import (
    COMPUTE,
    KAFKA,
    NOTHING,
    PREPROCESSING,
    Figures,
    Scrape,
    Thresholds,
    figures,
    gates,
    main,
    quantile,
    replay,
    report,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gates"


def exposition(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_quantile_interpolates_within_its_bucket_as_prometheus_does() -> None:
    cumulative = {0.1: 50.0, 0.2: 90.0, 0.5: 100.0, math.inf: 100.0}
    assert quantile(0.5, cumulative) == pytest.approx(0.1)
    assert quantile(0.7, cumulative) == pytest.approx(0.15)
    assert quantile(0.99, cumulative) == pytest.approx(0.2 + 0.3 * 0.9)
    assert quantile(0.99, {1.0: 0.0, math.inf: 10.0}) == 1.0  # in +Inf: the highest finite bound
    assert math.isnan(quantile(0.99, {}))


def test_the_window_is_the_difference_of_two_scrapes_of_a_real_registry() -> None:
    metrics = Metrics(CollectorRegistry())
    gpu = [0.2]
    metrics.track_gpu_memory(0, read_used_bytes=lambda: 3 * 2**30, read_utilization=lambda: gpu[0])
    metrics.records.labels("result").inc(1000)
    metrics.stage_seconds.labels("decode").inc(1.0)
    before = Scrape("a", 100.0, exposition(metrics))
    metrics.records.labels("result").inc(9_000)
    metrics.records.labels("dead_letter").inc(1_000)
    for stage, seconds in {"fetch": 0.05, "decode": 0.10, "infer": 0.02, "produce": 0.03}.items():
        metrics.stage_seconds.labels(stage).inc(seconds)
    for _ in range(150):
        metrics.batch_rows.observe(64)
    for _ in range(50):
        metrics.batch_rows.observe(1)
    metrics.record_age_seconds.observe_many([0.004] * 99 + [2.0])
    gpu[0] = 0.4
    after = Scrape("a", 110.0, exposition(metrics))
    f = figures([(before, after)])
    assert f.records == 10_000  # both outcomes, the first 1,000 before the window left out
    assert f.records_per_s == pytest.approx(1_000)
    assert f.stage_us["decode"] == pytest.approx(10.0)  # 0.1 s / 10,000 records
    assert f.share(["decode"]) == pytest.approx(0.5)
    assert f.batches == 200
    assert f.batch_rows[1.0] == pytest.approx(0.25)
    assert f.batch_rows[64.0] == pytest.approx(0.75)
    assert f.mean_rows == pytest.approx((150 * 64 + 50) / 200)
    assert f.gpu_utilization == pytest.approx(0.4)  # read at the second scrape
    assert f.gpu_memory_bytes == 3 * 2**30
    assert 0.0025 < f.p99_age_s <= 0.005
    assert f.cpu_cores >= 0  # this process's own CPU over the (made-up) window: a number, not checked


def made(**overrides: object) -> Figures:
    base: dict[str, object] = {
        "consumers": 1, "window_s": 10.0, "records": 100_000.0, "records_per_s": 10_000.0, "batches": 2_000.0,
        "batch_rows": {64.0: 1.0}, "mean_rows": 50.0,
        "stage_us": {"fetch": 5.0, "decode": 10.0, "assemble": 0.2, "infer": 1.3, "encode": 3.0, "produce": 6.0,
                     "commit": 3.7},
        "cpu_cores": 0.95, "cpu_us_per_record": 33.0, "gpu_utilization": None, "gpu_memory_bytes": None,
        "p99_age_s": 0.05, "p99_infer_s": 0.001,
    }  # fmt: skip
    return Figures(**(base | overrides))  # type: ignore[arg-type]


def test_each_gate_on_made_figures() -> None:
    t = Thresholds()
    # issue 33's digits stages: Python stages 45 % with a saturated core and no GPU: preprocessing-bound
    assert gates(made(), t).verdict == PREPROCESSING
    # the core is not saturated, a backlog waits, the client's stages are the largest: Kafka-bound
    assert gates(made(cpu_cores=0.4, p99_age_s=0.5), t).verdict == KAFKA
    assert gates(made(cpu_cores=0.4), t).verdict == NOTHING  # p99 under its threshold: nothing to do
    busy_gpu = made(gpu_utilization=0.6, stage_us={"fetch": 1.0, "decode": 2.0, "infer": 1.0})
    assert gates(busy_gpu, t).verdict == NOTHING
    compute = made(stage_us={"fetch": 1.0, "decode": 2.0, "infer": 40.0}, p99_age_s=0.5, gpu_utilization=0.95)
    assert gates(compute, t).verdict == COMPUTE
    assert gates(made(stage_us={"fetch": 1.0, "decode": 2.0, "infer": 40.0}, p99_age_s=0.05), t).verdict == NOTHING
    lines = report(made(batch_rows={1.0: 0.9, 64.0: 0.1}), gates(made(), t))
    assert any("most batches hold 1 row (90 %)" in line for line in lines)
    assert lines[-1] == f"verdict: {PREPROCESSING}"


@pytest.mark.parametrize(
    ("name", "verdicts"), [("digits", {PREPROCESSING, KAFKA}), ("heavy", {COMPUTE}), ("minilm", {COMPUTE})]
)
def test_verdicts_on_scrapes_recorded_from_real_runs(
    name: str, verdicts: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = FIXTURES / f"{name}.json"
    f = figures(replay(path))
    assert f.records > 1000, "the recorded window holds the drain"
    reading = gates(f, Thresholds())
    assert reading.verdict in verdicts, "\n".join(report(f, reading))
    if name in ("heavy", "minilm"):
        assert f.share(["infer"]) > 0.5  # the figure behind it: ONNX Runtime's time dominates
    else:
        assert f.share(["infer"]) < 0.2
        assert f.mean_rows > 8  # a backlog: batches fill
    assert main(["--replay", str(path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f"verdict: {reading.verdict}"
    assert any(line.startswith("stages, us/record: fetch=") for line in printed)
    assert any(line.startswith("process CPU: ") for line in printed)


def test_bad_use_exits_2_and_an_unanswering_consumer_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])  # neither URLs nor --replay
    assert exc.value.code == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["--replay", str(bad)]) == 2
    assert "not a streaminfer-gates record" in capsys.readouterr().err
    assert main(["http://127.0.0.1:9", "--window", "0.01"]) == 1  # the discard port: refused
    assert "did not answer" in capsys.readouterr().err
