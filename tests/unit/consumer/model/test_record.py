"""The validation record as the consumer reads it: the hash check, the summary, the out-of-range counter."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from consumer.__main__ import EXIT_CONFIG, main
from consumer.errors import ConfigError, DeadLetterReason, DecodeError
from consumer.model.record import RECORD_FORMAT, RangeCheck, check_model, load_record, summary
from consumer.ops.metrics import Metrics
from consumer.work import DecodedRequest

METRIC = "streaminfer_input_out_of_range_total"


def write_record(path: Path, sha: str, ranges: dict[str, tuple[float, float]] | None = None, **extra: Any) -> Path:
    inputs = {name: {"datatype": "FP32", "range": {"min": lo, "max": hi}} for name, (lo, hi) in (ranges or {}).items()}
    path.write_text(json.dumps({"format": RECORD_FORMAT, "sha256": sha, "inputs": inputs, **extra}))
    return path


def test_check_model_accepts_the_recorded_file_and_names_both_hashes_otherwise(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model bytes")
    right = hashlib.sha256(b"model bytes").hexdigest()
    check_model(load_record(write_record(tmp_path / "ok.json", right)), model)
    wrong = "0" * 64
    with pytest.raises(ConfigError) as err:
        check_model(load_record(write_record(tmp_path / "bad.json", wrong)), model)
    assert right in str(err.value)
    assert wrong in str(err.value)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("not json", "validation_record"),
        (json.dumps({"format": 99, "sha256": "0" * 64, "inputs": {}}), "format"),
        (json.dumps({"format": RECORD_FORMAT, "sha256": "abc", "inputs": {}}), "sha256"),
        (json.dumps({"format": RECORD_FORMAT, "sha256": "0" * 64, "inputs": {"x": {"range": {"min": 1}}}}), "range"),
    ],
)
def test_a_malformed_record_is_a_config_error(tmp_path: Path, body: str, problem: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(body)
    with pytest.raises(ConfigError, match=problem):
        load_record(path)


def test_summary_names_the_model_runtime_and_ranges(tmp_path: Path) -> None:
    record = load_record(
        write_record(
            tmp_path / "r.json",
            "a" * 64,
            {"input": (0.0, 16.0)},
            model={"name": "digits", "version": "1"},
            runtime={"onnxruntime": "1.32.0", "provider": "CPUExecutionProvider"},
            set={"records": 360},
            accuracy={"top1": 0.97},
        )
    )
    line = summary(record)
    assert line["model"] == "digits v1"
    assert line["provider"] == "CPUExecutionProvider"
    assert line["set_records"] == 360
    assert line["accuracy"] == 0.97
    assert line["ranges"] == {"input": [0.0, 16.0]}


def test_the_consumer_exits_2_naming_both_hashes_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unit tests forbid ONNX Runtime sessions: exit 2 here proves the check runs before the model is opened."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not the recorded model")
    record = write_record(tmp_path / "r.json", "f" * 64)
    code = main(["--model-path", str(model), "--validation-record", str(record), "--http-port", "0"])
    assert code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "f" * 64 in err
    assert hashlib.sha256(b"not the recorded model").hexdigest() in err


def test_a_shadow_model_not_the_recorded_one_exits_2_naming_both_settings_and_hashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """shadow_validation_record is checked before any model is loaded, as validation_record is."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"the serving model")
    candidate = tmp_path / "c.onnx"
    candidate.write_bytes(b"not the recorded candidate")
    record = write_record(tmp_path / "r.json", "e" * 64)
    argv = ["--model-path", str(model), "--shadow-model-path", str(candidate), "--http-port", "0"]
    assert main([*argv, "--shadow-validation-record", str(record)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "e" * 64 in err
    assert hashlib.sha256(b"not the recorded candidate").hexdigest() in err
    assert "shadow_model_path" in err
    assert "shadow_validation_record" in err


def counter_value(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(METRIC, {"input": name}) or 0.0


def test_range_check_counts_records_per_input_over_blocks_and_loose_requests() -> None:
    metrics = Metrics(CollectorRegistry())
    check = RangeCheck({"input": (0.0, 16.0), "other": (0.0, 1.0)}, metrics.input_out_of_range)
    block = {"input": np.array([[1.0, 2.0], [3.0, 40.0], [0.0, 16.0], [-1.0, 0.0], [5.0, 5.0]], np.float32)}
    # three requests in one block: rows 0-1 (row 1 out of range), row 2 (in), rows 3-4 (row 3 out of range)
    in_block = [
        DecodedRequest(None, None, 2, None, block=block, start=0),
        DecodedRequest(None, None, 1, None, block=block, start=2),
        DecodedRequest(None, None, 2, None, block=block, start=3),
    ]
    loose_bad = DecodedRequest(None, {"input": np.array([[np.nan, 1.0]], np.float32)}, 1, None)
    loose_ok = DecodedRequest(None, {"input": np.array([[16.0, 0.0]], np.float32)}, 1, None)
    error = DecodeError(DeadLetterReason.INVALID_JSON, "not JSON")
    counted = check.count([*in_block, error, loose_bad, loose_ok])
    assert counted == {"input": 3}
    assert counter_value(metrics, "input") == 3
    assert counter_value(metrics, "other") == 0
    assert check.count([in_block[1], loose_ok]) == {}
    assert counter_value(metrics, "input") == 3


def test_range_check_skips_text_inputs_and_pending_images() -> None:
    metrics = Metrics(CollectorRegistry())
    check = RangeCheck({"text": (0.0, 1.0), "image": (0.0, 1.0)}, metrics.input_out_of_range)
    text = DecodedRequest(None, {"text": np.array(["words"], dtype=object)}, 1, None)
    pending = DecodedRequest(None, None, 1, None)
    pending.pending = [b"jpeg bytes"]
    assert check.count([text, pending]) == {}
