"""The custom resource definitions the overlays use, from their package registries at pinned versions, into
``<cache>/crds/<project>-<version>/`` (fetched once):

- KEDA (``keda.sh``: ScaledObject, TriggerAuthentication, ...): the Go module ``github.com/kedacore/keda/v2``,
  ``config/crd/bases/`` (``go mod download``: the module proxy and its checksum database). v2.20.2 is the newest
  this Go (1.26) can download: v2.21 requires go >= 1.27.4;
- the Prometheus operator (``monitoring.coreos.com``: ServiceMonitor, ...): the Go module
  ``github.com/prometheus-operator/prometheus-operator``, ``example/prometheus-operator-crd/``;
- Strimzi (``kafka.strimzi.io``: KafkaTopic, KafkaUser, ...): Maven Central's ``io.strimzi:api`` test jar
  (``api-<version>-tests.jar``, ``crds/v1beta2/``: each CRD serving v1beta2 and v1), its SHA-1 checked against the
  one Maven Central publishes. No other Strimzi artifact there carries them (the main ``api`` jar has only classes),
  and 1.x test jars have none; 0.51.0 is the newest 0.x. Its CRDs store ``v1beta2`` (the folder's name) and serve
  ``v1`` too, the version the manifests use (``v1beta2`` is deprecated there and gone in 1.x).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from harness.cluster import cache_dir

KEDA = ("github.com/kedacore/keda/v2", "v2.20.2", "config/crd/bases")
PROMETHEUS_OPERATOR = (
    "github.com/prometheus-operator/prometheus-operator",
    "v0.85.0",
    "example/prometheus-operator-crd",
)
STRIMZI_VERSION = "0.51.0"
MAVEN = "https://repo1.maven.org/maven2"
#: The Strimzi CRDs the manifests use (KafkaTopic, KafkaUser); the others (Kafka, KafkaConnect, ...) are not needed.
STRIMZI_FILES = ("043-Crd-kafkatopic.yaml", "044-Crd-kafkauser.yaml")


def _go_module(module: str, version: str, sub: str, dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GOFLAGS": "", "GOTOOLCHAIN": "local"}
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        info = json.loads(out.stdout or "{}")
        if out.returncode or "Dir" not in info:
            raise RuntimeError(f"go mod download {module}@{version}: {info.get('Error') or out.stderr.strip()}")
    tmp_dest = dest.with_suffix(".part")
    shutil.rmtree(tmp_dest, ignore_errors=True)
    tmp_dest.mkdir(parents=True)
    for yaml in sorted((Path(info["Dir"]) / sub).glob("*.yaml")):
        shutil.copyfile(yaml, tmp_dest / yaml.name)
    tmp_dest.rename(dest)


def _strimzi(version: str, dest: Path) -> None:
    url = f"{MAVEN}/io/strimzi/api/{version}/api-{version}-tests.jar"
    with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 - Maven Central
        jar = r.read()
    with urllib.request.urlopen(f"{url}.sha1", timeout=60) as r:  # noqa: S310
        want = r.read().decode().split()[0]
    if hashlib.sha1(jar).hexdigest() != want:  # noqa: S324 - the checksum Maven Central publishes
        raise RuntimeError(f"{url}: SHA-1 does not match Maven Central's")
    tmp_dest = dest.with_suffix(".part")
    shutil.rmtree(tmp_dest, ignore_errors=True)
    tmp_dest.mkdir(parents=True)
    with tempfile.NamedTemporaryFile(suffix=".jar") as f:
        f.write(jar)
        f.flush()
        with zipfile.ZipFile(f.name) as z:
            for name in STRIMZI_FILES:
                (tmp_dest / name).write_bytes(z.read(f"crds/v1beta2/{name}"))
    tmp_dest.rename(dest)


def fetch() -> list[Path]:
    """The three CRD folders, fetched where missing. Raises RuntimeError naming what could not be had."""
    root = cache_dir() / "crds"
    root.mkdir(parents=True, exist_ok=True)
    folders = []
    for module, version, sub in (KEDA, PROMETHEUS_OPERATOR):
        dest = root / f"{module.split('/')[2]}-{version}"
        if not dest.is_dir():
            _go_module(module, version, sub, dest)
        folders.append(dest)
    dest = root / f"strimzi-{STRIMZI_VERSION}"
    if not dest.is_dir():
        _strimzi(STRIMZI_VERSION, dest)
    folders.append(dest)
    return folders
