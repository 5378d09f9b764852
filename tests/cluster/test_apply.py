"""Every overlay applied to a real API server with the operators' real CRDs (``kubectl apply --server-side``):
admission, strict field decoding, defaulting, selector/label agreement and the CRDs' schemas, which the schema
checks of tests/manifests cannot see. The CRDs are installed by ``make cluster`` (:mod:`harness.cluster.crds`)."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Callable

import pytest

from harness.cluster import node
from tests.cluster.conftest import OVERLAYS, Kubectl, events, in_namespace, render

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_server_accepts_every_object_of_the_overlay(
    overlay: str, kubectl: Kubectl, namespace: Callable[[str], str]
) -> None:
    docs = render(overlay, kubectl)
    ns = namespace(overlay)
    applied = kubectl(
        "apply",
        "--server-side",
        "--field-manager=streaminfer-test",
        "-o",
        "name",
        "-f",
        "-",
        input=in_namespace(docs, ns),
    )
    names = sorted(applied.stdout.split())
    assert len(names) == len(docs), applied.stdout
    assert "deprecated" not in applied.stderr, applied.stderr  # e.g. Strimzi's v1beta2 (the manifests use v1)
    listed = {(d["kind"].lower(), d["metadata"]["name"]) for d in docs}
    for kind, name in listed:
        assert kubectl("get", kind, name, "-n", ns, "-o", "name").stdout.strip(), (kind, name)
    # applied again unchanged: no conflicts, nothing immutable touched
    again = kubectl(
        "apply", "--server-side", "--field-manager=streaminfer-test", "-f", "-", input=in_namespace(docs, ns)
    )
    assert "serverside-applied" in again.stdout
    # kept deliberately: the Deployment has no replicas field, so KEDA or the HPA owns the count (1 to start)
    replicas = kubectl("get", "deployment", "streaminfer", "-n", ns, "-o", "jsonpath={.spec.replicas}").stdout
    assert replicas == "1"


def _unschedulable(kubectl: Kubectl, ns: str, wanted: str, timeout_s: float = 60) -> str:
    """The scheduler's message on the namespace's pods once it names ``wanted`` (or the last one after
    ``timeout_s``)."""
    message = ""
    deadline = time.monotonic() + timeout_s
    while wanted not in message and time.monotonic() < deadline:
        time.sleep(0.5)  # the Deployment and ReplicaSet controllers make the pod, the scheduler marks it
        pods = json.loads(kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
        message = " ".join(
            c.get("message", "")
            for p in pods
            for c in p["status"].get("conditions", [])
            if c["type"] == "PodScheduled" and c["status"] == "False"
        )
    return message


def test_the_gpu_overlay_asks_for_a_gpu_the_node_does_not_have(
    whole_cluster: Kubectl, namespace: Callable[[str], str]
) -> None:
    """Accepted by the server, never scheduled here: the pod waits Pending, first for a node labelled by GPU Feature
    Discovery (the overlay's nodeSelector), and on a node so labelled for the nvidia.com/gpu it does not have (the
    scheduler names the first filter that fails)."""
    kubectl = whole_cluster
    ns = namespace("gpu-sched")
    kubectl("apply", "--server-side", "-f", "-", input=in_namespace(render("gpu", kubectl), ns))
    message = _unschedulable(kubectl, ns, "didn't match Pod's node affinity/selector")
    assert "didn't match Pod's node affinity/selector" in message, events(kubectl, ns)
    label = "nvidia.com/gpu.present"
    kubectl("label", "node", node.NODE_NAME, f"{label}=true")
    try:
        message = _unschedulable(kubectl, ns, "Insufficient nvidia.com/gpu")
    finally:
        kubectl("label", "node", node.NODE_NAME, f"{label}-")
    assert "Insufficient nvidia.com/gpu" in message, events(kubectl, ns)


def _rejected(kubectl: Kubectl, ns: str, doc: dict[str, object]) -> str:
    result = kubectl("apply", "--server-side", "-f", "-", input=in_namespace([doc], ns), check=False)
    assert result.returncode != 0, f"the server accepted {doc['kind']}: {result.stdout}"
    return str(result.stderr)


def test_the_server_rejects_what_only_a_server_checks(kubectl: Kubectl, namespace: Callable[[str], str]) -> None:
    """The same objects, each spoilt once: these checks can fail, and they are the server's, not ours."""
    docs = {d["kind"]: d for d in render("cpu", kubectl)}
    ns = namespace("reject")
    deployment = copy.deepcopy(docs["Deployment"])
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Never"
    assert "imagePullPolicyy: field not declared in schema" in _rejected(kubectl, ns, deployment)
    deployment = copy.deepcopy(docs["Deployment"])
    deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "other"
    assert "selector" in _rejected(kubectl, ns, deployment)
    topic = copy.deepcopy(next(d for d in render("cpu", kubectl) if d["kind"] == "KafkaTopic"))
    topic["spec"]["partitions"] = "twelve"
    assert "partitions" in _rejected(kubectl, ns, topic)
    scaled = copy.deepcopy(docs["ScaledObject"])
    scaled["spec"]["minReplicaCount"] = "one"
    assert "minReplicaCount" in _rejected(kubectl, ns, scaled)
    monitor = copy.deepcopy(docs["ServiceMonitor"])
    monitor["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    assert "interval" in _rejected(kubectl, ns, monitor)


@pytest.mark.parametrize("kind", ["KafkaTopic", "KafkaUser"])
def test_the_strimzi_version_of_the_manifests_is_served_and_not_deprecated(kubectl: Kubectl, kind: str) -> None:
    """The pinned Strimzi CRDs (0.51) serve v1 next to the deprecated v1beta2 (which Strimzi 1.x drops): the
    manifests use v1, and the server answers it without a deprecation warning."""
    used = {d["apiVersion"] for d in render("cpu", kubectl) if d["kind"] == kind}
    assert len(used) == 1, used
    version = used.pop().split("/")[1]
    crd = json.loads(kubectl("get", "crd", f"{kind.lower()}s.kafka.strimzi.io", "-o", "json").stdout)
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert version == "v1"
    assert versions[version]["served"] is True
    assert not versions[version].get("deprecated", False)
    assert versions["v1beta2"].get("deprecated") is True
    listed = kubectl("get", f"{kind.lower()}s.{version}.kafka.strimzi.io", "-A")
    assert "deprecated" not in listed.stderr, listed.stderr


def test_kubectl_is_the_cached_build_of_the_pinned_version(kubectl: Kubectl) -> None:
    from harness.cluster import K8S_VERSION

    out = kubectl("version", "-o", "json", check=False)
    assert f'"gitVersion": "{K8S_VERSION}"' in out.stdout, out.stdout
    with pytest.raises(subprocess.CalledProcessError):
        kubectl("get", "nosuchkind")
