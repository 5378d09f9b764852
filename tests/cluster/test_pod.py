"""The consumer as a pod of the one-node cluster: the CPU image (``make image-cpu``) imported into containerd, the
cpu overlay applied through a test overlay (:func:`write_test_overlay`), the pod Ready through its readiness probe, and
requests produced from outside the cluster answered.

The test overlay is the documented patch (docs/operations.md "Tested on a real cluster"): the Deployment on the host
network (the one-node cluster runs no CNI plugin; pods share 127.0.0.1 with the broker), its image used as imported
(``imagePullPolicy: Never``), requests small enough for a 2-core node, the ConfigMap pointing at the tests' broker
(PLAINTEXT) and topics, the HTTP port one the kernel chose; the two Secrets the pod mounts made with placeholder
contents (Strimzi would write them). Everything else is the overlay as shipped: probes, security context, grace
period, PodDisruptionBudget.
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

from harness.cluster import REPO, node
from harness.ports import free_port
from producer_tools.produce import digits_requests, send_all
from producer_tools.results import collect
from producer_tools.topics import ensure_topics
from tests.cluster.conftest import Kubectl, events, render

pytestmark = pytest.mark.cluster
IMAGE = f"streaminfer:{os.environ.get('IMAGE_TAG', '0.1.0')}-cpu"
HELDOUT = REPO / "models/digits/artifacts/heldout.npz"


def ensure_image(image: str = IMAGE) -> None:
    """The image in the cluster's containerd, imported from the Docker engine where missing (fails naming what to
    run when neither has it)."""
    ref = f"docker.io/library/{image}"
    listed = subprocess.run(
        [*node.ctr_argv(), "images", "ls", "-q", f"name=={ref}"], capture_output=True, text=True, check=True
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


def write_test_overlay(
    folder: Path, ns: str, bootstrap: str, topics: dict[str, str], http_port: int, **settings: str
) -> Path:
    """Write the test overlay (a kustomization over k8s/overlays/cpu) into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "STREAMINFER_BOOTSTRAP_SERVERS": bootstrap,
        "STREAMINFER_SECURITY_PROTOCOL": "PLAINTEXT",
        "STREAMINFER_GROUP_ID": f"cluster-{ns}",
        "STREAMINFER_REQUESTS_TOPIC": topics["requests"],
        "STREAMINFER_RESULTS_TOPIC": topics["results"],
        "STREAMINFER_DEAD_LETTER_TOPIC": topics["dlq"],
        "STREAMINFER_HTTP_PORT": str(http_port),
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
                    "hostNetwork": True,
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
            {  # the one port, renumbered (a strategic merge would add a second "http" port)
                "target": {"kind": "Deployment", "name": "streaminfer"},
                "patch": yaml.safe_dump(
                    [
                        {
                            "op": "replace",
                            "value": http_port,
                            "path": "/spec/template/spec/containers/0/ports/0/containerPort",
                        }
                    ]
                ),
            },
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


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
        tag = uuid.uuid4().hex[:8]
        topics = {"requests": f"k8s-{tag}.requests", "results": f"k8s-{tag}.results", "dlq": f"k8s-{tag}.dlq"}
        append = {"message.timestamp.type": "LogAppendTime"}
        asyncio.run(
            ensure_topics(
                kafka_bootstrap,
                {topics["requests"]: 4, topics["results"]: 4, topics["dlq"]: 1},
                configs={topics["results"]: append, topics["dlq"]: append},
            )
        )
        for secret, key in (("streaminfer", "password"), ("my-cluster-cluster-ca-cert", "ca.crt")):
            kubectl("create", "secret", "generic", secret, "-n", ns, f"--from-literal={key}=placeholder")
        folder = write_test_overlay(tmp_path / ns, ns, kafka_bootstrap, topics, free_port(), **settings)
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
    requests arrive, delivery exactly_once: the Deployment's next pod (scheduled once the old one is gone: the host
    port is the node's) takes over from the committed offsets; read_committed sees every answer once."""
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
