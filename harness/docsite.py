"""The documentation site's own parts and its check in a real browser (``make docs``, ``make docs-check``).

``vendor``  puts Mermaid's browser bundle (``dist/mermaid.min.js`` of the npm package :data:`MERMAID_VERSION`, fetched
            with npm's own client into ``~/.cache/streaminfer/npm`` and checked against :data:`MERMAID_INTEGRITY`, the
            registry's sha512) at :data:`VENDORED` inside docs/, where the site's build copies it; the file is never
            committed (.gitignore). Zensical's bundle uses a ``mermaid`` already on the page and loads it from a public
            CDN only when there is none, so with it the site makes no request off the machine.
``tools``   installs what the check needs where it is missing (Debian's ``npm`` and ``chromium``; root on Debian).
``check``   serves site/ over HTTP on a free loopback port and opens every page in headless Chromium (Debian's
            ``/usr/bin/chromium``, driven by Playwright; Playwright's own browser download is never used): each page
            loads without a console error or an uncaught exception, makes no request to any other host (such a request
            is blocked and reported), has every Mermaid diagram drawn as an SVG (not left as source text, no
            "Syntax error" diagram), and every link to the site resolves: the page or file exists, and so does the
            anchor (an ``id`` on the rendered target page), and it names a file, not a folder (so that the site
            opened from the file system, site/index.html, navigates too). Prints one line a page and a summary;
            exit 1 on a finding.

Exit codes: 0 clean, 1 findings (each printed), 2 a bad argument or a missing tool (with how to install it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, ConsoleMessage, Response, Route, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from harness.docker.engine import EngineError, EngineUnavailable, apt_install

REPO = Path(__file__).resolve().parent.parent
#: The npm package and version whose ``dist/mermaid.min.js`` draws the diagrams (the major Zensical's bundle asks for).
MERMAID_VERSION = "12.3.0"
#: ``npm view mermaid@12.3.0 dist.integrity``: the tarball's sha512, base64, as the registry publishes it.
MERMAID_INTEGRITY = "sha512-4113TdXeLAsMruJ79OpFL5O8+LTFXhQqZ260rF3tgUmiNAtRm4Uume04I+65PRN6yZ69J4f8rVYWW8zRk65UYw=="
#: Where the bundle goes inside docs/ (mkdocs.yml's ``extra_javascript`` names it; ignored by git).
VENDORED = REPO / "docs" / "assets" / "vendor" / "mermaid.min.js"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "streaminfer" / "npm"
CHROMIUM = os.environ.get("STREAMINFER_CHROMIUM", "/usr/bin/chromium")
#: One page's load, its diagrams' drawing, in ms.
PAGE_TIMEOUT_MS = 30_000
NPM_TIMEOUT_S = 300


class ToolMissing(Exception):
    """A program the command needs is not installed (the message says how to install it)."""


def _integrity(path: Path) -> str:
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


def fetch_mermaid(cache: Path = CACHE) -> Path:
    """The npm tarball of Mermaid :data:`MERMAID_VERSION` in ``cache``, fetched with ``npm pack`` when absent.

    Raises:
        ToolMissing: npm is not installed.
        RuntimeError: npm failed, or the tarball's sha512 is not :data:`MERMAID_INTEGRITY` (the file is removed).
    """
    tarball = cache / f"mermaid-{MERMAID_VERSION}.tgz"
    if not tarball.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise ToolMissing("npm is not installed (Debian: apt-get install npm; `python -m harness.docsite tools`)")
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            done = subprocess.run(  # noqa: S603 (npm with our own arguments)
                [npm, "pack", f"mermaid@{MERMAID_VERSION}", "--pack-destination", tmp, "--silent"],
                capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"npm pack mermaid@{MERMAID_VERSION} failed: {done.stderr.strip()[-2000:]}")
            Path(tmp, tarball.name).replace(tarball)
    if (got := _integrity(tarball)) != MERMAID_INTEGRITY:
        tarball.unlink()
        raise RuntimeError(f"{tarball}: sha512 {got}, expected {MERMAID_INTEGRITY} (removed; run again)")
    return tarball


def vendor(target: Path = VENDORED, cache: Path = CACHE) -> Path:
    """Mermaid's ``dist/mermaid.min.js`` (and its licence beside it) at ``target``; unchanged when already there."""
    tarball = fetch_mermaid(cache)
    with tarfile.open(tarball) as tar:
        wanted = {"package/dist/mermaid.min.js": target, "package/LICENSE": target.with_name("mermaid.LICENSE.txt")}
        for member, dest in wanted.items():
            source = tar.extractfile(member)
            if source is None:
                raise RuntimeError(f"{tarball}: no {member}")
            data = source.read()
            if not dest.exists() or dest.read_bytes() != data:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
    return target


def tools() -> None:
    """Install Debian's npm and chromium where missing.

    Raises:
        ToolMissing: one is missing and cannot be installed here (not root, not Debian) or apt-get failed.
    """
    for package, command in (("npm", "npm"), ("chromium", "chromium")):
        try:
            apt_install(package, command, lambda line: print(f"docsite: {line}", file=sys.stderr))
        except (EngineUnavailable, EngineError) as exc:
            raise ToolMissing(str(exc)) from exc


@contextmanager
def serve(root: Path) -> Iterator[str]:
    """``root`` served over HTTP on a free port of 127.0.0.1 (the kernel's choice) while inside; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docsite-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class Report:
    """What one page showed: its findings, its anchors and its links to the site (absolute URLs)."""

    path: str
    problems: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)
    diagrams: int = 0


def pages(site: Path) -> list[str]:
    """Every HTML page of the built site (but 404.html), as a path relative to its root (``events.html``)."""
    return [p.relative_to(site).as_posix() for p in sorted(site.rglob("*.html")) if p.name != "404.html"]


_LINKS_JS = """() => [...document.querySelectorAll('a[href]')]
    .filter(a => !a.closest('.md-search'))
    .map(a => a.href)"""
_IDS_JS = "() => [...document.querySelectorAll('[id]')].map(e => e.id)"
#: Zensical's bundle replaces each ``pre.mermaid`` by a ``div.mermaid`` whose (closed) shadow root holds the SVG.
_DIAGRAMS_DRAWN_JS = "n => document.querySelectorAll('div.mermaid').length >= n"


def _svg_texts(cdp: Any) -> list[str]:
    """The text of each ``div.mermaid``'s SVG, read through closed shadow roots (DevTools' DOM, ``pierce``)."""
    root = cdp.send("DOM.getDocument", {"depth": -1, "pierce": True})["root"]
    texts: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        attrs = node.get("attributes", [])
        classes = dict(zip(attrs[::2], attrs[1::2], strict=True)).get("class", "").split()
        if node.get("localName") == "div" and "mermaid" in classes:
            inside = [n for shadow in node.get("shadowRoots", []) for n in _descendants(shadow)]
            svg = [n for n in inside if n.get("localName") == "svg"]
            texts.append(" ".join(_text(svg[0])) if svg else "")
            return
        for child in [*node.get("children", []), *node.get("shadowRoots", [])]:
            walk(child)

    walk(root)
    return texts


def _descendants(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for child in [*node.get("children", []), *node.get("shadowRoots", [])]:
        yield child
        yield from _descendants(child)


def _text(node: dict[str, Any]) -> Iterator[str]:
    for n in _descendants(node):
        if n.get("nodeType") == 3 and n.get("nodeValue", "").strip():  # a text node
            yield n["nodeValue"].strip()


def visit(browser: Browser, base: str, path: str, expected_diagrams: int, screenshots: Path | None = None) -> Report:
    """Open ``base + path`` in a fresh page of ``browser`` and record what it showed (see the module's docstring).

    With ``screenshots``, a full-page PNG of it goes there (``index.png`` for the home page, ``events.png``, ...).
    """
    page = Report(path)
    origin = urllib.parse.urlsplit(base).netloc
    tab = browser.new_page()

    def on_route(route: Route) -> None:
        url = route.request.url
        if urllib.parse.urlsplit(url).netloc == origin or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            page.problems.append(f"request off the machine: {url}")
            route.abort()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            page.problems.append(f"console error: {message.text}")

    def on_response(response: Response) -> None:
        if response.status >= 400:
            page.problems.append(f"HTTP {response.status}: {response.url}")

    tab.route("**/*", on_route)
    tab.on("console", on_console)
    tab.on("pageerror", lambda error: page.problems.append(f"uncaught exception: {error}"))
    tab.on("response", on_response)
    try:
        tab.goto(base + path, wait_until="networkidle", timeout=PAGE_TIMEOUT_MS)
        if expected_diagrams:
            with contextlib.suppress(PlaywrightTimeout):  # counted below: fewer drawn than the page has
                tab.wait_for_function(_DIAGRAMS_DRAWN_JS, arg=expected_diagrams, timeout=PAGE_TIMEOUT_MS)
            texts = _svg_texts(tab.context.new_cdp_session(tab))
            page.diagrams = sum(1 for t in texts if t and "Syntax error" not in t)
            if page.diagrams != expected_diagrams:
                page.problems.append(f"{expected_diagrams} diagrams in the page, {page.diagrams} drawn as an SVG")
        page.ids = set(tab.evaluate(_IDS_JS))
        page.links = [u for u in tab.evaluate(_LINKS_JS) if urllib.parse.urlsplit(u).netloc == origin]
        if screenshots is not None:
            screenshots.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=screenshots / f"{path.removesuffix('.html').replace('/', '-')}.png", full_page=True)
    except Exception as exc:  # noqa: BLE001 (Playwright's time-outs and errors: a finding for this page)
        page.problems.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    finally:
        tab.close()
    return page


def check_links(site: Path, base: str, seen: dict[str, Report]) -> dict[str, list[str]]:
    """Each page's links to the site that do not resolve: no such page or file, or no such anchor on the page."""
    broken: dict[str, list[str]] = {}
    for page in seen.values():
        for url in page.links:
            parts = urllib.parse.urlsplit(url)
            path = urllib.parse.unquote(parts.path).removeprefix("/")
            if not path or path.endswith("/"):  # opened from the file system (site/index.html), a folder's listing
                broken.setdefault(page.path, []).append(f"a link to a folder, not a page: {url}")
                continue
            target = seen.get(path)
            if target is None:
                file = site / path
                if not (file.is_file() or (file / "index.html").is_file()):
                    broken.setdefault(page.path, []).append(f"no such page or file: {url}")
                elif parts.fragment:
                    broken.setdefault(page.path, []).append(f"an anchor on a page not visited: {url}")
            elif parts.fragment and urllib.parse.unquote(parts.fragment) not in target.ids:
                broken.setdefault(page.path, []).append(f"no such anchor: {url}")
    return broken


def check(site: Path, screenshots: Path | None = None) -> int:
    """Open every page of ``site`` in headless Chromium; print one line a page and a summary; 0 clean, 1 findings.

    Raises:
        ToolMissing: Chromium is not at :data:`CHROMIUM`, or site/ is not built.
    """
    if not Path(CHROMIUM).exists():
        raise ToolMissing(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; STREAMINFER_CHROMIUM=path)")
    paths = pages(site)
    if not paths:
        raise ToolMissing(f"{site} has no pages: build the site first (make docs)")
    seen: dict[str, Report] = {}
    with serve(site) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for path in paths:
                html = (site / path).read_text()
                seen[path] = visit(browser, base, path, html.count('<pre class="mermaid">'), screenshots)
        finally:
            browser.close()
        broken = check_links(site, base, seen)
    findings = 0
    for path, page in seen.items():
        problems = page.problems + broken.get(path, [])
        findings += len(problems)
        verdict = "ok  " if not problems else "FAIL"
        print(f"docs-check: {verdict} /{path} ({page.diagrams} diagrams, {len(page.links)} links)")
        for problem in problems:
            print(f"docs-check:      {problem}")
    links = sum(len(p.links) for p in seen.values())
    diagrams = sum(p.diagrams for p in seen.values())
    verdict = "ok" if findings == 0 else f"{findings} findings"
    print(f"docs-check: {len(seen)} pages, {diagrams} diagrams drawn, {links} links to the site checked: {verdict}")
    return 0 if findings == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.docsite", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("vendor", help="put Mermaid's bundle into docs/ (npm pack, sha512 checked, cached)")
    sub.add_parser("tools", help="install Debian's npm and chromium where missing (root on Debian)")
    check_cmd = sub.add_parser("check", help="open every page of the built site in headless Chromium")
    check_cmd.add_argument("--site", type=Path, default=REPO / "site", help="the built site (default: site/)")
    check_cmd.add_argument("--screenshots", type=Path, metavar="DIR", help="save a full-page PNG of each page in DIR")
    args = parser.parse_args(argv)
    try:
        if args.command == "vendor":
            print(f"docsite: {vendor().relative_to(REPO)} (mermaid {MERMAID_VERSION})")
            return 0
        if args.command == "tools":
            tools()
            return 0
        return check(args.site, args.screenshots)
    except ToolMissing as exc:
        print(f"docsite: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
