"""The commands of docs/events.md ("Scoring an existing topic") run as written: each shell block alone, in a fresh
bash from the repository root (nothing carried over from another block: no variable, no broker), against a broker
and a registry the block itself starts. Each ends with the truth: accuracy is the model's held-out accuracy
(metrics.json), agreement with the direct ONNX Runtime run 1.0000. Anything a block leaves running is stopped
afterwards."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.conftest import KAFKA_STOP, REGISTRY_STOP, ROOT, results_lines, run_shell_block, shell_blocks

pytestmark = pytest.mark.integration


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
    # a fresh shell: no variable a block sets (BOOTSTRAP, REGISTRY) nor the suite's broker and registry
    fresh = ("BOOTSTRAP", "REGISTRY", "KAFKA_BOOTSTRAP_SERVERS", "SCHEMA_REGISTRY_URL")
    block = shell_blocks(ROOT / "docs" / "events.md")[number]
    out = run_shell_block(block, tmp_path, unset=fresh, stops=(REGISTRY_STOP, KAFKA_STOP))
    (fields,) = results_lines(out)
    assert fields["sent"] == fields["results"] == "114", fields  # every event answered, none dead-lettered
    assert fields["dead_letters"] == "0", fields
    metrics = json.loads((ROOT / "models" / "breast_cancer" / "artifacts" / "metrics.json").read_text())
    assert fields["accuracy"] == f"{metrics['onnx_heldout_accuracy']:.4f}", fields  # the truth: the model's own
    assert fields["agreement"] == "1.0000", fields  # every label the direct run's
    assert fields["score_mismatches"] == "0", fields  # each result's probability the direct run's
