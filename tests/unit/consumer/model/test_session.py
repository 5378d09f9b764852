"""Session options (consumer/model/session.py): the service's settings become the options the model is opened
with, field for field."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from consumer.config import Settings
from consumer.model.session import SessionOptions


def test_options_from_settings_take_each_setting_of_the_same_name(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    settings = Settings(
        model_path=model,
        execution_provider="cpu",
        intra_op_threads=3,
        graph_optimization_level="basic",
        max_batch_size=8,
        model_name="m",
        model_version="7",
    )
    options = SessionOptions.from_settings(settings)
    assert options == SessionOptions(
        execution_provider="cpu",
        intra_op_threads=3,
        graph_optimization_level="basic",
        max_batch_size=8,
        model_name="m",
        model_version="7",
        trt_engine_cache_dir=Path(".cache/trt"),  # the setting's default
    )
    assert {f.name for f in fields(SessionOptions)} <= set(Settings.model_fields)
