"""The NetworkPolicy of the base (k8s/base/networkpolicy.yaml), evaluated on every overlay's build as the API server
would: only Prometheus of the monitoring namespace reaches the consumer, on the metrics port; the consumer reaches
the brokers (on the bootstrap address's port), a schema registry and DNS, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from tests.manifests.test_k8s import OVERLAYS, Doc, build, container_of, env_of, one, strimzi_cluster

#: The documented peers: Prometheus (Prometheus Operator's pod label) in the namespace "monitoring".
PROMETHEUS = ({"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "prometheus"})


def matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions In / NotIn / Exists / DoesNotExist) against ``labels``;
    {} selects everything, None (absent) too."""
    if not selector:
        return True
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]  # fmt: skip
        if not ok:
            return False
    return True


def allowed(rules: list[Doc], side: str, policy_ns: str, ns: dict[str, str], pod: dict[str, str], port: Any,
            protocol: str = "TCP") -> bool:  # fmt: skip
    """Whether a peer pod (its namespace's labels ``ns``, its labels ``pod``) is let through on ``port`` by
    ``rules`` (a policy's ingress ``from`` or egress ``to`` rules). A peer without namespaceSelector is in the
    policy's own namespace."""
    for rule in rules:
        ports = rule.get("ports")
        if ports is not None and not any(p.get("port") == port and p.get("protocol", "TCP") == protocol
                                         for p in ports):  # fmt: skip
            continue
        peers = rule.get(side)
        if peers is None:
            return True  # no peers listed: everyone
        for peer in peers:
            in_ns = (matches(peer["namespaceSelector"], ns) if "namespaceSelector" in peer
                     else ns.get("kubernetes.io/metadata.name") == policy_ns)  # fmt: skip
            if in_ns and matches(peer.get("podSelector"), pod):
                return True
    return False


def policy(docs: tuple[Doc, ...]) -> Doc:
    return one(docs, "NetworkPolicy", "streaminfer")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_policy_covers_the_consumer_pods_both_ways(overlay: str) -> None:
    docs = build(overlay)
    spec = policy(docs)["spec"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert matches(spec["podSelector"], pod_labels)
    assert not matches(spec["podSelector"], {"app.kubernetes.io/component": "consumer"})  # another app's consumer
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_prometheus_of_the_monitoring_namespace_reaches_the_metrics_port(overlay: str) -> None:
    docs = build(overlay)
    ns = policy(docs)["metadata"]["namespace"]
    rules = policy(docs)["spec"]["ingress"]
    port = next(p for p in container_of(docs)["ports"] if p["name"] == "http")
    monitoring, prometheus = PROMETHEUS
    opened = [p["port"] for rule in rules for p in rule["ports"]]
    assert opened == [port["name"]] or opened == [port["containerPort"]]  # the metrics port only
    assert allowed(rules, "from", ns, monitoring, prometheus, opened[0])
    assert not allowed(rules, "from", ns, monitoring, prometheus, 22)  # another port
    assert not allowed(rules, "from", ns, monitoring, {"app.kubernetes.io/name": "grafana"}, "http")
    assert not allowed(rules, "from", ns, {"kubernetes.io/metadata.name": "default"}, prometheus, "http")
    same = {"kubernetes.io/metadata.name": ns}
    assert not allowed(rules, "from", ns, same, {"app.kubernetes.io/name": "streaminfer"}, "http")  # a neighbour


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_consumer_reaches_the_brokers_the_registry_and_dns_and_nothing_else(overlay: str) -> None:
    docs = build(overlay)
    ns = policy(docs)["metadata"]["namespace"]
    rules = policy(docs)["spec"]["egress"]
    own = {"kubernetes.io/metadata.name": ns}
    bootstrap = env_of(docs)["STREAMINFER_BOOTSTRAP_SERVERS"]
    broker_ports = {int(address.rsplit(":", 1)[1]) for address in bootstrap.split(",")}
    broker = {"strimzi.io/cluster": strimzi_cluster(docs), "strimzi.io/kind": "Kafka",
              "strimzi.io/name": f"{strimzi_cluster(docs)}-kafka"}  # fmt: skip
    for port in broker_ports:
        assert allowed(rules, "to", ns, own, broker, port)
    assert not allowed(rules, "to", ns, own, {**broker, "strimzi.io/cluster": "other"}, min(broker_ports))
    dns = ({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})
    assert allowed(rules, "to", ns, *dns, 53, "UDP")
    assert allowed(rules, "to", ns, *dns, 53, "TCP")
    registry_ns = {"kubernetes.io/metadata.name": "registry"}
    assert allowed(rules, "to", ns, registry_ns, {"app.kubernetes.io/name": "schema-registry"}, 8081)
    assert allowed(rules, "to", ns, registry_ns, {"app.kubernetes.io/name": "apicurio-registry"}, 8080)
    internet = ({}, {})  # outside the cluster: no pod labels, no namespace
    for port in (443, 80, 9093, 8081):
        assert not allowed(rules, "to", ns, *internet, port)
    api = ({"kubernetes.io/metadata.name": "default"}, {"component": "apiserver"})
    assert not allowed(rules, "to", ns, *api, 443)
    assert all("to" in rule and "ports" in rule for rule in rules)  # no rule that lets everything through


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_peer_selector_was_rewritten_by_the_common_labels(overlay: str) -> None:
    """kustomize's labels (includeSelectors) add the app's own labels to every matchLabels of a NetworkPolicy, peers'
    included: a Prometheus selector with app.kubernetes.io/name=streaminfer would select no Prometheus."""
    spec = policy(build(overlay))["spec"]
    peers = [p for rule in spec["ingress"] for p in rule["from"]] + [p for rule in spec["egress"] for p in rule["to"]]
    for peer in peers:
        for selector in (peer.get("podSelector") or {}, peer.get("namespaceSelector") or {}):
            assert "app.kubernetes.io/part-of" not in selector.get("matchLabels", {}), peer
