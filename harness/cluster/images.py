"""Images for the cluster's containerd, which has no registry to pull from: the pod sandbox (pause) image made here
as an OCI archive around the static ``pause`` binary of the cache (``harness/cluster/pause/main.go``), and images
of the Docker engine carried over with ``docker save | ctr images import``. Pods use them with
``imagePullPolicy: Never``.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

from harness.cluster import PAUSE_IMAGE, bin_dir, ctr_argv


def _blob(out: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    _add(out, f"blobs/sha256/{digest.split(':')[1]}", data)
    return digest, len(data)


def _add(out: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    out.addfile(info, io.BytesIO(data))


def pause_archive(binary: Path, name: str = PAUSE_IMAGE) -> bytes:
    """An OCI image layout archive (``oci-layout``, ``index.json``, ``blobs/``) of one uncompressed layer holding
    ``/pause``, linux/amd64, entrypoint ``/pause``; the index names it ``name`` (``io.containerd.image.name``)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        _add(t, "pause", binary.read_bytes(), mode=0o755)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as out:
        layer_digest, layer_size = _blob(out, layer.getvalue())
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
        config_digest, config_size = _blob(out, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}
            ],
        }
        manifest_digest, manifest_size = _blob(out, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
                }
            ],
        }
        _add(out, "index.json", json.dumps(index).encode())
        _add(out, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    return archive.getvalue()


def import_archive(data: bytes) -> None:
    """``ctr images import`` of an archive (OCI layout or ``docker save``), unpacked for the CRI. Raises
    :class:`subprocess.CalledProcessError` with ctr's message."""
    subprocess.run([*ctr_argv(), "images", "import", "-"], input=data, check=True, capture_output=True, timeout=600)


def import_pause() -> None:
    import_archive(pause_archive(bin_dir() / "pause"))


def import_docker_image(image: str, docker: str = "docker") -> float:
    """Carry ``image`` from the Docker engine (``DOCKER_HOST``) into the cluster's containerd; MB imported."""
    saved = subprocess.run([docker, "save", image], check=True, capture_output=True, timeout=600).stdout
    import_archive(saved)
    return len(saved) / 1e6
