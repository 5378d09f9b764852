"""What every model export script shares (``models/*/build.py``): build once into a cache folder, keyed.

An export writes its artifacts and, last, ``build.json`` holding a cache key (the sha256 of its script and of the
files it depends on, and the versions of the packages it reads). ``--check`` only says whether a matching build is
there (exit 0, else 3) without importing torch; a build whose key matches is not redone unless ``--force``; a failed
step prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def cache_folder(name: str) -> Path:
    """Where export ``name`` goes by default: ``$STREAMINFER_CACHE/<name>`` when that variable is set, else
    ``~/.cache/streaminfer/<name>``."""
    root = os.environ.get("STREAMINFER_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "streaminfer") / name


def build_key(sources: Sequence[Path], packages: Sequence[str]) -> dict[str, str]:
    """The cache key: ``script_sha256``, the sha256 (hex) of ``sources`` (the script first, then the files it
    depends on) read one after another, and the version of each of ``packages`` that is installed (a check from the
    project's lean venv, which lacks them and torch, matches on the sources alone)."""
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sources))
    key = {"script_sha256": digest.hexdigest()}
    for package in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            key[package] = importlib.metadata.version(package)
    return key


def cached_record(out: Path, key: dict[str, str], artifacts: Sequence[str]) -> dict[str, Any] | None:
    """The ``build.json`` of ``out`` when it holds every one of ``artifacts`` and its key matches ``key``; else None."""
    if not all((out / name).is_file() for name in (*artifacts, "build.json")):
        return None
    try:
        recorded: dict[str, Any] = json.loads((out / "build.json").read_text())
    except (OSError, ValueError):
        return None
    return recorded if all(recorded.get(k) == v for k, v in key.items()) else None


def write_record(out: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Write ``build.json`` (last, once the artifacts are in place) and return ``record``."""
    (out / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def export_cli(
    name: str,
    doc: str,
    artifacts: Sequence[str],
    key: Callable[[], dict[str, str]],
    build: Callable[[Path, dict[str, str]], dict[str, Any]],
    wrote: Callable[[Path, dict[str, Any]], str],
    argv: list[str] | None = None,
) -> None:
    """Parse ``--out`` (default :func:`cache_folder`), ``--force``, ``--check`` and run ``build(out, key())`` unless
    a matching build of ``artifacts`` is cached there.

    Args:
        name: the export's name, first word of every line printed and the cache folder's name.
        doc: the script's docstring (its ``--help``).
        artifacts: the files a build leaves in its folder (besides ``build.json``).
        key: the cache key (:func:`build_key` of the script's sources and packages).
        build: builds into the folder, ``build.json`` last (:func:`write_record`); returns its contents.
        wrote: the line printed after a real build (given the folder and the record).

    Raises:
        SystemExit: 0/3 for ``--check``; 1 when the build failed.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=cache_folder(name), help="output folder (the export cache)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a matching build is cached")
    parser.add_argument("--check", action="store_true", help="only say whether a matching build is cached (exit 0/3)")
    args = parser.parse_args(argv)
    wanted = key()
    cached = cached_record(args.out, wanted, artifacts)
    if args.check:
        print(f"{name}: {'cached' if cached is not None else 'not built'} at {args.out}")
        raise SystemExit(0 if cached is not None else 3)
    if cached is not None and not args.force:
        print(f"{name}: cached at {args.out}")
        return
    try:
        record = build(args.out, wanted)
    except Exception as exc:  # one clear line and exit 1 for any failed step
        print(f"{name}: FAILED: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(f"{name}: {wrote(args.out, record)}")
