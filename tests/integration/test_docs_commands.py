"""The commands of docs/events.md ("Scoring an existing topic") run as written: its shell blocks, one after another,
in one bash script from the repository root, against a broker and a registry the page itself starts. Anything the
script leaves running is stopped afterwards."""

from __future__ import annotations

import contextlib
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
    assert len(blocks) == 2
    assert "--format json" in blocks[0]
    assert "--format avro" in blocks[1]


def test_scoring_an_existing_topic_runs_as_written(tmp_path: Path) -> None:
    if os.environ.get("SCHEMA_REGISTRY_URL"):
        pytest.skip("the page starts its own local registry; SCHEMA_REGISTRY_URL names another one")
    script = "set -euo pipefail\n" + "\n".join(shell_blocks(ROOT / "docs" / "events.md"))
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["KAFKA_LOCAL_STATE"] = str(tmp_path / "state")  # the page's broker and registry, apart from the suite's
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
    summaries = [line for line in out.splitlines() if line.startswith("results:")]
    assert len(summaries) == 2, out[-4000:]
    for line in summaries:  # every event answered, none dead-lettered, every label right
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        assert fields["sent"] == fields["results"] == "114", line
        assert fields["dead_letters"] == "0", line
        assert fields["score_mismatches"] == "0", line  # each result's probability is the direct run's
