"""The rules of the house that an import check cannot see (docs/architecture.md), read off every consumer module's
syntax tree: only ``consumer/__main__.py`` reads the process environment, builds the settings and decodes the
warm-up request. (The import layers themselves: ``lint-imports`` in ``make lint``, contracts in pyproject.toml.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CONSUMER = Path(__file__).resolve().parents[3] / "consumer"
MODULES = sorted(p for p in CONSUMER.rglob("*.py") if p.name != "__main__.py")
#: Where the settings are defined (its load_settings builds them, called by __main__ only).
CONFIG = CONSUMER / "config.py"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _called(tree: ast.Module) -> set[str]:
    """Names of the functions and classes a module calls (``f(...)``, ``x.f(...)``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def _environment_reads(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and getattr(node.value, "id", None) == "os"
            and node.attr in {"environ", "getenv", "putenv", "unsetenv", "environb"}
        ):
            found.append(f"os.{node.attr} (line {node.lineno})")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"from os import {a.name} (line {node.lineno})" for a in node.names if "env" in a.name]
    return found


def test_the_rules_see_every_module() -> None:
    assert len(MODULES) > 40
    assert CONSUMER / "oip" / "decode.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(CONSUMER)))
def test_only_main_reads_the_environment(path: Path) -> None:
    assert _environment_reads(_tree(path)) == []


@pytest.mark.parametrize("path", [m for m in MODULES if m != CONFIG], ids=lambda p: str(p.relative_to(CONSUMER)))
def test_only_main_builds_the_settings_and_decodes_the_warmup_request(path: Path) -> None:
    tree = _tree(path)
    assert {"Settings", "load_settings"} & _called(tree) == set()
    warmup_reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "warmup_request"]
    assert warmup_reads == []


def test_main_does_what_the_others_may_not() -> None:
    main = _tree(CONSUMER / "__main__.py")
    assert _environment_reads(main)  # the rule's one exception really is where the reading happens
    assert {"load_settings", "decode_request"} <= _called(main)


def test_the_check_finds_a_reader(tmp_path: Path) -> None:
    sample = ast.parse("import os\nfrom os import getenv\nx = os.environ['A']\ny = os.getenv('B')\n")
    assert _environment_reads(sample) == ["from os import getenv (line 2)", "os.environ (line 3)", "os.getenv (line 4)"]
