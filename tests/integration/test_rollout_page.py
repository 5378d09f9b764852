"""The commands of docs/rollout.md ("Rolling out a new model") run as written: each ``sh`` block alone, in a fresh
bash from the repository root (no variable, broker or file carried over from another block), against a broker the
block itself starts; each output checked against the truth (the models' own held-out accuracy, metrics.json; the
converters' verdict on the graphs' operators; the retrained candidates pass). The shadow block runs once shadow
scoring is a setting (``shadow_model_path`` in :class:`consumer.config.Settings`), and is skipped with that reason
until then. The page's Kubernetes overlay is rendered with ``kubectl kustomize`` (no cluster) where kubectl is
installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from consumer.config import Settings
from tests.integration.conftest import ROOT, results_lines, run_shell_block
from tests.integration.conftest import shell_blocks as page_blocks

pytestmark = pytest.mark.integration

PAGE = ROOT / "docs" / "rollout.md"
#: pydantic keeps fields in model_fields, not as class attributes (hasattr(Settings, name) is False for every field).
SHADOW = "shadow_model_path" in Settings.model_fields


def shell_blocks() -> list[str]:
    return page_blocks(PAGE)


def run_block(number: int, tmp_path: Path) -> str:
    """Run the page's ``number``-th sh block alone; returns its output (stdout and stderr), asserting exit 0."""
    shutil.rmtree("/tmp/rollout", ignore_errors=True)  # the page's own folder: nothing from before
    fresh = ("BOOTSTRAP", "A", "B", "KAFKA_BOOTSTRAP_SERVERS", "SCHEMA_REGISTRY_URL")
    return run_shell_block(shell_blocks()[number], tmp_path, unset=fresh)


def accuracy(model: str) -> float:
    metrics = json.loads((ROOT / "models" / model / "artifacts" / "metrics.json").read_text())
    return float(metrics.get("onnx_heldout_accuracy", metrics["heldout_accuracy"]))


def test_the_pages_blocks_are_what_this_test_runs() -> None:
    blocks = shell_blocks()
    assert len(blocks) == 4
    assert "--variant int8-dynamic" in blocks[0]
    assert "--candidate /tmp/rollout/digits-v2/digits.onnx" in blocks[0]
    assert "--request-format json" in blocks[1]
    assert "--variant $variant" in blocks[1]
    assert "--tokenizer-path $T/tokenizer.json --topic texts" in blocks[2]
    assert "--shadow-model-path" in blocks[3]
    assert "--shadow-results-topic" in blocks[3]
    # the MiniLM block (bash: not run, it needs the real export) runs the text block's commands on MiniLM
    (minilm,) = [b for b in re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), re.S | re.M) if "minilm" in b]
    for command in ("streaminfer-model set", "--tokenizer-path", "streaminfer-model gate", "--variant $variant"):
        assert command in minilm, command
        assert command in blocks[2], command
    assert "int8-dynamic-per-channel" in minilm  # the INT8 copy that keeps MiniLM's embeddings (per-channel scales)
    for setting in ("shadow_model_path", "shadow_validation_record", "shadow_results_topic", "shadow_max_pending"):
        assert f"`{setting}`" in PAGE.read_text(), setting  # the agreed names (the bulletin's)


def test_the_digits_path_records_sets_and_gates(tmp_path: Path) -> None:
    out = run_block(0, tmp_path)
    assert "validation record {" in out  # the consumer logged the record it serves under
    (served,) = results_lines(out)
    assert served["sent"] == served["results"] == "360", served
    assert served["dead_letters"] == "0", served
    assert served["accuracy"] == f"{accuracy('digits'):.4f}", served
    assert "streaminfer-model set: 360 records (360 rows, 360 labelled)" in out
    assert f"360 records, accuracy {accuracy('digits'):.6f}" in out  # the record of the set from the topic
    for variant in ("int8-dynamic", "fp16"):  # exit 2 (the block's `|| test $? -eq 2`), the operators named
        (line,) = [line for line in out.splitlines() if f"gate: {variant} does not apply" in line]
        assert "LinearClassifier (ai.onnx.ml)" in line, line
        assert "Scaler (ai.onnx.ml)" in line, line
    assert "gate: PASS: /tmp/rollout/digits-v2/digits.onnx" in out
    record = json.loads(Path("/tmp/rollout/digits-v2/digits.record.json").read_text())  # the passing candidate's
    assert record["model"]["version"] == "2"  # --model-version 2: what its answers will carry


def test_the_breast_cancer_path_sets_from_an_events_topic(tmp_path: Path) -> None:
    out = run_block(1, tmp_path)
    assert "streaminfer-model set: 114 records (114 rows, 114 labelled)" in out
    assert f"114 records, accuracy {accuracy('breast_cancer'):.6f}" in out
    for variant in ("int8-dynamic", "int8-static", "fp16"):
        (line,) = [line for line in out.splitlines() if f"gate: {variant} does not apply" in line]
        assert "TreeEnsembleClassifier (ai.onnx.ml)" in line, line
    assert "gate: PASS: /tmp/rollout/breast_cancer-v2/breast_cancer.onnx" in out
    record = json.loads(Path("/tmp/rollout/breast_cancer-v2/breast_cancer.record.json").read_text())
    assert record["model"]["version"] == "2"


def test_the_text_path_gates_fp16_and_int8_by_cosine(tmp_path: Path) -> None:
    out = run_block(2, tmp_path)
    assert "streaminfer-model set: 200 records (200 rows, 0 labelled)" in out  # from the topic, tokenized
    for variant in ("fp16", "int8-dynamic", "int8-static"):
        assert f"gate: PASS: /tmp/rollout/text/text.{variant}.onnx" in out, variant
        report = json.loads(Path(f"/tmp/rollout/text/{variant}.report.json").read_text())
        assert report["embeddings"] == ["embedding"]
        cosine = {c["name"]: c for c in report["checks"] if c["name"].startswith("embedding: ")}
        assert cosine["embedding: p1 cosine"]["threshold"] == ">= 0.98"
        assert cosine["embedding: mean cosine"]["passed"] is True
        assert 0.99 < report["outputs"]["embedding"]["min_cosine"] < 1.0 + 1e-9
    assert "embedding: p1 cosine" in out  # the table shows it


@pytest.mark.skipif(not SHADOW, reason="shadow scoring is not on this branch yet: no shadow_model_path setting")
def test_the_shadow_block_serves_as_without_shadow_and_writes_the_candidates_answers(tmp_path: Path) -> None:
    out = run_block(3, tmp_path)
    served, shadowed = results_lines(out)
    assert served["sent"] == served["results"] == "360", served  # the served answers, as without shadow
    assert served["accuracy"] == f"{accuracy('digits'):.4f}", served
    assert shadowed["sent"] == shadowed["results"] == "360", shadowed  # the candidate's answers, same IDs
    # on the same 360 digits the candidate answers live as it did in the gate (the block gates it first)
    (gated,) = re.findall(r"accuracy \(candidate\)\s*\S\s*([0-9.]+)", out)
    assert shadowed["accuracy"] == f"{float(gated):.4f}", (shadowed, gated)
    assert re.search(r"^streaminfer_shadow_rows_total 360\.0$", out, re.M), "the candidate scored every row"
    assert re.search(r"^streaminfer_shadow_shed_batches_total 0\.0$", out, re.M), "16 pending batches shed none"


def test_the_pages_overlay_renders_the_candidates_pod_template(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the overlay is not rendered")
    page = PAGE.read_text()
    (overlay,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", page, re.S | re.M) if "kind: Kustomization" in b]
    shutil.copytree(ROOT / "k8s", tmp_path / "k8s")
    (tmp_path / "k8s" / "overlays" / "digits-v2").mkdir()
    (tmp_path / "k8s" / "overlays" / "digits-v2" / "kustomization.yaml").write_text(overlay)
    render = [kubectl, "kustomize", str(tmp_path / "k8s" / "overlays" / "digits-v2")]
    new = subprocess.run(render, capture_output=True, text=True, check=True, timeout=60).stdout
    render[-1] = str(tmp_path / "k8s" / "overlays" / "cpu")
    old = subprocess.run(render, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "image: streaminfer:0.1.0-cpu-digits-v2" in new
    assert "image: streaminfer:0.1.0-cpu\n" in old
    assert "value: /opt/streaminfer/models/digits-v2.onnx" in new
    assert "value: /opt/streaminfer/models/digits-v2.record.json" in new
    assert "fieldPath: metadata.name" in new  # the base's env (client and group instance ids) kept beside it
    assert "maxSurge: 1" in new  # the rollout the page describes
    assert "maxUnavailable: 0" in new
