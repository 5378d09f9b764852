"""The local schema registry's parts that need no JVM: the JDK search, the archive's checks and unpacking, the JVM's
configuration, the record of a started registry, its status, and the command line's refusals."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.localkafka import BrokerSetupError
from harness.registry import LocalRegistry, RegistrySetupError
from harness.registry import java as registry_java
from harness.registry.cli import main as cli
from harness.registry.java import app_home, find_registry_java, release_major, resolve_archive, unpack, verify_archive
from harness.registry.registry import RegistryRecord, is_registry, registry_properties

# ---------------------------------------------------------------------------------------------------------- JDKs


def fake_jdk(home: Path, version: str, *, release: bool = True) -> Path:
    """A folder that looks like a JDK of ``version``: ``release`` and a ``bin/java`` that prints the version."""
    (home / "bin").mkdir(parents=True)
    if release:
        (home / "release").write_text(f'IMPLEMENTOR="Test"\nJAVA_VERSION="{version}"\n')
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2026-01-01' >&2\n")
    java.chmod(0o755)
    return home


def test_release_files_give_the_major_version(tmp_path: Path) -> None:
    assert release_major(fake_jdk(tmp_path / "a", "25.0.3")) == 25
    assert release_major(fake_jdk(tmp_path / "b", "1.8.0_402")) == 8
    assert release_major(fake_jdk(tmp_path / "c", "21", release=False)) is None


def test_the_setting_wins_and_must_be_a_jdk_21_or_newer(tmp_path: Path) -> None:
    jdk21 = fake_jdk(tmp_path / "jdk21", "21.0.2")
    jdk17 = fake_jdk(tmp_path / "jdk17", "17.0.15")
    roots = (str(tmp_path / "jdk*"),)
    found = find_registry_java({"KAFKA_LOCAL_REGISTRY_JAVA_HOME": str(jdk21), "JAVA_HOME": str(jdk17)}, roots)
    assert (found.java, found.major) == (jdk21 / "bin" / "java", 21)
    with pytest.raises(RegistrySetupError, match=r"KAFKA_LOCAL_REGISTRY_JAVA_HOME is set to .*a Java 17: .* >= 21"):
        find_registry_java({"KAFKA_LOCAL_REGISTRY_JAVA_HOME": str(jdk17)}, roots)
    with pytest.raises(RegistrySetupError, match="does not run"):  # no fall-back to the JDK found in roots
        find_registry_java({"KAFKA_LOCAL_REGISTRY_JAVA_HOME": str(tmp_path / "missing")}, roots)


def test_java_home_is_taken_only_when_new_enough_then_the_newest_installed_jdk(tmp_path: Path) -> None:
    jdk17 = fake_jdk(tmp_path / "jvm" / "java-17", "17.0.15")
    fake_jdk(tmp_path / "jvm" / "temurin-21", "21.0.5")
    newest = fake_jdk(tmp_path / "jvm" / "temurin-25", "25.0.3", release=False)  # asked by running it
    roots = (str(tmp_path / "jvm" / "*"),)
    found = find_registry_java({"JAVA_HOME": str(jdk17), "PATH": ""}, roots)
    assert (found.java, found.major) == (newest / "bin" / "java", 25)
    jdk22 = fake_jdk(tmp_path / "home22", "22.0.1")
    assert find_registry_java({"JAVA_HOME": str(jdk22), "PATH": ""}, roots).java == jdk22 / "bin" / "java"


def test_java_on_path_is_the_last_resort(tmp_path: Path) -> None:
    jdk = fake_jdk(tmp_path / "opt" / "jdk", "23.0.1")
    found = find_registry_java({"PATH": str(jdk / "bin")}, roots=(str(tmp_path / "none" / "*"),))
    assert found.major == 23


def test_no_jdk_is_one_line_naming_every_place_searched(tmp_path: Path) -> None:
    jdk17 = fake_jdk(tmp_path / "jvm" / "java-17", "17.0.15")
    (tmp_path / "jvm" / "openjdk-17").mkdir()  # a folder without bin/java: not a JDK
    roots = (str(tmp_path / "jvm" / "*"),)
    with pytest.raises(RegistrySetupError) as caught:
        find_registry_java({"JAVA_HOME": str(jdk17), "PATH": str(jdk17 / "bin")}, roots)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("no JDK >= 21 for the schema registry")
    named = (
        "KAFKA_LOCAL_REGISTRY_JAVA_HOME (unset)",
        f"JAVA_HOME={jdk17} (Java 17)",
        f"{jdk17}: Java 17",
        f"java on PATH ({jdk17 / 'bin' / 'java'}: Java 17)",
        "set KAFKA_LOCAL_REGISTRY_JAVA_HOME",
    )
    for place in named:
        assert place in text
    with pytest.raises(RegistrySetupError, match=r"JAVA_HOME \(unset\), .* \(no JDK\), java on PATH \(none\)"):
        find_registry_java({"PATH": str(tmp_path / "empty")}, (str(tmp_path / "none" / "*"),))


def test_a_jdk_whose_release_file_lies_is_refused_when_run(tmp_path: Path) -> None:
    home = fake_jdk(tmp_path / "jdk", "17.0.15")
    (home / "release").write_text('JAVA_VERSION="21.0.1"\n')
    with pytest.raises(RegistrySetupError, match="reports Java 17"):
        find_registry_java({"KAFKA_LOCAL_REGISTRY_JAVA_HOME": str(home)})


def test_setup_errors_are_the_brokers_kind() -> None:
    assert issubclass(RegistrySetupError, BrokerSetupError)


# ---------------------------------------------------------------------------------------------- the application


def make_archive(path: Path, members: dict[str, bytes]) -> str:
    """A tar.gz of ``members`` (name -> content) at ``path``; returns its SHA-256."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_archive_is_checked_against_the_pinned_sha256_and_centrals_sha1(tmp_path: Path) -> None:
    archive = tmp_path / "app-all.tar.gz"
    sha256 = make_archive(archive, {"quarkus-run.jar": b"jar"})
    sha1 = hashlib.sha1(archive.read_bytes(), usedforsecurity=False).hexdigest()
    (tmp_path / "app-all.tar.gz.sha1").write_text(sha1 + "\n")
    verify_archive(archive, sha256)  # both agree
    (tmp_path / "app-all.tar.gz.sha1").write_text("0" * 40)
    with pytest.raises(RegistrySetupError, match=r"SHA-1 .*Maven Central's .sha1 says 0000.*deleted it"):
        verify_archive(archive, sha256)
    assert not archive.exists()  # the next start downloads it again
    make_archive(archive, {"quarkus-run.jar": b"jar"})
    (tmp_path / "app-all.tar.gz.sha1").unlink()
    with pytest.raises(RegistrySetupError, match=r"SHA-256 .*, pinned ffff"):
        verify_archive(archive, "f" * 64)


def test_the_application_is_unpacked_once_and_then_found_in_the_cache(tmp_path: Path) -> None:
    archive = tmp_path / "app.tar.gz"
    sha = make_archive(archive, {"quarkus-run.jar": b"jar", "lib/main/a.jar": b"a"})
    into = tmp_path / "cache" / "apicurio-registry-app-x"
    assert unpack(archive, into, sha) == into
    assert (into / "lib" / "main" / "a.jar").read_bytes() == b"a"
    assert (into / ".unpacked").read_text().strip() == sha
    archive.unlink()  # not read again
    assert unpack(archive, into, sha) == into
    assert not list(into.parent.glob(".*.tmp.*"))  # no half-unpacked folder left


def test_an_archive_without_the_runner_or_with_a_path_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar.gz"
    make_archive(empty, {"README": b"x"})
    with pytest.raises(RegistrySetupError, match=r"holds no quarkus-run\.jar"):
        unpack(empty, tmp_path / "a", "x")
    evil = tmp_path / "evil.tar.gz"
    make_archive(evil, {"../escaped": b"x", "quarkus-run.jar": b"jar"})
    with pytest.raises(RegistrySetupError, match="cannot unpack"):
        unpack(evil, tmp_path / "b", "x")
    assert not (tmp_path / "escaped").exists()
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


def test_a_cached_application_needs_no_maven_and_none_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry_java.shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(RegistrySetupError, match=r"mvn \(Apache Maven\) not found"):
        app_home(tmp_path / "cache")
    with pytest.raises(RegistrySetupError, match=r"mvn \(Apache Maven\) not found"):
        resolve_archive(scratch=tmp_path)
    into = tmp_path / "cache" / f"apicurio-registry-app-{registry_java.APP_VERSION}"
    into.mkdir(parents=True)
    (into / "quarkus-run.jar").write_bytes(b"jar")
    (into / ".unpacked").write_text(registry_java.APP_SHA256 + "\n")
    assert app_home(tmp_path / "cache") == into


def test_the_cache_folder_follows_the_settings(tmp_path: Path) -> None:
    assert registry_java.default_cache({"KAFKA_LOCAL_REGISTRY_CACHE": "/c"}) == Path("/c")
    assert registry_java.default_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/streaminfer")
    assert registry_java.default_cache({"HOME": "/h"}) == Path("/h/.cache/streaminfer")


# ------------------------------------------------------------------------------------------- configuration


def test_both_interfaces_bind_loopback_and_the_schemas_live_in_a_file(tmp_path: Path) -> None:
    props = registry_properties(tmp_path, 20001, 20002, {"apicurio.datasource.jdbc.max-size": "4"})
    assert props["quarkus.http.host"] == props["quarkus.management.host"] == "127.0.0.1"
    assert (props["quarkus.http.port"], props["quarkus.management.port"]) == ("20001", "20002")
    assert props["apicurio.storage.kind"] == "sql"
    assert props["apicurio.datasource.url"] == f"jdbc:h2:file:{tmp_path}/data/registry"
    assert props["apicurio.datasource.jdbc.max-size"] == "4"  # extra properties win
    assert props["java.io.tmpdir"] == str(tmp_path / "tmp")


def test_the_command_line_runs_the_fast_jar_with_our_heap_flags_and_properties(tmp_path: Path) -> None:
    registry = LocalRegistry(tmp_path, jvm_opts="-Dx=1 -XX:+Foo", properties={"a.b": "c"}, log=False)
    argv = registry.command(Path("/jdk/bin/java"), Path("/app"), 20001, 20002)
    assert argv[0] == "/jdk/bin/java"
    assert argv[-2:] == ["-jar", "/app/quarkus-run.jar"]
    assert argv[1:3] == ["-Xms64m", "-Xmx256m"]
    for flag in ("-Dx=1", "-XX:+Foo", "-Da.b=c", "-Dquarkus.management.port=20002", "-Dquarkus.http.host=127.0.0.1",
                 f"-Dstreaminfer.registry.record={tmp_path}/state.json"):  # fmt: skip
        assert flag in argv


def test_bad_ports_are_refused() -> None:
    with pytest.raises(ValueError, match="port must be a port number"):
        LocalRegistry(Path("x"), port=70000)
    with pytest.raises(ValueError, match="must differ"):
        LocalRegistry(Path("x"), port=20001, management_port=20001)


# ------------------------------------------------------------------------------------------------ record, status


def record(state: Path, **fields: object) -> LocalRegistry:
    """A registry in ``state`` whose record says ``fields`` (no JVM)."""
    rec = RegistryRecord("127.0.0.1", 20001, 20002, "/jdk/bin/java", ["java"])
    for name, value in fields.items():
        setattr(rec, name, value)
    state.mkdir(parents=True, exist_ok=True)
    rec.save(state / "state.json")
    return LocalRegistry(state, log=False)


def test_nothing_started_is_not_running_and_has_no_url(tmp_path: Path) -> None:
    registry = LocalRegistry(tmp_path, log=False)
    assert registry.status() == "not running"
    assert registry.url == registry.health_url == ""
    for verb in (registry.pause, registry.resume, registry.freeze, registry.thaw):
        with pytest.raises(RegistrySetupError, match="no registry is started"):
            verb()
    registry.stop()  # nothing to do


def test_status_tells_paused_from_exited_and_never_trusts_a_reused_pid(tmp_path: Path) -> None:
    registry = record(tmp_path, pid=os.getpid())  # this test's process: not the registry's JVM
    assert registry.status() == "exited"
    assert registry.url == "http://127.0.0.1:20001/apis/ccompat/v7"
    assert registry.health_url == "http://127.0.0.1:20002/health/ready"
    assert record(tmp_path, pid=0, paused=True).status() == "paused"


def reader(marker: str) -> subprocess.Popen[bytes]:
    """A process with ``marker`` on its command line that runs until its stdin is closed; returned once it runs
    (right after exec its command line still reads empty)."""
    code = "import sys; print('up', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code, marker], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    return proc


def test_a_running_jvm_is_known_by_the_marker_in_its_command_line_frozen_or_not(tmp_path: Path) -> None:
    marker = f"-Dstreaminfer.registry.record={tmp_path.resolve()}/state.json"
    with reader(marker) as stranger:  # on leaving: stdin closed, so it ends, and waited for
        assert is_registry(stranger.pid, marker, None)
        assert not is_registry(stranger.pid, marker + "x", None)
        assert record(tmp_path, pid=stranger.pid).status() == "running"
        assert record(tmp_path, pid=stranger.pid, frozen=True).status() == "frozen"
    assert record(tmp_path, pid=stranger.pid).status() == "exited"


def test_stop_of_a_frozen_registry_thaws_it_so_it_hears_sigterm(tmp_path: Path) -> None:
    marker = f"-Dstreaminfer.registry.record={tmp_path.resolve()}/state.json"
    with reader(marker) as proc:
        os.kill(proc.pid, signal.SIGSTOP)
        registry = record(tmp_path, pid=proc.pid, frozen=True)
        (tmp_path / "data").mkdir()
        registry.stop()
        assert proc.wait(timeout=30) == -signal.SIGTERM
    assert registry.status() == "not running"
    assert not (tmp_path / "data").exists()


def test_a_record_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"nodes": 3}')
    with pytest.raises(RegistrySetupError, match="not a local registry's record"):
        LocalRegistry(tmp_path, log=False).status()


def test_start_refuses_a_paused_or_exited_registry_and_keeps_it(tmp_path: Path) -> None:
    with pytest.raises(RegistrySetupError, match="is paused: resume it, or stop it"):
        record(tmp_path, paused=True).start()
    with pytest.raises(RegistrySetupError, match=r"never stopped .* resume restarts it"):
        record(tmp_path).start()
    assert (tmp_path / "state.json").exists()


def test_resume_refuses_while_another_program_holds_the_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        registry = record(tmp_path, paused=True, port=port)
        with pytest.raises(RegistrySetupError, match=rf"port\(s\) \[{port}\] .* it stays paused"):
            registry.resume()
    assert registry.status() == "paused"


# ------------------------------------------------------------------------------------------------ command line


def test_cli_status_and_pause_without_a_registry_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--state", str(tmp_path), "status"], env={}) == 3
    assert capsys.readouterr().out.strip() == "not running"
    for verb in ("pause", "resume", "freeze", "thaw"):
        assert cli(["--state", str(tmp_path), verb], env={}) == 3


def test_cli_state_folder_is_the_brokers_registry_subfolder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record(tmp_path / "registry", paused=True)
    assert cli(["status"], env={"KAFKA_LOCAL_STATE": str(tmp_path)}) == 4
    assert capsys.readouterr().out.splitlines() == ["paused", "http://127.0.0.1:20001/apis/ccompat/v7"]


def test_cli_start_refuses_a_paused_registry_with_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record(tmp_path, paused=True)
    assert cli(["--state", str(tmp_path), "start"], env={}) == 4
    assert "'resume' restarts it, 'stop' discards it" in capsys.readouterr().err
    assert (tmp_path / "state.json").exists()


def test_cli_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert cli(["--state", str(afile / "x"), "status"], env={}) == 1
    assert cli(["status"], env={"KAFKA_LOCAL_STATE": str(tmp_path), "KAFKA_LOCAL_REGISTRY_JVM_OPTS": '"x'}) == 1
    assert cli(["--state", str(tmp_path), "status"], env={"KAFKA_LOCAL_REGISTRY_START_TIMEOUT": "nan"}) == 1
    assert cli(["--state", str(tmp_path), "status"], env={"KAFKA_LOCAL_REGISTRY_PORT": "http"}) == 1
    assert cli(["--state", str(tmp_path), "start", "--port", "20001", "--management-port", "20001"], env={}) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5, err
    assert all(line.startswith("registry-local: error: ") for line in err)
    assert "KAFKA_LOCAL_REGISTRY_JVM_OPTS is not a list of shell words" in err[1]
    assert "KAFKA_LOCAL_REGISTRY_START_TIMEOUT must be a number" in err[2]
    assert "KAFKA_LOCAL_REGISTRY_PORT must be a port number" in err[3]
    assert "must differ" in err[4]


def test_cli_start_without_a_jdk_21_says_so_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"KAFKA_LOCAL_REGISTRY_JAVA_HOME": str(fake_jdk(tmp_path / "jdk17", "17.0.15"))}
    assert cli(["--state", str(tmp_path / "state"), "start"], env=env) == 1
    assert "needs Java >= 21" in capsys.readouterr().err
    assert not (tmp_path / "state" / "state.json").exists()
