"""The commands of docs/events.md ("Scoring an existing topic") run as written: each shell block alone, in a fresh
bash from the repository root (nothing carried over from another block: no variable, no broker), against a broker
and a registry the block itself starts. Each ends with the truth: accuracy is the model's held-out accuracy
(metrics.json), agreement with the direct ONNX Runtime run 1.0000. Anything a block leaves running is stopped
afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def shell_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def test_the_pages_blocks_are_what_this_test_runs() -> None:
    blocks = shell_blocks(ROOT / "docs" / "events.md")
    assert len(blocks) == 3
    assert "--format json" in blocks[0]
    assert "--format avro" in blocks[1]
    assert "--input-mapping models/breast_cancer/mapping.yaml" in blocks[2]


@pytest.mark.parametrize("number", [0, 1, 2], ids=["json", "avro", "mapping"])
def test_each_block_runs_as_written_alone_in_a_fresh_shell(number: int, tmp_path: Path) -> None:
    if os.environ.get("SCHEMA_REGISTRY_URL"):
        pytest.skip("the page starts its own local registry; SCHEMA_REGISTRY_URL names another one")
    script = "set -euo pipefail\n" + shell_blocks(ROOT / "docs" / "events.md")[number]
    # a fresh shell: no variable a block sets (BOOTSTRAP, REGISTRY) nor the suite's broker and registry
    fresh = {"BOOTSTRAP", "REGISTRY", "KAFKA_BOOTSTRAP_SERVERS", "SCHEMA_REGISTRY_URL"}
    env = {k: v for k, v in os.environ.items() if k not in fresh}
    env["KAFKA_LOCAL_STATE"] = str(tmp_path / "state")  # the block's broker and registry, apart from the suite's
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the script and what it left in the background (consumers)
            os.killpg(proc.pid, signal.SIGKILL)
        for stop in (["scripts/registry-local", "stop"], ["scripts/kafka-local", "stop"]):
            subprocess.run(stop, cwd=ROOT, env=env, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, out[-4000:]
    (line,) = [line for line in out.splitlines() if line.startswith("results:")]
    fields = dict(part.split("=", 1) for part in line.split()[1:])
    assert fields["sent"] == fields["results"] == "114", line  # every event answered, none dead-lettered
    assert fields["dead_letters"] == "0", line
    metrics = json.loads((ROOT / "models" / "breast_cancer" / "artifacts" / "metrics.json").read_text())
    assert fields["accuracy"] == f"{metrics['onnx_heldout_accuracy']:.4f}", line  # the truth: the model's own
    assert fields["agreement"] == "1.0000", line  # every label the direct run's
    assert fields["score_mismatches"] == "0", line  # each result's probability the direct run's
