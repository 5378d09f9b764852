"""The consumer as a child process (harness.process): readiness, early exit, bounded stop."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.process import ConsumerProcess, stop_process

pytestmark = pytest.mark.integration


def test_a_consumer_that_exits_before_it_is_ready_says_so_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "consumer.log"
    consumer = ConsumerProcess({"model_path": tmp_path / "missing.onnx"}, log)
    with pytest.raises(RuntimeError, match=r"exited with code 2 before it was ready; log: .*consumer\.log"):
        consumer.start(timeout_s=60)
    assert "model_path" in log.read_text()  # the consumer's own message names the bad setting


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace() -> None:
    ignores = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", ignores], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    code, took = stop_process(proc, grace_s=0.5)
    proc.stdout.close()
    assert code == -9
    assert 0.5 <= took < 30


def test_a_consumer_on_a_missing_requests_topic_exits_2_naming_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    model = Path(__file__).resolve().parents[2] / "models" / "digits" / "artifacts" / "digits.onnx"
    if not model.is_file():
        pytest.skip("make model first")
    log = tmp_path / "consumer.log"
    missing = f"it-missing-{uuid.uuid4().hex[:8]}"  # never created: the consumer must not create it either
    consumer = ConsumerProcess(
        {"bootstrap_servers": kafka_bootstrap, "model_path": model, "requests_topic": missing, "warmup_runs": 1}, log
    )
    try:
        with pytest.raises(RuntimeError, match="exited with code 2"):
            consumer.start(timeout_s=120)
    finally:
        if consumer.proc is not None:
            consumer.terminate(grace_s=10)  # never leave a consumer behind, whatever the outcome
    assert f"requests_topic {missing!r}, results_topic 'results', dead_letter_topic 'requests.dlq' do not exist" in (
        log.read_text()
    )
