"""The ``docker`` command line against one engine, and the BuildKit-capable client the image builds need.

Everything here runs the ``docker`` CLI (the commands a user would type, printed where they matter) with
``DOCKER_HOST`` set to the engine's address; JSON comes from ``--format '{{json .}}'`` and ``inspect``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Where Debian's docker.io puts its client (20.10: BuildKit built in, no buildx needed), beside a newer client on PATH.
DEBIAN_CLI = Path("/usr/bin/docker")
#: From this client version on, ``docker build`` needs the buildx plugin for BuildKit (else it falls back to the legacy
#: builder, which refuses ``RUN --mount``).
BUILDX_REQUIRED_FROM = 23


class DockerError(RuntimeError):
    """A docker command failed; the message has the command and the end of its output."""


def cli_candidates(env: Mapping[str, str] | None = None) -> list[str]:
    """The docker clients on this machine: PATH's first, then Debian's, each once."""
    env = os.environ if env is None else env
    found: list[str] = []
    on_path = shutil.which("docker", path=env.get("PATH"))
    for candidate in (on_path, str(DEBIAN_CLI) if DEBIAN_CLI.exists() else None):
        if candidate and os.path.realpath(candidate) not in {os.path.realpath(f) for f in found}:
            found.append(candidate)
    return found


def major(version: str) -> int:
    """The major version of a docker client version string (``28.2.2`` -> 28, ``20.10.24+dfsg1`` -> 20); 0 when
    unreadable."""
    match = re.match(r"\s*(\d+)", version)
    return int(match.group(1)) if match else 0


def buildkit_argv(client: str, client_version: str, has_buildx: bool) -> tuple[list[str], dict[str, str]] | None:
    """How ``client`` builds with BuildKit: (argv prefix up to ``build``, extra environment), or None when it cannot
    (a client from :data:`BUILDX_REQUIRED_FROM` on without the buildx plugin)."""
    if has_buildx:
        return [client, "buildx", "build", "--load"], {}
    if 0 < major(client_version) < BUILDX_REQUIRED_FROM:
        return [client, "build"], {"DOCKER_BUILDKIT": "1"}
    return None


class Docker:
    """The docker CLI against the engine at ``host`` (a ``DOCKER_HOST`` value such as ``unix:///var/run/docker.sock``).

    Args:
        host: the engine's address.
        cli: the client for everything but builds (default: the first of :func:`cli_candidates`).

    Raises:
        DockerError: no docker client is installed.
    """

    def __init__(self, host: str, cli: str | None = None) -> None:
        candidates = cli_candidates()
        if cli is None and not candidates:
            raise DockerError("no docker client found (Debian: apt-get install docker.io; `make docker-engine` does)")
        self.host = host
        self.cli = cli or candidates[0]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with ``DOCKER_HOST`` pointing at the engine."""
        return {**os.environ, "DOCKER_HOST": self.host, **(extra or {})}

    def run(
        self,
        *args: str,
        check: bool = True,
        timeout_s: float | None = 300,
        capture: bool = True,
        cli: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` (or ``cli ARGS`` for a build client); output captured as text unless ``capture`` is False
        (then it goes to this process's stdout and stderr).

        Raises:
            DockerError: with ``check``, a non-zero exit or a timeout (``timeout_s``, seconds).
        """
        argv = [*(cli or [self.cli]), *args]
        try:
            done = subprocess.run(  # noqa: S603 (the docker client with our own arguments)
                argv, capture_output=capture, text=True, timeout=timeout_s, env=self.env(env), cwd=cwd, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise DockerError(f"{' '.join(argv[:4])} ... timed out after {timeout_s} s") from exc
        if check and done.returncode != 0:
            tail = "\n".join(((done.stdout or "") + (done.stderr or "")).strip().splitlines()[-30:])
            raise DockerError(f"{' '.join(argv[:6])} ... failed (exit {done.returncode}):\n{tail}")
        return done

    def json(self, *args: str) -> Any:
        """The JSON a docker command prints (``inspect``, ``--format '{{json .}}'``).

        Raises:
            DockerError: the command failed or printed no JSON.
        """
        out = self.run(*args).stdout
        try:
            return json.loads(out)
        except ValueError as exc:
            raise DockerError(f"docker {' '.join(args[:3])} printed no JSON: {out[:200]!r}") from exc

    def answers(self, timeout_s: float = 5) -> str | None:
        """The engine's version when it answers within ``timeout_s`` seconds, else None."""
        try:
            done = self.run("version", "--format", "{{.Server.Version}}", check=False, timeout_s=timeout_s)
        except DockerError:
            return None
        version = done.stdout.strip()
        return version if done.returncode == 0 and version else None

    def image(self, ref: str) -> dict[str, Any] | None:
        """``docker image inspect REF``'s object, or None when there is no such image here."""
        done = self.run("image", "inspect", ref, check=False)
        if done.returncode != 0:
            return None
        found: list[dict[str, Any]] = json.loads(done.stdout)
        return found[0] if found else None

    def pull(self, ref: str, timeout_s: float = 120) -> str | None:
        """``docker pull REF``: None when it worked, else the reason (the end of its output)."""
        try:
            done = self.run("pull", "--quiet", ref, check=False, timeout_s=timeout_s)
        except DockerError as exc:
            return str(exc)
        if done.returncode == 0:
            return None
        return (done.stderr or done.stdout).strip().splitlines()[-1] if (done.stderr or done.stdout).strip() else "?"

    def have_or_pull(self, ref: str, timeout_s: float = 120) -> str | None:
        """None when ``ref`` is here or could be pulled, else why it could not."""
        return None if self.image(ref) is not None else self.pull(ref, timeout_s)

    @functools.cached_property
    def builder(self) -> tuple[list[str], dict[str, str]]:
        """The argv prefix and environment of a BuildKit build (:func:`buildkit_argv`) by the first client that can.

        Raises:
            DockerError: no client here can (the message says what to install).
        """
        tried = []
        for client in cli_candidates():
            done = self.run("version", "--format", "{{.Client.Version}}", cli=[client], check=False, timeout_s=30)
            version = done.stdout.strip()
            buildx = self.run("buildx", "version", cli=[client], check=False, timeout_s=30).returncode == 0
            found = buildkit_argv(client, version, buildx)
            if found is not None:
                return found
            tried.append(f"{client} {version or '?'} (no buildx plugin)")
        raise DockerError(
            "no docker client here builds with BuildKit (the Dockerfiles' optional secret needs it): tried "
            f"{', '.join(tried) or 'none'}; install the buildx plugin, or use Docker 20.10's client with "
            "DOCKER_BUILDKIT=1 (Debian: apt-get install docker.io puts one at /usr/bin/docker)"
        )

    def build(self, args: Sequence[str], context: Path, timeout_s: float = 3600) -> None:
        """A BuildKit build (:attr:`builder`) of ``context`` with ``args``, its progress printed as it goes.

        Raises:
            DockerError: the build failed or took longer than ``timeout_s`` seconds.
        """
        prefix, env = self.builder
        self.run(*args, "--progress", "plain", str(context), cli=prefix, env=env, capture=False, timeout_s=timeout_s)

    def remove_container(self, name: str) -> None:
        """``docker rm --force NAME`` (gone already: nothing to do)."""
        self.run("rm", "--force", "--volumes", name, check=False, timeout_s=120)
