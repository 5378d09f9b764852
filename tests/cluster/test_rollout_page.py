"""docs/rollout.md "Promote it" on the one-node cluster: its Kubernetes (``bash``) blocks run as written, each
alone in a fresh bash, while requests arrive from outside at 100/s: the candidate's image built (``docker build``),
the page's overlay applied (``kubectl apply -k k8s/overlays/digits-v2``, ``rollout status``), then ``kubectl rollout
undo``. Every request answered; the answers after the promotion carry the candidate's ``model_version`` 2, after
the undo v1's again; the longest gap with no answer during each rollout printed (:func:`tests.cluster.load.measure`).

What the page takes as given is made here as on a real cluster: the cpu flavour serving v1 in the namespace
``kafka`` (the page's ``-n kafka``; the test overlay of test_pod.py in place of ``k8s/overlays/cpu`` in a copy of
``k8s/``, so ``../cpu`` is the cluster's broker, PLAINTEXT), and the passing candidate of the page's first block in
``/tmp/rollout/digits-v2`` (``models/digits/build.py --c 0.5 --model-version 2``, gated on ``make model``'s held-out
set, which writes its record). The page's pushed image is ``import-image``d into the node's containerd (no registry
here), as the page's comment says for this cluster."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from harness.cluster import REPO, bin_dir, images, kubeconfig
from tests.cluster.conftest import Kubectl, cluster_required
from tests.cluster.load import Step, measure, report_of, under_load
from tests.cluster.test_pod import (
    HELDOUT,
    _step,
    _wait_pods,
    _wait_rollout,
    ensure_image,
    make_secrets,
    make_topics,
    write_test_overlay,
)
from tests.integration.conftest import run_shell_block

pytestmark = pytest.mark.cluster
PAGE = REPO / "docs" / "rollout.md"
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)
#: The page's namespace (the base's, Strimzi's "kafka"): its commands name it.
NS = "kafka"
CANDIDATE = Path("/tmp/rollout/digits-v2")
ARTIFACTS = REPO / "models" / "digits" / "artifacts"


def promote_section() -> str:
    """The page's "Promote it" section (to the next ``## `` heading or the end)."""
    text = PAGE.read_text()
    start = text.index("\n## Promote it\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def kube_blocks() -> list[str]:
    """The ``bash`` blocks of "Promote it" (the page's other ``bash`` blocks, MiniLM's, are not Kubernetes')."""
    return BASH_BLOCK.findall(promote_section())


def test_the_pages_kubernetes_blocks_are_what_this_test_runs() -> None:
    image, promote, undo = kube_blocks()
    assert "docker build -t streaminfer:0.1.0-cpu-digits-v2 /tmp/rollout" in image
    assert "import-image streaminfer:0.1.0-cpu-digits-v2" in image  # this cluster's way to the node
    assert "kubectl apply -k k8s/overlays/digits-v2" in promote
    assert "rollout status deployment/streaminfer" in promote
    assert "rollout undo deployment/streaminfer" in undo
    (overlay,) = [b for b in YAML_BLOCK.findall(promote_section()) if "kind: Kustomization" in b]
    assert "../cpu" in overlay


def _candidate() -> None:
    """The page's first block's passing candidate and its record, where missing (no broker: the held-out set)."""
    if (CANDIDATE / "digits.onnx").is_file() and (CANDIDATE / "digits.record.json").is_file():
        return
    py = str(Path(sys.executable))
    build = [py, "models/digits/build.py", "--out", str(CANDIDATE), "--c", "0.5", "--model-version", "2"]
    subprocess.run(build, cwd=REPO, check=True, capture_output=True, timeout=300)
    gate = [py, "-m", "producer_tools.model", "gate", "--model", str(ARTIFACTS / "digits.onnx")]
    gate += ["--set", str(ARTIFACTS / "heldout.set.jsonl"), "--candidate", str(CANDIDATE / "digits.onnx")]
    done = subprocess.run(gate, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr  # the candidate passes, its record written
    assert (CANDIDATE / "digits.record.json").is_file()


def _versions(report_answers: list[tuple[float, str]], start: float, end: float) -> Counter[str]:
    return Counter(v for t, v in report_answers if start <= t <= end)


def test_the_promote_and_undo_blocks_run_as_written_under_load(
    whole_cluster: Kubectl, kafka_bootstrap: str, tmp_path: Path
) -> None:
    kubectl = whole_cluster
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        reason = "the page's docker build needs a Docker engine (make docker-engine; export DOCKER_HOST=...)"
        if cluster_required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    if kubectl("get", "namespace", NS, check=False).returncode == 0:
        pytest.fail(f"a namespace {NS} exists already: not this test's (kubectl delete namespace {NS})", pytrace=False)
    ensure_image()  # v1: the CPU image as make image-cpu built it
    _candidate()

    topics = make_topics(kafka_bootstrap)
    tree = tmp_path / "tree"  # the page's commands run here: k8s/overlays/cpu is the test overlay
    shutil.copytree(REPO / "k8s", tree / "k8s")
    shutil.rmtree(tree / "k8s" / "overlays" / "cpu")
    write_test_overlay(tree / "k8s" / "overlays" / "cpu", NS, kafka_bootstrap, topics)
    (overlay,) = [b for b in YAML_BLOCK.findall(promote_section()) if "kind: Kustomization" in b]
    (tree / "k8s" / "overlays" / "digits-v2").mkdir()
    (tree / "k8s" / "overlays" / "digits-v2" / "kustomization.yaml").write_text(overlay)
    env = {"KUBECONFIG": str(kubeconfig()), "PATH": f"{bin_dir()}{os.pathsep}{REPO / '.venv' / 'bin'}"}
    env["PATH"] += os.pathsep + os.environ.get("PATH", "")
    unset = ("KAFKA_BOOTSTRAP_SERVERS", "SCHEMA_REGISTRY_URL")

    def block(number: int) -> str:
        return run_shell_block(kube_blocks()[number], tmp_path, unset=unset, stops=(), cwd=tree, extra_env=env)

    image, promote, undo = 0, 1, 2
    block(image)
    images.import_docker_image("streaminfer:0.1.0-cpu-digits-v2")  # the page's comment: this cluster's "push"
    kubectl("create", "namespace", NS)
    try:
        make_secrets(kubectl, NS)
        kubectl("apply", "-k", str(tree / "k8s" / "overlays" / "cpu"))  # v1 serving, as the page starts from
        _wait_rollout(kubectl, NS)
        _wait_pods(kubectl, NS, 1)
        outputs: dict[str, str] = {}

        def run(number: int, name: str) -> str:
            outputs[name] = block(number)
            pods = _wait_pods(kubectl, NS, 1)
            images_ = [c["image"] for p in pods for c in p["spec"]["containers"]]
            return f"pods {[p['metadata']['name'] for p in pods]} on {images_}"

        def steps() -> list[Step]:
            return [_step("promote (apply -k digits-v2)", lambda: run(promote, "promote")),
                    _step("rollout undo", lambda: run(undo, "undo"))]  # fmt: skip

        t0 = time.monotonic()
        sent, done = asyncio.run(under_load(kafka_bootstrap, topics["requests"], HELDOUT, steps))
        report = report_of(kafka_bootstrap, topics, sent, exactly_once=False)
    finally:
        logs = kubectl("logs", "-n", NS, "deployment/streaminfer", "--tail=20", check=False)
        kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s", check=False, timeout_s=150)
    answered = sorted(
        (a.timestamp_ms / 1000, str((a.body or {}).get("model_version"))) for a in report.answers.values()
    )
    promoted, undone = done
    print(
        f"cluster rollout page: {report.results} of {len(sent)} answered {time.monotonic() - t0:.1f} s after the "
        f"first send, missing {len(report.missing)}, duplicates {report.duplicates}\n{measure(report, done)}\n"
        f"  answers by model_version: promote {dict(_versions(answered, promoted.start, promoted.end))}, "
        f"undo {dict(_versions(answered, undone.start, undone.end))}"
    )
    assert "successfully rolled out" in outputs["promote"], outputs["promote"]
    assert "rolled back" in outputs["undo"], outputs["undo"]
    assert report.missing == [], logs.stdout
    assert report.results == len(sent)
    assert report.dead_letters == 0
    settled = promoted.end - 2.0  # the step's last seconds: the rollout done, only the new pod serves
    assert set(_versions(answered, settled, promoted.end)) == {"2"}, _versions(answered, settled, promoted.end)
    assert set(_versions(answered, undone.end - 2.0, undone.end)) == {"1"}
    assert _versions(answered, 0, promoted.start)["1"] > 0  # v1 served before
    assert "REVISION" in outputs["undo"]  # rollout history listed the revisions
