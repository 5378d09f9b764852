"""The dependency lock: the digest that stops a stale lock, the install sets, and the repository's own lock."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from harness import lock
from harness.lock import SETS, LockError, check, dependency_digest, locked_names, strays

ROOT = Path(__file__).resolve().parents[3]

PYPROJECT = """
[project]
name = "x"
requires-python = ">=3.11"
dependencies = ["aiokafka>=0.12"]  # a comment

[project.optional-dependencies]
cpu = ["onnxruntime>=1.23"]

[tool.ruff]
line-length = 120
"""


def _digest(text: str) -> str:
    return dependency_digest(tomllib.loads(text))


def test_the_digest_follows_the_dependency_tables_only() -> None:
    base = _digest(PYPROJECT)
    assert _digest(PYPROJECT.replace("# a comment", "# another comment")) == base
    assert _digest(PYPROJECT.replace("line-length = 120", "line-length = 100")) == base
    assert _digest(PYPROJECT.replace('"aiokafka>=0.12"]', '"aiokafka>=0.12", "fastavro>=1.9"]')) != base
    assert _digest(PYPROJECT.replace('cpu = ["onnxruntime>=1.23"]', 'cpu = ["onnxruntime>=1.24"]')) != base
    assert _digest(PYPROJECT.replace(">=3.11", ">=3.12")) != base
    assert _digest(PYPROJECT + '\n[tool.uv]\nconstraint-dependencies = ["numpy<3"]\n') != base


def _project(tmp_path: Path, text: str = PYPROJECT) -> Path:
    (tmp_path / "pyproject.toml").write_text(text)
    (tmp_path / "uv.lock").write_text("version = 1\n")
    (tmp_path / "locks").mkdir()
    for name in SETS:
        (tmp_path / "locks" / f"{name}.txt").write_text("")
    (tmp_path / "locks" / "pyproject.sha256").write_text(f"{_digest(text)}  pyproject.toml\n")
    return tmp_path


def test_check_passes_when_the_lock_was_made_from_this_pyproject(tmp_path: Path) -> None:
    check(_project(tmp_path))


def test_check_names_make_lock_when_a_dependency_was_added(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "pyproject.toml").write_text(PYPROJECT.replace('"aiokafka>=0.12"]', '"aiokafka>=0.12", "confluent-kafka"]'))
    with pytest.raises(LockError, match=r"dependencies changed since the lock.*run 'make lock'.*nothing was installed"):
        check(root)


def test_check_names_a_missing_lock_file(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "locks" / "cpu.txt").unlink()
    with pytest.raises(LockError, match=r"locks/cpu\.txt missing"):
        check(root)


def test_the_repositorys_lock_matches_its_pyproject() -> None:
    check(ROOT)  # fails after a dependency change until `make lock` is run and committed


def test_the_command_line_exits_1_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _project(tmp_path)
    assert lock.main(["check"], root) == 0
    (root / "pyproject.toml").write_text(PYPROJECT.replace(">=3.11", ">=3.12"))
    assert lock.main(["check"], root) == 1
    assert "run 'make lock'" in capsys.readouterr().err


def _locked(name: str) -> set[str]:
    return locked_names((ROOT / "locks" / f"{name}.txt").read_text())


def test_each_install_set_carries_one_onnxruntime_build() -> None:
    assert "onnxruntime" in _locked("cpu")
    assert "onnxruntime-gpu" not in _locked("cpu")
    assert not {n for n in _locked("cpu") if n.startswith("nvidia-") and n != "nvidia-ml-py"}
    assert "onnxruntime-gpu" in _locked("gpu")
    assert "onnxruntime" not in _locked("gpu")
    assert {"onnxruntime-gpu", "nvidia-cudnn-cu13", "nvidia-cuda-runtime", "nvidia-cublas"} <= _locked("cuda")
    assert "onnxruntime" in _locked("dev")
    assert "onnxruntime-gpu" not in _locked("dev")
    assert {"scikit-learn", "skl2onnx", "onnx"} <= _locked("model")


def test_every_pinned_requirement_has_hashes() -> None:
    for name in SETS:
        entries: list[str] = []
        for line in (ROOT / "locks" / f"{name}.txt").read_text().splitlines():
            if line and not line.startswith((" ", "#")):
                entries.append(line)
            elif entries and line.startswith(" "):
                entries[-1] += line
        assert entries, name
        for entry in entries:
            assert "==" in entry, f"locks/{name}.txt: {entry[:80]}"
            assert "--hash=sha256:" in entry, f"locks/{name}.txt: {entry[:80]}"


def test_locked_names_and_strays() -> None:
    text = "Foo_Bar==1.0 \\\n    --hash=sha256:00\nnumpy==2.4.6 ; python_full_version < '3.12' \\\n# baz==1\n"
    assert locked_names(text) == {"foo-bar", "numpy"}
    assert strays(["numpy", "six", "pip", "Foo.Bar", "streaminfer"], {"foo-bar", "numpy"}) == ["six"]
    # the GPU build left over beside the locked CPU build: both go (they share files), the lock's comes back whole
    assert strays(["numpy", "onnxruntime", "onnxruntime-gpu"], {"numpy", "onnxruntime"}) == [
        "onnxruntime",
        "onnxruntime-gpu",
    ]
    assert strays(["numpy", "onnxruntime"], {"numpy", "onnxruntime"}) == []


def test_refresh_and_verify_use_uv_export_per_set(tmp_path: Path) -> None:
    argv = lock.export_command("uv", SETS["cpu"])
    assert argv[:3] == ["uv", "export", "--frozen"]
    assert "--no-emit-project" in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--extra"] == ["cpu", "otel"]


def test_find_uv_prefers_the_virtualenvs(tmp_path: Path) -> None:
    uv = tmp_path / ".venv" / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_text("#!/bin/sh\n")
    uv.chmod(0o755)
    assert lock.find_uv(tmp_path, {"PATH": ""}) == str(uv)
    shutil.rmtree(tmp_path / ".venv")
    on_path = tmp_path / "bin" / "uv"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert lock.find_uv(tmp_path, {"PATH": str(on_path.parent)}) == str(on_path)
