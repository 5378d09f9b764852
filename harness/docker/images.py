"""Building the streaminfer images: ``make image-cpu`` and ``make image-gpu`` (``python -m harness.docker build``).

- **Base**: ``--base`` when given; else the Dockerfile's own default (``ARG BASE_IMAGE=``: the official
  ``python:3.11-slim``, NVIDIA's ``nvidia/cuda`` for the GPU image) when it is here or can be pulled; else, where no
  registry answers, the Debian base made here (:mod:`harness.docker.base`), and for the GPU image
  ``RUNTIME_LOCK=cuda`` (CUDA and cuDNN from PyPI's nvidia-* wheels instead of the CUDA image's).
- **Build**: BuildKit (:attr:`harness.docker.client.Docker.builder`), ``--network host`` (an engine started here has
  no NAT for the bridge), the CA bundle as the optional ``pip_ca`` secret (``--ca-bundle``, else ``$PIP_CERT``, else
  none), the OCI labels: version (pyproject.toml), revision (``git rev-parse HEAD``, ``-dirty`` when tracked files
  differ), source (``$IMAGE_SOURCE``, else git's ``origin``).
- **After**: the image this tag named before is removed when no other tag names it; the image's size; for the GPU
  image, ``ldd`` on the CUDA provider and the nvidia-* wheels' libraries inside it: every library must resolve but
  the driver's ``libcuda.so.1`` (:func:`unresolved`).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.docker import base as local_base
from harness.docker.client import Docker, DockerError

ROOT = Path(__file__).resolve().parents[2]
#: Libraries ``ldd`` may leave unresolved in the GPU image: the driver's, which the NVIDIA container toolkit mounts.
DRIVER_LIBRARIES = frozenset({"libcuda.so.1"})
CUDA_PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"


@dataclass(frozen=True)
class Built:
    """A built image: its tag, size (bytes), the base it was built on, the seconds the build took."""

    tag: str
    size: int
    base: str
    seconds: float
    unresolved: tuple[str, ...] = ()


def dockerfile(flavour: str) -> Path:
    """``docker/<flavour>.Dockerfile``.

    Raises:
        ValueError: no such flavour.
    """
    path = ROOT / "docker" / f"{flavour}.Dockerfile"
    if flavour not in ("cpu", "gpu") or not path.exists():
        raise ValueError(f"unknown image flavour {flavour!r}: cpu or gpu")
    return path


def default_base(path: Path) -> str:
    """The ``ARG BASE_IMAGE=`` default of a Dockerfile.

    Raises:
        ValueError: it has none.
    """
    found = re.search(r"^ARG BASE_IMAGE=(\S+)$", path.read_text(), flags=re.M)
    if not found:
        raise ValueError(f"{path} has no ARG BASE_IMAGE=...")
    return found.group(1)


def project_version(root: Path = ROOT) -> str:
    """``[project] version`` of pyproject.toml."""
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def revision(root: Path = ROOT) -> str:
    """The commit the image is built from (``-dirty`` when tracked files differ from it); ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)  # noqa: S607
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root, capture_output=True, check=False)  # noqa: S607
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.returncode else "")


def source(root: Path = ROOT, env: Mapping[str, str] | None = None) -> str:
    """Where the source comes from: ``$IMAGE_SOURCE``, else git's ``origin`` URL, else ``unknown``."""
    env = os.environ if env is None else env
    if env.get("IMAGE_SOURCE"):
        return env["IMAGE_SOURCE"]
    done = subprocess.run(["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True, check=False)  # noqa: S607
    return done.stdout.strip() or "unknown"


def ca_bundle(given: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The CA bundle for pip inside the build: ``given``, else ``$PIP_CERT``, else None.

    Raises:
        ValueError: the named file does not exist.
    """
    env = os.environ if env is None else env
    chosen = given or (Path(env["PIP_CERT"]) if env.get("PIP_CERT") else None)
    if chosen is not None and not chosen.is_file():
        raise ValueError(f"CA bundle {chosen} is not a file")
    return chosen


def build_args(
    flavour: str, *, tag: str, base: str, runtime_lock: str | None, ca: Path | None, no_cache: bool = False
) -> list[str]:
    """The ``docker build`` arguments of one image (the context, the repository root, comes last from the caller)."""
    args = ["--network", "host", "-f", str(dockerfile(flavour)), "-t", tag,
            "--build-arg", f"BASE_IMAGE={base}",
            "--build-arg", f"VERSION={project_version()}",
            "--build-arg", f"REVISION={revision()}",
            "--build-arg", f"SOURCE={source()}"]  # fmt: skip
    if runtime_lock:
        args += ["--build-arg", f"RUNTIME_LOCK={runtime_lock}"]
    if ca is not None:
        args += ["--secret", f"id=pip_ca,src={ca}"]
    if no_cache:
        args.append("--no-cache")
    return args


def choose_base(docker: Docker, flavour: str, given: str | None, say: Callable[[str], None]) -> tuple[str, str | None]:
    """(base image, RUNTIME_LOCK or None) for ``flavour`` (see the module docstring)."""
    if given:
        return given, None
    official = default_base(dockerfile(flavour))
    problem = docker.have_or_pull(official, timeout_s=120)
    if problem is None:
        return official, None
    tag = local_base.ensure(docker, local_base.RECIPES["python"], say=say)
    say(f"{official} cannot be pulled ({problem}): building on the local base {tag}")
    return tag, ("cuda" if flavour == "gpu" else None)


def build(
    docker: Docker,
    flavour: str,
    *,
    tag: str,
    base: str | None = None,
    ca: Path | None = None,
    no_cache: bool = False,
    say: Callable[[str], None] = print,
) -> Built:
    """Build ``docker/<flavour>.Dockerfile`` as ``tag`` (see the module docstring); the GPU image is also checked with
    ``ldd``.

    Raises:
        DockerError: the build failed, or (GPU) a library of the CUDA provider does not resolve.
        ValueError: an unknown flavour or a missing CA bundle.
    """
    chosen, runtime_lock = choose_base(docker, flavour, base, say)
    previous = (docker.image(tag) or {}).get("Id")
    started = time.monotonic()
    args = build_args(flavour, tag=tag, base=chosen, runtime_lock=runtime_lock, ca=ca, no_cache=no_cache)
    say(f"building {tag} on {chosen}" + (f" (RUNTIME_LOCK={runtime_lock})" if runtime_lock else ""))
    docker.build(args, ROOT)
    took = time.monotonic() - started
    inspected = docker.image(tag)
    if inspected is None:
        raise DockerError(f"the build reported success but there is no image {tag}")
    if previous and previous != inspected.get("Id"):  # the image this tag named before, if nothing else names it now
        old = docker.image(previous)
        if old is not None and not old.get("RepoTags"):
            docker.run("rmi", previous, check=False)
    missing: tuple[str, ...] = ()
    if flavour == "gpu":
        missing = tuple(unresolved(docker, tag))
        if set(missing) - DRIVER_LIBRARIES:
            raise DockerError(f"{tag}: the CUDA provider's libraries do not resolve: {sorted(missing)}")
    return Built(tag, int(inspected.get("Size", 0)), chosen, took, missing)


def unresolved(docker: Docker, tag: str) -> list[str]:
    """The libraries ``ldd`` finds no file for, in image ``tag``: for ONNX Runtime's CUDA provider and for every
    library of the nvidia-* wheels (cuDNN, cuFFT and NVRTC are opened at run time, so the provider's own ``ldd`` does
    not list them).

    Raises:
        DockerError: the provider library is not in the image.
    """
    script = (
        "set -e; sp=$(ls -d /opt/venv/lib/python3*/site-packages | head -n 1); "
        f'f="$sp/{CUDA_PROVIDER}"; test -f "$f" || {{ echo "no CUDA provider library" >&2; exit 3; }}; '
        'for lib in "$f" $(ls "$sp"/nvidia/*/lib/*.so* 2>/dev/null); do ldd "$lib"; done'
    )
    done = docker.run("run", "--rm", "--network", "none", "--entrypoint", "sh", tag, "-c", script, check=False)
    if done.returncode != 0:
        raise DockerError(f"{tag}: ldd of the CUDA provider failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return not_found(done.stdout)


def not_found(ldd_output: str) -> list[str]:
    """The sonames ``ldd`` prints as ``=> not found``."""
    return sorted({line.split()[0] for line in ldd_output.splitlines() if "not found" in line and line.split()})
