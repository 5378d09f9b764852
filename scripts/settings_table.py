"""Rewrite the settings reference (docs/settings.md, between the settings markers) from consumer.config.Settings.

Usage: ``.venv/bin/python scripts/settings_table.py`` (``make docs`` runs it before building the site).
tests/unit/test_docs.py fails when the page and the settings disagree.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_core import PydanticUndefined

from consumer.config import ENV_PREFIX, Settings

PAGE = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"


def shown(default: object) -> str:
    """A default as the table shows it."""
    if default is PydanticUndefined:
        return "(required)"
    if default is None:
        return "none"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


def table() -> str:
    """The markdown table of every setting: name, flag, environment variable, default, meaning with unit."""
    rows = ["| setting | flag | default | meaning, unit |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        rows.append(f"| `{name}` | `{flag}` | `{shown(field.default)}` | {field.description} |")
    return "\n".join(rows)


def block() -> str:
    """What goes between the markers."""
    return f"{BEGIN}\nEnvironment variable: `{ENV_PREFIX}<SETTING>` in upper case.\n\n{table()}\n{END}"


def rewrite(text: str) -> str:
    """``text`` with its settings block regenerated; SystemExit when the markers are missing."""
    new, n = re.subn(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block(), text, flags=re.DOTALL)
    if n != 1:
        raise SystemExit(f"{PAGE}: settings markers not found")
    return new


def main() -> None:
    PAGE.write_text(rewrite(PAGE.read_text()))


if __name__ == "__main__":
    main()
