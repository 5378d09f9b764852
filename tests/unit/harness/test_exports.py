"""The export cache of the model build scripts (harness/exports.py): a build is redone only when its key changed or
an artifact is missing; --check says which without building."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.exports import build_key, cached_record, export_cli, write_record


def test_the_key_follows_every_source_file(tmp_path: Path) -> None:
    script, dep = tmp_path / "build.py", tmp_path / "fuse.py"
    script.write_text("a")
    dep.write_text("b")
    first = build_key([script, dep], ["pytest", "no-such-package-here"])
    assert set(first) == {"script_sha256", "pytest"}  # packages that are not installed are left out
    dep.write_text("c")
    assert build_key([script, dep], ["pytest"])["script_sha256"] != first["script_sha256"]


def test_cli_builds_once_then_reports_the_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    builds: list[Path] = []

    def build(out: Path, key: dict[str, str]) -> dict[str, Any]:
        builds.append(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.onnx").write_bytes(b"onnx")
        return write_record(out, {**key, "figure": 1.5})

    def run(*flags: str) -> None:
        export_cli(
            "toy",
            "doc",
            ["model.onnx"],
            lambda: {"script_sha256": "k1"},
            build,
            lambda o, r: "wrote",
            argv=["--out", str(tmp_path / "toy"), *flags],
        )

    with pytest.raises(SystemExit) as check:
        run("--check")
    assert check.value.code == 3
    run()
    run()
    assert len(builds) == 1
    assert capsys.readouterr().out.splitlines()[-2:] == ["toy: wrote", f"toy: cached at {tmp_path / 'toy'}"]
    assert cached_record(tmp_path / "toy", {"script_sha256": "k1"}, ["model.onnx"]) == {
        "script_sha256": "k1",
        "figure": 1.5,
    }
    assert cached_record(tmp_path / "toy", {"script_sha256": "k2"}, ["model.onnx"]) is None  # another key
    (tmp_path / "toy" / "model.onnx").unlink()
    assert cached_record(tmp_path / "toy", {"script_sha256": "k1"}, ["model.onnx"]) is None  # an artifact gone
    run()
    run("--force")
    assert len(builds) == 3


def test_a_failed_build_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def build(out: Path, key: dict[str, str]) -> dict[str, Any]:
        raise RuntimeError("verification failed: diff 0.2 > 0.001")

    with pytest.raises(SystemExit) as failed:
        export_cli("toy", "doc", ["m"], dict, build, lambda o, r: "", argv=["--out", str(tmp_path)])
    assert failed.value.code == 1
    assert capsys.readouterr().err == "toy: FAILED: verification failed: diff 0.2 > 0.001\n"
