"""The README documents every setting with its default and every dead-letter reason, so they cannot drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.config import Settings
from consumer.errors import DeadLetterReason
from scripts.settings_table import shown

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_in_readme_with_default(name: str) -> None:
    field = Settings.model_fields[name]
    row = f"| `{name}` | `--{name.replace('_', '-')}` | `{shown(field.default)}` |"
    assert row in README, f"README settings table lacks or misstates: {row}"


@pytest.mark.parametrize("reason", list(DeadLetterReason))
def test_every_dead_letter_reason_in_readme(reason: DeadLetterReason) -> None:
    assert f"| `{reason.value}` |" in README


def test_readme_opens_with_the_two_commands() -> None:
    head = README[: README.index("## The record contract")]
    assert "make demo" in head
    assert "make test" in head


def test_make_help_lists_every_documented_target_with_variables_expanded() -> None:
    import re
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[2]
    documented = re.findall(r"^([a-zA-Z0-9_-]+):.*## ", (root / "Makefile").read_text(), flags=re.M)
    shown = subprocess.run(["make", "-s", "help"], cwd=root, capture_output=True, text=True, check=True).stdout
    assert "k8s" in documented
    for target in documented:
        assert f"make {target} " in shown, target
    assert "$(" not in shown
