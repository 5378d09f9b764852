"""Session building (consumer/model/session.py): the service's settings become the options the model is opened
with, field for field; which ONNX Runtime is installed: none stops start-up naming the extras, two builds at once
are a warning."""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from consumer.config import Settings
from consumer.errors import ModelError
from consumer.model import session
from consumer.model.session import RUNTIME_EXTRAS, SessionOptions, import_onnxruntime, installed_runtimes, open_session


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


def test_no_onnxruntime_is_a_model_error_naming_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    with pytest.raises(ModelError, match=r"ONNX Runtime is not installed") as caught:
        open_session(Path("model.onnx"))
    for extra in ("streaminfer[cpu]", "streaminfer[gpu]", "streaminfer[cuda]"):
        assert extra in str(caught.value)
    assert RUNTIME_EXTRAS in str(caught.value)


def test_no_onnxruntime_stops_the_consumer_with_exit_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from consumer.__main__ import EXIT_MODEL, main

    model = tmp_path / "model.onnx"
    model.write_bytes(b"not read: the runtime is missing first")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    code = main(["--model-path", str(model), "--http-port", "0", "--no-log-json"])
    assert code == EXIT_MODEL
    assert "streaminfer[cpu]" in capsys.readouterr().err


def test_two_builds_installed_together_are_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    versions = {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions[name])
    assert installed_runtimes() == ["onnxruntime==1.32.0", "onnxruntime-gpu==1.31.1"]
    with caplog.at_level(logging.WARNING, logger=session.__name__):
        import_onnxruntime()
    assert "onnxruntime==1.32.0 and onnxruntime-gpu==1.31.1 are all installed" in caplog.text


def test_one_build_installed_is_silent(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def version(name: str) -> str:
        if name == "onnxruntime":
            return "1.32.0"
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with caplog.at_level(logging.WARNING, logger=session.__name__):
        import_onnxruntime()
    assert caplog.text == ""
