"""``make lock`` / ``make lock-check`` / the check in ``make venv``: the dependency lock.

``uv.lock`` resolves every extra of ``pyproject.toml`` together, for every platform and Python version the project
supports (``uv lock``), so CI's virtualenv and the images run the same version of every package they share. The
installs read hashed requirement files exported from it, one per install (``locks/<set>.txt``, :data:`SETS`)::

    pip install --require-hashes --no-deps -r locks/<set>.txt     # exactly the lock, every file's hash checked
    pip install --no-deps .                                        # then streaminfer itself
    pip check                                                      # and nothing the project needs is missing

``locks/pyproject.sha256`` is the digest of the tables of ``pyproject.toml`` that the lock was made from
(:func:`dependency_digest`). ``check`` (standard library only: it runs before the virtualenv exists) compares it, so a
dependency added to ``pyproject.toml`` without ``make lock`` stops ``make venv`` with the fix named, instead of
installing something that no lock recorded. An upstream release changes nothing until ``make lock`` is run and its
result committed.

Verbs (exit 0 unless said otherwise)::

    check             pyproject.toml's dependency tables against locks/pyproject.sha256 (exit 1 naming the fix)
    refresh [--upgrade]
                      uv lock (keeps every locked version that still fits; --upgrade: the newest that fit), then
                      the exports and the digest. The one command to run after a dependency change (make lock)
    verify            check, then uv lock --check (uv's own comparison), then every export regenerated from
                      uv.lock and compared with the committed file (exit 1 naming the first difference): CI
    sync SET          run by a virtualenv's python (make venv): uninstall every distribution that locks/SET.txt
                      does not list (pip, setuptools, wheel and streaminfer aside), before the lock is installed, so
                      an existing virtualenv ends up with exactly the lock (onnxruntime-gpu replaced by onnxruntime)

``uv`` is the one in the virtualenv (the dev extra), else on PATH, else :data:`UV_VERSION` installed once into
``$STREAMINFER_CACHE/uv-<version>`` (so ``make lock`` works while ``make venv`` refuses a stale lock).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DIGEST = ROOT / "locks" / "pyproject.sha256"
#: The uv installed when none is found (``make lock`` before any virtualenv exists).
UV_VERSION = "0.13.9"

#: Install set -> the extras it exports (the project's own dependencies always come with them).
SETS: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu", "otel"),  # docker/cpu.Dockerfile: the runtime virtualenv
    "gpu": ("gpu", "otel"),  # docker/gpu.Dockerfile on nvidia/cuda (CUDA and cuDNN from the base image)
    "cuda": ("cuda", "otel"),  # docker/gpu.Dockerfile on a plain base (CUDA and cuDNN from nvidia-* wheels)
    "model": ("digits",),  # the images' build stage that trains and exports the digits model
    "dev": ("cpu", "dev", "digits", "bench", "docs"),  # make venv, CI
}


class LockError(RuntimeError):
    """The lock and pyproject.toml disagree, or a lock command failed; the message names the fix."""


def dependency_digest(pyproject: Mapping[str, Any]) -> str:
    """SHA-256 of the parts of a parsed ``pyproject.toml`` that decide the lock: ``requires-python``,
    ``dependencies``, ``optional-dependencies``, ``[dependency-groups]`` and ``[tool.uv]`` (comments, formatting and
    every other table do not count), as hex."""
    project = pyproject.get("project", {})
    relevant = {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "dependency-groups": pyproject.get("dependency-groups", {}),
        "tool.uv": pyproject.get("tool", {}).get("uv", {}),
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()


def read_pyproject(root: Path = ROOT) -> dict[str, Any]:
    """``root/pyproject.toml``, parsed.

    Raises:
        LockError: it is missing or not TOML.
    """
    try:
        return tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LockError(f"cannot read {root / 'pyproject.toml'}: {exc}") from exc


def check(root: Path = ROOT) -> None:
    """The lock was made from the current ``pyproject.toml``: its digest equals ``locks/pyproject.sha256``, and
    ``uv.lock`` and every export exist.

    Raises:
        LockError: they disagree or a file is missing (the message says which and that ``make lock`` fixes it).
    """
    missing = [p for p in (root / "uv.lock", *(root / "locks" / f"{s}.txt" for s in SETS)) if not p.is_file()]
    if missing:
        names = ", ".join(str(p.relative_to(root)) for p in missing)
        raise LockError(f"the dependency lock is incomplete ({names} missing): run 'make lock' and commit the result")
    digest_file = root / "locks" / DIGEST.name
    recorded = digest_file.read_text().split()[0] if digest_file.is_file() else "(none)"
    current = dependency_digest(read_pyproject(root))
    if recorded != current:
        raise LockError(
            "pyproject.toml's dependencies changed since the lock was made (locks/pyproject.sha256 records "
            f"{recorded[:12]}, pyproject.toml is now {current[:12]}): run 'make lock' and commit uv.lock and locks/ "
            "(nothing was installed)"
        )


def find_uv(root: Path = ROOT, env: Mapping[str, str] | None = None) -> str:
    """The ``uv`` executable: the virtualenv's, else PATH's, else :data:`UV_VERSION` installed into the cache.

    Raises:
        LockError: none found and the install failed.
    """
    env = os.environ if env is None else env
    venv = Path(env.get("VENV", ".venv"))
    venv_uv = (venv if venv.is_absolute() else root / venv) / "bin" / "uv"
    if venv_uv.is_file() and os.access(venv_uv, os.X_OK):
        return str(venv_uv)
    on_path = shutil.which("uv", path=env.get("PATH"))
    if on_path:
        return on_path
    cache = Path(env.get("STREAMINFER_CACHE") or Path.home() / ".cache" / "streaminfer") / f"uv-{UV_VERSION}"
    uv = cache / "bin" / "uv"
    if not uv.is_file():
        print(f"lock: installing uv {UV_VERSION} into {cache}, once", file=sys.stderr)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(cache)], check=True)  # noqa: S603
            subprocess.run(  # noqa: S603 (pip from the venv just made)
                [str(cache / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", f"uv=={UV_VERSION}"],
                check=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            raise LockError(f"cannot install uv {UV_VERSION} into {cache}: {exc}") from exc
    return str(uv)


def export_command(uv: str, extras: Sequence[str]) -> list[str]:
    """The ``uv export`` argv that writes one install set (hashed requirements, without the project itself)."""
    argv = [uv, "export", "--frozen", "--format", "requirements-txt", "--no-emit-project", "--no-dev"]
    for extra in extras:
        argv += ["--extra", extra]
    return argv


def _run(argv: Sequence[str], root: Path) -> str:
    done = subprocess.run(list(argv), cwd=root, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise LockError(f"{' '.join(argv[:3])} ... failed (exit {done.returncode}):\n{done.stderr.strip()[-3000:]}")
    return done.stdout


def refresh(root: Path = ROOT, *, upgrade: bool = False) -> list[Path]:
    """``uv lock`` (``--upgrade``: newest versions that fit), then every export of :data:`SETS` and the digest.
    Returns the files written.

    Raises:
        LockError: uv could not resolve (its message included) or is missing.
    """
    uv = find_uv(root)
    _run([uv, "lock", *(["--upgrade"] if upgrade else [])], root)
    written = [root / "uv.lock"]
    (root / "locks").mkdir(exist_ok=True)
    for name, extras in SETS.items():
        target = root / "locks" / f"{name}.txt"
        target.write_text(_run(export_command(uv, extras), root))
        written.append(target)
    digest_file = root / "locks" / DIGEST.name
    digest_file.write_text(f"{dependency_digest(read_pyproject(root))}  pyproject.toml (harness/lock.py)\n")
    written.append(digest_file)
    return written


def verify(root: Path = ROOT) -> None:
    """:func:`check`, ``uv lock --check``, and every committed export equal to what ``uv.lock`` exports now.

    Raises:
        LockError: the first disagreement, named, with the fix.
    """
    check(root)
    uv = find_uv(root)
    try:
        _run([uv, "lock", "--check"], root)
    except LockError as exc:
        raise LockError(
            f"uv.lock does not satisfy pyproject.toml: run 'make lock' and commit the result\n{exc}"
        ) from exc
    with tempfile.TemporaryDirectory() as tmp:
        for name, extras in SETS.items():
            fresh = Path(tmp, f"{name}.txt")
            fresh.write_text(_run(export_command(uv, extras), root))
            committed = root / "locks" / f"{name}.txt"
            if fresh.read_text() != committed.read_text():
                raise LockError(f"locks/{name}.txt is not what uv.lock exports for it: run 'make lock' and commit it")


#: Distributions ``sync`` never removes: the installer's own, and the project (installed after the lock).
KEPT = frozenset({"pip", "setuptools", "wheel", "streaminfer"})


def normalize(name: str) -> str:
    """A distribution name in PEP 503's normal form (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_names(text: str) -> set[str]:
    """The distribution names a requirements file pins (``name==version`` lines), normalized."""
    return {normalize(m.group(1)) for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", text, flags=re.M)}


#: Distributions that install the same package folder (``onnxruntime/``): removing one breaks the others' files.
SHARED_FILES = frozenset({"onnxruntime", "onnxruntime-gpu"})


def strays(installed: Iterable[str], locked: set[str]) -> list[str]:
    """The ``installed`` distributions that ``locked`` does not list and :data:`KEPT` does not keep, sorted; when one
    of them is an ONNX Runtime build (:data:`SHARED_FILES`), every installed build is in the list, so that the lock's
    is installed again afterwards with whole files."""
    names = {normalize(n) for n in installed}
    found = names - locked - KEPT
    if found & SHARED_FILES:
        found |= names & SHARED_FILES
    return sorted(found)


def sync(name: str, root: Path = ROOT) -> list[str]:
    """Uninstall, from this interpreter's environment, what ``locks/<name>.txt`` does not list. Returns the names.

    Raises:
        LockError: no such lock set, or pip failed.
    """
    if name not in SETS:
        raise LockError(f"unknown lock set {name!r}: one of {', '.join(SETS)}")
    locked = locked_names((root / "locks" / f"{name}.txt").read_text())
    found = strays((d.metadata["Name"] for d in importlib.metadata.distributions() if d.metadata["Name"]), locked)
    if found:
        done = subprocess.run(  # noqa: S603 (this interpreter's pip)
            [sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *found], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise LockError(f"pip uninstall {' '.join(found)} failed: {done.stderr.strip()[-1000:]}")
    return found


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    """Entry point (on the repository at ``root``); returns the exit status (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m harness.lock", description=__doc__.split("\n\n")[0])
    verbs = p.add_subparsers(dest="verb", required=True, metavar="check|refresh|verify|sync")
    verbs.add_parser("check", help="pyproject.toml against the lock's digest (standard library only)")
    refresh_p = verbs.add_parser("refresh", help="uv lock, the exports and the digest (make lock)")
    refresh_p.add_argument("--upgrade", action="store_true", help="the newest versions that fit, not the locked ones")
    verbs.add_parser("verify", help="check, uv lock --check and the exports regenerated identically (CI)")
    sync_p = verbs.add_parser("sync", help="uninstall what locks/SET.txt does not list (run by the venv's python)")
    sync_p.add_argument("set", choices=sorted(SETS), help="the lock set")
    args = p.parse_args(argv)
    try:
        if args.verb == "check":
            check(root)
        elif args.verb == "sync":
            removed = sync(args.set, root)
            if removed:
                print(f"lock: removed what locks/{args.set}.txt does not list: {', '.join(removed)}", file=sys.stderr)
        elif args.verb == "refresh":
            for path in refresh(root, upgrade=args.upgrade):
                print(f"lock: wrote {path.relative_to(root)}", file=sys.stderr)
        else:
            verify(root)
            print(f"lock: uv.lock and locks/ ({', '.join(SETS)}) agree with pyproject.toml", file=sys.stderr)
    except LockError as exc:
        print(f"lock: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
