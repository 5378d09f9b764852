"""The consumer as a pod of the one-node cluster: the CPU image (``make image-cpu``) imported into containerd, the
cpu overlay applied through a test overlay (:func:`write_test_overlay`), the pod Ready through its readiness probe, and
requests produced from outside the cluster answered.

The test overlay is the documented patch (docs/operations.md "Tested on a real cluster"): the image used as imported
(``imagePullPolicy: Never``), requests small enough for a 2-core node, ``dnsPolicy: Default`` (no cluster DNS runs;
the broker is an address), the ConfigMap pointing at the tests' broker (PLAINTEXT, at the pods' bridge gateway:
:mod:`harness.cluster.network`) and topics; the two Secrets the pod mounts made with placeholder contents (Strimzi
would write them). Everything else is the overlay as shipped: each pod on the pod network with its own address and
the shipped HTTP port, probes, security context, grace period, PodDisruptionBudget.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import REPO, ctr_argv, node
from producer_tools.produce import digits_requests, send_all
from producer_tools.results import collect
from producer_tools.topics import ensure_topics
from tests.cluster.conftest import Kubectl, events, render
from tests.cluster.load import Step, clock, measure, report_of, under_load

pytestmark = pytest.mark.cluster
IMAGE = f"streaminfer:{os.environ.get('IMAGE_TAG', '0.1.0')}-cpu"
HELDOUT = REPO / "models/digits/artifacts/heldout.npz"


def ensure_image(image: str = IMAGE) -> None:
    """The image in the cluster's containerd, imported from the Docker engine where missing (fails naming what to
    run when neither has it)."""
    ref = f"docker.io/library/{image}"
    listed = subprocess.run(
        [*ctr_argv(), "images", "ls", "-q", f"name=={ref}"], capture_output=True, text=True, check=True
    ).stdout
    if ref in listed.split():
        return
    from harness.cluster import images

    try:
        images.import_docker_image(image)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.fail(
            f"{image} is neither in the cluster nor in a Docker engine (make docker-engine image-cpu): "
            f"{getattr(exc, 'stderr', exc)!r}",
            pytrace=False,
        )


def write_test_overlay(folder: Path, ns: str, bootstrap: str, topics: dict[str, str], **settings: str) -> Path:
    """Write the test overlay (a kustomization over k8s/overlays/cpu) into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "STREAMINFER_BOOTSTRAP_SERVERS": bootstrap,
        "STREAMINFER_SECURITY_PROTOCOL": "PLAINTEXT",
        "STREAMINFER_GROUP_ID": f"cluster-{ns}",
        "STREAMINFER_REQUESTS_TOPIC": topics["requests"],
        "STREAMINFER_RESULTS_TOPIC": topics["results"],
        "STREAMINFER_DEAD_LETTER_TOPIC": topics["dlq"],
        "STREAMINFER_INTRA_OP_THREADS": "1",
        **settings,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "streaminfer"},
        "spec": {
            "template": {
                "spec": {
                    "dnsPolicy": "Default",
                    "containers": [
                        {
                            "name": "consumer",
                            "imagePullPolicy": "Never",
                            "resources": {
                                "requests": {"cpu": "250m", "memory": "256Mi"},
                                "limits": {"cpu": "2", "memory": "2Gi"},
                            },
                        }
                    ],
                }
            }
        },
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "resources": [os.path.relpath(REPO / "k8s/overlays/cpu", folder)],
        "images": [{"name": "streaminfer", "newName": IMAGE.split(":")[0], "newTag": IMAGE.split(":")[1]}],
        "patches": [
            {
                "patch": yaml.safe_dump(
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "streaminfer"}, "data": config}
                )
            },
            {"patch": yaml.safe_dump(deployment)},
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


def make_topics(bootstrap: str) -> dict[str, str]:
    """New requests (4 partitions), results (4) and dead-letter (1) topics, the answers' with ``LogAppendTime`` (the
    gaps of :mod:`tests.cluster.load` are measured in append times); their names by role."""
    tag = uuid.uuid4().hex[:8]
    topics = {"requests": f"k8s-{tag}.requests", "results": f"k8s-{tag}.results", "dlq": f"k8s-{tag}.dlq"}
    append = {"message.timestamp.type": "LogAppendTime"}
    asyncio.run(
        ensure_topics(
            bootstrap,
            {topics["requests"]: 4, topics["results"]: 4, topics["dlq"]: 1},
            configs={topics["results"]: append, topics["dlq"]: append},
        )
    )
    return topics


def make_secrets(kubectl: Kubectl, ns: str) -> None:
    """The two Secrets the pod mounts (Strimzi's KafkaUser password, the cluster CA), with placeholder contents."""
    for secret, key in (("streaminfer", "password"), ("my-cluster-cluster-ca-cert", "ca.crt")):
        kubectl("create", "secret", "generic", secret, "-n", ns, f"--from-literal={key}=placeholder")


def _pod_status(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    out = kubectl("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=consumer", "-o", "json").stdout
    return list(json.loads(out)["items"])


def _wait_rollout(kubectl: Kubectl, ns: str, timeout_s: int = 240) -> float:
    t0 = time.monotonic()
    done = kubectl(
        "rollout",
        "status",
        "deployment/streaminfer",
        "-n",
        ns,
        f"--timeout={timeout_s}s",
        check=False,
        timeout_s=timeout_s + 30,
    )
    if done.returncode:
        logs = kubectl("logs", "-n", ns, "deployment/streaminfer", "--tail=30", check=False)
        pytest.fail(
            f"rollout not done: {done.stderr}\nevents:\n{events(kubectl, ns)}\nlogs:\n{logs.stdout}{logs.stderr}",
            pytrace=False,
        )
    return time.monotonic() - t0


Deploy = Callable[..., dict[str, Any]]


@pytest.fixture
def deploy(whole_cluster: Kubectl, namespace: Callable[[str], str], kafka_bootstrap: str, tmp_path: Path) -> Deploy:
    """``deploy(**settings)``: the cpu overlay deployed through the test overlay (``settings``: more ConfigMap
    entries); returns its namespace, topics, bootstrap and the seconds from apply to the rollout's end."""
    kubectl = whole_cluster
    if not HELDOUT.is_file():
        pytest.fail("models/digits/artifacts/heldout.npz is missing (make model)", pytrace=False)
    ensure_image()

    def make(**settings: str) -> dict[str, Any]:
        ns = namespace("pod")
        topics = make_topics(kafka_bootstrap)
        make_secrets(kubectl, ns)
        folder = write_test_overlay(tmp_path / ns, ns, kafka_bootstrap, topics, **settings)
        t0 = time.monotonic()
        kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(render(folder, kubectl)))
        _wait_rollout(kubectl, ns)
        return {"ns": ns, "topics": topics, "bootstrap": kafka_bootstrap, "ready_s": time.monotonic() - t0}

    return make


def test_the_pod_is_ready_through_its_probe_and_answers_requests_from_outside(deploy: Deploy, kubectl: Kubectl) -> None:
    deployed = deploy()
    ns, topics, bootstrap = deployed["ns"], deployed["topics"], deployed["bootstrap"]
    pods = _pod_status(kubectl, ns)
    assert len(pods) == 1
    pod = pods[0]
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert not pod["spec"].get("hostNetwork")
    _in_pod_network(pods)

    records = list(digits_requests(uuid.uuid4().hex[:6], HELDOUT, limit=500))
    t0 = time.monotonic()
    asyncio.run(send_all(bootstrap, topics["requests"], records, progress=False))
    expected = {r.correlation_id: r.manifest() for r in records}
    report = asyncio.run(collect(bootstrap, topics["results"], topics["dlq"], expected, 120, progress=False))
    print(
        f"cluster pod: rollout done {deployed['ready_s']:.1f} s after apply; {report.results} of {len(records)} "
        f"answered {time.monotonic() - t0:.1f} s after the first send, missing {len(report.missing)}, "
        f"duplicates {report.duplicates}, accuracy {report.accuracy}"
    )
    assert report.missing == []
    assert report.results == len(records)
    assert report.dead_letters == 0
    assert report.accuracy is not None
    assert report.accuracy >= 0.9


async def _disrupted(bootstrap: str, topic: str, records: list[Any], rate: float, disrupt: Callable[[], Any]) -> None:
    """Send ``records`` at ``rate`` records/s and run ``disrupt`` (blocking: kubectl) in a thread once a third are
    out; both awaited."""
    sending = asyncio.create_task(send_all(bootstrap, topic, records, rate=rate, progress=False))
    await asyncio.sleep(len(records) / rate / 3)
    await asyncio.to_thread(disrupt)
    await sending


def test_a_pod_deleted_under_load_loses_nothing_and_answers_each_request_once(deploy: Deploy, kubectl: Kubectl) -> None:
    """``kubectl delete pod`` (the kubelet's SIGTERM, the consumer's drain within the 30 s grace period) while
    requests arrive, delivery exactly_once: the Deployment's next pod (made as soon as the old one is terminating)
    takes over from the committed offsets; read_committed sees every answer once."""
    deployed = deploy(STREAMINFER_DELIVERY="exactly_once")
    ns, topics, bootstrap = deployed["ns"], deployed["topics"], deployed["bootstrap"]
    old = _pod_status(kubectl, ns)[0]["metadata"]["name"]
    records = list(digits_requests(uuid.uuid4().hex[:6], HELDOUT, limit=3000))
    timings: dict[str, float] = {}

    def delete() -> None:
        t0 = time.monotonic()
        kubectl("delete", "pod", old, "-n", ns, "--wait=true", timeout_s=90)
        timings["terminated_s"] = time.monotonic() - t0
        timings["next_ready_s"] = _wait_rollout(kubectl, ns) + timings["terminated_s"]

    t0 = time.monotonic()
    asyncio.run(_disrupted(bootstrap, topics["requests"], records, 100.0, delete))
    expected = {r.correlation_id: r.manifest() for r in records}
    report = asyncio.run(
        collect(
            bootstrap,
            topics["results"],
            topics["dlq"],
            expected,
            180,
            progress=False,
            isolation_level="read_committed",
            settle_s=5,
        )
    )
    pods = _pod_status(kubectl, ns)
    print(
        f"cluster pod delete: old pod gone {timings['terminated_s']:.1f} s after kubectl delete, next Ready "
        f"{timings['next_ready_s']:.1f} s after it; {report.results} of {len(records)} answered "
        f"{time.monotonic() - t0:.1f} s after the first send, missing {len(report.missing)}, "
        f"duplicates {report.duplicates}"
    )
    assert [p["metadata"]["name"] for p in pods] != [old]
    assert report.missing == []
    assert report.duplicates == 0
    assert report.results == len(records)


#: Seconds each step keeps running once its pods settled (the consumer group's rebalance onto what is left).
SETTLE_S = 4.0
CONSUMERS = "app.kubernetes.io/component=consumer"


def _ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def _wait_pods(kubectl: Kubectl, ns: str, count: int, timeout_s: float = 180) -> list[dict[str, Any]]:
    """Poll until the namespace has exactly ``count`` consumer pods, each Ready (no terminating one left); them.
    (kubectl wait has no "exactly N"; the ReplicaSet's pods come and go under it.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = _pod_status(kubectl, ns)
        if len(pods) == count and all(_ready(p) for p in pods):
            return pods
        time.sleep(0.5)
    pytest.fail(f"not {count} Ready pods after {timeout_s:.0f} s:\n{events(kubectl, ns)}", pytrace=False)


def _in_pod_network(pods: list[dict[str, Any]]) -> list[str]:
    """The pods' addresses, each checked to be its own on the bridge's subnet (not the host's)."""
    import ipaddress

    from harness.cluster import network

    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == len(ips), ips
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(network.SUBNET) for ip in ips), ips
    assert all(ip != p["status"]["hostIP"] for ip, p in zip(ips, pods, strict=True)), ips
    return ips


def _step(name: str, act: Callable[[], str]) -> Step:
    """Run ``act`` (kubectl until the pods settled; returns a note) as the step ``name``, then :data:`SETTLE_S`."""
    step = Step(name, clock())
    t0 = time.monotonic()
    step.note = act()
    step.action_s = time.monotonic() - t0
    time.sleep(SETTLE_S)
    step.end = clock()
    return step


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_scaled_to_two_and_back_and_restarted_under_load_loses_nothing(
    deploy: Deploy, kubectl: Kubectl, delivery: str
) -> None:
    """``kubectl scale`` to 2 (a second pod of its own address joins the group), back to 1 (the kubelet's SIGTERM
    and grace period for the one removed: it drains, commits and leaves the group) and ``kubectl rollout restart``
    (a surge pod, then the old one stopped), while requests arrive from outside at 100/s: every request answered,
    and under exactly_once (read_committed) each once."""
    deployed = deploy(STREAMINFER_DELIVERY=delivery)
    ns, topics, bootstrap = deployed["ns"], deployed["topics"], deployed["bootstrap"]
    deploy_ = ["deployment/streaminfer", "-n", ns]

    def scale(replicas: int) -> Callable[[], str]:
        def act() -> str:
            before = {p["metadata"]["name"] for p in _pod_status(kubectl, ns)}
            kubectl("scale", *deploy_, f"--replicas={replicas}")
            pods = _wait_pods(kubectl, ns, replicas)
            after = {p["metadata"]["name"] for p in pods}
            return f"pods {sorted(after)} at {_in_pod_network(pods)}; stopped {sorted(before - after)}"

        return act

    def restart() -> str:
        before = {p["metadata"]["name"] for p in _pod_status(kubectl, ns)}
        kubectl("rollout", "restart", *deploy_)
        _wait_rollout(kubectl, ns)
        pods = _wait_pods(kubectl, ns, 1)
        after = {p["metadata"]["name"] for p in pods}
        assert not before & after, (before, after)
        return f"{sorted(before)} replaced by {sorted(after)}"

    def steps() -> list[Step]:
        return [_step("scale 1->2", scale(2)), _step("scale 2->1", scale(1)), _step("rollout restart", restart)]

    t0 = time.monotonic()
    sent, done = asyncio.run(under_load(bootstrap, topics["requests"], HELDOUT, steps))
    report = report_of(bootstrap, topics, sent, delivery == "exactly_once")
    print(
        f"cluster scale/restart ({delivery}): {report.results} of {len(sent)} answered "
        f"{time.monotonic() - t0:.1f} s after the first send, missing {len(report.missing)}, "
        f"duplicates {report.duplicates}\n{measure(report, done)}"
    )
    assert report.missing == []
    assert report.results == len(sent)
    assert report.dead_letters == 0
    if delivery == "exactly_once":
        assert report.duplicates == 0


def _drain(kubectl: Kubectl, timeout_s: int) -> subprocess.CompletedProcess[str]:
    return kubectl(
        "drain",
        node.NODE_NAME,
        f"--pod-selector={CONSUMERS}",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        f"--timeout={timeout_s}s",
        check=False,
        timeout_s=timeout_s + 30,
    )


def _disruptions_allowed(kubectl: Kubectl, ns: str, wanted: int, timeout_s: float = 30) -> None:
    """Wait until the disruption controller counted the PDB's allowed disruptions as ``wanted``."""
    deadline = time.monotonic() + timeout_s
    got = ""
    while time.monotonic() < deadline:
        got = kubectl("get", "pdb", "streaminfer", "-n", ns, "-o", "jsonpath={.status.disruptionsAllowed}").stdout
        if got == str(wanted):
            return
        time.sleep(0.5)
    pytest.fail(f"the PDB allows {got!r} disruptions, not {wanted}", pytrace=False)


def _said(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """The kubectl output's lines that hold any of ``words``, joined (for the step's note)."""
    text = result.stdout + result.stderr
    return " | ".join(sorted({line.strip() for line in text.splitlines() if any(w in line for w in words)}))


def test_a_node_drain_honours_the_pod_disruption_budget(deploy: Deploy, kubectl: Kubectl) -> None:
    """``kubectl drain`` of the one node under load (at_least_once), three times:

    1. one pod, the PDB as shipped (``maxUnavailable: 1``): the budget allows one disruption, so the only pod is
       evicted and the drain passes; its replacement stays Pending on the cordoned node until ``uncordon``: an
       outage the shipped budget does not prevent with one replica;
    2. one pod, the PDB patched to ``minAvailable: 1``: the eviction is refused (429), the drain times out, the pod
       keeps serving;
    3. two pods, ``minAvailable: 1``: one is evicted, the other's eviction refused until the first one's
       replacement is Ready, which on a cordoned single node never comes: the drain times out with one pod serving.

    Every request is answered in the end."""
    deployed = deploy(STREAMINFER_DELIVERY="at_least_once")
    ns, topics, bootstrap = deployed["ns"], deployed["topics"], deployed["bootstrap"]
    budget = ["pdb", "streaminfer", "-n", ns]

    def uncordoned(count: int) -> str:
        kubectl("uncordon", node.NODE_NAME)
        return f"uncordoned: {len(_wait_pods(kubectl, ns, count))} Ready"

    def shipped_budget() -> str:
        _disruptions_allowed(kubectl, ns, 1)
        drained = _drain(kubectl, 60)
        assert drained.returncode == 0, drained.stderr
        pending = _pod_status(kubectl, ns)
        assert [p["status"]["phase"] for p in pending] == ["Pending"], pending
        return f"drain rc 0: {_said(drained, 'evicted', 'drained')}; replacement Pending; {uncordoned(1)}"

    def min_available_one_pod() -> str:
        kubectl(
            "patch",
            *budget,
            "--type=json",
            "-p",
            json.dumps(
                [
                    {"op": "remove", "path": "/spec/maxUnavailable"},
                    {"op": "add", "path": "/spec/minAvailable", "value": 1},
                ]
            ),
        )
        _disruptions_allowed(kubectl, ns, 0)
        drained = _drain(kubectl, 15)
        assert drained.returncode != 0, drained.stdout
        assert "disruption budget" in drained.stdout + drained.stderr, drained.stderr
        assert [_ready(p) for p in _pod_status(kubectl, ns)] == [True]
        return f"drain rc {drained.returncode}: {_said(drained, 'budget', 'evicted')}; {uncordoned(1)}"

    def min_available_two_pods() -> str:
        kubectl("scale", "deployment/streaminfer", "-n", ns, "--replicas=2")
        _wait_pods(kubectl, ns, 2)
        _disruptions_allowed(kubectl, ns, 1)
        drained = _drain(kubectl, 30)
        pods = _pod_status(kubectl, ns)
        phases = sorted((p["status"]["phase"], _ready(p)) for p in pods)
        assert drained.returncode != 0, drained.stdout
        assert "evicted" in drained.stdout, drained.stdout
        assert phases == [("Pending", False), ("Running", True)], phases
        return f"drain rc {drained.returncode}: {_said(drained, 'evicted', 'budget')}; pods {phases}; {uncordoned(2)}"

    def steps() -> list[Step]:
        try:
            return [
                _step("drain, 1 pod, maxUnavailable 1", shipped_budget),
                _step("drain, 1 pod, minAvailable 1", min_available_one_pod),
                _step("drain, 2 pods, minAvailable 1", min_available_two_pods),
            ]
        finally:
            kubectl("uncordon", node.NODE_NAME, check=False)

    sent, done = asyncio.run(under_load(bootstrap, topics["requests"], HELDOUT, steps, rate=50.0))
    report = report_of(bootstrap, topics, sent, exactly_once=False)
    print(
        f"cluster drain (at_least_once): {report.results} of {len(sent)} answered, missing {len(report.missing)}, "
        f"duplicates {report.duplicates}\n{measure(report, done)}"
    )
    assert report.missing == []
    assert report.results == len(sent)
