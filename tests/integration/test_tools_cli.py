"""streaminfer-produce and streaminfer-results fail cleanly: one-line errors, exit codes, and a manifest written as
records are acknowledged, so a failed run still says exactly what reached the topic."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import orjson
import pytest

from harness.ports import free_port
from producer_tools.produce import main
from producer_tools.topics import ensure_topics

pytestmark = pytest.mark.integration


def test_a_missing_source_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--source", str(tmp_path / "missing.npy"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streaminfer-produce: --source ")
    assert "Traceback" not in err


def test_an_unreachable_broker_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "sent.jsonl"
    code = main(
        [
            "--bootstrap-servers",
            f"127.0.0.1:{free_port()}",
            "--limit",
            "3",
            "--manifest",
            str(manifest),
            "--no-progress",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "0 of 3 records acknowledged" in err
    assert manifest.read_bytes() == b""  # nothing reached a broker: the manifest says so


@pytest.mark.parametrize("tool", ["producer_tools.produce", "producer_tools.results"])
def test_an_unreachable_broker_is_exactly_one_line_from_the_tool_itself(tool: str, tmp_path: Path) -> None:
    """As a user runs it (no test logging around it): the Kafka client's own records stay off the terminal and the
    exception's name is not repeated."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"correlation_id": "x"}\n')
    argv = ["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--no-progress"]
    argv += ["--limit", "3"] if tool.endswith("produce") else ["--manifest", str(manifest), "--timeout-s", "2"]
    done = subprocess.run([sys.executable, "-m", tool, *argv], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"streaminfer-{tool.split('.')[-1]}: KafkaConnectionError: Unable to bootstrap")
    assert lines[0].count("KafkaConnectionError") == 1


def test_bad_arguments_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from producer_tools.results import main as results_main

    assert main(["--source", str(tmp_path / "rows.csv"), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "streaminfer-produce: --source must be 'digits', 'samples', a folder of images, a .jsonl or a .npy file, "
        f"got '{tmp_path / 'rows.csv'}'\n"
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["--source", str(empty), "--no-progress"]) == 2
    assert "no records to send" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["--limit", "0"])
    assert exited.value.code == 2
    capsys.readouterr()
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"correlation_id": "a"}\n{"id": "x"}\n')
    assert results_main(["--manifest", str(manifest), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"streaminfer-results: --manifest {manifest}: line 2 is not a manifest entry")
    assert "Traceback" not in err


def test_the_manifest_lists_every_acknowledged_record_and_the_input_comes_from_the_model(
    kafka_bootstrap: str, tmp_path: Path, digits_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = np.load(digits_model / "heldout.npz")["x"][:5]
    np.save(tmp_path / "rows.npy", rows)
    manifest = tmp_path / "sent.jsonl"
    topic = f"it-{uuid.uuid4().hex[:8]}.requests"
    argv = ["--bootstrap-servers", kafka_bootstrap, "--topic", topic, "--source", str(tmp_path / "rows.npy")]
    argv += ["--model-path", str(digits_model / "digits.onnx"), "--manifest", str(manifest), "--no-progress"]
    assert main(argv) == 2  # the broker creates no topic on first use: nothing is sent, one line says so
    err = capsys.readouterr().err
    assert f"streaminfer-produce: --topic: topic {topic!r} does not exist on the cluster" in err
    assert "Traceback" not in err
    assert manifest.read_bytes() == b""
    asyncio.run(ensure_topics(kafka_bootstrap, {topic: 1}))
    assert main(argv) == 0
    lines = [orjson.loads(line) for line in manifest.read_bytes().splitlines()]
    assert len(lines) == 5
    assert len({line["correlation_id"] for line in lines}) == 5


def test_results_with_a_missing_manifest_or_no_broker_fail_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from producer_tools.results import main as results_main

    assert results_main(["--manifest", str(tmp_path / "missing.jsonl"), "--no-progress"]) == 2
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"correlation_id": "x"}\n')
    argv = ["--manifest", str(manifest), "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--no-progress"]
    assert results_main(argv) == 1
    err = capsys.readouterr().err
    assert "streaminfer-results: --manifest " in err
    assert "streaminfer-results: KafkaConnectionError: Unable to bootstrap" in err
    assert "Traceback" not in err
