"""streaminfer-bench at small sizes against the real broker: every mode runs, the outputs exist and hold numbers,
the last line has the exact form. The MiniLM step runs on the small text model (same interface)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import onnx
import pytest

from harness import bench
from harness.bench.plan import SHED_SHARE
from producer_tools.fuse import fuse
from tests.image_model import DECLARED

#: The last line: every ratio, each measured over rounds followed by its spread, all numbers; then the CPU the rest
#: of the machine used meanwhile.
KEYS = [
    "digits_vs_passthrough", "digits_vs_passthrough_spread", "digits_vs_naive",
    "minilm_vs_bare_ort", "minilm_vs_bare_ort_spread", "digits_eos_vs_alo", "digits_eos_vs_alo_spread",
    "vision_vs_ceiling", "vision_vs_ceiling_spread", "events_vs_passthrough", "events_vs_passthrough_spread",
    "avro_events_vs_passthrough", "avro_events_vs_passthrough_spread",
    *(f"{key}{suffix}" for key in (
        "digits_cpu_vs_passthrough", "events_cpu_vs_passthrough", "avro_events_cpu_vs_passthrough",
        "digits_eos_cpu_vs_alo", "wide_digits_vs_passthrough", "wide_digits_cpu_vs_passthrough",
        "wide_digits_eos_cpu_vs_alo", "first_answer_alo_s", "first_answer_eos_s", "wide_first_answer_alo_s",
        "wide_first_answer_eos_s", "shadow_digits_vs_off", "shadow_digits_cpu_vs_off", "shadow_digits_shed_share",
        "shadow_slow_digits_vs_off", "shadow_slow_digits_cpu_vs_off", "shadow_slow_digits_shed_share",
    ) for suffix in ("", "_spread")),
]  # fmt: skip
LAST_LINE = re.compile(r"^bench: " + " ".join(rf"{key}=(\d+\.\d\d)" for key in KEYS) + r" other_cpu_pct=(\d+)$")


def test_quick_bench_runs_every_mode(
    kafka_bootstrap: str,
    schema_registry_url: str,
    tmp_path: Path,
    text_model: tuple[Path, Path],
    image_model: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not bench.DIGITS_MODEL.is_file():
        pytest.skip("make model first (models/digits/artifacts/digits.onnx)")
    model, tokenizer = text_model
    minilm = tmp_path / "minilm"
    minilm.mkdir()
    shutil.copy(model, minilm / "minilm.onnx")
    shutil.copy(tokenizer, minilm / "tokenizer.json")
    vision = tmp_path / "vision"  # the tiny colour classifier and its fused twin stand in for EfficientNet-Lite0
    vision.mkdir()
    shutil.copy(image_model, vision / "efficientnet_lite0.onnx")
    onnx.save(fuse(onnx.load(str(image_model)), DECLARED), str(vision / "efficientnet_lite0_uint8.onnx"))
    out = tmp_path / "results"
    code = bench.main(
        [
            "--bootstrap-servers", kafka_bootstrap,
            "--quick", "--no-progress",
            "--out", str(out),
            "--minilm-dir", str(minilm),
            "--minilm-batch", "16",
            "--vision-dir", str(vision),
            "--schema-registry-url", schema_registry_url,
            "--timeout-s", "60",
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out.strip().splitlines()
    match = LAST_LINE.match(printed[-1])
    assert match, printed[-1]
    assert any(line.startswith("stages (digits streaminfer b64/d5ms), us/record: fetch=") for line in printed)

    result = json.loads((out / "bench.json").read_text())
    ratios = {k: r for k, r in result["ratios"].items() if k not in SHED_SHARE}  # a share of shed rows may be 0
    assert all(r > 0 for r in ratios.values()), result["ratios"]  # the small text model: R3 rounds to 0
    assert all(0 <= result["ratios"][k] <= 1 for k in SHED_SHARE if k in result["ratios"]), result["ratios"]
    words = dict(w.split("=") for w in printed[-1].split()[1:])
    for pair, key in (
        ("streaminfer/passthrough", "digits_vs_passthrough"),
        ("streaminfer-eos/streaminfer", "digits_eos_vs_alo"),
        ("minilm streaminfer/bare-ort", "minilm_vs_bare_ort"),
        ("vision streaminfer/ceiling", "vision_vs_ceiling"),
        ("events-json streaminfer/passthrough", "events_vs_passthrough"),
        ("events-avro streaminfer/passthrough", "avro_events_vs_passthrough"),
    ):
        values = result["rounds"][pair]
        assert len(values) == 2, pair  # --quick: two rounds
        assert result["ratios"][key] == pytest.approx(sum(values) / 2), pair  # the median of two
        assert result["spreads"][key] == pytest.approx(abs(values[0] - values[1])), pair
        assert float(words[f"{key}_spread"]) == pytest.approx(result["spreads"][key], abs=0.006), pair
        assert any(line.startswith(f"rounds {pair}: ") for line in printed)
    assert len(result["warmup"]) == 1  # --quick: one untimed pass before any round
    assert any(line.startswith("warm-up (passthrough, untimed, before any round), rec/s: ") for line in printed)
    runs = result["runs"]
    modes = {(r["model"], r["mode"]) for r in runs}
    for expected in [
        ("digits", "naive"),
        ("digits", "passthrough"),
        ("digits", "decode-encode"),
        ("digits", "streaminfer-eos"),
        ("digits", "bare-ort"),
        ("digits", "streaminfer"),
        ("digits", "streaminfer-binary"),
        ("digits", "streaminfer-shadow"),
        ("digits", "streaminfer-shadow-slow"),
        ("digits", "open-loop"),
        ("digits", "lone"),
        ("minilm", "bare-ort"),
        ("minilm", "streaminfer"),
        ("vision", "decode-candidate"),
        ("vision", "decode-alone"),
        ("vision", "bare-ort"),
        ("vision", "streaminfer"),
        ("vision", "streaminfer-uint8"),
        ("vision", "naive-vision"),
        ("events-json", "passthrough"),
        ("events-json", "streaminfer"),
        ("events-avro", "passthrough"),
        ("events-avro", "streaminfer"),
    ]:
        assert expected in modes, f"no {expected} run"
    assert {r["mode"] for r in runs if r["model"] == "digits-wide"} == {"passthrough", "streaminfer", "streaminfer-eos"}
    assert result["wide_partitions"] == 16  # --quick
    sizes = {
        "digits": result["records"],
        "digits-wide": result["round_records"],
        "minilm": 200,
        "vision": 256,
        "events-json": 2000,
        "events-avro": 2000,
    }
    for r in runs:
        if r["mode"] in ("passthrough", "decode-encode", "streaminfer", "streaminfer-binary", "streaminfer-eos"):
            assert r["records"] == sizes[r["model"]], r
            assert r["throughput_rps"] > 0
            assert r["peak_rss_mib"] > 10
            assert r["cpu_us_per_record"] > 0, r  # the process's own CPU time over its results' window
        if r["mode"] in ("streaminfer", "streaminfer-eos") and r["extra"].get("round"):
            assert r["extra"]["first_answer_s"] > 0, r
        if r["mode"] == "streaminfer":
            assert sum(1 for v in r["batch_rows"].values() if v > 0) > 0
            assert r["extra"]["stage_us"]["decode"] > 0  # the consumer's own per-stage costs
            assert r["extra"]["stage_us"]["produce"] > 0
        if r["mode"] in ("open-loop", "lone"):
            assert r["p50_ms"] > 0
            assert r["p99_ms"] >= r["p50_ms"]
    assert {r["setting"] for r in runs if r["mode"] == "lone"} == {"1 at a time", "client only"}  # and its floor
    minilm_rounds = [r for r in runs if r["model"] == "minilm" and r["extra"].get("round") == 2]
    assert {r["mode"] for r in minilm_rounds} == {"bare-ort", "streaminfer"}  # round 2: the ceiling and us again
    assert any(line.startswith("vision (EfficientNet-Lite0, images/s, round 1): decode_alone=") for line in printed)
    for plot in ("throughput.png", "latency.png"):
        assert (out / plot).stat().st_size > 10_000
