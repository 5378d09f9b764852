"""The consumer's argument list as the tools build it (harness.process)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from consumer.config import load_settings
from harness.process import consumer_argv


def test_settings_become_the_flags_the_consumer_parses(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    argv = consumer_argv(
        {"model_path": model, "max_batch_size": 8, "flush_when_caught_up": False, "log_json": True, "group_id": None}
    )
    assert argv[:3] == [sys.executable, "-m", "consumer"]
    assert "--no-flush-when-caught-up" in argv
    assert "--log-json" in argv
    assert "--group-id" not in argv  # None: left to the default
    settings = load_settings(argv[3:], os.environ)
    assert settings.model_path == model
    assert settings.max_batch_size == 8
    assert settings.flush_when_caught_up is False
    assert settings.log_json is True


def test_a_name_that_is_not_a_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="'max_batch' is not a consumer setting"):
        consumer_argv({"max_batch": 8})
