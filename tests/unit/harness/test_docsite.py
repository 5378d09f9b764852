"""harness.docsite without a browser: which pages it opens, which links it calls broken, how it finds a diagram's SVG
behind a closed shadow root, and that a Mermaid tarball with the wrong sha512 is refused (the browser run itself is
`make docs-check`, in CI)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from harness import docsite


def site(tmp_path: Path) -> Path:
    for rel in ("index.html", "events.html", "404.html", "bench/latency.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    return tmp_path


def test_pages_are_every_html_file_but_the_404_page(tmp_path: Path) -> None:
    assert docsite.pages(site(tmp_path)) == ["events.html", "index.html"]


def test_links_to_missing_pages_anchors_and_folders_are_broken(tmp_path: Path) -> None:
    root = site(tmp_path)
    base = "http://127.0.0.1:1/"
    home = docsite.Report("index.html", ids={"top"})
    home.links = [
        base + "events.html#avro-events",  # ok
        base + "index.html#top",  # ok
        base + "bench/latency.png",  # a file: ok
        base + "events.html#no-such-anchor",
        base + "nope.html",
        base + "bench/",  # a folder: a listing from the file system
    ]
    seen = {"index.html": home, "events.html": docsite.Report("events.html", ids={"avro-events"})}
    broken = docsite.check_links(root, base, seen)
    assert broken == {
        "index.html": [
            f"no such anchor: {base}events.html#no-such-anchor",
            f"no such page or file: {base}nope.html",
            f"a link to a folder, not a page: {base}bench/",
        ]
    }


class FakeCDP:
    """DevTools' ``DOM.getDocument`` answer: one drawn diagram (an SVG in a shadow root), one not drawn."""

    def __init__(self) -> None:
        svg = {"localName": "svg", "children": [{"nodeType": 3, "nodeValue": " Source "}]}
        drawn = {"localName": "div", "attributes": ["class", "mermaid"], "shadowRoots": [{"children": [svg]}]}
        empty = {"localName": "div", "attributes": ["class", "mermaid"], "shadowRoots": []}
        body = {"localName": "body", "children": [{"localName": "p", "attributes": ["class", "x"]}, drawn, empty]}
        self.root = {"localName": "html", "children": [body]}

    def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert (method, params) == ("DOM.getDocument", {"depth": -1, "pierce": True})
        return {"root": self.root}


def test_svg_texts_reads_through_shadow_roots() -> None:
    assert docsite._svg_texts(FakeCDP()) == ["Source", ""]


def test_a_tarball_with_the_wrong_sha512_is_refused_and_removed(tmp_path: Path) -> None:
    tarball = tmp_path / f"mermaid-{docsite.MERMAID_VERSION}.tgz"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"not mermaid"
        info = tarfile.TarInfo("package/dist/mermaid.min.js")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tarball.write_bytes(buffer.getvalue())
    with pytest.raises(RuntimeError, match="sha512"):
        docsite.vendor(tmp_path / "out" / "mermaid.min.js", cache=tmp_path)
    assert not tarball.exists()
    assert not (tmp_path / "out").exists()
