"""Base images made here, for machines that reach Debian's package mirror but no image registry.

``debootstrap --variant=minbase --include=PACKAGES bookworm`` builds a Debian root file system from Debian's own
packages (about a minute); docs, man pages, locales and apt's caches are removed (copyright files stay), and
``docker import`` turns the folder into an image. Built once per recipe: the image carries the recipe's digest in the
label ``dev.streaminfer.base.recipe`` and is reused while it matches (:func:`ensure`).

    python   python3 (3.11), python3-venv, ca-certificates, netbase: the streaminfer images' base where the
             official python:3.11-slim cannot be pulled (docker/*.Dockerfile take it as BASE_IMAGE)
    jre      openjdk-17-jre-headless, ca-certificates, netbase: the base of the local apache/kafka image

Debian's ``bookworm`` suite is used as the mirror serves it today, with ``bookworm-updates`` and the security suite
applied (``apt-get upgrade`` inside the new root): a rebuild (``--rebuild``) picks up later updates.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.docker.client import Docker, DockerError
from harness.docker.engine import EngineError, apt_install

#: Label of a local base image: the digest of the recipe it was built from.
RECIPE_LABEL = "dev.streaminfer.base.recipe"
#: Changes whenever :func:`build_rootfs` changes what it does (a new digest: every base is rebuilt once).
RECIPE_VERSION = 1
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
#: Seconds debootstrap (and the upgrade after it) may take.
DEBOOTSTRAP_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Recipe:
    """A Debian root file system to build.

    Attributes:
        name: its short name (``python``, ``jre``).
        packages: what ``debootstrap --include`` adds to minbase.
        env: ``ENV`` lines of the image (``docker import --change``).
        cmd: its default command.
        suite: Debian's suite.
    """

    name: str
    packages: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = (("LANG", "C.UTF-8"),)
    cmd: tuple[str, ...] = ("bash",)
    suite: str = "bookworm"

    @property
    def digest(self) -> str:
        """A short digest of everything that decides the root file system's content (not the day it is built)."""
        key = json.dumps([RECIPE_VERSION, self.packages, self.env, self.cmd, self.suite, MIRROR], sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @property
    def tag(self) -> str:
        """The image name, e.g. ``streaminfer-local/debian-python:bookworm``."""
        return f"streaminfer-local/debian-{self.name}:{self.suite}"


RECIPES: dict[str, Recipe] = {
    "python": Recipe("python", ("python3", "python3-venv", "ca-certificates", "netbase"), cmd=("python3",)),
    "jre": Recipe("jre", ("openjdk-17-jre-headless", "ca-certificates", "netbase")),
}

#: Removed from the root file system after the install (what Debian's own slim images leave out).
TRIMMED = ("usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt/archives", "var/lib/apt/lists")


def ensure(docker: Docker, recipe: Recipe, *, rebuild: bool = False, say: Callable[[str], None] = print) -> str:
    """The tag of ``recipe``'s image, built first unless one with its digest is already there (or ``rebuild``).

    Raises:
        EngineUnavailable: debootstrap is missing and cannot be installed (not root on Debian).
        EngineError: debootstrap failed.
        DockerError: the import failed.
    """
    found = docker.image(recipe.tag)
    labels = ((found or {}).get("Config") or {}).get("Labels") or {}
    if found is not None and labels.get(RECIPE_LABEL) == recipe.digest and not rebuild:
        return recipe.tag
    debootstrap = apt_install("debootstrap", "debootstrap", say)
    started = time.monotonic()
    with _workdir(recipe) as work:
        rootfs = work / "rootfs"
        build_rootfs(debootstrap, recipe, rootfs, say)
        changes = [f"ENV {k}={v}" for k, v in recipe.env] + [
            f"CMD {json.dumps(list(recipe.cmd))}",
            f'LABEL {RECIPE_LABEL}="{recipe.digest}"',
            f'LABEL org.opencontainers.image.description="Debian {recipe.suite} minbase + {" ".join(recipe.packages)}'
            ' (debootstrap, docker import; harness/docker/base.py)"',
        ]
        argv = ["import", *(a for c in changes for a in ("--change", c)), "-", recipe.tag]
        tar = subprocess.Popen(  # noqa: S603 (tar of the root we just built)
            [shutil.which("tar") or "/bin/tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
        )
        try:
            done = subprocess.run(  # noqa: S603 (the docker client)
                [docker.cli, *argv], stdin=tar.stdout, capture_output=True, text=True, env=docker.env(), check=False
            )
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait()
        if done.returncode != 0 or tar.returncode != 0:
            raise DockerError(f"docker import of {rootfs} failed: {done.stderr.strip()[-2000:]}")
    say(f"base image {recipe.tag} built in {time.monotonic() - started:.0f} s")
    return recipe.tag


def build_rootfs(debootstrap: str, recipe: Recipe, rootfs: Path, say: Callable[[str], None]) -> None:
    """``debootstrap --variant=minbase`` of ``recipe`` into ``rootfs``, security updates applied, then trimmed.

    Raises:
        EngineError: debootstrap or the upgrade failed (the end of its output in the message).
    """
    argv = [debootstrap, "--variant=minbase", f"--include={','.join(recipe.packages)}", recipe.suite, str(rootfs),
            MIRROR]  # fmt: skip
    say(f"building {recipe.tag}: {' '.join(argv)}")
    _run(argv)
    (rootfs / "etc/apt/sources.list").write_text(
        f"deb {MIRROR} {recipe.suite} main\n"
        f"deb {MIRROR} {recipe.suite}-updates main\n"
        f"deb {SECURITY_MIRROR} {recipe.suite}-security main\n"
    )
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    # Package scripts may need /proc (the JRE's do): mounted for the upgrade only (_workdir unmounts whatever is left).
    _run(["mount", "-t", "proc", "proc", str(rootfs / "proc")])
    try:
        _run(["chroot", str(rootfs), "apt-get", "update", "--quiet"], env)
        _run(["chroot", str(rootfs), "apt-get", "upgrade", "--yes", "--quiet", "--no-install-recommends"], env)
        _run(["chroot", str(rootfs), "apt-get", "clean"], env)
    finally:
        _run(["umount", str(rootfs / "proc")])
    for rel in TRIMMED:
        target = rootfs / rel
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                elif child.name not in ("lock", "partial"):
                    child.unlink()
    doc = rootfs / "usr/share/doc"
    for path in sorted(doc.rglob("*"), reverse=True) if doc.is_dir() else []:
        if path.is_file() and path.name != "copyright":
            path.unlink()
        elif path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            path.rmdir()
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)  # the engine provides its own


def _run(argv: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(  # noqa: S603 (debootstrap / chroot with our own arguments)
        argv, capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT_S, env=env, check=False
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise EngineError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}):\n{tail}")


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (``/proc/self/mounts``), deepest first."""
    prefix = str(path.resolve())
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        for line in mounts:
            target = line.split()[1].replace("\\040", " ")
            if target == prefix or target.startswith(prefix + "/"):
                found.append(target)
    return sorted(found, key=len, reverse=True)


@contextlib.contextmanager
def _workdir(recipe: Recipe) -> Iterator[Path]:
    """A scratch folder for one root file system, removed afterwards; never while anything is mounted inside it
    (debootstrap mounts /proc and /sys in the new root while it works: an interrupted run can leave them)."""
    work = Path(tempfile.mkdtemp(prefix=f"streaminfer-base-{recipe.name}-"))
    try:
        yield work
    finally:
        for target in mounts_under(work):
            subprocess.run(["umount", "--lazy", target], capture_output=True, check=False)  # noqa: S603, S607
        left = mounts_under(work)
        if left:
            raise EngineError(f"cannot remove {work}: still mounted there: {left}")
        if os.path.isdir(work):
            shutil.rmtree(work)
