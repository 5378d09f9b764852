"""harness.docker without an engine: dockerd's flags, the BuildKit client choice, the Dockerfiles and their build
arguments, the local Kafka image's contract, and the sweep that ends an engine's processes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.docker import base, client, engine, images, kafka
from harness.docker.engine import Record, attempts, dockerd_argv, engine_processes

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))


# ------------------------------------------------------------------------------------------------------ engine
def test_dockerd_runs_without_iptables_on_a_socket_of_its_own(tmp_path: Path) -> None:
    argv = dockerd_argv("/usr/sbin/dockerd", tmp_path, "overlay2", "bridge", None)
    assert "--iptables=false" in argv
    assert "--ip6tables=false" in argv
    assert "--ip-forward=false" in argv
    assert argv[argv.index("--host") + 1] == f"unix://{tmp_path}/docker.sock"
    assert argv[argv.index("--exec-root") + 1] == str(tmp_path / "exec")
    assert argv[argv.index("--storage-driver") + 1] == "overlay2"
    assert "--bridge=none" not in argv
    assert "--data-root" not in argv
    host = dockerd_argv("dockerd", tmp_path, "vfs", "host", tmp_path / "data")
    assert "--bridge=none" in host
    assert host[host.index("--data-root") + 1] == str(tmp_path / "data")


def test_start_tries_overlay2_before_vfs_and_the_bridge_before_host_networking() -> None:
    assert attempts(None, None) == [("overlay2", "bridge"), ("overlay2", "host"), ("vfs", "bridge"), ("vfs", "host")]
    assert attempts("vfs", None) == [("vfs", "bridge"), ("vfs", "host")]
    assert attempts(None, "host") == [("overlay2", "host"), ("vfs", "host")]


def test_the_record_round_trips_and_garbage_reads_as_none(tmp_path: Path) -> None:
    rec = Record(123, "unix:///x/docker.sock", "overlay2", "bridge", "/x/dockerd.log", 1.5)
    rec.save(tmp_path / "engine.json")
    assert Record.load(tmp_path / "engine.json") == rec
    (tmp_path / "engine.json").write_text("{half")
    assert Record.load(tmp_path / "engine.json") is None
    assert Record.load(tmp_path / "missing.json") is None


def test_the_sweep_finds_processes_naming_the_state_folder(tmp_path: Path) -> None:
    state = tmp_path / "engine-state"
    # Popen returns once the child has exec'd (the exec-error pipe closes): its command line names the folder now
    proc = subprocess.Popen(["sh", "-c", "sleep 30", str(state / "containerd.toml")])
    try:
        assert (proc.pid, "sh") in engine_processes(state, 0)
        assert engine_processes(tmp_path / "another-state", 0) == []
    finally:
        proc.kill()
        proc.wait()
    assert engine_processes(state, 0) == []


def test_an_unknown_stop_is_a_no_op(tmp_path: Path) -> None:
    assert engine.stop(tmp_path, say=lambda _line: None) is False


def test_start_refuses_a_docker_host_that_does_not_answer(tmp_path: Path) -> None:
    with pytest.raises(engine.EngineUnavailable, match=r"DOCKER_HOST=unix:///nowhere/docker\.sock does not answer"):
        engine.start(tmp_path, env={"DOCKER_HOST": "unix:///nowhere/docker.sock"}, say=lambda _line: None)


# ------------------------------------------------------------------------------------------------------ client
def test_buildkit_needs_buildx_from_docker_23_on() -> None:
    assert client.buildkit_argv("/usr/local/bin/docker", "28.2.2", has_buildx=False) is None
    assert client.buildkit_argv("/usr/local/bin/docker", "28.2.2", has_buildx=True) == (
        ["/usr/local/bin/docker", "buildx", "build", "--load"],
        {},
    )
    assert client.buildkit_argv("/usr/bin/docker", "20.10.24+dfsg1", has_buildx=False) == (
        ["/usr/bin/docker", "build"],
        {"DOCKER_BUILDKIT": "1"},
    )
    assert client.buildkit_argv("docker", "", has_buildx=False) is None
    assert client.major("20.10.24+dfsg1") == 20
    assert client.major("?") == 0


# --------------------------------------------------------------------------------------------------- Dockerfiles
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_pull_no_frontend_and_take_their_base_as_an_argument(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, flags=re.M | re.I), "a # syntax= line pulls a frontend"
    assert re.search(r"^ARG BASE_IMAGE=\S+$", text, flags=re.M)
    assert re.findall(r"^FROM (\S+)", text, flags=re.M)[-1] == "${BASE_IMAGE}"
    for key in ("version", "revision", "source"):
        assert f"org.opencontainers.image.{key}=" in text
    # the CA bundle is an optional secret (never required, never copied into a layer)
    assert "--mount=type=secret,id=pip_ca" in text
    assert "required=true" not in text
    assert "COPY" not in "".join(line for line in text.splitlines() if "pip_ca" in line and "COPY" in line)
    # installs come from the lock only, every hash checked
    assert re.search(r"pip install --require-hashes --no-deps -r locks/", text)
    assert "pip check" in text
    assert "USER 10001:10001" in text
    assert 'ENTRYPOINT ["streaminfer-consumer"]' in text


def test_the_cpu_image_installs_the_cpu_lock_and_the_gpu_image_either_gpu_lock() -> None:
    cpu = (ROOT / "docker" / "cpu.Dockerfile").read_text()
    gpu = (ROOT / "docker" / "gpu.Dockerfile").read_text()
    assert "locks/cpu.txt" in cpu
    assert "gpu" not in re.sub(r"#.*", "", cpu).lower()
    assert "ARG RUNTIME_LOCK=gpu" in gpu
    assert "locks/${RUNTIME_LOCK}.txt" in gpu
    assert images.default_base(ROOT / "docker" / "cpu.Dockerfile") == "python:3.11-slim"
    assert images.default_base(ROOT / "docker" / "gpu.Dockerfile").startswith("nvidia/cuda:13.")


def test_the_build_context_sends_everything_the_dockerfiles_copy() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    for path in DOCKERFILES:
        for line in path.read_text().splitlines():
            if line.startswith("COPY") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    source = re.sub(r"\$\{RUNTIME_LOCK\}", "gpu", source)
                    assert any(source == inc or source.startswith(inc + "/") for inc in included), source
                    assert (ROOT / source).exists() or source.startswith("locks/"), source


def test_build_arguments_carry_labels_base_lock_and_the_optional_secret(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    args = images.build_args("gpu", tag="t:1", base="local/base", runtime_lock="cuda", ca=ca)
    joined = " ".join(args)
    assert "--network host" in joined
    assert "-f " + str(ROOT / "docker" / "gpu.Dockerfile") in joined
    assert "BASE_IMAGE=local/base" in joined
    assert "RUNTIME_LOCK=cuda" in joined
    assert f"VERSION={images.project_version()}" in joined
    assert re.search(r"REVISION=[0-9a-f]{40}", joined)
    assert f"--secret id=pip_ca,src={ca}" in joined
    assert "--secret" not in images.build_args("cpu", tag="t:1", base="b", runtime_lock=None, ca=None)


def test_the_ca_bundle_comes_from_the_flag_else_pip_cert(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    assert images.ca_bundle(None, {"PIP_CERT": str(ca)}) == ca
    assert images.ca_bundle(None, {}) is None
    with pytest.raises(ValueError, match="is not a file"):
        images.ca_bundle(tmp_path / "missing.pem", {})
    with pytest.raises(ValueError, match="unknown image flavour"):
        images.dockerfile("tpu")


def test_ldd_output_names_what_does_not_resolve() -> None:
    out = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibcudart.so.13 => /opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13 (0x1)\n"
        "\tlibcuda.so.1 => not found\n"
        "\tlibcudnn.so.9 => not found\n"
    )
    assert images.not_found(out) == ["libcuda.so.1", "libcudnn.so.9"]
    assert set(images.not_found(out)) - images.DRIVER_LIBRARIES == {"libcudnn.so.9"}


# ------------------------------------------------------------------------------------------------ kafka, base
def test_the_kafka_image_is_named_after_the_local_brokers_version() -> None:
    assert kafka.kafka_version() == re.search(
        r"<kafka\.version>([^<]+)<", (ROOT / "harness" / "localkafka" / "pom.xml").read_text()
    ).group(1)  # type: ignore[union-attr]
    assert kafka.image_name() == f"apache/kafka:{kafka.kafka_version()}"


def test_the_broker_environment_follows_the_official_images_contract() -> None:
    env = kafka.broker_env("bridge")
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_LISTENERS"] == "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093,CONTROLLER://0.0.0.0:9094"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@localhost:9094"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"  # exactly-once tests on one broker
    assert all(k.startswith("KAFKA_") for k in env)
    host = kafka.broker_env("host", (21001, 21002, 21003))
    assert host["KAFKA_LISTENERS"].startswith("PLAINTEXT://127.0.0.1:21001,")
    script = kafka.start_script("172.17.0.1", 32768)
    assert "KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://172.17.0.1:32768,BROKER://localhost:9093" in script
    assert script.rstrip().endswith("exec /etc/kafka/docker/run")
    run = (kafka.CONTEXT / "run").read_text()
    assert "kafka.docker.KafkaDockerWrapper setup" in run
    assert "exec java" in run


def test_a_base_recipe_is_rebuilt_when_its_packages_change() -> None:
    python = base.RECIPES["python"]
    assert {"python3", "python3-venv"} <= set(python.packages)
    assert python.tag == "streaminfer-local/debian-python:bookworm"
    changed = base.Recipe("python", (*python.packages, "curl"), cmd=python.cmd)
    assert changed.digest != python.digest
    assert base.Recipe("python", python.packages, cmd=python.cmd).digest == python.digest


def test_mounts_under_a_fresh_folder_are_none(tmp_path: Path) -> None:
    assert base.mounts_under(tmp_path) == []
    assert "/proc" in base.mounts_under(Path("/proc")) or sys.platform != "linux"


def test_ci_and_make_set_no_streaminfer_variable_the_consumer_would_refuse() -> None:
    """The consumer stops at start-up on a STREAMINFER_* variable that is no setting: a variable of the CI script,
    the Makefile or the test fixtures with that prefix would stop every consumer the tests start."""
    from consumer.config import unknown_variables

    sources = [
        ROOT / ".ci" / "run",
        ROOT / "Makefile",
        ROOT / "tests" / "conftest.py",
        ROOT / "harness" / "docker" / "cli.py",
    ]
    names = {m for path in sources for m in re.findall(r"\bSTREAMINFER_[A-Z0-9_]*[A-Z0-9]", path.read_text())}
    assert names, "the pattern finds the settings these files do mention"
    assert unknown_variables(dict.fromkeys(names, "1")) == []
