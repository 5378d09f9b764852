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
from producer_tools.fuse import fuse
from tests.image_model import DECLARED

LAST_LINE = re.compile(
    r"^bench: digits_vs_passthrough=(\d+\.\d\d) digits_vs_naive=(\d+\.\d\d) minilm_vs_bare_ort=(\d+\.\d\d) "
    r"digits_eos_vs_alo=(\d+\.\d\d) vision_vs_ceiling=(\d+\.\d\d)$"
)


def test_quick_bench_runs_every_mode(
    kafka_bootstrap: str,
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
            "--timeout-s", "60",
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out.strip().splitlines()
    match = LAST_LINE.match(printed[-1])
    assert match, printed[-1]
    assert any(line.startswith("stages (digits streaminfer b64/d5ms), us/record: fetch=") for line in printed)

    result = json.loads((out / "bench.json").read_text())
    assert all(r > 0 for r in result["ratios"].values()), result["ratios"]  # the small text model: R3 rounds to 0
    for pair, key in (
        ("streaminfer/passthrough", "digits_vs_passthrough"),
        ("streaminfer-eos/streaminfer", "digits_eos_vs_alo"),
        ("minilm streaminfer/bare-ort", "minilm_vs_bare_ort"),
        ("vision streaminfer/ceiling", "vision_vs_ceiling"),
    ):
        values = result["rounds"][pair]
        assert len(values) == 2, pair  # --quick: two rounds
        assert result["ratios"][key] == pytest.approx(sum(values) / 2), pair  # the median of two
        assert any(line.startswith(f"rounds {pair}: ") for line in printed)
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
    ]:
        assert expected in modes, f"no {expected} run"
    for r in runs:
        if r["mode"] in ("passthrough", "decode-encode", "streaminfer", "streaminfer-binary", "streaminfer-eos"):
            assert r["records"] == {"digits": result["records"], "minilm": 200, "vision": 256}[r["model"]], r
            assert r["throughput_rps"] > 0
            assert r["peak_rss_mib"] > 10
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
