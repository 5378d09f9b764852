"""The local broker's command line end to end (scripts/kafka-local, as a user runs it): start, status, topics,
an outage (pause, resume) that keeps the data, stop. Needs a JDK and Maven like the rest of the local path."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def kafka_local(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_LOCAL_")}
    env["KAFKA_LOCAL_STATE"] = str(state)
    return subprocess.run(
        [str(ROOT / "scripts" / "kafka-local"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_verbs_of_scripts_kafka_local(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    started = kafka_local(state, "start")
    assert started.returncode == 0, started.stderr
    address = started.stdout.strip().splitlines()[-1]
    try:
        assert address.startswith("127.0.0.1:")
        status = kafka_local(state, "status")
        assert (status.returncode, status.stdout.splitlines()[:2]) == (0, ["running", address])
        again = kafka_local(state, "start")  # reuses the running broker
        assert (again.returncode, again.stdout.strip()) == (0, address)
        assert kafka_local(state, "topics", "create", "kept", "3").returncode == 0
        assert "kept" in kafka_local(state, "topics", "list").stdout.split()

        assert kafka_local(state, "pause").returncode == 0
        paused = kafka_local(state, "status")
        assert (paused.returncode, paused.stdout.splitlines()[0]) == (4, "paused")
        refused = kafka_local(state, "start")
        assert refused.returncode == 4
        assert "resume" in refused.stderr
        assert kafka_local(state, "topics", "list").returncode == 3  # nothing answers while paused

        resumed = kafka_local(state, "resume")
        assert (resumed.returncode, resumed.stdout.strip().splitlines()[-1]) == (0, address)  # same address
        assert "kept" in kafka_local(state, "topics", "list").stdout.split()  # same data
    finally:
        stopped = kafka_local(state, "stop")
    assert stopped.returncode == 0, stopped.stderr
    gone = kafka_local(state, "status")
    assert (gone.returncode, gone.stdout.strip()) == (3, "not running")
    assert not list(state.glob("node-*"))  # the data is deleted


def test_run_stops_its_broker_on_sigterm_during_start_up_and_reports_signals(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_") or k == "KAFKA_LOCAL_MVN_ARGS"}
    env["KAFKA_LOCAL_STATE"] = str(state)
    with subprocess.Popen(
        [str(ROOT / "scripts" / "kafka-local"), "run", "--", "sleep", "60"], env=env, stderr=subprocess.PIPE, text=True
    ) as run:
        assert run.stderr is not None
        for line in run.stderr:  # SIGTERM once the broker's JVM is launched, before it is ready
            if "starting 1 node(s)" in line:
                run.send_signal(signal.SIGTERM)
                break
        assert run.wait(timeout=120) == 128 + signal.SIGTERM
    assert kafka_local(state, "status").returncode == 3  # nothing left running, nothing recorded
    assert not subprocess.run(["pgrep", "-f", str(state)], capture_output=True, check=False).stdout

    killed = subprocess.run(
        [str(ROOT / "scripts" / "kafka-local"), "run", "--", "sh", "-c", "kill -TERM $$"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert killed.returncode == 128 + signal.SIGTERM, killed.stderr
    assert kafka_local(state, "status").returncode == 3
