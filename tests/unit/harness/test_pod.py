"""The Deployment as docker run flags (the cpu overlay, rendered), and the checks of the image against it."""

from __future__ import annotations

import copy
import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from harness.docker import pod
from harness.docker.pod import ManifestError

ROOT = Path(__file__).resolve().parents[3]


@cache
def _docs(overlay: str = "cpu") -> tuple[dict[str, Any], ...]:
    return tuple(pod.render(overlay))


def _deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment")


def test_the_cpu_overlay_translates() -> None:
    p = pod.plan(_docs())
    assert p.image == "streaminfer:0.1.0-cpu"
    assert (p.run_as_user, p.run_as_group, p.fs_group, p.run_as_non_root) == (10001, 10001, 10001, True)
    assert p.read_only_root
    assert p.cap_drop == ("ALL",)
    assert p.no_new_privileges
    assert p.tmpfs == {"/tmp": "256m"}
    assert {(s.path, s.mode) for s in p.secrets} == {
        ("/var/run/secrets/kafka/user", 0o644),
        ("/var/run/secrets/kafka/ca", 0o644),
    }
    assert (p.memory, p.cpus, p.port, p.readiness_path, p.grace_s) == ("2g", "2", 9400, "/readyz", 30)
    assert p.env["STREAMINFER_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert p.env["STREAMINFER_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert p.env["STREAMINFER_EXECUTION_PROVIDER"] == "cpu"  # the overlay's patch over the base ConfigMap
    assert p.env_from_pod_name == ("STREAMINFER_CLIENT_ID", "STREAMINFER_GROUP_INSTANCE_ID")  # static membership
    assert {t.name for t in p.topics} == {"requests", "results", "requests.dlq"}


def test_docker_run_starts_it_as_the_deployment_does(tmp_path: Path) -> None:
    p = pod.plan(_docs())
    dirs = {s.volume: tmp_path / s.volume for s in p.secrets}
    argv = pod.run_argv(
        p,
        name="pod-1",
        image="img",
        overrides={"STREAMINFER_BOOTSTRAP_SERVERS": "172.17.0.1:9093"},
        secret_dirs=dirs,
        network="bridge",
    )
    joined = " ".join(argv)
    for flag in (
        "--user 10001:10001",
        "--group-add 10001",
        "--read-only",
        "--tmpfs /tmp:rw,nosuid,nodev,size=256m",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--memory 2g",
        "--cpus 2",
        "--env STREAMINFER_BOOTSTRAP_SERVERS=172.17.0.1:9093",
        "--env STREAMINFER_CLIENT_ID=pod-1",
        "--env STREAMINFER_SASL_PASSWORD_FILE=/var/run/secrets/kafka/user/password",
        f"--volume {tmp_path / 'kafka-user'}:/var/run/secrets/kafka/user:ro",
        "--publish 127.0.0.1::9400",
    ):
        assert flag in joined, flag
    assert "my-cluster-kafka-bootstrap" not in joined  # the one override replaced it
    assert argv[-1] == "img"
    host = pod.run_argv(p, name="n", image="img", overrides={}, secret_dirs=dirs, network="host")
    assert "--network" in host
    assert "--publish" not in host
    with pytest.raises(ManifestError, match="STREAMINFER_NO_SUCH"):
        pod.run_argv(p, name="n", image="i", overrides={"STREAMINFER_NO_SUCH": "1"}, secret_dirs=dirs, network="host")


def test_the_secrets_files_land_where_the_configmap_points() -> None:
    p = pod.plan(_docs())
    files = pod.secret_files(p, {"STREAMINFER_SASL_PASSWORD_FILE": b"pw", "STREAMINFER_SSL_CAFILE": b"pem"})
    assert files == {"kafka-user": {"password": b"pw"}, "kafka-ca": {"ca.crt": b"pem"}}
    moved = dataclasses.replace(p, env={**p.env, "STREAMINFER_SSL_CAFILE": "/etc/ssl/ca.crt"})
    with pytest.raises(ManifestError, match=r"STREAMINFER_SSL_CAFILE=/etc/ssl/ca\.crt is under no mounted Secret"):
        pod.secret_files(moved, {"STREAMINFER_SSL_CAFILE": b"pem"})


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c, _p: c.update(command=["python", "-m", "consumer"]), "command"),
        (lambda c, _p: c["securityContext"]["capabilities"].update(add=["NET_ADMIN"]), "capabilities.add"),
        (lambda c, _p: c["securityContext"].update(privileged=True), "privileged"),
        (lambda _c, p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), None),
        (lambda c, p: (p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
                       c["volumeMounts"].append({"name": "h", "mountPath": "/h"})), "only emptyDir and Secret"),
        (lambda c, _p: c["env"].append({"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}), "X"),
        (lambda c, _p: c["volumeMounts"][1].update(readOnly=False), "mounted writable"),
    ],
)  # fmt: skip
def test_what_the_translation_cannot_honour_fails_named(change: Any, named: str | None) -> None:
    docs = copy.deepcopy(list(_docs()))
    spec = _deployment(docs)["spec"]["template"]["spec"]
    change(spec["containers"][0], spec)
    if named is None:  # a volume nobody mounts changes nothing
        pod.plan(docs)
        return
    with pytest.raises(ManifestError, match=named):
        pod.plan(docs)


def test_the_gpu_overlay_is_refused_by_name() -> None:
    with pytest.raises(ManifestError, match=r"nvidia\.com/gpu"):
        pod.plan(_docs("gpu"))


def _inspected() -> dict[str, Any]:
    return {
        "Size": 1,
        "Config": {
            "User": "10001:10001",
            "Entrypoint": ["streaminfer-consumer"],
            "ExposedPorts": {"9400/tcp": {}},
            "Env": ["PATH=/opt/venv/bin", "STREAMINFER_MODEL_PATH=/opt/streaminfer/models/digits.onnx"],
            "Labels": {
                "org.opencontainers.image.version": "0.1.0",
                "org.opencontainers.image.revision": "abc",
                "org.opencontainers.image.source": "https://example.invalid/streaminfer",
            },
        },
    }


def test_the_image_configuration_is_checked_against_the_manifests() -> None:
    p = pod.plan(_docs())
    assert pod.image_problems(p, _inspected()) == []
    for path, value, named in [
        ("User", "root", "numeric"),
        ("User", "0:0", "root but the pod has runAsNonRoot"),
        ("User", "1000:1000", "differs from the Deployment's runAsUser"),
        ("Entrypoint", None, "no ENTRYPOINT"),
        ("ExposedPorts", {"8080/tcp": {}}, "does not expose 9400/tcp"),
        ("Env", ["STREAMINFER_MODEL_PATH=/models/x.onnx"], "is not the ConfigMap's"),
        ("Labels", {}, "no org.opencontainers.image.version label"),
    ]:
        image = _inspected()
        image["Config"][path] = value
        problems = pod.image_problems(p, image)
        assert any(named in problem for problem in problems), (path, problems)


def test_what_the_probe_finds_inside_is_checked() -> None:
    p = pod.plan(_docs())
    good = {
        "uid": 10001,
        "gid": 10001,
        "model_bytes": 4000,
        "runtimes": ["onnxruntime"],
        "nvidia": [],
        "providers": ["CPUExecutionProvider"],
        "writable": ["/tmp"],
    }
    assert pod.probe_problems(p, good) == []
    assert pod.parse_probe("noise\n" + '{"uid": 1}\n') == {"uid": 1}
    with pytest.raises(ManifestError, match="printed no report"):
        pod.parse_probe("Traceback ...")
    for change, named in [
        ({"model_error": "No such file"}, "No such file"),
        ({"writable": ["/", "/tmp"]}, "writable outside"),
        ({"runtimes": ["onnxruntime", "onnxruntime-gpu"]}, "onnxruntime only"),
        ({"nvidia": ["nvidia-cudnn-cu13"]}, "CUDA libraries"),
        ({"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}, "GPU execution providers"),
    ]:
        assert any(named in x for x in pod.probe_problems(p, {**good, **change})), change
    assert pod.probe_problems(p, {**good, "nvidia": ["nvidia-cudnn-cu13"]}, "gpu") == []


@pytest.mark.parametrize(
    ("value", "expected"), [("2Gi", "2g"), ("256Mi", "256m"), ("512Ki", "512k"), ("1G", "1000000000b"), (1024, "1024b")]
)
def test_memory_quantities(value: str | int, expected: str) -> None:
    assert pod.docker_quantity(value, "x") == expected


def test_cpu_quantities_and_refusals() -> None:
    assert pod.docker_cpus("2", "x") == "2"
    assert pod.docker_cpus("500m", "x") == "0.5"
    assert pod.docker_cpus(1.5, "x") == "1.5"
    with pytest.raises(ManifestError, match="not a CPU quantity"):
        pod.docker_cpus("two", "cpu limit")
    with pytest.raises(ManifestError, match="not a memory quantity"):
        pod.docker_quantity("2.5Gi", "memory limit")
