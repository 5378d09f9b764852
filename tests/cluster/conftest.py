"""Fixtures for the tests against the one-node cluster of ``make cluster`` (:mod:`harness.cluster`): skipped when
no cluster runs, failed instead with ``CLUSTER_TESTS_REQUIRED=1`` (``make test-cluster``). Each test works in
namespaces of its own, deleted afterwards (the kubelet stops their pods: SIGTERM, then the grace period)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import REPO, bin_dir, kubeconfig, network, node
from harness.localkafka import BrokerSetupError, LocalBroker

pytestmark = pytest.mark.cluster
OVERLAYS = ("cpu", "gpu", "cpu-hpa")
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def cluster_required() -> bool:
    return os.environ.get("CLUSTER_TESTS_REQUIRED", "").lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    """The cached kubectl against the running cluster (``kubectl(*args, input=..., check=True)``)."""
    if not node.api_running():
        reason = "no one-node cluster runs (make cluster)"
        if cluster_required():
            pytest.fail(f"CLUSTER_TESTS_REQUIRED=1 but {reason}", pytrace=False)
        pytest.skip(reason)

    def run(*args: str, input: str | None = None, check: bool = True, timeout_s: float = 180) -> Any:
        return subprocess.run(
            [str(bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig()}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout_s,
        )

    return run


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The cluster tests' broker: a local one listening and advertised at the pods' bridge gateway
    (:data:`harness.cluster.network.GATEWAY`), which the pods reach over the bridge and the host's clients as one
    of the host's own addresses (so no traffic leaves the machine). Replaces the session broker of tests/conftest.py,
    which listens on loopback, out of the pods' reach."""
    if not network.bridge_exists():
        reason = f"the cluster's bridge {network.BRIDGE} does not exist (make cluster)"
        if cluster_required():
            pytest.fail(f"CLUSTER_TESTS_REQUIRED=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    broker = LocalBroker(tmp_path_factory.mktemp("kafka-cluster"), hosts=[network.GATEWAY])
    try:
        broker.start()
    except BrokerSetupError as exc:
        pytest.fail(f"the local broker at {network.GATEWAY} did not start: {exc}", pytrace=False)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def whole_cluster(kubectl: Kubectl) -> Kubectl:
    """:func:`kubectl`, where every component runs (controllers, scheduler, kubelet): for tests that make pods."""
    if not node.running():
        down = [name for name in node.ORDER if not node.alive(name)]
        if cluster_required():
            pytest.fail(f"CLUSTER_TESTS_REQUIRED=1 but these do not run: {down}", pytrace=False)
        pytest.skip(f"the cluster's {down} do not run")
    return kubectl


def render(overlay: str | Path, kubectl: Kubectl) -> list[dict[str, Any]]:
    """The overlay as ``kubectl kustomize`` renders it (the cached kubectl: the same kustomize as the server's
    version)."""
    path = overlay if isinstance(overlay, Path) else REPO / "k8s/overlays" / overlay
    return [d for d in yaml.safe_load_all(kubectl("kustomize", str(path)).stdout) if d]


def in_namespace(docs: list[dict[str, Any]], namespace: str) -> str:
    """``docs`` moved to ``namespace`` (every object of the overlays is namespaced), as one YAML stream."""
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return yaml.safe_dump_all(docs, sort_keys=False)


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[Callable[[str], str]]:
    """Make namespaces ``it-<name>-<tag>``; all are deleted (and waited for) after the test."""
    made: list[str] = []

    def make(name: str) -> str:
        ns = f"it-{name}-{uuid.uuid4().hex[:6]}"
        kubectl("create", "namespace", ns)
        made.append(ns)
        return ns

    yield make
    # the namespace controller (kube-controller-manager) finishes a deletion: waited for only where it runs
    wait = "--wait=true" if node.alive("kube-controller-manager") else "--wait=false"
    for ns in made:
        kubectl("delete", "namespace", ns, wait, "--timeout=120s", check=False, timeout_s=150)


def events(kubectl: Kubectl, ns: str) -> str:
    out = kubectl("get", "events", "-n", ns, "-o", "json", check=False).stdout or "{}"
    return "\n".join(
        f"{e.get('involvedObject', {}).get('name')}: {e.get('reason')}: {e.get('message')}"
        for e in json.loads(out).get("items", [])
    )
