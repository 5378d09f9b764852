"""``make soak``'s short version: one minute of open loop against the real broker, every figure printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.harness.test_soak import LINE

ROOT = Path(__file__).resolve().parents[2]


def test_a_one_minute_soak_prints_its_line_and_loses_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.soak", "--bootstrap-servers", kafka_bootstrap, "--minutes", "1",
         "--rate", "200", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert LINE.match(line), line
    assert line.endswith(" lost=0")
    result = json.loads((tmp_path / "soak.json").read_text())
    assert len(result["samples"]) == 6
    assert all(s["results"] > 0 and s["tasks"] > 0 and s["fds"] > 0 for s in result["samples"])
    assert result["sent"] == result["answered"] >= 11_000
    assert (tmp_path / "soak.png").stat().st_size > 10_000
