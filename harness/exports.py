"""The command line every model export script shares (``models/*/build.py``): build once into a cache folder.

An export writes its artifacts and, last, ``build.json`` holding a cache key (its script's sha256 and the package
versions it read). ``--check`` only says whether a matching build is there (exit 0, else 3) without importing torch;
a build whose key matches is not redone unless ``--force``; a failed step prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def export_cli(
    name: str,
    doc: str,
    default_out: Path,
    build_key: Callable[[], dict[str, str]],
    is_cached: Callable[[Path, dict[str, str]], bool],
    build: Callable[[Path, bool], dict[str, Any]],
    wrote: Callable[[Path, dict[str, Any]], str],
    argv: list[str] | None = None,
) -> None:
    """Parse ``--out``, ``--force``, ``--check`` and run ``build(out, force)``.

    Args:
        name: the export's name, first word of every line printed.
        doc: the script's docstring (its ``--help``).
        build: returns the ``build.json`` contents, with ``"cached": True`` when nothing was redone.
        wrote: the line printed after a real build (given the folder and the record).

    Raises:
        SystemExit: 0/3 for ``--check``; 1 when the build failed.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=default_out, help="output folder (the export cache)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a matching build is cached")
    parser.add_argument("--check", action="store_true", help="only say whether a matching build is cached (exit 0/3)")
    args = parser.parse_args(argv)
    if args.check:
        cached = is_cached(args.out, build_key())
        print(f"{name}: {'cached' if cached else 'not built'} at {args.out}")
        raise SystemExit(0 if cached else 3)
    try:
        record = build(args.out, args.force)
    except Exception as exc:  # one clear line and exit 1 for any failed step
        print(f"{name}: FAILED: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    if record.get("cached"):
        print(f"{name}: cached at {args.out}")
        return
    print(f"{name}: {wrote(args.out, record)}")
