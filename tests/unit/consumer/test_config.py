from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from consumer.__main__ import EXIT_CONFIG, main
from consumer.config import Settings, load_settings
from consumer.errors import ConfigError


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not really onnx; settings only check that it is a file")
    return path


def test_defaults(model: Path) -> None:
    s = load_settings(["--model-path", str(model)], os.environ)
    assert (s.max_batch_size, s.max_batch_delay_ms, s.requests_topic, s.dead_letter_topic) == (
        64,
        5.0,
        "requests",
        "requests.dlq",
    )


def test_env_then_flag_precedence(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMINFER_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("STREAMINFER_MODEL_PATH", str(model))
    assert load_settings([], os.environ).max_batch_size == 16
    assert load_settings(["--max-batch-size", "8"], os.environ).max_batch_size == 8


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--max-batch-size", "0"], "max_batch_size"),
        (["--max-batch-delay-ms", "-1"], "max_batch_delay_ms"),
        (["--auto-offset-reset", "middle"], "auto_offset_reset"),
        (["--results-topic", "requests"], "must differ"),
        (["--dead-letter-topic", "dlq bad!"], "dead_letter_topic"),
        (["--group-id", " "], "group_id"),
        (["--group-instance-id", ""], "group_instance_id"),
        (["--transactional-id-prefix", " x"], "transactional_id_prefix"),
        (["--transaction-timeout-ms", "999999999"], "transaction_timeout_ms"),
        (["--max-in-flight-bytes", "4096"], "max_in_flight_bytes must be at least max_record_bytes"),
        (["--max-batch-unpacked-bytes", "4096"], "max_batch_unpacked_bytes must be at least max_record_bytes"),
        (["--max-batch-unpacked-bytes", "99999999999999"], "max_batch_unpacked_bytes"),
    ],
)
def test_bad_value_names_the_setting(model: Path, flags: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(["--model-path", str(model), *flags], os.environ)


def test_missing_model_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model_path"):
        load_settings(["--model-path", str(tmp_path / "absent.onnx")], os.environ)


def test_settings_are_frozen(model: Path) -> None:
    s = load_settings(["--model-path", str(model)], os.environ)
    with pytest.raises(Exception, match="frozen"):
        s.max_batch_size = 2  # type: ignore[misc]


def test_main_exits_2_with_the_setting_named(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model-path", str(model), "--max-batch-size", "0"]) == EXIT_CONFIG
    assert "max_batch_size" in capsys.readouterr().err


def test_a_misspelt_environment_variable_stops_start_up_naming_the_setting(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAMINFER_MAX_BATCH_SIZ", "8")
    assert main(["--model-path", str(model)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "STREAMINFER_MAX_BATCH_SIZ is not a setting (did you mean STREAMINFER_MAX_BATCH_SIZE?)" in err


def test_an_otel_exporter_streaminfer_cannot_use_stops_start_up_naming_the_variable(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    assert main(["--model-path", str(model)]) == EXIT_CONFIG
    assert "OTEL_TRACES_EXPORTER='jaeger'" in capsys.readouterr().err


def test_kubernetes_service_links_and_the_tools_cache_are_not_mistakes(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "STREAMINFER_CACHE",
        "STREAMINFER_METRICS_SERVICE_HOST",
        "STREAMINFER_METRICS_SERVICE_PORT",
        "STREAMINFER_METRICS_SERVICE_PORT_METRICS",
        "STREAMINFER_METRICS_PORT",
        "STREAMINFER_METRICS_PORT_9000_TCP",
        "STREAMINFER_METRICS_PORT_9000_TCP_ADDR",
        "STREAMINFER_SERVICE_HOST",  # a Service named just "streaminfer"
        "STREAMINFER_PORT_9400_TCP_PROTO",
    ):
        monkeypatch.setenv(name, "1")
    assert load_settings(["--model-path", str(model)], os.environ).max_batch_size == 64


def test_a_bad_value_is_named_as_flag_and_variable(model: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"max_batch_size \(--max-batch-size, STREAMINFER_MAX_BATCH_SIZE\): Input"):
        load_settings(["--model-path", str(model), "--max-batch-size", "0"], os.environ)
    with pytest.raises(ConfigError, match=r"model_path \(--model-path, STREAMINFER_MODEL_PATH\): model_path '.*absent"):
        load_settings(["--model-path", str(tmp_path / "absent.onnx")], os.environ)


def test_help_tells_the_environment_prefix_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(["--help"], os.environ)
    text = capsys.readouterr().out
    assert "[env: STREAMINFER_MAX_BATCH_SIZE]" in text
    assert "Exit codes: 0 clean stop" in text
    assert "3 the model cannot be served" in text
    assert "{str,null}" not in text


def test_an_abbreviated_or_unknown_flag_is_refused_with_the_closest_flag(model: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"unrecognized arguments: --max-batch-siz 3 \(did you mean --max-batch-size\?\)"
    ):
        load_settings(["--model-path", str(model), "--max-batch-siz", "3"], environ={})
    with pytest.raises(ConfigError, match="unrecognized arguments: --frobnicate; --help lists every flag"):
        load_settings(["--model-path", str(model), "--frobnicate"], environ={})


def test_the_retry_backoff_must_not_shrink(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    with pytest.raises(ValidationError, match="retry_backoff_max_ms must be at least retry_backoff_ms"):
        Settings(model_path=model, retry_backoff_ms=500, retry_backoff_max_ms=100)


def test_the_shadow_settings_are_checked_together(model: Path, tmp_path: Path) -> None:
    base = ["--model-path", str(model)]
    s = load_settings([*base, "--shadow-model-path", str(model), "--shadow-results-topic", "requests.shadow"], {})
    assert (s.shadow_model_path, s.shadow_results_topic, s.shadow_max_pending) == (model, "requests.shadow", 16)
    with pytest.raises(ConfigError, match="shadow_validation_record and shadow_results_topic need shadow_model_path"):
        load_settings([*base, "--shadow-results-topic", "requests.shadow"], {})
    with pytest.raises(ConfigError, match=r"shadow_model_path .* is not a file"):
        load_settings([*base, "--shadow-model-path", str(tmp_path / "absent.onnx")], {})
    with pytest.raises(ConfigError, match="shadow_results_topic must differ"):
        load_settings([*base, "--shadow-model-path", str(model), "--shadow-results-topic", "requests"], {})
    with pytest.raises(ConfigError, match="shadow_max_pending"):
        load_settings([*base, "--shadow-model-path", str(model), "--shadow-max-pending", "0"], {})
    assert s.shadow_max_busy_share == 0.5
    for share in ("0", "1.5", "nan"):
        with pytest.raises(ConfigError, match="shadow_max_busy_share"):
            load_settings([*base, "--shadow-model-path", str(model), "--shadow-max-busy-share", share], {})
